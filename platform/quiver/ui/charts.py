"""Inline SVG charts for the console (no script, no external file): a guardrail's confidence sequence over
a rollout's looks against its floor, and drift scores over data time."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from quiver.registry.explain import Look
from quiver.ui.html import esc

WIDTH, HEIGHT, PAD_L, PAD_R, PAD_T, PAD_B = 560, 190, 62, 120, 24, 34
STATUS_COLORS = {"pass": "#1b6e2a", "fail": "#b3261e", "wait": "#9a6700"}


def _scale(low: float, high: float) -> tuple[float, float]:
    if not (math.isfinite(low) and math.isfinite(high)) or high <= low:
        return (low - 1.0, low + 1.0) if math.isfinite(low) else (0.0, 1.0)
    pad = (high - low) * 0.08
    return low - pad, high + pad


def _y(value: float, low: float, high: float) -> float:
    return PAD_T + (HEIGHT - PAD_T - PAD_B) * (1 - (value - low) / (high - low))


def _x(index: int, count: int) -> float:
    inner = WIDTH - PAD_L - PAD_R
    return PAD_L + (inner * (index + 0.5) / max(count, 1))


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
                     f"stroke-dasharray='{dash}' stroke-width='1.2'/><text x='{WIDTH - PAD_R + 6}' "
                     f"y='{text_y:.1f}' font-size='11' fill='{color}'>{esc(label)}</text>")
    return "".join(parts)


def guardrail_chart(name: str, looks: Sequence[Look], what: str = "canary − champion",
                    kind: str = "canary_step") -> str:
    """One guardrail over a rollout's looks: estimate (dot, coloured by verdict) and confidence sequence
    (bar), the floor (dashed: pass when the whole bar is below it) and the fail line (dotted: fail when the
    whole bar is above it)."""
    values = [v for look in looks for v in (look.lower, look.upper, look.estimate) if v is not None]
    floor = next((look.floor for look in reversed(looks) if look.floor is not None), None)
    fail = next((look.fail_above for look in reversed(looks) if look.fail_above is not None), None)
    values += [v for v in (floor, fail, 0.0) if v is not None]
    low, high = _scale(min(values, default=0.0), max(values, default=1.0))
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{HEIGHT}' role='img' "
             f"aria-label='{esc(name)} confidence sequence over looks' class='cs-chart' data-guardrail='{esc(name)}' "
             f"data-kind='{esc(kind)}'>",
             f"<text x='{PAD_L}' y='15' font-size='12' font-weight='600'>{esc(name)}: {esc(what)} per look"
             f"</text>"]
    for tick in (low, (low + high) / 2, high):
        parts.append(f"<text x='{PAD_L - 6}' y='{_y(tick, low, high) + 4:.1f}' font-size='10' text-anchor='end' "
                     f"fill='#66707a'>{tick:.3g}</text>")
    levels = [(0.0, "#99a1aa", "2,0", "0")]
    if floor is not None:
        levels.append((floor, "#b3261e", "6,4", f"floor {floor:.3g}"))
    if fail is not None:
        levels.append((fail, "#b3261e", "2,3", f"fails above {fail:.3g}"))
    parts.append(_hlines(levels, low, high))
    for i, look in enumerate(looks):
        x = _x(i, len(looks))
        color = STATUS_COLORS.get(look.status, "#66707a")
        if look.lower is not None and look.upper is not None:
            parts.append(f"<line x1='{x:.1f}' x2='{x:.1f}' y1='{_y(look.lower, low, high):.1f}' "
                         f"y2='{_y(look.upper, low, high):.1f}' stroke='{color}' stroke-width='3' "
                         f"stroke-linecap='round'><title>decision #{look.decision_id}: [{look.lower:.4g}, "
                         f"{look.upper:.4g}]</title></line>")
        if look.estimate is not None:
            parts.append(f"<circle cx='{x:.1f}' cy='{_y(look.estimate, low, high):.1f}' r='4' fill='{color}'>"
                         f"<title>decision #{look.decision_id} ({look.status}): estimate {look.estimate:.4g}"
                         f"</title></circle>")
        parts.append(f"<text x='{x:.1f}' y='{HEIGHT - PAD_B + 14}' font-size='10' text-anchor='middle'>"
                     f"#{look.decision_id}</text><text x='{x:.1f}' y='{HEIGHT - PAD_B + 26}' font-size='9' "
                     f"text-anchor='middle' fill='#66707a'>{esc(look.status)}</text>")
    parts.append("</svg>")
    return "".join(parts)


def series_chart(title: str, series: Mapping[str, Sequence[tuple[datetime, float]]],
                 levels: Sequence[tuple[float, str]] = ()) -> str:
    """Lines over data time (x: the data window's end, not when the check ran), with horizontal levels."""
    points = [(t, v) for values in series.values() for t, v in values if math.isfinite(v)]
    if not points:
        return "<p class='muted'>no values to draw</p>"
    times = [t.timestamp() for t, _ in points]
    t0, t1 = min(times), max(times)
    if t1 <= t0:
        t0, t1 = t0 - 3600, t1 + 3600
    low, high = _scale(min(0.0, *(v for _, v in points)), max([v for _, v in points] + [lv for lv, _ in levels]))

    def x(t: datetime) -> float:
        return PAD_L + (WIDTH - PAD_L - PAD_R) * (t.timestamp() - t0) / (t1 - t0)

    palette = ("#0b57d0", "#e8710a", "#1b6e2a", "#8430ce", "#b3261e", "#00838f", "#5f6368", "#c2185b")
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{HEIGHT}' role='img' "
             f"aria-label='{esc(title)}'><text x='{PAD_L}' y='15' font-size='12' font-weight='600'>{esc(title)}"
             f"</text>"]
    parts.append(_hlines([(level, "#9a6700" if "warn" in label else "#b3261e", "6,4", label)
                          for level, label in levels], low, high))
    for i, (name, values) in enumerate(sorted(series.items())):
        color = palette[i % len(palette)]
        kept = sorted((t, v) for t, v in values if math.isfinite(v))
        path = " ".join(f"{x(t):.1f},{_y(v, low, high):.1f}" for t, v in kept)
        parts.append(f"<polyline points='{path}' fill='none' stroke='{color}' stroke-width='1.5'/>")
        parts += [f"<circle cx='{x(t):.1f}' cy='{_y(v, low, high):.1f}' r='3' fill='{color}'><title>{esc(name)} "
                  f"{t:%Y-%m-%d %H:%M}: {v:.4g}</title></circle>" for t, v in kept]
        if i < 8:
            parts.append(f"<text x='{WIDTH - PAD_R + 6}' y='{PAD_T + 12 * i + 30}' font-size='10' fill='{color}'>"
                         f"{esc(name[:18])}</text>")
    first, last = datetime.fromtimestamp(t0, UTC), datetime.fromtimestamp(t1, UTC)
    parts.append(f"<text x='{PAD_L}' y='{HEIGHT - 8}' font-size='10' fill='#66707a'>{first:%Y-%m-%d %H:%M}</text>"
                 f"<text x='{WIDTH - PAD_R}' y='{HEIGHT - 8}' font-size='10' text-anchor='end' fill='#66707a'>"
                 f"{last:%Y-%m-%d %H:%M} (data time, UTC)</text></svg>")
    return "".join(parts)
