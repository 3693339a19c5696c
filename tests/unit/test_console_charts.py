"""Console charts a person can read: round ticks, axes that name their unit, a note on an empty chart, floor
lines kept apart, drift charts with a y-axis and no tangle of lines, a guardrail table that says why the fail
line sits below the floor."""

from __future__ import annotations

import itertools
import math
import re
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from quiver.registry import rollouts
from quiver.registry.explain import Look
from quiver.registry.rollouts import Decision, Rollout
from quiver.ui.charts import guardrail_chart, series_chart
from quiver.ui.model_pages import decision_page

NOW = datetime(2026, 11, 10, tzinfo=UTC)
SVG = "{http://www.w3.org/2000/svg}"


def look(i: int, estimate: float | None, lower: float | None, upper: float | None, floor: float = 0.02,
         status: str = "wait") -> Look:
    return Look(i, NOW.isoformat(), 0, 0.05, "hold", status, estimate, lower, upper, floor, floor / 2)


def texts(svg: str) -> list[ET.Element]:
    return list(ET.fromstring(svg).iter(f"{SVG}text"))


def y_ticks(svg: str) -> list[float]:
    """The y-axis tick labels: right-aligned numbers left of the plot."""
    return [float((t.text or "").replace("−", "-")) for t in texts(svg)
            if t.get("text-anchor") == "end" and re.fullmatch(r"[−-]?[\d.]+", t.text or "")]


def axis_label(svg: str) -> str:
    """The y-axis label: the text turned upright at the chart's left edge."""
    return " ".join(t.text or "" for t in texts(svg) if (t.get("transform") or "").startswith("rotate(-90 14 "))


def is_round(ticks: list[float]) -> bool:
    """Evenly spaced by 1, 2, 2.5 or 5 × 10^k, each a multiple of that step."""
    steps = {round(b - a, 12) for a, b in itertools.pairwise(ticks)}
    if len(ticks) < 3 or len(steps) != 1:
        return False
    step = abs(steps.pop())
    mantissa = step / 10 ** math.floor(math.log10(step))
    return round(mantissa, 9) in (1.0, 2.0, 2.5, 5.0) and all(abs(t / step - round(t / step)) < 1e-6 for t in ticks)


def test_guardrail_ticks_are_round_numbers_even_for_tiny_differences() -> None:
    # Before: ticks at the range's ends and middle, e.g. 0.000203 and −7.86e-05.
    svg = guardrail_chart("error_rate", [look(1, 6e-5, -7.86e-05, 0.000203, floor=0.0002),
                                         look(2, 2e-5, -3e-05, 0.0001, floor=0.0002)])
    ticks = sorted(y_ticks(svg))
    assert is_round(ticks), ticks
    assert not any("e-" in (t.text or "") for t in texts(svg))


def test_the_latency_axis_names_its_unit() -> None:
    svg = guardrail_chart("latency_p99", [look(1, 0.001, -0.002, 0.004, floor=0.01)])
    assert "ms" in axis_label(svg) and "share of calls" in axis_label(svg)


def test_an_empty_quality_chart_says_no_labelled_rows_yet() -> None:
    svg = guardrail_chart("log_loss", [look(1, None, None, None), look(2, None, None, None)])
    shown = " ".join(t.text or "" for t in texts(svg))
    assert "no labelled rows yet" in shown


def test_floor_and_fail_lines_stay_apart_beside_a_wide_first_interval() -> None:
    # Before: a first look's interval of ±0.5 squeezed floor 0.02 and fail line 0.01 into one pixel.
    svg = guardrail_chart("log_loss", [look(1, 0.05, -0.5, 0.6), look(2, 0.001, -0.01, 0.012, status="pass")])
    lines = {(line.get("stroke-dasharray")): float(line.get("y1") or 0) for line in ET.fromstring(svg).iter(
        f"{SVG}line") if line.get("y1") == line.get("y2") and line.get("stroke-dasharray") in ("6,4", "2,3")}
    assert abs(lines["6,4"] - lines["2,3"]) >= 12, lines
    shown = " ".join(t.text or "" for t in texts(svg))
    assert "fails above 0.01 (½ × floor)" in shown


def test_the_drift_share_chart_has_a_y_axis() -> None:
    share = {"drift share": [(NOW + timedelta(days=i), v) for i, v in enumerate((0.1, 0.2, 0.65))]}
    svg = series_chart("m: drift share over data time", share, [(0.5, "dataset drift")])
    assert axis_label(svg) == "drift share"
    assert is_round(sorted(y_ticks(svg)))


def test_many_psi_lines_are_cut_to_the_top_ones_and_the_chart_says_which() -> None:
    psi = {f"feature_with_a_long_name_{i:02d}": [(NOW, 0.01 * i), (NOW + timedelta(days=1), 0.01 * i + 0.001)]
           for i in range(25)}
    svg = series_chart("m: PSI per feature over data time", psi, [(0.1, "warn 0.1"), (0.2, "alert 0.2")],
                       y_label="PSI", top=6)
    lines = list(ET.fromstring(svg).iter(f"{SVG}polyline"))
    assert len(lines) == 6
    shown = " ".join(t.text or "" for t in texts(svg))
    assert "6 of 25 features" in shown and "highest latest PSI" in shown
    assert "feature_with_a_long_name_24" in shown  # the highest, named in full
    assert "feature_with_a_long_name_18" not in shown
    assert axis_label(svg) == "PSI"


def guardrail(name: str, status: str, estimate: float | None, reason: str = "why", **more: Any) -> dict[str, Any]:
    stats = {"estimate": estimate, "lower": None if estimate is None else estimate - 0.01,
             "upper": None if estimate is None else estimate + 0.01, "floor": 0.01, "fail_above": 0.005,
             "test": "t", **more}
    return {"name": name, "status": status, "reason": reason, "statistics": stats}


def test_the_decision_page_explains_the_fail_line_names_units_and_notes_missing_labels(
        monkeypatch: pytest.MonkeyPatch) -> None:
    waiting = "0 canary / 0 champion labelled rows (0 paired), need 200"
    d = Decision(7, "m", 3, "canary_step", "hold", 0, 0.05, "m:1", "m:2",
                 {"reason": "waiting", "guardrails": [
                     guardrail("error_rate", "pass", 0.0001), guardrail("latency_p99", "wait", 0.002),
                     guardrail("log_loss", "wait", None, waiting)]}, "k" * 16, NOW, "judge")
    r = Rollout(3, "m", 1, 2, "salt", 0.05, 0, "running", {"steps": [0.05, 1.0]}, NOW, NOW, None, "op",
                reference={"latency_threshold_ms": 12.5})
    monkeypatch.setattr(rollouts, "get_decision", lambda registry, i: d)
    monkeypatch.setattr(rollouts, "list_decisions", lambda registry, *a, **k: [d])
    monkeypatch.setattr(rollouts, "get_rollout", lambda registry, i: r)
    console = SimpleNamespace(registry=None, config=SimpleNamespace(project="p"))
    html = decision_page(console, 7)  # type: ignore[arg-type]
    assert "fails above = ½ × floor" in html  # the table says why its fail line sits below the floor
    latency = re.search(r"<svg[^>]*data-guardrail='latency_p99'.*?</svg>", html, re.S)
    assert latency and "12.5 ms" in axis_label(latency.group(0))
    log_loss = re.search(r"<svg[^>]*data-guardrail='log_loss'.*?</svg>", html, re.S)
    assert log_loss and "no labelled rows yet" in log_loss.group(0) and "need 200" in log_loss.group(0)


def test_a_look_without_an_estimate_is_marked_where_its_bar_would_be() -> None:
    svg = guardrail_chart("brier", [look(1, None, None, None), look(2, 0.001, -0.004, 0.006, floor=0.01)])
    marks = [t for t in texts(svg) if t.text == "no labels"]
    assert len(marks) == 1 and marks[0].get("x") == "161.0"  # look 1 of 2: a quarter across the plot (158), nudged 3 px


def test_p_values_below_what_a_double_resolves_read_as_a_bound() -> None:
    from quiver.ui.html import pvalue

    assert [pvalue(v) for v in (2.6e-321, 0.0, 3.3e-9, 0.2627, None)] == ["&lt; 1e-16", "&lt; 1e-16", "3.3e-09",
                                                                          "0.2627", "–"]
