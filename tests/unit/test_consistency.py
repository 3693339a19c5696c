"""Online/offline consistency, the pure parts: value equality, per-feature counts, and how a differing row is
given its cause (arrays in, numbers out)."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from quiver.monitoring import consistency as cons
from quiver.monitoring.consistency import as_values, classify, equal, summarize
from quiver.monitoring.consistency_evidence import (
    LateFile,
    earlier_moments,
    last_materialization,
    unseen_late,
)

NAN = float("nan")


def test_floats_are_equal_within_the_relative_tolerance_and_nan_meets_nan() -> None:
    served = as_values(np.array([1.0, 1e6, 1e6, NAN, NAN, 0.0, 3.0, math.inf]))
    offline = as_values(np.array([1.0 + 1e-12, 1e6 * (1 + 1e-10), 1e6 * (1 + 1e-8), NAN, 2.0, 1e-13, NAN,
                                  math.inf]))
    assert equal(served, offline).tolist() == [True, True, False, True, False, True, False, True]


def test_nulls_are_missing_and_text_ints_bools_and_times_compare_exactly() -> None:
    assert equal(as_values(["a", None, "b", None]), as_values(["a", None, "c", "x"])).tolist() == \
        [True, True, False, False]
    ints = pa.array([5, None, 2**53, 7], pa.int64())
    assert equal(as_values(ints), as_values(pa.array([5, None, 2**53, 8], pa.int64()))).tolist() == \
        [True, True, True, False]
    assert equal(as_values(pa.array([True, False, None])), as_values(pa.array([True, True, None]))).tolist() == \
        [True, False, True]
    t = datetime(2026, 11, 3, 9, tzinfo=UTC)
    times = pa.array([t, None], pa.timestamp("us", tz="UTC"))
    assert equal(as_values(times), as_values(times)).tolist() == [True, True]
    # An int logged as a float (a NaN had made the flush float) equals the engine's int64.
    assert equal(as_values(pa.array([3.0, NAN])), as_values(pa.array([3, None], pa.int64()))).tolist() == \
        [True, True]
    # Text against numbers (a mixed flush logged "7"): compared as values, never equal to 7.0 by accident.
    assert equal(as_values(["7", "x"]), as_values(pa.array([7, 8], pa.int64()))).tolist() == [False, False]


def test_counts_split_into_mismatched_missing_online_and_missing_offline_with_smape() -> None:
    served = as_values(np.array([1.0, 2.0, 3.0, NAN, 5.0, NAN]))
    offline = as_values(np.array([1.0, 2.0, 4.0, 4.0, NAN, NAN]))
    same = equal(served, offline)
    codes = classify(same)
    f = summarize("v:x", served, offline, codes, threshold=0.01)
    assert (f.compared, f.equal, f.mismatched, f.missing_online, f.missing_offline) == (6, 3, 1, 1, 1)
    assert f.causes["unexplained"] == 3 and f.wrong == 3 and f.wrong_rate == pytest.approx(0.5)
    assert f.smape == pytest.approx(abs(3 - 4) / 3.5)  # over the one mismatched row only
    assert f.status == "alert"


def test_late_events_are_reported_but_never_counted_as_wrong() -> None:
    served = as_values(np.arange(1000, dtype=float))
    offline_values = np.arange(1000, dtype=float)
    offline_values[:3] += 1  # three rows differ
    offline = as_values(offline_values)
    late = np.zeros(1000, dtype=bool)
    late[:2] = True  # two of them explained by a late event
    codes = classify(equal(served, offline), late=late)
    f = summarize("v:x", served, offline, codes, threshold=0.001)
    assert f.late == 2 and f.wrong == 1 and f.causes["unexplained"] == 1
    assert f.wrong_rate == pytest.approx(0.001) and f.status == "ok"  # at the threshold, not over it
    worse = summarize("v:x", served, offline, classify(equal(served, offline)), threshold=0.001)
    assert worse.wrong == 3 and worse.status == "alert"


def test_causes_take_precedence_late_then_ttl_then_lag_then_gap() -> None:
    same = np.array([True, False, False, False, False, False])
    every = np.array([True, True, True, True, True, True])
    late = np.array([False, True, False, False, False, False])
    ttl = np.array([False, True, True, False, False, False])
    lag = np.array([False, True, True, True, False, False])
    gap = np.array([True, True, True, True, True, False])
    codes = classify(same, late=late, ttl=ttl, lag=lag, gap=gap & every)
    assert codes.tolist() == [cons.EQUAL, cons.LATE_EVENT, cons.TTL_BOUNDARY, cons.STREAM_LAG,
                              cons.MATERIALIZATION_GAP, cons.UNEXPLAINED]
    assert classify(same).tolist() == [cons.EQUAL] + [cons.UNEXPLAINED] * 5


def test_late_evidence_needs_an_unseen_event_and_the_value_known_at_the_request() -> None:
    served = as_values([10.0, 10.0, 10.0])
    known = as_values([10.0, 10.0, 12.0])  # recomputed with only the events arrived by the request
    unseen = np.array([True, False, True])
    assert cons.late_evidence(served, known, unseen).tolist() == [True, False, False]


def test_ttl_evidence_both_ways() -> None:
    # Row 0: serving had nothing, offline's value expires within the margin (gone with a shorter TTL).
    # Row 1: serving had nothing, offline's value is far from its TTL: not a TTL edge.
    # Row 2: serving kept a value offline had just expired; the longer TTL finds exactly it.
    # Row 3: serving kept a value offline expired, but another one than the longer TTL finds.
    served = as_values([None, None, 5.0, 5.0])
    offline = as_values([3.0, 3.0, None, None])
    shorter = as_values([None, 3.0, None, None])
    longer = as_values([3.0, 3.0, 5.0, 6.0])
    assert cons.ttl_evidence(served, offline, shorter, longer).tolist() == [True, False, True, False]


def test_lag_evidence_finds_the_served_value_at_any_earlier_moment() -> None:
    served = as_values([1.0, 2.0, 3.0, None])
    earlier = [as_values([1.0, 0.0, 0.0, 5.0]), as_values([0.0, 2.0, 0.0, None])]
    assert cons.lag_evidence(served, earlier).tolist() == [True, True, False, True]


def test_an_empty_view_is_every_feature_missing_or_a_count_at_zero() -> None:
    count = as_values(pa.array([0, 0, 3, 0], pa.int64()))
    mean = as_values([None, 1.0, None, None])
    last = as_values([None, None, None, "a"])
    assert cons.empty_rows([count, mean, last], [True, False, False]).tolist() == [True, False, False, False]
    with pytest.raises(ValueError):
        cons.empty_rows([], [])


def test_report_names_the_inconsistent_features_and_says_when_it_sampled() -> None:
    ok = summarize("v:a", as_values([1.0]), as_values([1.0]), np.array([cons.EQUAL], np.int8), 0.001)
    bad = summarize("v:b", as_values([1.0]), as_values([2.0]), np.array([cons.UNEXPLAINED], np.int8), 0.001)
    empty = summarize("v:c", as_values([]), as_values([]), np.zeros(0, np.int8), 0.001)
    report = cons.ConsistencyReport("model m", ("a", "b"), 10, 1, (ok, bad, empty))
    assert [f.feature for f in report.inconsistent] == ["v:b"] and report.sampled
    assert empty.status == "no_rows" and empty.smape is None
    as_dict = report.to_dict()
    assert as_dict["inconsistent"] == ["v:b"]
    assert as_dict["features"][1]["causes"] == {"late_event": 0, "ttl_boundary": 0, "stream_lag": 0,
                                               "materialization_gap": 0, "unexplained": 1}


def test_late_events_count_only_for_their_entity_before_the_request_and_arrived_after_it() -> None:
    t = np.array([100, 100, 100, 300])
    files = [LateFile(Path("a"), arrival_us=200, keys=[(1,), (2,)], event_us=np.array([50, 150])),
             LateFile(Path("b"), arrival_us=90, keys=[(3,)], event_us=np.array([60]))]
    # user 1: event 50 < 100, arrived 200 > 100 → unseen; user 2: dated after the request; user 3: arrived
    # before the request; the last row is after the arrival.
    got = unseen_late(files, [(1,), (2,), (3,), (1,)], t)
    assert got == [frozenset({0}), frozenset(), frozenset(), frozenset()]


def test_earlier_moments_are_the_lag_ladder_then_the_last_materialization() -> None:
    t = np.array([10_000_000_000, 20_000_000_000])
    moments = earlier_moments(t, max_lag_s=5, materialized_us=np.array([-1, 19_000_000_000]))
    assert [m.tolist() for m in moments] == [[t[0] - 1_000_000, t[1] - 1_000_000], [t[0] - 2_000_000,
                                             t[1] - 2_000_000], [t[0] - 5_000_000, t[1] - 5_000_000],
                                             [t[0], 19_000_000_000]]


def test_last_materialization_is_the_newest_succeeded_run_at_or_before_each_request() -> None:
    class Runs:
        def runs(self, view: str, kind: str) -> list[dict[str, object]]:
            return [{"status": "succeeded", "end_ts": datetime(1970, 1, 1, 0, 0, 10)},
                    {"status": "failed", "end_ts": datetime(1970, 1, 1, 0, 0, 15, tzinfo=UTC)},
                    {"status": "succeeded", "end_ts": datetime(1970, 1, 1, 0, 0, 20, tzinfo=UTC)}]

    got = last_materialization(Runs(), "v", np.array([5, 10, 17, 25]) * 1_000_000)
    assert got is not None and got.tolist() == [-1, 10_000_000, 10_000_000, 20_000_000]
    # The one before: what a request saw while the newest run was still writing.
    before = last_materialization(Runs(), "v", np.array([5, 10, 17, 25]) * 1_000_000, back=1)
    assert before is not None and before.tolist() == [-1, -1, -1, 10_000_000]


def test_both_last_materializations_are_earlier_moments() -> None:
    t = np.array([10_000_000_000, 20_000_000_000])
    newest, previous = np.array([-1, 19_000_000_000]), np.array([-1, 13_000_000_000])
    moments = earlier_moments(t, max_lag_s=0, materialized_us=[newest, previous])
    assert [m.tolist() for m in moments] == [[t[0], 19_000_000_000], [t[0], 13_000_000_000]]
    assert earlier_moments(t, max_lag_s=0, materialized_us=[np.array([-1, -1])]) == []  # none before


def test_lag_is_the_nearest_earlier_moment_served_and_its_quantiles_cover_equal_and_lagging_rows() -> None:
    import numpy as np

    from quiver.monitoring import consistency as cons

    served = cons.as_values([1.0, 2.0, 3.0, 4.0])
    t = np.full(4, 100_000_000, dtype=np.int64)  # every request at 100 s
    moments = [t - 5_000_000, t - 60_000_000]  # 5 s and 60 s before
    earlier = [cons.as_values([9.0, 2.0, 3.0, 9.0]), cons.as_values([1.0, 2.0, 9.0, 9.0])]
    lag = cons.lag_seconds(served, earlier, t, moments)
    assert lag[1] == 5.0 and lag[2] == 5.0 and lag[0] == 60.0 and np.isnan(lag[3])
    codes = np.array([cons.STREAM_LAG, cons.EQUAL, cons.STREAM_LAG, cons.UNEXPLAINED], dtype=np.int8)
    summary = cons.summarize("v:x", served, cons.as_values([0.0, 2.0, 0.0, 0.0]), codes, 0.001,
                             lag_s=lag, objective_s=30.0)
    assert summary.lag_p50_s == 5.0 and summary.lag_p99_s == pytest.approx(58.9)  # over 0 (equal), 5 and 60
    assert summary.wrong == 1 and summary.freshness_status == "over" and summary.status == "alert"
    plain = cons.summarize("v:x", served, cons.as_values([0.0, 2.0, 0.0, 0.0]), codes, 0.001, lag_s=lag)
    assert plain.wrong == 3 and plain.freshness_status is None  # no objective: lag stays wrong, as before
