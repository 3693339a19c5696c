"""`make bench-quick`'s table: figures read from results, judged against goals and a recorded baseline.

The logic only, on made-up results: no timing is asserted here. A planted regression (the drift ratio after
a sleep in the drift path: the same Evidently time over a slower Quiver) must be flagged, a figure inside its
noise band must not, and a failed benchmark must make the run fail.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _table() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_table", BENCHMARKS / "_table.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


table = _table()
DRIFT = next(r for r in table.ROWS if r.bench == "drift")
LV_FLOOR = next(r for r in table.ROWS if r.path == "ratio_quiver_lv_over_read_floor")


def _baseline(**figures: tuple[float, float]) -> dict:
    return {"recorded": "2026-12-07", "commit": "abc1234", "machine": {"label": "test", **table.machine_facts()},
            "figures": {key: {"median": m, "band": b, "runs": [m]} for key, (m, b) in figures.items()}}


def test_figures_are_read_by_dotted_path() -> None:
    results = {"ratio": 9.5, "ratios": {"4_connections": {"rps_vs_floor": 0.71}}, "flag": True}
    assert table.figure(results, "ratio") == 9.5
    assert table.figure(results, "ratios.4_connections.rps_vs_floor") == 0.71
    assert table.figure(results, "ratios.8_connections.rps_vs_floor") is None
    assert table.figure(results, "flag") is None  # a boolean is no figure


def test_a_planted_slowdown_in_the_drift_path_is_flagged() -> None:
    baseline = _baseline(**{DRIFT.key: (10.2, 0.05)})
    # A sleep of a third of Quiver's time in the drift path: Evidently's time over 1.33x Quiver's.
    slowed = 10.2 / 1.33
    verdict = table.judge(DRIFT, slowed, baseline)
    assert verdict.regressed and verdict.met is False
    assert verdict.change(DRIFT.higher_is_better) == pytest.approx(1 / 1.33 - 1)
    text, wrong = table.render([DRIFT], {DRIFT.key: [slowed]}, baseline, {})
    assert wrong and "REGRESSED" in text


def test_a_figure_inside_its_band_is_not_flagged_and_lower_is_better_is_respected() -> None:
    baseline = _baseline(**{DRIFT.key: (10.2, 0.08), LV_FLOOR.key: (1.2, 0.05)})
    assert not table.judge(DRIFT, 10.2 * 0.93, baseline).regressed  # 7 % worse, band 8 %
    assert table.judge(DRIFT, 10.2 * 0.91, baseline).regressed
    # For a time over its floor, higher is worse.
    assert table.judge(LV_FLOOR, 1.3, baseline).regressed
    assert not table.judge(LV_FLOOR, 0.9, baseline).regressed
    assert table.judge(LV_FLOOR, 0.9, baseline).change(False) == pytest.approx(0.25)
    text, wrong = table.render([DRIFT, LV_FLOOR], {DRIFT.key: [10.0], LV_FLOOR.key: [1.21]}, baseline, {})
    assert not wrong and "REGRESSED" not in text


def test_a_failed_benchmark_or_a_missing_figure_fails_the_table_and_no_baseline_judges_goals_only() -> None:
    text, wrong = table.render([DRIFT], {DRIFT.key: []}, None, {"drift": "exit 1 (answers differ)"})
    assert wrong and "FAILED: exit 1 (answers differ)" in text
    verdict = table.judge(DRIFT, 12.0, None)
    assert verdict.met and not verdict.regressed and verdict.base is None
    # A benchmark that ran but no longer writes the figure the table reads: the table is out of date.
    text, wrong = table.render([DRIFT], {DRIFT.key: []}, None, {})
    assert wrong and "NO FIGURE" in text


def test_the_noise_band_is_the_widest_run_from_the_median_never_below_the_floor() -> None:
    assert table.noise_band([10.0, 10.1, 9.9, 10.0, 10.05]) == table.MIN_BAND
    assert table.noise_band([10.0, 11.0, 9.0, 10.0, 10.2]) == pytest.approx(0.1)


def test_the_committed_baseline_names_its_machine_and_covers_every_row() -> None:
    baseline = json.loads((BENCHMARKS / "baseline.json").read_text())
    assert baseline["machine"]["cpu"] and baseline["machine"]["cores"]
    for row in table.ROWS:
        entry = baseline["figures"][row.key]
        assert entry["band"] >= table.MIN_BAND and len(entry["runs"]) >= 5, row.key
