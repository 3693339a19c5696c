"""The model page's "estimated vs realized performance": per metric over data time, the label-free estimate
(a line, its band shaded) and the realized value once labels arrived (points), one colour per arm (champion,
shadow, canary), a note under each window whose labels have not arrived, and a table of the newest windows
with the estimate's error.

Reads the registry's `performance_estimates` table (migration 0009) with plain selects: the drift check
writes it (`quiver.monitoring.estimate_records`); the console only reads."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select

from quiver.registry.estimate_tables import performance_estimates
from quiver.ui.charts import HEIGHT, PAD_B, PAD_L, PAD_R, WIDTH, _frame, _hlines, _ticks, _y
from quiver.ui.html import esc, num, table, when

METRIC_ORDER = ("roc_auc", "log_loss", "brier", "precision", "recall", "f1", "accuracy")
# What each metric's axis measures, in its unit, and which way is better.
METRIC_UNITS = {
    "roc_auc": "ROC-AUC (0–1, higher is better)",
    "log_loss": "log loss (nats per row, lower is better)",
    "brier": "Brier score (mean squared error, lower is better)",
    "precision": "precision at the threshold (share, higher is better)",
    "recall": "recall at the threshold (share, higher is better)",
    "f1": "F1 at the threshold (0–1, higher is better)",
    "accuracy": "accuracy at the threshold (share, higher is better)",
}
ARM_COLORS = {"champion": "#0b57d0", "shadow": "#8430ce", "canary": "#e8710a"}
ARM_ORDER = ("champion", "shadow", "canary")
NO_ESTIMATES = ("no estimates yet: the drift check estimates performance daily once the champion serves traffic "
                "and its scores pass the calibration check on labelled held-out rows; the realized value joins "
                "each day once its labels arrive")
TABLE_ROWS = 30


@dataclass(frozen=True)
class EstimatePoint:
    """One (version, arm, window, metric) row of `performance_estimates`."""

    version: str
    arm: str
    window_start: datetime
    window_end: datetime
    as_of: datetime
    metric: str
    status: str  # estimated | realized | uncalibrated
    rows: int
    estimate: float | None
    lower: float | None
    upper: float | None
    reference: float | None
    realized: float | None
    realized_rows: int | None
    computed_at: datetime
    reason: str  # why nothing was estimated (uncalibrated), from the row's detail


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _finite(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def performance_points(registry: Any, model: str) -> list[EstimatePoint]:
    """`model`'s estimates, oldest data time first."""
    import json

    query = (select(performance_estimates)
             .where(performance_estimates.c.project == registry.project, performance_estimates.c.model == model)
             .order_by(performance_estimates.c.as_of, performance_estimates.c.id))
    with registry.engine.connect() as connection:
        rows = connection.execute(query).all()
    out = []
    for r in rows:
        try:
            detail = json.loads(r.detail_json or "{}")
        except ValueError:
            detail = {}
        out.append(EstimatePoint(
            r.version, r.arm, _utc(r.window_start), _utc(r.window_end), _utc(r.as_of), r.metric, r.status,
            int(r.rows), _finite(r.estimate), _finite(r.lower), _finite(r.upper), _finite(r.reference),
            _finite(r.realized), r.realized_rows, _utc(r.computed_at),
            str(detail.get("reason", "")) if isinstance(detail, dict) else ""))
    return out


def _arms(points: Sequence[EstimatePoint]) -> list[str]:
    found = {p.arm for p in points}
    return [a for a in ARM_ORDER if a in found] + sorted(found - set(ARM_ORDER))


def estimate_chart(metric: str, points: Sequence[EstimatePoint]) -> str:
    """One metric over data time: per arm the estimate (line) in its band (shaded) and the realized values
    (filled dots); "no labels yet" under each window whose labels have not arrived; the champion's reference
    value (the metric on its labelled held-out rows: what "no harm" reads) as a dashed level."""
    drawn = [p for p in points if p.estimate is not None or p.realized is not None]
    label = METRIC_UNITS.get(metric, metric)
    if not drawn:
        return ""
    values = [v for p in drawn for v in (p.estimate, p.lower, p.upper, p.realized) if v is not None]
    reference = next((p.reference for p in reversed(drawn) if p.arm == "champion" and p.reference is not None),
                     None)
    ticks = _ticks(min([*values, *([reference] if reference is not None else [])]),
                   max([*values, *([reference] if reference is not None else [])]))
    low, high = ticks[0], ticks[-1]
    times = sorted({p.as_of.timestamp() for p in drawn})
    t0, t1 = times[0], times[-1]
    if t1 <= t0:
        t0, t1 = t0 - 43_200, t1 + 43_200

    def x(moment: datetime) -> float:
        return PAD_L + (WIDTH - PAD_L - PAD_R) * (moment.timestamp() - t0) / (t1 - t0)

    arms = _arms(drawn)
    height = HEIGHT + 14 * len(arms)
    parts = [_frame(f"{metric}: estimated vs realized", "line: estimate · shade: its band · dot: realized",
                    label, ticks, height, f"aria-label='{esc(metric)} estimated vs realized' class='estimate-chart' "
                                          f"data-metric='{esc(metric)}'")]
    if reference is not None:
        parts.append(_hlines([(reference, "#66707a", "6,4", f"reference {reference:.3g}")], low, high))
    for i, arm in enumerate(arms):
        color = ARM_COLORS.get(arm, "#5f6368")
        own = sorted((p for p in drawn if p.arm == arm), key=lambda p: p.as_of)
        banded = [(p.as_of, lo, hi) for p in own if (lo := p.lower) is not None and (hi := p.upper) is not None
                  and p.estimate is not None]
        if len(banded) == 1:  # one window: a bar, since a polygon of two points has no area
            moment, lo, hi = banded[0]
            top, bottom = _y(min(hi, high), low, high), _y(max(lo, low), low, high)
            parts.append(f"<rect x='{x(moment) - 4:.1f}' y='{top:.1f}' width='8' height='{bottom - top:.1f}' "
                         f"fill='{color}' fill-opacity='0.18' class='band'/>")
        elif banded:
            edge = [f"{x(t):.1f},{_y(min(hi, high), low, high):.1f}" for t, _, hi in banded]
            edge += [f"{x(t):.1f},{_y(max(lo, low), low, high):.1f}" for t, lo, _ in reversed(banded)]
            parts.append(f"<polygon points='{' '.join(edge)}' fill='{color}' fill-opacity='0.18' stroke='none' "
                         f"class='band'/>")
        estimated = [(p, value) for p in own if (value := p.estimate) is not None]
        if len(estimated) > 1:
            line = " ".join(f"{x(p.as_of):.1f},{_y(value, low, high):.1f}" for p, value in estimated)
            parts.append(f"<polyline points='{line}' fill='none' stroke='{color}' stroke-width='1.5' "
                         f"class='estimate-line'/>")
        for p, value in estimated:
            band = f" [{p.lower:.4g}, {p.upper:.4g}]" if p.lower is not None and p.upper is not None else ""
            parts.append(f"<circle cx='{x(p.as_of):.1f}' cy='{_y(value, low, high):.1f}' r='2.5' fill='#fff' "
                         f"stroke='{color}' class='estimate'><title>{esc(p.version)} ({esc(arm)}) "
                         f"{p.as_of:%Y-%m-%d %H:%M}: estimated {value:.4g}{band} from {p.rows:,} rows"
                         f"</title></circle>")
        for p in own:
            if p.realized is not None:
                error = f", estimate off by {p.realized - p.estimate:+.4g}" if p.estimate is not None else ""
                parts.append(f"<circle cx='{x(p.as_of):.1f}' cy='{_y(p.realized, low, high):.1f}' r='4' "
                             f"fill='{color}' class='realized'><title>{esc(p.version)} ({esc(arm)}) "
                             f"{p.as_of:%Y-%m-%d %H:%M}: realized {p.realized:.4g} on "
                             f"{p.realized_rows or 0:,} labelled rows{error}</title></circle>")
        ly = HEIGHT + 4 + 14 * i
        parts.append(f"<line x1='{PAD_L}' x2='{PAD_L + 14}' y1='{ly - 4}' y2='{ly - 4}' stroke='{color}' "
                     f"stroke-width='2'/><circle cx='{PAD_L + 24}' cy='{ly - 4}' r='3.5' fill='{color}'/>"
                     f"<text x='{PAD_L + 32}' y='{ly}' font-size='10' fill='{color}'>{esc(arm)}: estimate "
                     f"(line, band shaded), realized (dot)</text>")
    waiting = sorted({p.as_of for p in drawn if p.realized is None and p.estimate is not None})
    base = HEIGHT - PAD_B - 4
    for moment in waiting:  # written upwards from the x-axis: windows sit closer together than the words
        parts.append(f"<text x='{x(moment) + 3:.1f}' y='{base}' transform='rotate(-90 {x(moment) + 3:.1f} {base})' "
                     f"font-size='9' fill='#66707a' class='no-labels'>no labels yet</text>")
    first, last = datetime.fromtimestamp(times[0], UTC), datetime.fromtimestamp(times[-1], UTC)
    parts.append(f"<text x='{PAD_L}' y='{HEIGHT - PAD_B + 16}' font-size='10' fill='#66707a'>{first:%Y-%m-%d %H:%M}"
                 f"</text><text x='{WIDTH - PAD_R}' y='{HEIGHT - PAD_B + 16}' font-size='10' text-anchor='end' "
                 f"fill='#66707a'>{last:%Y-%m-%d %H:%M}</text><text x='{(PAD_L + WIDTH - PAD_R) / 2:.1f}' "
                 f"y='{HEIGHT - PAD_B + 30}' font-size='10' text-anchor='middle' fill='#3c4650'>data time: each "
                 f"window's end (UTC)</text></svg>")
    return "".join(parts)


def _metric_key(metric: str) -> tuple[int, str]:
    return (METRIC_ORDER.index(metric) if metric in METRIC_ORDER else len(METRIC_ORDER), metric)


def performance_section(registry: Any, model: str) -> str:
    """Charts per metric, the newest windows as a table, and the windows the calibration check refused."""
    points = performance_points(registry, model)
    if not points:
        return f"<p class='muted' id='no-estimates'>{esc(NO_ESTIMATES)}</p>"
    charts = [estimate_chart(m, [p for p in points if p.metric == m])
              for m in sorted({p.metric for p in points}, key=_metric_key)]
    refused = sorted({(p.as_of, p.version, p.arm, p.reason) for p in points if p.status == "uncalibrated"})
    newest = sorted((p for p in points if p.status != "uncalibrated"),
                    key=lambda p: (-p.as_of.timestamp(), _metric_key(p.metric), p.arm))[:TABLE_ROWS]
    rows = [[when(p.as_of), esc(p.version), esc(p.arm), esc(p.metric), num(p.estimate),
             f"[{num(p.lower)}, {num(p.upper)}]" if p.lower is not None and p.upper is not None else "–",
             num(p.realized) if p.realized is not None else "<span class='muted'>no labels yet</span>",
             num(p.realized - p.estimate) if p.realized is not None and p.estimate is not None else "–",
             num(p.reference), num(p.rows), num(p.realized_rows) if p.realized_rows is not None else "–",
             when(p.computed_at)] for p in newest]
    out = ("<p class='muted'>Estimated without labels from the model's calibrated scores (CBPE), per serving "
           "window and arm, with a band; the realized value appears once the window's labels arrived. The "
           "reference is the metric on the version's labelled held-out rows.</p>"
           + "<div class='grid'>" + "".join(f"<div>{c}</div>" for c in charts if c) + "</div>"
           + table(["data time ↓", "version", "arm", "metric", "estimate", "band", "realized",
                    "realized − estimate", "reference", "rows", "labelled rows", "computed"], rows,
                   numeric=(4, 6, 7, 8, 9, 10), id_="performance-estimates", empty="no estimates yet"))
    if refused:
        out += ("<p id='not-estimated'>Not estimated (the scores failed the calibration check): "
                + "; ".join(f"{when(t)} {esc(v)} ({esc(a)}){': ' + esc(r) if r else ''}" for t, v, a, r in refused)
                + "</p>")
    return out
