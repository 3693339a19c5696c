"""The feeder (stream dir → inbox) on real files: order, validation, markers, crash-safe bookkeeping."""

from __future__ import annotations

import json
from pathlib import Path

from quiver.streaming.feeder import BATCH_PREFIX, MARKER, Feeder
from quiver.streaming.paths import StreamPaths


def write(folder: Path, name: str, lines: list[str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text("".join(line + "\n" for line in lines))


def batch_lines(paths: StreamPaths, source: str = "tx") -> list[list[str]]:
    inbox = paths.inbox(source)
    return [p.read_text().splitlines() for p in sorted(inbox.glob(BATCH_PREFIX + "*"))]


def test_pending_files_become_one_time_ordered_batch_ending_with_its_marker(tmp_path: Path) -> None:
    stream, paths = tmp_path / "stream", StreamPaths.at(tmp_path / "state")
    write(stream, "0000000000002-00000001.jsonl", ['{"ts_ms": 3}', '{"ts_ms": 4}'])
    write(stream, "0000000000001-00000000.jsonl", ['{"ts_ms": 1}', '{"ts_ms": 2}'])
    write(stream, ".0000000000003-00000002.jsonl.tmp", ['{"ts_ms": 9}'])  # still being written: ignored
    result = Feeder({"tx": stream}, paths).feed()
    assert result.files == {"tx": 2} and result.lines == {"tx": 4} and result.unparseable == {"tx": 0}
    [lines] = batch_lines(paths)
    assert [json.loads(x)["ts_ms"] for x in lines[:-1]] == [1, 2, 3, 4]
    assert json.loads(lines[-1]) == {"ts_ms": MARKER + BATCH_PREFIX + "0000000000002-00000001.jsonl"}


def test_unparseable_lines_go_to_the_quarantine_with_their_file(tmp_path: Path) -> None:
    stream, paths = tmp_path / "stream", StreamPaths.at(tmp_path / "state")
    write(stream, "a.jsonl", ['{"ts_ms": 1}', "garbage", "[1, 2]", "", '{"ts_ms": 2', '"just a string"'])
    result = Feeder({"tx": stream}, paths).feed()
    assert result.lines == {"tx": 1} and result.unparseable == {"tx": 4}
    [quarantine] = list(paths.sink("quarantine", "tx").iterdir())
    rows = [json.loads(x) for x in quarantine.read_text().splitlines()]
    assert [r["line"] for r in rows] == ["garbage", "[1, 2]", '{"ts_ms": 2', '"just a string"']
    assert {r["reason"] for r in rows} == {"unparseable_json"} and {r["file"] for r in rows} == {"a.jsonl"}


def test_a_restarted_feeder_feeds_nothing_twice_but_late_files_still_get_in(tmp_path: Path) -> None:
    stream, paths = tmp_path / "stream", StreamPaths.at(tmp_path / "state")
    write(stream, "b.jsonl", ['{"ts_ms": 2}'])
    Feeder({"tx": stream}, paths).feed()
    again = Feeder({"tx": stream}, paths)  # a new process: what was fed is read back from the manifests
    assert again.pending("tx") == [] and again.feed().files == {}
    write(stream, "a.jsonl", ['{"ts_ms": 1}'])  # an older name that showed up late is not skipped
    write(stream, "c.jsonl", ['{"ts_ms": 3}'])
    assert [p.name for p in again.pending("tx")] == ["a.jsonl", "c.jsonl"]
    again.feed()
    assert len(batch_lines(paths)) == 2
    assert sorted(Feeder({"tx": stream}, paths).batches()["tx"]) == ["upto-b.jsonl", "upto-c.jsonl"]


def test_a_batch_without_its_manifest_is_fed_again_and_reset_forgets_everything(tmp_path: Path) -> None:
    stream, paths = tmp_path / "stream", StreamPaths.at(tmp_path / "state")
    write(stream, "a.jsonl", ['{"ts_ms": 1}'])
    Feeder({"tx": stream}, paths).feed()
    (paths.inbox("tx") / ".upto-a.jsonl.json").unlink()  # as if the crash hit before the manifest was written
    assert [p.name for p in Feeder({"tx": stream}, paths).pending("tx")] == ["a.jsonl"]
    feeder = Feeder({"tx": stream}, paths)
    feeder.reset()
    assert list(paths.inbox("tx").iterdir()) == [] and len(feeder.pending("tx")) == 1


def test_big_backlogs_are_cut_into_batches(tmp_path: Path) -> None:
    stream, paths = tmp_path / "stream", StreamPaths.at(tmp_path / "state")
    for i in range(5):
        write(stream, f"{i}.jsonl", [json.dumps({"ts_ms": i, "pad": "x" * 100})])
    Feeder({"tx": stream}, paths, max_batch_bytes=250).feed()
    sizes = [len(lines) - 1 for lines in batch_lines(paths)]  # minus the marker
    assert sum(sizes) == 5 and len(sizes) == 3
