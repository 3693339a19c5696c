"""The feeder (stream dir → inbox) on real files: order, typed checks, the late split, markers, retention."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from quiver.compile.flink import BATCH_FIELD
from quiver.streaming.feeder import BATCH_PREFIX, HISTORY, Feeder, SourceFeed, check_lines, late_mask
from quiver.streaming.paths import StreamPaths

S = 1_000_000
FEED = SourceFeed("tx", (("user_id", "int64"), ("amount", "float64"), ("flag", "bool"), ("cat", "string")),
                  (("spend", ("user_id",)),), "ts", watermark_delay_us=2 * S, allowed_lateness_us=10 * S)
NOW = 2_000_000_000.0  # the feeder's clock in these tests (2033): every event below is in the past


def write(folder: Path, name: str, lines: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("".join(line + "\n" for line in lines))


def feeder(stream: Path, paths: StreamPaths, **kwargs: object) -> Feeder:
    return Feeder({"tx": stream}, paths, {"tx": FEED}, paths.root / "late", clock=lambda: NOW, **kwargs)  # type: ignore[arg-type]


def batch_lines(paths: StreamPaths, source: str = "tx") -> list[list[str]]:
    inbox = paths.inbox(source)
    return [p.read_text().splitlines() for p in sorted(inbox.glob(BATCH_PREFIX + "*"))]


def quarantined(paths: StreamPaths) -> list[dict[str, str]]:
    folder = paths.sink("quarantine", "tx")
    return [json.loads(x) for p in sorted(folder.iterdir()) for x in p.read_text().splitlines()]


def test_pending_files_become_one_time_ordered_batch_ending_with_its_marker(tmp_path: Path) -> None:
    stream, paths = tmp_path / "stream", StreamPaths.at(tmp_path / "state")
    write(stream, "0000000000002-00000001.jsonl", ['{"ts_us": 3}', '{"ts_us": 4}'])
    write(stream, "0000000000001-00000000.jsonl", ['{"ts_ms": 1}', '{"ts_us": 2}'])
    write(stream, ".0000000000003-00000002.jsonl.tmp", ['{"ts_us": 9}'])  # still being written: ignored
    result = feeder(stream, paths).feed()
    assert result.files == {"tx": 2} and result.lines == {"tx": 4} and result.unparseable == {"tx": 0}
    [lines] = batch_lines(paths)
    assert lines[:-1] == ['{"ts_ms": 1}', '{"ts_us": 2}', '{"ts_us": 3}', '{"ts_us": 4}']  # passed unchanged
    assert json.loads(lines[-1]) == {BATCH_FIELD: BATCH_PREFIX + "0000000000002-00000001.jsonl"}


def test_lines_are_checked_against_the_types_like_the_batch_files(tmp_path: Path) -> None:
    lines = [b'{"ts_us": 1, "user_id": 1, "amount": 2, "flag": true, "cat": "a"}',
             b"garbage", b"[1, 2]", b'{"ts_us": 2', b'"just a string"',
             b'{"ts_us": 3, "amount": "3.5"}',  # a number written as a string is not a number
             b'{"ts_us": 4, "flag": "yes"}',  # nor is "yes" a boolean (Flink's CAST would say TRUE)
             b'{"ts_us": 5, "user_id": 1.5}', b'{"ts_us": 6, "cat": 7}',
             b'{"ts_ms": 7.5}', b'{"user_id": 1}', b'{"ts_us": 8, "__batch": "upto-x"}',
             b'{"ts_ms": 99999999999999999}',  # would overflow as µs
             b'{"ts_us": 9, "amount": NaN}', b'{"ts_us": 10, "amount": "-Infinity"}', b'{"ts_us": 11}']
    checked = check_lines(FEED, lines)
    reasons = dict(checked.rejected)
    assert reasons == {1: "unparseable_json", 2: "unparseable_json", 3: "unparseable_json", 4: "unparseable_json",
                       5: "bad_type:amount", 6: "bad_type:flag", 7: "bad_type:user_id", 8: "bad_type:cat",
                       9: "bad_type:ts_ms", 10: "null_event_ts", 11: f"reserved_field:{BATCH_FIELD}",
                       12: "bad_type:ts_ms"}
    assert checked.rows.tolist() == [0, 13, 14, 15]
    assert checked.table.column("ts_us").to_pylist() == [1, 9, 10, 11]
    amounts = checked.table.column("amount").to_pylist()
    assert amounts[0] == 2.0 and math.isnan(amounts[1]) and amounts[2] == -math.inf and amounts[3] is None
    assert checked.non_finite.tolist() == [False, True, True, False]


def test_late_split_is_flinks_rule_made_exact() -> None:
    ts = np.array([100, 50, 89, 88, 200, 130, 10_000, 189], dtype=np.int64) * S
    future = np.array([False] * 6 + [True, False])
    feed = SourceFeed("tx", (), (), "ts", watermark_delay_us=2 * S, allowed_lateness_us=10 * S)
    newest, late = late_mask(ts, future, None, feed)
    # watermark before each event = greatest earlier (non-future) time - 2 s; late when <= watermark - 10 s
    assert late.tolist() == [False, True, False, True, False, True, False, False]
    assert newest == 200 * S  # the future event does not move it
    _, again = late_mask(np.array([188, 189], dtype=np.int64) * S, np.zeros(2, bool), newest, feed)
    assert again.tolist() == [True, False]  # the state carries over to the next batch


def test_late_future_and_bad_lines_leave_the_stream_with_their_reason(tmp_path: Path) -> None:
    stream, paths = tmp_path / "stream", StreamPaths.at(tmp_path / "state")
    write(stream, "a.jsonl", ['{"ts_us": 100000000, "user_id": 1, "amount": 1.0}',
                              '{"ts_us": 50000000, "user_id": 2, "amount": 2.0, "cat": "late"}',
                              '{"ts_us": 99000000, "amount": 3.0}',
                              f'{{"ts_us": {int(NOW * S) + 301 * S}, "user_id": 3, "amount": 4.0}}',
                              '{"ts_us": 99500000, "user_id": 4, "amount": NaN}',
                              "garbage"])
    result = feeder(stream, paths).feed()
    assert result.lines == {"tx": 3} and result.late == {"tx": 1} and result.future == {"tx": 1}
    [lines] = batch_lines(paths)
    assert [json.loads(x).get("user_id") for x in lines[:-1]] == [1, None, 4]
    assert json.loads(lines[2])["amount"] == "NaN"  # Flink's JSON reads the string, not the token
    rows = quarantined(paths)
    assert [(r["reason"], r["view"]) for r in rows] == [("unparseable_json", ""), ("null_key", "spend")]
    late = pq.read_table(paths.root / "late" / "tx", partitioning=None)
    assert sorted(late.column("user_id").to_pylist()) == [2, 3]
    assert late.schema.field("ts").type.unit == "us" and "ts_us" not in late.column_names
    assert {"user_id", "amount", "flag", "cat"} <= set(late.column_names)


def test_a_restarted_feeder_feeds_nothing_twice_and_keeps_its_watermark(tmp_path: Path) -> None:
    stream, paths = tmp_path / "stream", StreamPaths.at(tmp_path / "state")
    write(stream, "b.jsonl", ['{"ts_us": 100000000, "user_id": 1}'])
    feeder(stream, paths).feed()
    again = feeder(stream, paths)  # a new process: what was fed is read back from the manifests
    assert again.pending("tx") == [] and again.feed().files == {}
    write(stream, "a.jsonl", ['{"ts_us": 50000000, "user_id": 1}'])  # an older name that showed up late
    write(stream, "c.jsonl", ['{"ts_us": 100000001, "user_id": 1}'])
    assert [p.name for p in again.pending("tx")] == ["a.jsonl", "c.jsonl"]
    result = again.feed()
    assert result.late == {"tx": 1}  # 50 s is behind the 100 s watermark read back from the manifest
    assert sorted(feeder(stream, paths).batches()["tx"]) == ["upto-b.jsonl", "upto-c.jsonl"]
    assert feeder(stream, paths).totals["tx"]["late"] == 1


def test_a_batch_without_its_rename_is_fed_again_and_reset_forgets_everything(tmp_path: Path) -> None:
    stream, paths = tmp_path / "stream", StreamPaths.at(tmp_path / "state")
    write(stream, "a.jsonl", ['{"ts_us": 1}'])
    feeder(stream, paths).feed()
    (paths.inbox("tx") / "upto-a.jsonl").unlink()  # as if the crash hit between manifest and rename
    assert [p.name for p in feeder(stream, paths).pending("tx")] == ["a.jsonl"]
    f = feeder(stream, paths)
    f.reset()
    assert list(paths.inbox("tx").iterdir()) == [] and len(f.pending("tx")) == 1


def test_a_big_backlog_is_one_batch_in_order_checked_a_chunk_at_a_time(tmp_path: Path) -> None:
    """Flink reads the files of one scan in no fixed order: a backlog cut into several batches reached the
    job shuffled. A pass makes one batch whatever its size, checked `max_batch_bytes` at a time, and the
    watermark runs on across the chunks (a later chunk's old event is late)."""
    stream, paths = tmp_path / "stream", StreamPaths.at(tmp_path / "state")
    times = [100, 101, 102, 80, 103]  # seconds; 80 s is behind the 102 s of an earlier chunk (+10 s lateness)
    for i, t in enumerate(times):
        write(stream, f"{i}.jsonl", [json.dumps({"ts_us": t * S, "user_id": i, "cat": "x" * 100})])
    result = feeder(stream, paths, max_batch_bytes=250).feed()
    [lines] = batch_lines(paths)
    assert [json.loads(line)["user_id"] for line in lines[:-1]] == [0, 1, 2, 4]  # in file order, late one out
    assert json.loads(lines[-1]) == {BATCH_FIELD: BATCH_PREFIX + "4.jsonl"}
    assert result.files == {"tx": 5} and result.lines == {"tx": 4} and result.late == {"tx": 1}
    late = pq.read_table(paths.root / "late" / "tx", partitioning=None)
    assert late.column("user_id").to_pylist() == [3]
    again = feeder(stream, paths)  # the manifest holds the whole pass
    assert again.pending("tx") == [] and again.totals["tx"]["lines"] == 5 and again.totals["tx"]["late"] == 1


def test_retention_removes_done_batches_and_old_stream_files_but_remembers_them(tmp_path: Path) -> None:
    import os

    stream, paths = tmp_path / "stream", StreamPaths.at(tmp_path / "state")
    write(stream, "a.jsonl", ['{"ts_us": 100000000, "user_id": 1}'])
    f = feeder(stream, paths, stream_retention_s=60.0)
    f.feed()
    write(stream, "b.jsonl", ['{"ts_us": 100000001, "user_id": 1}'])
    f.feed()
    os.utime(stream / "a.jsonl", (NOW - 120, NOW - 120))  # fed two minutes ago
    os.utime(stream / "b.jsonl", (NOW - 1, NOW - 1))
    assert f.retire({"upto-a.jsonl"}) == 1
    assert sorted(p.name for p in paths.inbox("tx").iterdir()) == sorted([".upto-b.jsonl.json", HISTORY, "upto-b.jsonl"])
    assert [p.name for p in stream.iterdir()] == ["b.jsonl"]  # a.jsonl was fed, committed and is old
    history = json.loads((paths.inbox("tx") / HISTORY).read_text())
    assert history["absorbed_upto"] == "upto-a.jsonl" and history["files"] == []  # deleted: forgotten
    again = feeder(stream, paths)
    assert again.pending("tx") == [] and again.totals["tx"]["fed"] == 2
    write(stream, "c.jsonl", ['{"ts_us": 80000000, "user_id": 1}'])
    assert again.feed().late == {"tx": 1}  # the watermark survived the retention


def test_a_pass_that_fails_half_way_changes_nothing_and_its_retry_finds_the_same_events_on_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pass whose batch cannot be put in place (a full disk at the rename) leaves no batch, no temporary
    file and the watermark where it was: the retry checks the same events against the same watermark, so the
    first chunk's events are not late against the second chunk's."""
    import quiver.streaming.feeder as feeder_module

    stream, paths = tmp_path / "stream", StreamPaths.at(tmp_path / "state")
    write(stream, "0.jsonl", [json.dumps({"ts_us": 50 * S, "user_id": 1, "cat": "x" * 200})])
    write(stream, "1.jsonl", [json.dumps({"ts_us": 100 * S, "user_id": 2, "cat": "x" * 200})])
    f = feeder(stream, paths, max_batch_bytes=250)  # one file a chunk
    real_replace = feeder_module.os.replace
    calls = {"n": 0}

    def failing_replace(src: object, dst: object) -> None:
        if str(dst).endswith("upto-1.jsonl"):
            calls["n"] += 1
            if calls["n"] == 1:
                raise OSError(28, "No space left on device")
        real_replace(src, dst)  # type: ignore[arg-type]

    monkeypatch.setattr(feeder_module.os, "replace", failing_replace)
    with pytest.raises(OSError, match="No space"):
        f.feed()
    assert batch_lines(paths) == [] and not list(paths.inbox("tx").glob("*.tmp"))
    assert [p.name for p in f.pending("tx")] == ["0.jsonl", "1.jsonl"]
    result = f.feed()  # the retry, in the same process
    assert result.late == {"tx": 0} and result.lines == {"tx": 2}
    [lines] = batch_lines(paths)
    assert [json.loads(line)["user_id"] for line in lines[:-1]] == [1, 2]


def test_future_tolerance_is_the_sources_unless_the_run_sets_one(tmp_path: Path) -> None:
    """A producer whose clock runs a second (or four minutes) fast loses nothing: the default tolerance is the
    source's max_future (5 minutes); a run's --max-future-ms overrides every source's."""
    lines = [f'{{"ts_us": {int(NOW * S) + ahead * S}, "user_id": {i}, "amount": 1.0}}'
             for i, ahead in enumerate((1, 240, 301))]
    fed = {}
    for name, kwargs, feed in (("default", {}, FEED), ("strict", {}, replace(FEED, max_future_us=0)),
                               ("run", {"max_future_ms": 500_000}, FEED)):
        stream, paths = tmp_path / name / "stream", StreamPaths.at(tmp_path / name / "state")
        write(stream, "a.jsonl", lines)
        result = Feeder({"tx": stream}, paths, {"tx": feed}, paths.root / "late", clock=lambda: NOW,
                        **kwargs).feed()  # type: ignore[arg-type]
        fed[name] = (result.lines["tx"], result.future["tx"])
    assert fed == {"default": (2, 1), "strict": (0, 3), "run": (3, 0)}
