"""Inline SVG charts for the console (no script, no external file): a guardrail's confidence sequence over
a rollout's looks against its floor (x: each look's data time, as the evaluation report reads), and drift
scores over data time.

Ticks come from matplotlib's `MaxNLocator` (steps of 1, 2, 2.5 or 5 × 10^k), so an axis reads 0, 0.0001,
0.0002 rather than −7.86e-05 … 0.000203; every y-axis names what it measures and in which unit."""

from __future__ import annotations

import math
import re
import textwrap
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from matplotlib.ticker import MaxNLocator

from quiver.registry.explain import LatencyCutoff, Look, milliseconds
from quiver.ui.html import esc

WIDTH, HEIGHT, PAD_L, PAD_R, PAD_T, PAD_B = 560, 250, 74, 150, 42, 40
STATUS_COLORS = {"pass": "#1b6e2a", "fail": "#b3261e", "wait": "#9a6700"}
QUALITY = ("log_loss", "brier")  # guardrails that need labels
TOP_LINES = 6  # more lines than this tangle: a chart keeps the highest and says which
X_LABEL_PX = 58  # the width of an x label ("11-09 06:00" at 9 px) and a gap
_LABELLED = re.compile(r"(\d+) canary / (\d+) champion labelled")


def axis_label(name: str, cutoff: LatencyCutoff | None = None) -> str:
    """What a guardrail's y-axis measures (canary − champion), with its unit; latency names the one recorded
    cut-off the page names too (the subtitle says whose)."""
    if name == "latency_p99":
        return f"Δ share of calls > {cutoff.value if cutoff is not None else 'the cut-off (ms)'}"
    return {"error_rate": "Δ share of calls failed", "score_shift": "score distance (W1, score units)",
            "log_loss": "Δ log loss (nats per row)", "brier": "Δ Brier score"}.get(name, f"Δ {name}")


def _ticks(low: float, high: float) -> list[float]:
    """Round ticks covering [low, high]; the axis then spans the first to the last tick."""
    if not (math.isfinite(low) and math.isfinite(high)):
        low, high = 0.0, 1.0
    if high - low < 1e-12 * max(1.0, abs(low)):
        half = abs(low) * 0.5 or 1.0
        low, high = low - half, high + half
    values = MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10]).tick_values(low, high)
    step = float(values[1] - values[0])
    return [round(float(v) / step) * step for v in values if low - step < v < high + step]


def _tick_texts(ticks: Sequence[float]) -> list[str]:
    """As few decimals as make every tick exact; a true minus sign."""
    step = abs(ticks[1] - ticks[0]) if len(ticks) > 1 else 1.0
    digits = next((d for d in range(12) if all(abs(round(t, d) - t) < step * 1e-6 for t in ticks)), 12)
    out = []
    for t in ticks:
        text = f"{t:.{digits}f}"
        out.append("0" if float(text) == 0 else text.replace("-", "−"))
    return out


def _y(value: float, low: float, high: float) -> float:
    return PAD_T + (HEIGHT - PAD_T - PAD_B) * (1 - (value - low) / (high - low))


def _x(index: int, count: int) -> float:
    inner = WIDTH - PAD_L - PAD_R
    return PAD_L + (inner * (index + 0.5) / max(count, 1))


def _frame(title: str, subtitle: str, label: str, ticks: Sequence[float], height: int, attrs: str) -> str:
    """The svg element, title, subtitle, y-axis (grid, tick labels, the rotated axis label)."""
    low, high = ticks[0], ticks[-1]
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{height}' role='img' {attrs}>",
             f"<text x='{PAD_L}' y='15' font-size='12' font-weight='600'>{esc(title)}</text>"]
    if subtitle:
        parts.append(f"<text x='{PAD_L}' y='30' font-size='10' fill='#66707a'>{esc(subtitle)}</text>")
    for tick, text in zip(ticks, _tick_texts(ticks), strict=True):
        y = _y(tick, low, high)
        parts.append(f"<line x1='{PAD_L}' x2='{WIDTH - PAD_R}' y1='{y:.1f}' y2='{y:.1f}' stroke='#eef1f4'/>"
                     f"<text x='{PAD_L - 6}' y='{y + 4:.1f}' font-size='10' text-anchor='end' fill='#66707a'>"
                     f"{text}</text>")
    mid = (PAD_T + HEIGHT - PAD_B) / 2
    parts.append(f"<line x1='{PAD_L}' x2='{PAD_L}' y1='{PAD_T}' y2='{HEIGHT - PAD_B}' stroke='#99a1aa'/>"
                 f"<text x='14' y='{mid:.1f}' transform='rotate(-90 14 {mid:.1f})' font-size='10' "
                 f"text-anchor='middle' fill='#3c4650'>{esc(label)}</text>")
    return "".join(parts)


def _hlines(levels: Sequence[tuple[float, str, str, str]], low: float, high: float) -> str:
    """Horizontal lines (value, colour, dash, label), labels at the right edge, nudged apart so close levels
    stay readable."""
    placed: list[float] = []
    parts = []
    for value, color, dash, label in sorted(levels, key=lambda level: -level[0]):
        y = _y(value, low, high)
        text_y = y + 4
        if placed and text_y - placed[-1] < 12:
            text_y = placed[-1] + 12
        placed.append(text_y)
        parts.append(f"<line x1='{PAD_L}' x2='{WIDTH - PAD_R}' y1='{y:.1f}' y2='{y:.1f}' stroke='{color}' "
                     f"stroke-dasharray='{dash}' stroke-width='1.2'/>")
        if label:
            parts.append(f"<text x='{WIDTH - PAD_R + 6}' y='{text_y:.1f}' font-size='10' fill='{color}'>"
                         f"{esc(label)}</text>")
    return "".join(parts)


def _note(lines: Sequence[str]) -> str:
    """Text in the middle of an empty plot area."""
    mid_x, mid_y = (PAD_L + WIDTH - PAD_R) / 2, PAD_T + 28  # above the middle, where the zero line runs
    return "".join(f"<text x='{mid_x:.1f}' y='{mid_y + 14 * i:.1f}' font-size='{12 if i == 0 else 10}' "
                   f"text-anchor='middle' fill='#66707a'>{esc(line)}</text>" for i, line in enumerate(lines))


def empty_note(name: str, reason: str = "") -> list[str]:
    """Why a guardrail has no estimate yet, in lines: the headline, then the judge's reason."""
    counts = _LABELLED.search(reason)
    if name in QUALITY and (not reason or (counts and min(int(counts[1]), int(counts[2])) == 0)):
        head = "no labelled rows yet"
    elif name in QUALITY and counts:
        head = "too few labelled rows yet"
    else:
        head = "no estimate yet"
    return [head, *textwrap.wrap(reason, 56)]


def _fail_label(fail: float, floor: float | None) -> str:
    if floor:
        ratio = fail / floor
        share = "½" if math.isclose(ratio, 0.5) else f"{ratio:.2g}"
        return f"fails above {fail:.3g} ({share} × floor)"
    return f"fails above {fail:.3g}"


def _look_labels(looks: Sequence[Look]) -> tuple[list[str], int]:
    """Each look's x label (its data time, else its decision) and the stride that keeps labels apart."""
    texts = [f"{look.data_time:%m-%d %H:%M}" if look.data_time is not None else f"#{look.decision_id}"
             for look in looks]
    room = (WIDTH - PAD_L - PAD_R) / max(len(looks), 1)
    return texts, max(1, math.ceil(X_LABEL_PX / room))


def guardrail_chart(name: str, looks: Sequence[Look], what: str = "canary − champion",
                    kind: str = "canary_step", *, cutoff: LatencyCutoff | None = None, reason: str = "") -> str:
    """One guardrail over a rollout's looks: estimate (dot, coloured by verdict) and confidence sequence
    (bar), the floor (dashed: pass when the whole bar is below it) and the fail line (dotted: fail when the
    whole bar is above it). `reason`: the judge's latest word, shown when no look has an estimate yet; the
    x-axis: each look's data time (every few looks' when they crowd).

    The y-range follows the estimates and the floor lines; a bar far wider than that (an early look) is cut
    at the edge (an arrowhead marks the cut) so the floor lines stay apart."""
    floor = next((look.floor for look in reversed(looks) if look.floor is not None), None)
    fail = next((look.fail_above for look in reversed(looks) if look.fail_above is not None), None)
    core = [v for v in (floor, fail, 0.0) if v is not None] + [look.estimate for look in looks
                                                               if look.estimate is not None]
    lo, hi = min(core), max(core)
    margin = 0.5 * (hi - lo) if hi > lo else abs(hi) or 1.0
    ends = [v for look in looks for v in (look.lower, look.upper) if v is not None]
    ticks = _ticks(max(lo - margin, min([*ends, lo])), min(hi + margin, max([*ends, hi])))
    low, high = ticks[0], ticks[-1]
    attrs = (f"aria-label='{esc(name)} confidence sequence over looks' class='cs-chart' data-guardrail='{esc(name)}' "
             f"data-kind='{esc(kind)}'")
    subtitle = "dot: estimate · bar: confidence sequence"
    if name == "latency_p99" and cutoff is not None:
        subtitle = f"cut-off {cutoff.value}: " + ("the rollout's reference" if cutoff.decision_id is None else
                                                  f"as decision #{cutoff.decision_id} recorded it") + " · " + subtitle
    parts = [_frame(f"{name}: {what} per look", subtitle, axis_label(name, cutoff), ticks, HEIGHT, attrs)]
    levels = [(0.0, "#99a1aa", "2,0", "")]
    if floor is not None:
        levels.append((floor, "#b3261e", "6,4", f"floor {floor:.3g}"))
    if fail is not None:
        levels.append((fail, "#b3261e", "2,3", _fail_label(fail, floor)))
    parts.append(_hlines(levels, low, high))
    empty = not any(look.estimate is not None for look in looks)
    if empty:
        parts.append(_note(empty_note(name, reason)))
    labels, stride = _look_labels(looks)
    for i, look in enumerate(looks):
        x = _x(i, len(looks))
        color = STATUS_COLORS.get(look.status, "#66707a")
        own_cutoff = f"; its cut-off {milliseconds(look.threshold_ms)}" if look.threshold_ms is not None else ""
        if look.estimate is None and not empty:  # a gap among drawn looks: say it is missing, not zero
            # written upwards from the x-axis: looks sit closer together than the words are wide
            base = HEIGHT - PAD_B - 4
            parts.append(f"<text x='{x + 3:.1f}' y='{base}' transform='rotate(-90 {x + 3:.1f} {base})' font-size='9' "
                         f"fill='#66707a'>{'no labels' if name in QUALITY else 'no estimate'}</text>")
        if look.lower is not None and look.upper is not None:
            bottom, top = max(look.lower, low), min(look.upper, high)
            parts.append(f"<line x1='{x:.1f}' x2='{x:.1f}' y1='{_y(bottom, low, high):.1f}' "
                         f"y2='{_y(top, low, high):.1f}' stroke='{color}' stroke-width='3' "
                         f"stroke-linecap='round'><title>decision #{look.decision_id} ({labels[i]}): "
                         f"[{look.lower:.4g}, {look.upper:.4g}]{own_cutoff}</title></line>")
            for cut, edge, sign in ((look.upper > high, high, -1), (look.lower < low, low, 1)):
                if cut:
                    y = _y(edge, low, high)
                    parts.append(f"<polygon points='{x - 5:.1f},{y + 7 * sign:.1f} {x + 5:.1f},{y + 7 * sign:.1f} "
                                 f"{x:.1f},{y:.1f}' fill='{color}'/>")
        if look.estimate is not None and low <= look.estimate <= high:
            parts.append(f"<circle cx='{x:.1f}' cy='{_y(look.estimate, low, high):.1f}' r='4' fill='{color}'>"
                         f"<title>decision #{look.decision_id} ({look.status}): estimate {look.estimate:.4g}"
                         f"</title></circle>")
        if i % stride == 0:  # a time under every look while they fit, else under every `stride`-th
            parts.append(f"<text x='{x:.1f}' y='{HEIGHT - PAD_B + 13}' font-size='9' text-anchor='middle' "
                         f"class='x-tick'>{esc(labels[i])}</text>")
            if stride == 1:
                parts.append(f"<text x='{x:.1f}' y='{HEIGHT - PAD_B + 24}' font-size='9' text-anchor='middle' "
                             f"fill='#66707a'>{esc(look.status)}</text>")
    parts.append(f"<text x='{(PAD_L + WIDTH - PAD_R) / 2:.1f}' y='{HEIGHT - 4}' font-size='10' "
                 f"text-anchor='middle' fill='#3c4650'>data time of each look (UTC)</text></svg>")
    return "".join(parts)


def _latest(values: Sequence[tuple[datetime, float]]) -> float:
    kept = sorted((t, v) for t, v in values if math.isfinite(v))
    return kept[-1][1] if kept else -math.inf


def series_chart(title: str, series: Mapping[str, Sequence[tuple[datetime, float]]],
                 levels: Sequence[tuple[float, str]] = (), *, y_label: str | None = None,
                 top: int = TOP_LINES) -> str:
    """Lines over data time (x: the data window's end, not when the check ran), with horizontal levels and a
    legend below. `y_label` (default: the lone series' name) names the y-axis; of more than `top` series (one
    per feature), the `top` with the highest latest value are drawn and the subtitle says so."""
    label = y_label if y_label is not None else (next(iter(series)) if len(series) == 1 else "value")
    subtitle = ""
    if len(series) > top:
        kept = sorted(series, key=lambda n: (-_latest(series[n]), n))[:top]
        subtitle = f"the {top} of {len(series)} features with the highest latest {label}; the table lists every one"
        series = {n: series[n] for n in kept}
    points = [(t, v) for values in series.values() for t, v in values if math.isfinite(v)]
    if not points:
        return "<p class='muted'>no values to draw</p>"
    times = [t.timestamp() for t, _ in points]
    t0, t1 = min(times), max(times)
    if t1 <= t0:
        t0, t1 = t0 - 3600, t1 + 3600
    ticks = _ticks(min(0.0, *(v for _, v in points)), max([v for _, v in points] + [lv for lv, _ in levels]))
    low, high = ticks[0], ticks[-1]

    def x(t: datetime) -> float:
        return PAD_L + (WIDTH - PAD_L - PAD_R) * (t.timestamp() - t0) / (t1 - t0)

    palette = ("#0b57d0", "#e8710a", "#1b6e2a", "#8430ce", "#b3261e", "#00838f", "#5f6368", "#c2185b")
    names = sorted(series, key=lambda n: (-_latest(series[n]), n))
    rows = -(-len(names) // 2) if len(names) > 1 else 0
    height = HEIGHT + 14 * rows
    parts = [_frame(title, subtitle, label, ticks, height, f"aria-label='{esc(title)}'")]
    parts.append(_hlines([(level, "#9a6700" if "warn" in text else "#b3261e", "6,4", text)
                          for level, text in levels], low, high))
    for i, name in enumerate(names):
        color = palette[i % len(palette)]
        kept_points = sorted((t, v) for t, v in series[name] if math.isfinite(v))
        path = " ".join(f"{x(t):.1f},{_y(v, low, high):.1f}" for t, v in kept_points)
        parts.append(f"<polyline points='{path}' fill='none' stroke='{color}' stroke-width='1.5'/>")
        parts += [f"<circle cx='{x(t):.1f}' cy='{_y(v, low, high):.1f}' r='3' fill='{color}'><title>{esc(name)} "
                  f"{t:%Y-%m-%d %H:%M}: {v:.4g}</title></circle>" for t, v in kept_points]
        if rows:
            lx, ly = PAD_L + (i % 2) * (WIDTH - PAD_L) / 2, HEIGHT + 4 + 14 * (i // 2)
            parts.append(f"<line x1='{lx:.1f}' x2='{lx + 14:.1f}' y1='{ly - 4:.1f}' y2='{ly - 4:.1f}' stroke='{color}' "
                         f"stroke-width='2'/><text x='{lx + 18:.1f}' y='{ly:.1f}' font-size='10' fill='{color}'>"
                         f"{esc(name)}</text>")
    first, last = datetime.fromtimestamp(t0, UTC), datetime.fromtimestamp(t1, UTC)
    parts.append(f"<text x='{PAD_L}' y='{HEIGHT - PAD_B + 16}' font-size='10' fill='#66707a'>{first:%Y-%m-%d %H:%M}"
                 f"</text><text x='{WIDTH - PAD_R}' y='{HEIGHT - PAD_B + 16}' font-size='10' text-anchor='end' "
                 f"fill='#66707a'>{last:%Y-%m-%d %H:%M}</text><text x='{(PAD_L + WIDTH - PAD_R) / 2:.1f}' "
                 f"y='{HEIGHT - PAD_B + 30}' font-size='10' text-anchor='middle' fill='#3c4650'>data time (UTC)</text>"
                 "</svg>")
    return "".join(parts)
