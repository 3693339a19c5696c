"""The evaluation page of a challenger: champion vs challenger on the same labelled requests, and its canary.

`write_evaluation_report` writes one self-contained HTML page (PNG charts embedded, and the same PNGs beside
it): ROC and precision-recall curves of both models on the shadow pairs, their calibration (reliability
diagram), and the canary's steps over time (traffic share and the judged guardrail estimates per step, with
the outcome of each step). The numbers come from serving logs joined with delayed labels
(`quiver.monitoring.evaluation.shadow_pairs`) and from the rollout's recorded decisions.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from quiver.monitoring.plots import _png, _pyplot

FloatArray = npt.NDArray[np.float64]
_CHAMPION, _CHALLENGER = "#4c72b0", "#dd8452"
_OUTCOME_COLORS = {"advance": "#2e7d32", "promote": "#1b5e20", "hold": "#f9a825", "rollback": "#c62828",
                   "halt": "#6a1b9a"}


def roc_points(labels: FloatArray, scores: FloatArray) -> tuple[FloatArray, FloatArray]:
    """False- and true-positive rates at every distinct threshold (from (0, 0) to (1, 1))."""
    order = np.argsort(-scores, kind="stable")
    y = labels[order]
    distinct = np.r_[np.flatnonzero(np.diff(scores[order])), len(y) - 1]
    tps = np.cumsum(y)[distinct]
    fps = (distinct + 1) - tps
    pos, neg = max(float(y.sum()), 1.0), max(float(len(y) - y.sum()), 1.0)
    return np.r_[0.0, fps / neg], np.r_[0.0, tps / pos]


def pr_points(labels: FloatArray, scores: FloatArray) -> tuple[FloatArray, FloatArray]:
    """Recall and precision at every distinct threshold, highest threshold first."""
    order = np.argsort(-scores, kind="stable")
    y = labels[order]
    distinct = np.r_[np.flatnonzero(np.diff(scores[order])), len(y) - 1]
    tps = np.cumsum(y)[distinct]
    predicted = distinct + 1
    return tps / max(float(y.sum()), 1.0), tps / predicted


def reliability(labels: FloatArray, scores: FloatArray, bins: int = 10) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Per equal-width score bin: mean score, observed positive rate, and rows (empty bins left out)."""
    index = np.clip((scores * bins).astype(int), 0, bins - 1)
    counts = np.bincount(index, minlength=bins).astype(np.float64)
    mean_score = np.bincount(index, weights=scores, minlength=bins)
    positives = np.bincount(index, weights=labels, minlength=bins)
    keep = counts > 0
    return mean_score[keep] / counts[keep], positives[keep] / counts[keep], counts[keep]


def _area(x: FloatArray, y: FloatArray) -> float:
    return float(np.sum(np.diff(x) * (y[1:] + y[:-1]) / 2))


def curves_png(labels: FloatArray, arms: Mapping[str, FloatArray], kind: str) -> bytes:
    """ROC (`kind="roc"`) or precision-recall (`kind="pr"`) curves of every arm on the same labels."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 4.2))
    for (name, scores), color in zip(arms.items(), (_CHAMPION, _CHALLENGER, "#55a868"), strict=False):
        if kind == "roc":
            x, y = roc_points(labels, scores)
            ax.plot(x, y, color=color, label=f"{name} (AUC {_area(x, y):.3f})")
        else:
            x, y = pr_points(labels, scores)
            ap = float(np.sum(np.diff(np.r_[0.0, x]) * y))
            ax.plot(x, y, color=color, label=f"{name} (AP {ap:.3f})")
    if kind == "roc":
        ax.plot([0, 1], [0, 1], color="#999", linestyle=":", linewidth=1)
        ax.set(xlabel="false-positive rate", ylabel="true-positive rate", title="ROC")
    else:
        ax.axhline(float(labels.mean()) if len(labels) else 0.0, color="#999", linestyle=":", linewidth=1)
        ax.set(xlabel="recall", ylabel="precision", title="Precision–recall")
    ax.legend(loc="lower right" if kind == "roc" else "upper right", fontsize=8)
    blob: bytes = _png(fig)
    plt.close(fig)
    return blob


MIN_BIN_ROWS = 30  # a calibration bin with fewer rows is too noisy to draw as a point
# A dense bin whose observed rate misses its mean score by more than this (and by > 3 standard errors, so
# not by chance) makes the model "poorly calibrated": its scores cannot be read as probabilities there.
MAX_CALIBRATION_GAP = 0.1


def expected_calibration_error(labels: FloatArray, scores: FloatArray, bins: int = 10) -> float:
    """Row-weighted mean |observed rate − mean score| over equal-width bins (NaN without rows)."""
    mean, rate, counts = reliability(labels, scores, bins)
    return float(np.sum(counts * np.abs(rate - mean)) / counts.sum()) if counts.sum() else float("nan")


def miscalibrated_bins(labels: FloatArray, arms: Mapping[str, FloatArray], bins: int = 10,
                       min_rows: int = MIN_BIN_ROWS,
                       max_gap: float = MAX_CALIBRATION_GAP) -> list[tuple[str, int, float, float]]:
    """Per poorly calibrated arm its worst dense bin: (arm, rows, mean score, observed rate)."""
    out = []
    for name, scores in arms.items():
        mean, rate, counts = reliability(labels, scores, bins)
        error = np.sqrt(np.clip(mean * (1 - mean), 1e-12, None) / counts)
        gap = np.abs(rate - mean)
        bad = (counts >= min_rows) & (gap > max_gap) & (gap > 3 * error)
        if bad.any():
            worst = int(np.argmax(np.where(bad, gap, -1.0)))
            out.append((name, int(counts[worst]), float(mean[worst]), float(rate[worst])))
    return out


def calibration_warnings(labels: FloatArray, arms: Mapping[str, FloatArray], bins: int = 10,
                         min_rows: int = MIN_BIN_ROWS) -> list[str]:
    """One sentence per poorly calibrated arm (see `MAX_CALIBRATION_GAP`)."""
    return [f"{name} is poorly calibrated: {n:,} rows scored {mean:.2f} on average were positive {rate:.0%} of "
            f"the time (ECE {expected_calibration_error(labels, arms[name], bins):.3f}); read its scores as a "
            "ranking, not as probabilities" for name, n, mean, rate in miscalibrated_bins(labels, arms, bins, min_rows)]


def calibration_table(labels: FloatArray, arms: Mapping[str, FloatArray], bins: int = 10) -> str:
    """HTML rows per arm and score bin: rows, mean score, observed rate (the chart's points, with their counts)."""
    rows = []
    for name, scores in arms.items():
        for mean, rate, n in zip(*reliability(labels, scores, bins), strict=True):
            rows.append(f"<tr><td>{html.escape(name)}</td><td>{int(n):,}</td><td>{mean:.3f}</td><td>{rate:.3f}</td>"
                        f"<td>{rate - mean:+.3f}</td></tr>".replace("-", "−"))
    return ("<table><tr><th>model</th><th>rows</th><th>mean score</th><th>observed rate</th>"
            "<th>observed − score</th></tr>" + "".join(rows) + "</table>")


def calibration_png(labels: FloatArray, arms: Mapping[str, FloatArray], bins: int = 10,
                    min_rows: int = MIN_BIN_ROWS) -> bytes:
    """`calibration_figure` as PNG bytes."""
    plt = _pyplot()
    fig = calibration_figure(labels, arms, bins, min_rows)
    blob: bytes = _png(fig)
    plt.close(fig)
    return blob


def calibration_figure(labels: FloatArray, arms: Mapping[str, FloatArray], bins: int = 10,
                       min_rows: int = MIN_BIN_ROWS) -> Any:
    """Reliability diagram: observed positive rate against mean score per bin (rows per bin: see
    `calibration_table`; labels on the points overlapped). Bins with fewer than `min_rows` rows are not drawn
    (a lone sparse bin would pull the line to 1.0); the x-axis caption says how many rows they held. A poorly
    calibrated arm is named on the chart (`calibration_warnings`)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 4.2))
    top = 0.0
    left_out: list[str] = []
    for (name, scores), color in zip(arms.items(), (_CHAMPION, _CHALLENGER, "#55a868"), strict=False):
        mean, rate, counts = reliability(labels, scores, bins)
        dense = counts >= min_rows
        ece = expected_calibration_error(labels, scores, bins)
        ax.plot(mean[dense], rate[dense], color=color, label=f"{name} (ECE {ece:.3f})", linewidth=1, marker="o",
                markersize=4)
        if (~dense).any():
            left_out.append(f"{name}: {int((~dense).sum())} bin(s), {int(counts[~dense].sum())} rows")
        top = max(top, float(mean[dense].max(initial=0)), float(rate[dense].max(initial=0)))
    top = min(1.0, top * 1.15 + 1e-3)
    ax.plot([0, top], [0, top], color="#999", linestyle=":", linewidth=1)
    xlabel = "mean predicted probability"
    if left_out:
        xlabel += f"\nnot drawn (< {min_rows} rows): " + "; ".join(left_out)
    ax.set(xlim=(0, top), ylim=(0, top), xlabel=xlabel, ylabel="observed fraud rate",
           title=f"Calibration (points: bins of ≥ {min_rows} rows; dotted: perfect)")
    ax.title.set_fontsize(9)
    ax.xaxis.label.set_fontsize(8)
    bad = miscalibrated_bins(labels, arms, bins, min_rows)
    if bad:
        ax.text(0.02, 0.98, "\n".join(f"{name} poorly calibrated:\n  scored {mean:.2f}, observed {rate:.0%}"
                                       for name, _, mean, rate in bad), transform=ax.transAxes, fontsize=7,
                va="top", color="#c62828")
    ax.legend(fontsize=7, loc="lower right")
    return fig


CHART_GUARDRAILS = ("log_loss", "brier", "score_shift", "error_rate", "latency_p99")


def canary_png(steps: Sequence[Mapping[str, Any]]) -> bytes:
    """`canary_figure` as PNG bytes."""
    plt = _pyplot()
    fig = canary_figure(steps)
    blob: bytes = _png(fig)
    plt.close(fig)
    return blob


def canary_figure(steps: Sequence[Mapping[str, Any]]) -> Any:
    """The canary over its judged looks: the traffic share per look, coloured by outcome; then per guardrail
    the estimate (canary − champion) with its confidence sequence as an error bar, the floor (dashed) and
    the line beyond which the guardrail fails (dotted). A look's row may carry `guardrails`: name →
    {estimate, lower, upper, floor, fail_above, status} (else only `log_loss_diff` is drawn, without bars)."""
    plt = _pyplot()
    names = [n for n in CHART_GUARDRAILS if any(n in (s.get("guardrails") or {}) for s in steps)]
    fig, axes = plt.subplots(1 + max(len(names), 1), 1, figsize=(7, 2.0 + 1.7 * max(len(names), 1)), sharex=True,
                             squeeze=False)
    share, panels = axes[0][0], [row[0] for row in axes[1:]]
    x = np.arange(len(steps))
    fractions = [float(s.get("fraction") or 0.0) for s in steps]
    colors = [_OUTCOME_COLORS.get(str(s.get("outcome")), "#757575") for s in steps]
    share.step(x, fractions, where="post", color="#555", linewidth=1)
    share.scatter(x, fractions, c=colors, s=50, zorder=3)
    for i, s in enumerate(steps):
        share.annotate(str(s.get("outcome")), (i, fractions[i]), textcoords="offset points", xytext=(0, 6),
                       ha="center", fontsize=7)
    share.set(ylabel="canary share", ylim=(0, 1.15), title="Canary looks: share, and each guardrail's confidence "
                                                           "sequence against its floor")
    share.title.set_fontsize(9)
    if not names:
        known = [(i, float(v)) for i, v in enumerate(s.get("log_loss_diff") for s in steps)
                 if v is not None and np.isfinite(float(v))]
        if known:
            panels[0].bar([i for i, _ in known], [v for _, v in known], color=[colors[i] for i, _ in known])
        else:
            panels[0].text(0.5, 0.5, "no labelled rows yet", transform=panels[0].transAxes, ha="center",
                           va="center", color="#555", fontsize=9)
        panels[0].axhline(0, color="#999", linewidth=1)
        panels[0].set(ylabel=UNITS["log_loss"])
    for ax, name in zip(panels, names, strict=False):
        _guardrail_panel(ax, name, steps)
    panels[-1].set_xlabel("judged look")
    panels[-1].set_xticks(x, [str(s.get("label") or i) for i, s in enumerate(steps)], fontsize=7, rotation=20)
    fig.tight_layout()
    return fig


UNITS = {"error_rate": "Δ share of calls failed", "score_shift": "score distance (W1)",
         "log_loss": "Δ log loss (nats/row)", "brier": "Δ Brier score"}


def _unit(name: str, threshold_ms: Any) -> str:
    """A panel's y-axis: what it measures (canary − champion) and in which unit."""
    if name == "latency_p99":
        from quiver.registry.explain import milliseconds  # the cut-off written as the console writes it

        return f"Δ share > {milliseconds(float(threshold_ms))}" if threshold_ms is not None else "Δ share > threshold ms"
    return UNITS.get(name, name)


def _guardrail_panel(ax: Any, name: str, steps: Sequence[Mapping[str, Any]]) -> None:
    """One guardrail's looks. The y-range follows the estimates and floor lines; an interval much wider (an
    early look) runs off the panel rather than squash the floor lines together."""
    status_colors = {"pass": "#2e7d32", "fail": "#c62828", "wait": "#f9a825"}
    floor = fail_above = threshold = None
    core: list[float] = [0.0]
    ends: list[float] = []
    for i, s in enumerate(steps):
        g = (s.get("guardrails") or {}).get(name) or {}
        estimate, lower, upper = g.get("estimate"), g.get("lower"), g.get("upper")
        floor = g.get("floor") if g.get("floor") is not None else floor
        fail_above = g.get("fail_above") if g.get("fail_above") is not None else fail_above
        threshold = g.get("threshold_ms") if g.get("threshold_ms") is not None else threshold
        if estimate is None:
            continue
        color = status_colors.get(str(g.get("status")), "#757575")
        core.append(float(estimate))
        ends += [float(v) for v in (lower, upper) if v is not None]
        if lower is not None and upper is not None:
            ax.errorbar([i], [estimate], yerr=[[estimate - lower], [upper - estimate]], fmt="o", color=color,
                        capsize=3, markersize=4)
        else:
            ax.plot([i], [estimate], "o", color=color, markersize=4)
    ax.axhline(0, color="#999", linewidth=0.8)
    if floor is not None:
        core.append(float(floor))
        ax.axhline(float(floor), color="#c62828", linestyle="--", linewidth=1, label=f"floor {float(floor):.3g}")
    if fail_above is not None:
        core.append(float(fail_above))
        share = f" ({float(fail_above) / float(floor):.2g} × floor)".replace("0.5 ×", "½ ×") if floor else ""
        ax.axhline(float(fail_above), color="#c62828", linestyle=":", linewidth=1,
                   label=f"fails above {float(fail_above):.3g}{share}")
    if len(core) == 1 + (floor is not None) + (fail_above is not None):  # no look has an estimate
        ax.text(0.5, 0.5, "no labelled rows yet" if name in ("log_loss", "brier") else "no estimate yet",
                transform=ax.transAxes, ha="center", va="center", color="#555", fontsize=9)
    lo, hi = min(core), max(core)
    margin = 0.5 * (hi - lo) if hi > lo else 1.0
    pad = 0.05 * margin
    ax.set_ylim(max(lo - margin, min([*ends, lo]) - pad), min(hi + margin, max([*ends, hi]) + pad))
    ax.set_ylabel(_unit(name, threshold), fontsize=7)
    ax.tick_params(labelsize=7)
    if floor is not None or fail_above is not None:
        ax.legend(fontsize=6, loc="upper right")


def write_evaluation_report(path: str | Path, *, labels: Sequence[float], champion_scores: Sequence[float],
                            challenger_scores: Sequence[float], champion: str, challenger: str,
                            canary_steps: Sequence[Mapping[str, Any]] = (), title: str = "",
                            facts: Sequence[tuple[str, str]] = ()) -> Path:
    """Write the page and its PNGs (`<stem>.roc.png`, `.pr.png`, `.calibration.png`, `.canary.png`)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    y = np.asarray(labels, np.float64)
    arms = {f"champion {champion}": np.asarray(champion_scores, np.float64),
            f"challenger {challenger}": np.asarray(challenger_scores, np.float64)}
    if not len(y) or any(len(s) != len(y) for s in arms.values()):
        raise ValueError(f"need as many scores as labels (>0), got {len(y)} labels and "
                         f"{[len(s) for s in arms.values()]} scores")
    charts = {"roc": curves_png(y, arms, "roc"), "pr": curves_png(y, arms, "pr"),
              "calibration": calibration_png(y, arms)}
    warnings = "".join(f"<p class='warn'>⚠ {html.escape(w)}</p>" for w in calibration_warnings(y, arms))
    ece = ", ".join(f"{html.escape(name)} {_cell(expected_calibration_error(y, scores), '.3f')}"
                    for name, scores in arms.items())
    calibration = (f"<h2>Calibration</h2><p>Expected calibration error (ECE, 10 equal-width bins): {ece}.</p>"
                   f"{warnings}<details><summary>rows per score bin</summary>{calibration_table(y, arms)}</details>")
    if canary_steps:
        charts["canary"] = canary_png(canary_steps)
    for name, blob in charts.items():
        target.with_name(f"{target.stem}.{name}.png").write_bytes(blob)
    images = "".join(f"<img alt='{name}' src='data:image/png;base64,{base64.b64encode(blob).decode()}'>"
                     for name, blob in charts.items())
    fact_rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in facts)
    step_rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(_cell(s.get(k)))}</td>"
                         for k in ("label", "fraction", "outcome", "rows", "log_loss_diff", "reason")) + "</tr>"
        for s in canary_steps)
    steps_table = ("<h2>Canary steps</h2><table><tr><th>step</th><th>share</th><th>outcome</th><th>rows</th>"
                   f"<th>log loss Δ</th><th>why</th></tr>{step_rows}</table>") if canary_steps else ""
    heading = html.escape(title or f"{challenger} vs {champion}")
    target.write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>" + heading + "</title><style>"
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}img{margin:6px;max-width:48%}"
        ".warn{color:#c62828;font-weight:bold}"
        "</style></head><body><h1>" + heading + "</h1>"
        f"<p>{len(y):,} labelled requests scored by both models ({int(y.sum()):,} positive).</p>"
        f"<table>{fact_rows}</table>{images}{calibration}{steps_table}</body></html>")
    return target


def _cell(value: Any, spec: str = ".4g") -> str:
    """A cell's text: a dash for a missing or undefined number, never Python's None or nan."""
    if value is None or (isinstance(value, float) and not np.isfinite(value)):
        return "—"
    if isinstance(value, float):
        return f"{value:{spec}}".replace("-", "−")
    return str(value)
