"""The embedded engine's kernels against plain loops: timelines, range merges (every path), entity codes."""

from __future__ import annotations

import math
import time

import numpy as np
import pyarrow as pa
import pytest

from quiver.offline import pit_ranges
from quiver.offline.pit_numpy import EntityIndex
from quiver.offline.pit_ranges import Timeline, last_positions, range_merge, resolve_ties


def _naive_search(codes: np.ndarray, times: np.ndarray, qc: int, qt: int) -> int:
    pairs = sorted(zip(codes.tolist(), times.tolist(), strict=True))
    return sum(1 for p in pairs if p < (qc, qt))


@pytest.mark.parametrize("wide", [False, True])
def test_timeline_search_matches_a_sorted_list(monkeypatch: pytest.MonkeyPatch, wide: bool) -> None:
    if wide:  # force the two-column sort and the segmented binary search
        monkeypatch.setattr(pit_ranges, "_FITS", 1)
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 5, 200)
    times = rng.integers(-50, 50, 200) * 7
    line = Timeline(codes.copy(), times, 6)
    q_codes = np.repeat(np.arange(-1, 7), 30)
    q_times = np.tile(np.arange(-400, 400, 27), 8)[: len(q_codes)]
    got = line.search(q_codes, q_times)
    expected = [0 if c < 0 else _naive_search(codes, times, c, t) for c, t in zip(q_codes, q_times, strict=True)]
    assert got.tolist() == expected
    assert sorted(zip(line.codes.tolist(), line.times.tolist(), strict=True)) == \
        list(zip(line.codes.tolist(), line.times.tolist(), strict=True))
    assert (codes[line.rows] == line.codes).all() and (times[line.rows] == line.times).all()
    pos = np.arange(0, 200, 17)
    assert (line.rows_at(pos) == line.rows[pos]).all()
    assert (line.codes_at(pos) == line.codes[pos]).all() and (line.times_at(pos) == line.times[pos]).all()


def test_timeline_keeps_table_rows_and_filters() -> None:
    rows = np.array([10, 11, 12, 13])
    line = Timeline(np.array([1, 0, 1, 0]), np.array([5, 5, 3, 9]), 2, rows)
    assert line.rows.tolist() == [11, 13, 12, 10]
    assert not line.identity
    assert line.ties().tolist() == [False, False, False]
    kept = line.filtered(np.array([True, False, True, True]))
    assert kept.rows.tolist() == [11, 12, 10] and kept.codes.tolist() == [0, 1, 1]
    already = Timeline(np.array([0, 0, 1]), np.array([1, 2, 0]), 2)
    assert already.identity and already.rows.tolist() == [0, 1, 2]


def _naive(op: str, values: np.ndarray, s: int, e: int) -> float:
    part = values[s:e]
    if op == "sum":
        with np.errstate(invalid="ignore"):
            return float(part.sum()) if len(part) else 0.0
    if not len(part):
        return math.nan
    finite = part[~np.isnan(part)]
    if op == "min":
        return float(finite.min()) if len(finite) else math.nan
    return math.nan if np.isnan(part).any() else float(part.max())


@pytest.mark.parametrize("path", ["scan", "big"])
@pytest.mark.parametrize("op", ["sum", "min", "max"])
def test_range_merge_matches_loops_on_every_path(monkeypatch: pytest.MonkeyPatch, op: str, path: str) -> None:
    if path == "big":  # ranges "too long to scan": prefix sums and the block sparse table
        monkeypatch.setattr(pit_ranges, "_SCAN_FACTOR", 0)
        monkeypatch.setattr(pit_ranges, "_BLOCK", 4)
    rng = np.random.default_rng(1)
    values = rng.normal(size=300) * 100
    values[[5, 77]] = np.nan
    values[100] = np.inf
    values[150] = -np.inf
    s = np.sort(rng.integers(0, 300, 400))
    e = np.minimum(s + rng.integers(0, 60, 400), 300)
    got = range_merge(op, values, s, e)
    for i in range(len(s)):
        expected = _naive(op, values, s[i], e[i])
        if s[i] == e[i]:  # the identity; a float min's is NaN, which np.fmin skips (see merge_identity)
            assert got[i] == {"sum": 0.0, "max": -np.inf}[op] if op != "min" else math.isnan(got[i])
        elif math.isnan(expected):
            assert math.isnan(got[i]), (i, s[i], e[i])
        else:
            assert got[i] == pytest.approx(expected, rel=1e-12, abs=1e-9), (i, s[i], e[i])


@pytest.mark.parametrize("path", ["scan", "big"])
def test_range_merge_on_integers_is_exact(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    if path == "big":
        monkeypatch.setattr(pit_ranges, "_SCAN_FACTOR", 0)
        monkeypatch.setattr(pit_ranges, "_BLOCK", 8)
    rng = np.random.default_rng(2)
    values = rng.integers(-(2**40), 2**40, 500)
    s = np.sort(rng.integers(0, 500, 300))
    e = np.minimum(s + rng.integers(1, 200, 300), 500)
    for op, fn in (("sum", sum), ("min", min), ("max", max)):
        got = range_merge(op, values, s, e)
        assert got.tolist() == [fn(values[a:b].tolist()) for a, b in zip(s, e, strict=True)]


def test_last_positions_and_ties() -> None:
    has = np.array([True, False, True, True, False, True])
    codes = np.array([0, 0, 0, 0, 1, 1])
    times = np.array([1, 2, 3, 3, 1, 2])
    values = [5, None, 7, 4, None, 1]
    s = np.array([0, 0, 1, 4, 0, 2])
    e = np.array([2, 4, 2, 5, 0, 3])
    pos = last_positions(has, s, e)
    assert pos.tolist() == [0, 3, -1, -1, -1, 2]
    best = resolve_ties(pos, s, has, codes, times, lambda i, j: values[i] > values[j])  # type: ignore[operator]
    assert best.tolist() == [0, 2, -1, -1, -1, 2]  # rows 2 and 3 tie at time 3: 7 beats 4


def test_entity_index_codes_one_int_key() -> None:
    t = np.arange(6)
    index = EntityIndex([pa.array([30, 10, None, 10, 20, 10**12])], t)
    assert index.codes.tolist() == [2, 0, -1, 0, 1, 3]
    assert index.order.tolist() == [2, 1, 3, 4, 0, 5]  # by (code, time), null keys first
    data = pa.chunked_array([[10, 20, 25], [None, 10**12, 30]])
    assert index.encode([data]).tolist() == [0, 1, -1, -1, 3, 2]


def test_entity_index_codes_two_keys_with_strings() -> None:
    t = np.zeros(4, dtype=np.int64)
    index = EntityIndex([pa.array([1, 1, 2, None]), pa.array(["b", "a", "b", "a"])], t)
    assert index.codes[3] == -1
    assert len(set(index.codes[:3].tolist())) == 3
    data = index.encode([pa.chunked_array([[1, 2, 2, 1, 3]]), pa.chunked_array([["a", "b", "a", None, "a"]])])
    assert data[0] == index.codes[1] and data[1] == index.codes[2]
    assert data[2] not in index.codes.tolist()  # (2, "a"): a code no label row has
    assert data[3:].tolist() == [-1, -1]


def test_entity_index_dense_codes_when_key_space_is_huge(monkeypatch: pytest.MonkeyPatch) -> None:
    from quiver.offline import pit_numpy

    monkeypatch.setattr(pit_numpy, "_DENSE_KEYS", 2)
    t = np.zeros(3, dtype=np.int64)
    keys = [pa.array([5, 6, 5]), pa.array(["x", "y", "y"]), pa.array([True, False, True])]
    index = EntityIndex(keys, t)
    assert index.n_codes < 2 * 2 * 2  # renumbered on the way
    assert len(set(index.codes.tolist())) == 3 and min(index.codes) >= 0
    data = index.encode([pa.chunked_array([[5, 6, 5]]), pa.chunked_array([["y", "y", "x"]]),
                         pa.chunked_array([[True, False, False]])])
    assert data[:2].tolist() == [index.codes[2], index.codes[1]]
    assert data[2] not in index.codes.tolist()


def test_finalize_shares_one_database_per_process_and_a_forked_child_opens_its_own() -> None:
    """finalize keeps one DuckDB database per process (opening one costs 15-30 ms per windowed column); a
    child forked after the parent used it must not touch the parent's (DuckDB's threads do not survive a fork)."""
    import os
    import signal

    from quiver.catalog.ir import AggSpec
    from quiver.offline import pit_merge

    aggs = [AggSpec("x_mean", "x", "mean", 3_600_000_000, "float64"),
            AggSpec("x_count", "x", "count", 3_600_000_000, "float64")]
    merged = pit_merge.Merged(np.array([2, 0, 1]), {"sum": np.array([3.0, 0.0, 5.0])})
    first = pit_merge.finalize(aggs, merged)
    assert first["x_mean"].to_pylist() == [1.5, None, 5.0] and first["x_count"].to_pylist() == [2, 0, 1]
    database = pit_merge._database()
    pit_merge.finalize(aggs, merged)
    assert pit_merge._database() is database  # reused, not reopened
    pid = os.fork()
    if pid == 0:  # the child: its own database, the same answers
        ok = pit_merge._database() is not database and \
            pit_merge.finalize(aggs, merged)["x_mean"].to_pylist() == [1.5, None, 5.0]
        os._exit(0 if ok else 1)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            assert os.waitstatus_to_exitcode(status) == 0
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail("the forked child hung in finalize")
