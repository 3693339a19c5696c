"""Pure parts of the closed loop: run windows, Asset event payloads, the retrain plan, serving-log alignment."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pyarrow as pa
import pytest

from quiver.pipelines.loop import drift_event_extra, event_extras
from quiver.pipelines.loop_common import drift_asset_uri, run_window, utc
from quiver.pipelines.loop_drift import SCORE, align_current, window_label
from quiver.pipelines.loop_retrain import plan_retrain
from quiver.pipelines.scheduled import _flagged_rows

D = datetime(2026, 11, 10, tzinfo=UTC)


def test_run_window_uses_the_data_interval_when_it_is_not_empty() -> None:
    assert run_window(D - timedelta(days=1), D) == (D - timedelta(days=1), D)


def test_run_window_of_an_empty_interval_spans_days_back_from_its_end() -> None:
    # Airflow 3 manual and asset runs: start == end.
    assert run_window(D, D, days=2) == (D - timedelta(days=2), D)


def test_run_window_prefers_the_latest_window_end_of_triggering_events() -> None:
    events = [{"window_end": "2026-11-08T00:00:00+00:00"}, {"window_end": "2026-11-09T00:00:00+00:00"}, {}]
    start, end = run_window(D, D + timedelta(days=3), events=events)
    assert (start, end) == (D - timedelta(days=2), D - timedelta(days=1))


def test_utc_treats_naive_as_utc_and_converts_offsets() -> None:
    assert utc(datetime(2026, 11, 1, 5)) == datetime(2026, 11, 1, 5, tzinfo=UTC)
    assert utc("2026-11-01T07:00:00+02:00") == datetime(2026, 11, 1, 5, tzinfo=UTC)


def test_event_extras_reads_objects_and_mappings_and_skips_empty_extras() -> None:
    events = {"a": [SimpleNamespace(extra={"x": 1}), SimpleNamespace(extra={})], "b": [{"extra": {"y": 2}}]}
    assert event_extras(events) == [{"x": 1}, {"y": 2}]
    assert event_extras(None) == []


def test_drift_event_carries_the_run_id_and_the_window() -> None:
    extra = drift_event_extra({"run_id": 7, "model": "m", "champion": "m:1", "window_start": "s",
                               "window_end": "e", "drift_share": 0.5, "drifted": ["a"], "rows": 10,
                               "trigger": "persistent_drift", "reason": "drift held 2 day(s) ≥ 2"})
    assert extra == {"drift_run_id": 7, "model": "m", "champion": "m:1", "window_start": "s", "window_end": "e",
                     "drift_share": 0.5, "drifted": ["a"], "trigger": "persistent_drift",
                     "reason": "drift held 2 day(s) ≥ 2"}  # why the retrain was called for
    assert drift_asset_uri("fraud_model") == "quiver://drift/fraud_model"


def test_retrain_window_ends_where_the_latest_drift_was_seen() -> None:
    events = [{"drift_run_id": 3, "window_end": "2026-11-08T00:00:00+00:00"},
              {"drift_run_id": 4, "window_end": "2026-11-09T00:00:00+00:00"}]
    plan = plan_retrain("m", 3, D + timedelta(days=5), events)
    assert plan == {"model": "m", "trigger": "drift", "cutoff": "2026-11-09T00:00:00+00:00",
                    "window_start": "2026-11-06T00:00:00+00:00", "window": "3d", "drift_run_id": 4}


def test_retrain_calendar_run_ends_at_its_interval_and_conf_overrides_everything() -> None:
    assert plan_retrain("m", 7, D)["trigger"] == "schedule"
    assert plan_retrain("m", 7, D)["window_start"] == "2026-11-03T00:00:00+00:00"
    manual = plan_retrain("m", 7, D, [{"drift_run_id": 1, "window_end": "2026-11-01T00:00:00+00:00"}],
                          {"cutoff": "2026-11-05", "window_days": 2})
    assert (manual["trigger"], manual["cutoff"], manual["window"]) == ("manual", "2026-11-05T00:00:00+00:00", "2d")
    with pytest.raises(ValueError, match="needs a drift event"):
        plan_retrain("m", 7, None)


def test_align_current_maps_view_qualified_names_and_prediction_to_score() -> None:
    logged = pa.table({"ts": [1, 2], "prediction": [0.1, 0.9], "key.user_id": [1, 2],
                       "feature.user_spend:amount_mean_24h": [5.0, 6.0], "feature.risk_score": [0.2, 0.3]})
    aligned = align_current(logged, ["amount_mean_24h", "risk_score", "missing_feature"])
    assert aligned.column_names == ["amount_mean_24h", "risk_score", SCORE]
    assert aligned[SCORE].to_pylist() == [0.1, 0.9]
    assert aligned["amount_mean_24h"].to_pylist() == [5.0, 6.0]


def test_window_label_names_the_serving_log_window() -> None:
    assert window_label(D - timedelta(days=1), D) == \
        "serving_logs[2026-11-09T00:00:00+00:00,2026-11-10T00:00:00+00:00)"


def test_flagged_rows_sums_unexpected_counts_and_spots_table_level_failures() -> None:
    validation = {"results": [
        {"success": True, "result": {"unexpected_count": 0}},
        {"success": False, "result": {"unexpected_count": 3}},
        {"success": False, "result": {"unexpected_count": 2}},
    ]}
    assert _flagged_rows(validation) == (5, False)
    validation["results"].append({"success": False, "result": {"observed_value": "int64"}})
    assert _flagged_rows(validation) == (5, True)


def test_canary_judge_overrides_are_typed_and_checked() -> None:
    from quiver.catalog.errors import QuiverError
    from quiver.pipelines.loop_rollout import judge_overrides

    assert judge_overrides("log_loss_floor=0.05, min_rows=200,require_labels=false") == \
        {"log_loss_floor": 0.05, "min_rows": 200, "require_labels": False}
    assert judge_overrides("") == {}
    with pytest.raises(QuiverError, match="loop_canary_judge: 'no_such=1'"):
        judge_overrides("no_such=1")
    with pytest.raises(QuiverError, match="not name=value"):
        judge_overrides("steps=0.5")  # steps have their own key, loop_canary_steps
