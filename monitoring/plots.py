"""Compact drift pictures: per-feature distributions (reference vs current) and PSI over time.

`summary_page` writes one self-contained HTML page (PNG charts embedded as data URIs, no external URL) next
to Evidently's full report: what was compared (reference and current windows, when, alert ids), the verdict
and what to do next, a status table of every feature, a grid of reference/current distributions, and — given
the registry history — each feature's PSI over time with the warn/alert levels drawn in.

`write_drift_reports` writes both pages for one check with **one verdict**: Evidently's report is drawn with
Quiver's per-column judgement (`column_verdicts`), so a feature drifted in one page drifted in the other.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from quiver.monitoring.drift import DriftConfig, DriftReport, FeatureDrift, Frame, Thresholds, column
from quiver.monitoring.evidently_ref import DEFAULT_SAMPLE_ROWS, ColumnVerdict, EvidentlyReport
from quiver.monitoring.stats import NUMERICAL, NumericPair, clean_categorical, clean_numeric

_COLORS = {"ok": "#2e7d32", "warn": "#f9a825", "alert": "#c62828", "insufficient_data": "#757575",
           "skipped": "#757575"}
_REF, _CUR = "#4c72b0", "#dd8452"
SCORE_COLUMN = "score"  # the model's own output, compared like a feature: always drawn when present


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Any) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    _pyplot().close(fig)
    return buffer.getvalue()


def _draw_distribution(ax: Any, ref: pd.Series, cur: pd.Series, kind: str, title: str) -> None:
    if kind == NUMERICAL:
        x, _ = clean_numeric(ref.to_numpy())
        y, _ = clean_numeric(cur.to_numpy())
        if x.size and y.size:
            edges = NumericPair(x, y).sturges_edges()
            ax.hist(x, bins=edges, weights=np.full(x.size, 1 / x.size), alpha=0.55, color=_REF, label="reference")
            ax.hist(y, bins=edges, weights=np.full(y.size, 1 / y.size), alpha=0.55, color=_CUR, label="current")
    else:
        r, _ = clean_categorical(ref)
        c, _ = clean_categorical(cur)
        shares = pd.DataFrame({"reference": r.value_counts(normalize=True),
                               "current": c.value_counts(normalize=True)}).fillna(0.0)
        shares = shares.sort_values("reference", ascending=False).head(12)
        positions = np.arange(len(shares))[::-1]  # horizontal bars: category names read in full, largest on top
        ax.barh(positions + 0.2, shares["reference"], 0.4, color=_REF, label="reference")
        ax.barh(positions - 0.2, shares["current"], 0.4, color=_CUR, label="current")
        ax.set_yticks(positions, [_short(str(k)) for k in shares.index], fontsize=7)
        ax.set_xlabel("share of rows", fontsize=7)
    ax.set_title(title, fontsize=9)
    ax.tick_params(labelsize=7)
    if kind == NUMERICAL:
        ax.set_ylabel("share of rows", fontsize=7)


def _short(name: str, limit: int = 40) -> str:
    return name if len(name) <= limit else name[:limit - 1] + "…"


def drawn_features(report: DriftReport, limit: int = 12) -> list[str]:
    """The features a distributions grid shows: the model's `score` first when it was compared, then
    drifted, warned and calm features, at most `limit`."""
    order = {"alert": 0, "warn": 1, "ok": 2}
    ranked = sorted((f for f in report.features if f.status in order or f.feature == SCORE_COLUMN),
                    key=lambda f: (f.feature != SCORE_COLUMN, order.get(f.status, 3), f.feature))
    return [f.feature for f in ranked][:limit]


def distributions_png(report: DriftReport, reference: Frame, current: Frame,
                      features: Sequence[str] | None = None, columns: int = 3) -> bytes:
    """A grid of reference-vs-current distributions (default: the model's `score` first when compared, then
    drifted and warned features, ≤ 12 in all)."""
    plt = _pyplot()
    chosen = list(features) if features else drawn_features(report)
    rows = max(1, -(-len(chosen) // columns))
    fig, axes = plt.subplots(rows, columns, figsize=(4 * columns, 2.8 * rows), squeeze=False)
    for ax in axes.flat[len(chosen):]:
        ax.axis("off")
    for ax, name in zip(axes.flat, chosen, strict=False):
        f = report.feature(name)
        label = f"{name} [{f.status}]" + (f"  PSI {f.scores['psi']:.3f}" if "psi" in f.scores else "")
        _draw_distribution(ax, column(reference, name), column(current, name), f.kind, label)
    if chosen:
        axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    return _png(fig)


PSI_LINES = 8  # more lines than this tangle: the chart keeps the features with the highest latest PSI


def psi_shown(history: Mapping[str, Sequence[tuple[datetime, float | None]]], top: int = PSI_LINES) -> list[str]:
    """The features a PSI-over-time chart draws: the `top` with the highest latest PSI, highest first."""
    def latest(name: str) -> float:
        kept = sorted((t, v) for t, v in history[name] if v is not None and np.isfinite(v))
        return kept[-1][1] if kept else -np.inf

    return sorted(history, key=lambda name: (-latest(name), name))[:top]


def psi_caption(history: Mapping[str, Sequence[tuple[datetime, float | None]]], top: int = PSI_LINES) -> str:
    shown = psi_shown(history, top)
    if len(shown) == len(history):
        return f"PSI over time of all {len(history)} features"
    return (f"PSI over time of the {len(shown)} of {len(history)} features with the highest latest PSI: "
            f"{', '.join(shown)}")


def psi_history_png(history: Mapping[str, Sequence[tuple[datetime, float | None]]],
                    thresholds: Thresholds | None = None, top: int = PSI_LINES) -> bytes:
    """PSI over time with the warn and alert levels, one line per feature for the `top` features with the
    highest latest PSI (the title says how many of how many)."""
    plt = _pyplot()
    thresholds = thresholds or Thresholds()
    fig, ax = plt.subplots(figsize=(9, 3.6))
    shown = psi_shown(history, top)
    for name, points in ((name, history[name]) for name in shown):
        kept = [(t, v) for t, v in points if v is not None]
        if kept:
            ax.plot([t for t, _ in kept], [v for _, v in kept], marker="o", markersize=3, label=name)
    times = [t for points in history.values() for t, v in points if v is not None]
    if times:  # the axis spans the data (matplotlib pads a lone point out to years)
        first, last = min(times), max(times)
        pad = max((last - first) * 0.05, timedelta(hours=1))
        ax.set_xlim(first - pad, last + pad)
    ax.axhline(thresholds.psi_warn, color=_COLORS["warn"], linestyle="--", linewidth=1, label="warn")
    ax.axhline(thresholds.psi_alert, color=_COLORS["alert"], linestyle="--", linewidth=1, label="alert")
    ax.set_ylabel("PSI")
    ax.set_title("PSI over time" + (f" (the {len(shown)} of {len(history)} features with the highest latest PSI)"
                                    if len(shown) < len(history) else ""), fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.autofmt_xdate()
    fig.tight_layout()
    return _png(fig)


def history_from_rows(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[tuple[datetime, float | None]]]:
    """Group registry drift rows ({feature, computed_at, psi}) into per-feature series."""
    out: dict[str, list[tuple[datetime, float | None]]] = {}
    for row in rows:
        out.setdefault(str(row["feature"]), []).append((row["computed_at"], row.get("psi")))
    return out


def summary_page(report: DriftReport, reference: Frame, current: Frame, path: str | Path, *,
                 title: str = "Quiver drift summary", evidently_report: str | None = None,
                 history: Mapping[str, Sequence[tuple[datetime, float | None]]] | None = None,
                 compared: Sequence[tuple[str, str]] = (), next_steps: Sequence[str] = ()) -> Path:
    """Write the compact HTML summary (and the same charts as PNG files beside it).

    `compared`: (label, value) rows for "what was compared" (windows, when, run and alert ids);
    `next_steps`: sentences for "what to do next".
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    drawn = drawn_features(report)
    charts = {"distributions": distributions_png(report, reference, current, drawn)}
    captions = {"distributions": (f"Distributions of {'all ' if len(drawn) == len(report.features) else ''}"
                                  f"{len(drawn)} of {len(report.features)} features (the model's score first, then "
                                  f"drifted, warned and calm ones, by name within each): {', '.join(drawn)}")}
    if history:
        charts["psi_history"] = psi_history_png(history)
        captions["psi_history"] = psi_caption(history)
    for name, blob in charts.items():
        target.with_name(f"{target.stem}.{name}.png").write_bytes(blob)
    score_names = sorted({k for f in report.features for k in f.scores if k != "psi_bins"})
    header = "".join(f"<th>{html.escape(h)}</th>" for h in ["feature", "kind", "status", *score_names,
                                                            "n ref", "n cur", "nulls ref/cur", "why"])
    rows = []
    for f in report.features:
        scores = "".join(f"<td>{html.escape(_fmt(f.scores.get(k), k))}</td>" for k in score_names)
        rows.append(f"<tr><td>{html.escape(f.feature)}</td><td>{f.kind}</td>"
                    f"<td style='color:{_COLORS.get(f.status, '#000')};font-weight:bold'>{f.status}</td>{scores}"
                    f"<td>{f.n_ref}</td><td>{f.n_cur}</td><td>{f.nulls_ref}/{f.nulls_cur}</td>"
                    f"<td>{html.escape('; '.join(f.reasons))}</td></tr>")
    verdict = "DRIFT" if report.dataset_drift else "no dataset drift"
    link = (f"<p>Full report (Evidently, same verdicts): <a href='{html.escape(evidently_report)}'>"
            f"{html.escape(evidently_report)}</a></p>" if evidently_report else "")
    facts = ("<table>" + "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in compared)
             + "</table>") if compared else ""
    steps = ("<h2>What to do next</h2><ul>" + "".join(f"<li>{html.escape(step)}</li>" for step in next_steps)
             + "</ul>") if next_steps else ""
    images = "".join(f"<h2>{name.replace('_', ' ')}</h2><p>{html.escape(captions[name])}</p>"
                     f"<img src='data:image/png;base64,{base64.b64encode(blob).decode()}'/>"
                     for name, blob in charts.items())
    target.write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>"
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:13px}"
        "td,th{border:1px solid #ddd;padding:4px 8px;text-align:right}td:first-child{text-align:left}"
        f"</style></head><body><h1>{html.escape(title)}</h1>"
        f"<p><b>{verdict}</b>: {len(report.drifted)} of {len(report.judged)} judged features drifted "
        f"({html.escape(report.rule)}); engine "
        f"{report.engine}, {report.elapsed_s:.2f} s.</p>{facts}{steps}{link}"
        f"<h2>Features</h2><table><tr>{header}</tr>{''.join(rows)}</table>"
        f"{images}</body></html>")
    return target


P_FLOOR = 1e-16  # below this a p-value says only "very small": doubles cannot resolve it against 1


def _fmt(value: float | None, key: str = "") -> str:
    if value is None or not np.isfinite(value):
        return "—"
    if key.endswith("pvalue") and value < P_FLOOR:
        return f"< {P_FLOOR:g}"
    return f"{value:.3g}" if abs(value) < 1e-3 and value != 0 else f"{value:.4f}"


def column_verdicts(report: DriftReport, config: DriftConfig | None = None) -> dict[str, ColumnVerdict]:
    """Quiver's judgement of every judged feature, in the form Evidently's report shows (see evidently_ref)."""
    config = config or DriftConfig()
    return {f.feature: _verdict(f, config.thresholds_for(f.feature)) for f in report.judged}


def _verdict(f: FeatureDrift, t: Thresholds) -> ColumnVerdict:
    """The score that decided (for a drifted feature: the rule that alerted; else PSI when it ran)."""
    s, ks_label = f.scores, f"KS D (needs p < {t.ks_pvalue})"
    methods = [("psi", "PSI", "psi", t.psi_alert), ("KS ", ks_label, "ks_statistic", t.ks_min_statistic),
               ("wasserstein", "Wasserstein (normed)", "wasserstein", t.wasserstein),
               ("jensenshannon", "Jensen-Shannon", "jensenshannon", t.jensenshannon),
               ("chisquare p", "chi-square p", "chisquare_pvalue", t.chisquare_pvalue),
               ("z p", "Z p", "z_pvalue", t.z_pvalue)]
    if f.drifted:
        for prefix, label, key, limit in methods:
            fired = [r for r in f.reasons if r.lower().startswith(prefix.lower()) and "not judged" not in r]
            if key == "psi":  # a PSI warning (≥ psi_warn) is not what made the feature drift
                fired = [r for r in fired if r.endswith(f"≥ {t.psi_alert}")]
            if fired and key in s:
                return ColumnVerdict(f.kind, label, s[key], limit, True)
    for _, label, key, limit in methods:
        if key in s:
            return ColumnVerdict(f.kind, label, s[key], limit, f.drifted)
    return ColumnVerdict(f.kind, "null share", 0.0, t.max_null_share_delta, f.drifted)


def next_steps(report: DriftReport, alert_ids: Sequence[int] = ()) -> list[str]:
    """Plain advice for the summary page, from the verdict."""
    steps: list[str] = []
    drifted = [f.feature for f in report.drifted]
    if report.dataset_drift:
        steps.append(f"Dataset drift: {len(drifted)} of {len(report.judged)} judged features moved. If the "
                     "shift is real (not a broken pipeline), retrain on recent data: the dataset_drift alert "
                     "triggers the retrain DAG through an airflow_asset sink, or run the training by hand.")
    if drifted:
        steps.append(f"Look at the distributions of {', '.join(drifted[:8])}{' …' if len(drifted) > 8 else ''} "
                     "below; a sudden jump in one feature usually means an upstream change (units, a new "
                     "category, a broken join), a slow slide means the world moved.")
    starved = [f.feature for f in report.features if f.status == "insufficient_data"]
    if starved:
        steps.append(f"{len(starved)} feature(s) had too few values to judge ({', '.join(starved[:5])}): widen "
                     "the current window.")
    if alert_ids:
        steps.append(f"Once handled, close the alerts: {', '.join(f'quiver alerts resolve {i}' for i in alert_ids)} "
                     "(a later healthy check resolves them too).")
    if not steps:
        steps.append("Nothing drifted: no action needed. The next scheduled check runs on the next "
                     "offline-features update.")
    return steps


def write_drift_reports(report: DriftReport, reference: Frame, current: Frame, path: str | Path, *,
                        name: str = "default", config: DriftConfig | None = None,
                        compared: Sequence[tuple[str, str]] = (),
                        alert_ids: Sequence[int] = (),
                        history: Mapping[str, Sequence[tuple[datetime, float | None]]] | None = None,
                        max_rows: int = DEFAULT_SAMPLE_ROWS, title: str | None = None) -> tuple[EvidentlyReport, Path]:
    """Evidently's HTML at `path` and the summary page beside it (`<stem>.summary.html`), one verdict."""
    from dataclasses import replace

    from quiver.monitoring.evidently_ref import evidently_html, sample_rows, to_pandas

    target = Path(path)
    # One sample feeds every chart of both pages (and bounds their cost); the verdicts come from all rows.
    names = [f.feature for f in report.features]
    rows = (_rows(reference), _rows(current))
    reference = sample_rows(to_pandas(reference, names), max_rows, seed=0)
    current = sample_rows(to_pandas(current, names), max_rows, seed=1)
    evidently = replace(evidently_html(reference, current, column_verdicts(report, config), target,
                                       drift_share=report.drift_share_threshold, max_rows=max_rows),
                        rows_ref=rows[0], rows_cur=rows[1])
    sample = (f"charts from a random sample of {evidently.sample_ref:,} of {evidently.rows_ref:,} reference and "
              f"{evidently.sample_cur:,} of {evidently.rows_cur:,} current rows; verdicts from all rows")
    summary = summary_page(report, reference, current, target.with_name(f"{target.stem}.summary.html"),
                           title=title or f"Drift check {name!r}", evidently_report=target.name, history=history,
                           compared=[*compared, ("Evidently report", sample)],
                           next_steps=next_steps(report, alert_ids))
    return evidently, summary


def _rows(data: Frame) -> int:
    return int(data.num_rows) if hasattr(data, "num_rows") else len(data)
