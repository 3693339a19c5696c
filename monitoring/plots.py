"""Compact drift pictures: per-feature distributions (reference vs current) and PSI over time.

`summary_page` writes one self-contained HTML page (PNG charts embedded as data URIs) next to Evidently's
full report: a status table of every feature, a grid of reference/current distributions, and — given the
registry history — each feature's PSI over time with the warn/alert levels drawn in.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from monitoring.drift import DriftReport, Frame, Thresholds, column
from monitoring.stats import NUMERICAL, NumericPair, clean_categorical, clean_numeric

_COLORS = {"ok": "#2e7d32", "warn": "#f9a825", "alert": "#c62828", "insufficient_data": "#757575",
           "skipped": "#757575"}
_REF, _CUR = "#4c72b0", "#dd8452"


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
        positions = np.arange(len(shares))
        ax.bar(positions - 0.2, shares["reference"], 0.4, color=_REF, label="reference")
        ax.bar(positions + 0.2, shares["current"], 0.4, color=_CUR, label="current")
        ax.set_xticks(positions, [str(k)[:10] for k in shares.index], rotation=45, ha="right", fontsize=7)
    ax.set_title(title, fontsize=9)
    ax.tick_params(labelsize=7)
    ax.set_ylabel("share", fontsize=7)


def distributions_png(report: DriftReport, reference: Frame, current: Frame,
                      features: Sequence[str] | None = None, columns: int = 3) -> bytes:
    """A grid of reference-vs-current distributions (default: drifted and warned features first, ≤ 12)."""
    plt = _pyplot()
    order = {"alert": 0, "warn": 1, "ok": 2}
    chosen = list(features) if features else [f.feature for f in sorted(
        (f for f in report.features if f.status in order), key=lambda f: (order[f.status], f.feature))][:12]
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


def psi_history_png(history: Mapping[str, Sequence[tuple[datetime, float | None]]],
                    thresholds: Thresholds | None = None) -> bytes:
    """PSI over time, one line per feature, with the warn and alert levels."""
    plt = _pyplot()
    thresholds = thresholds or Thresholds()
    fig, ax = plt.subplots(figsize=(9, 3.6))
    for name, points in sorted(history.items()):
        kept = [(t, v) for t, v in points if v is not None]
        if kept:
            ax.plot([t for t, _ in kept], [v for _, v in kept], marker="o", markersize=3, label=name)
    ax.axhline(thresholds.psi_warn, color=_COLORS["warn"], linestyle="--", linewidth=1, label="warn")
    ax.axhline(thresholds.psi_alert, color=_COLORS["alert"], linestyle="--", linewidth=1, label="alert")
    ax.set_ylabel("PSI")
    ax.set_title("PSI over time")
    ax.legend(fontsize=7, ncol=3)
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
                 history: Mapping[str, Sequence[tuple[datetime, float | None]]] | None = None) -> Path:
    """Write the compact HTML summary (and the same charts as PNG files beside it)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    charts = {"distributions": distributions_png(report, reference, current)}
    if history:
        charts["psi_history"] = psi_history_png(history)
    for name, blob in charts.items():
        target.with_name(f"{target.stem}.{name}.png").write_bytes(blob)
    score_names = sorted({k for f in report.features for k in f.scores if k != "psi_bins"})
    header = "".join(f"<th>{html.escape(h)}</th>" for h in ["feature", "kind", "status", *score_names,
                                                            "n ref", "n cur", "nulls ref/cur", "why"])
    rows = []
    for f in report.features:
        scores = "".join(f"<td>{_fmt(f.scores.get(k))}</td>" for k in score_names)
        rows.append(f"<tr><td>{html.escape(f.feature)}</td><td>{f.kind}</td>"
                    f"<td style='color:{_COLORS.get(f.status, '#000')};font-weight:bold'>{f.status}</td>{scores}"
                    f"<td>{f.n_ref}</td><td>{f.n_cur}</td><td>{f.nulls_ref}/{f.nulls_cur}</td>"
                    f"<td>{html.escape('; '.join(f.reasons))}</td></tr>")
    verdict = "DRIFT" if report.dataset_drift else "no dataset drift"
    link = (f"<p>Full report: <a href='{html.escape(evidently_report)}'>{html.escape(evidently_report)}</a></p>"
            if evidently_report else "")
    images = "".join(f"<h2>{name.replace('_', ' ')}</h2><img src='data:image/png;base64,"
                     f"{base64.b64encode(blob).decode()}'/>" for name, blob in charts.items())
    target.write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title><style>"
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:13px}"
        "td,th{border:1px solid #ddd;padding:4px 8px;text-align:right}td:first-child{text-align:left}"
        f"</style></head><body><h1>{html.escape(title)}</h1>"
        f"<p><b>{verdict}</b>: {len(report.drifted)} of {len(report.judged)} judged features drifted "
        f"(share {report.drift_share:.0%}, threshold {report.drift_share_threshold:.0%}); engine "
        f"{report.engine}, {report.elapsed_s:.2f} s.</p>{link}<table><tr>{header}</tr>{''.join(rows)}</table>"
        f"{images}</body></html>")
    return target


def _fmt(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.3g}" if abs(value) < 1e-3 and value != 0 else f"{value:.4f}"
