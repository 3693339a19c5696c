"""The benchmarks' answer checks fail the run on a mismatch, and compare what they time (no timing here)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pyarrow as pa
import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _answers(values: dict[str, list[float | None]]) -> pa.Table:
    return pa.table({"label_id": pa.array(range(3), pa.int64()),
                     **{f: pa.array(v, pa.float64()) for f, v in values.items()}})


def _pit_answers() -> dict[str, pa.Table]:
    pit = _load("pit_join")
    good = {f: [1.0, None, 3.0] for f in pit.LV}
    windows = {f: [0.0, 1.0, 2.0] for f in pit.WIN}
    return {"quiver_all": _answers({**good, **windows}), "quiver_lv": _answers(good),
            "duckdb_asof": _answers(good), "feast": _answers(good)}


def test_pit_join_answers_that_agree_have_no_differences() -> None:
    pit = _load("pit_join")
    differences, facts = pit.answer_differences(_pit_answers())
    assert set(differences) >= {"quiver_lv_vs_quiver_all", "duckdb_asof_vs_quiver_lv", "feast_vs_quiver_lv",
                                "feast_returned_no_values"}
    assert not any(differences.values()) and facts["feast_non_null_values"] == 2 * len(pit.LV)


def test_pit_join_a_wrong_timed_answer_is_a_difference() -> None:
    """The timed quiver_lv differing from quiver_all used to be stored under a key that never failed the run."""
    pit = _load("pit_join")
    answers = _pit_answers()
    answers["quiver_lv"] = _answers({f: [1.0, None, 4.0] for f in pit.LV})
    differences, _ = pit.answer_differences(answers)
    assert differences["quiver_lv_vs_quiver_all"] == len(pit.LV)
    # Feast and the ASOF join are checked against the timed quiver_lv, so they differ from it too.
    assert differences["feast_vs_quiver_lv"] == len(pit.LV)
    assert differences["duckdb_asof_vs_quiver_lv"] == len(pit.LV)


def test_pit_join_feast_answers_that_are_all_null_fail() -> None:
    pit = _load("pit_join")
    answers = _pit_answers()
    nothing = _answers({f: [None, None, None] for f in pit.LV})
    answers.update(feast=nothing, quiver_lv=nothing, quiver_all=_answers(
        {**{f: [None, None, None] for f in pit.LV}, **{f: [0.0, 1.0, 2.0] for f in pit.WIN}}))
    differences, _ = pit.answer_differences(answers)
    assert differences["feast_returned_no_values"] == 1


def test_backfill_tiles_that_differ_exit_non_zero() -> None:
    backfill = _load("backfill")
    a = pa.table({"n_events": pa.array([1, 2]), "amount__sum": pa.array([1.0, 2.0])})
    assert backfill.compare(a, a)["events"] == 3
    with pytest.raises(SystemExit, match="amount__sum differs"):
        backfill.compare(a, pa.table({"n_events": pa.array([1, 2]), "amount__sum": pa.array([1.0, 2.5])}))
    with pytest.raises(SystemExit, match="1 tiles from duckdb, 2 from spark"):
        backfill.compare(a.slice(0, 1), a)


def test_online_read_reports_p99_only_from_enough_calls() -> None:
    online = _load("online_read")
    assert online.tail_name(100) == "p99" and online.tail_name(99) == "p90" and online.tail_name(10) == "p90"
    with pytest.raises(SystemExit):
        online.tail_name(9)
    few = online.percentiles([0.001] * 20)
    assert few["p99_us"] is None and few["p90_us"] == pytest.approx(1000.0)
    assert online.percentiles([0.001] * 100)["p99_us"] == pytest.approx(1000.0)
