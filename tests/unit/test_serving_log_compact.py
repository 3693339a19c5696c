"""Compaction of the serving log (issue 50): an hour of every replica's files becomes one, atomically;
readers see the hour before or after, never twice or half, and files that arrive later still count once."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from quiver.catalog.locations import Location, local_location
from quiver.serving.logs import ServingLogger, read_serving_logs
from quiver.serving.logs.compact import MANIFEST, compact, compact_hour, hour_files

T0 = 1_793_696_400_000_000  # 2026-11-03 09:00 UTC
HOUR0 = datetime(2026, 11, 3, 9, tzinfo=UTC)
FOLDER = "serving_logs/date=2026-11-03/hour=09"


def log_rows(root: Path, replica: str, tag: str, n: int, flushes: int = 3) -> None:
    with ServingLogger(root, replica=replica, flush_interval_s=3_600) as logger:
        for k in range(flushes):
            ids = [f"{tag}{k}-{i}" for i in range(n)]
            logger.log_batch(ids, {"user_id": np.arange(n)}, {"amount": np.arange(n) * 1.0}, "m:1", "champion", 1.0,
                             np.full(n, 0.5), ts_us=np.full(n, T0 + 1000 * k, dtype=np.int64))
            logger.flush()


def ids_of(root: Path) -> list[str]:
    return sorted(read_serving_logs(root)["request_id"].to_pylist())


def test_an_hour_of_two_replicas_becomes_one_file_with_the_same_rows(tmp_path: Path) -> None:
    log_rows(tmp_path, "a", "a", 4)
    log_rows(tmp_path, "b", "b", 5)
    before = read_serving_logs(tmp_path).sort_by([("request_id", "ascending")])
    location = local_location(tmp_path)
    assert len(hour_files(location, location.path(FOLDER))) == 6
    result = compact_hour(location, location.path(FOLDER))
    assert result.compacted and result.files_in == 6 and result.rows == 27 and result.replicas == {"a": 12, "b": 15}
    assert [p.name for p in (tmp_path / FOLDER).iterdir() if p.name.startswith("part-")] == []  # deleted
    after = read_serving_logs(tmp_path).sort_by([("request_id", "ascending")])
    assert after.equals(before.select(after.column_names)) and after.num_rows == 27
    again = compact_hour(location, location.path(FOLDER))  # nothing new: nothing to do
    assert not again.compacted


def test_files_after_the_compaction_count_once(tmp_path: Path) -> None:
    log_rows(tmp_path, "a", "a", 3)
    folder = tmp_path / FOLDER
    early = sorted(folder.glob("part-*.parquet"))[0]
    kept = tmp_path / "repeat.parquet"
    shutil.copy(early, kept)  # what a spool would upload again after a crash: same name, same bytes
    location = local_location(tmp_path)
    compact_hour(location, location.path(FOLDER))
    shutil.copy(kept, folder / early.name)  # the repeated upload lands after the compaction
    log_rows(tmp_path, "b", "late", 2, flushes=1)  # a late file of another replica
    assert ids_of(tmp_path) == sorted([f"a{k}-{i}" for k in range(3) for i in range(3)] + ["late0-0", "late0-1"])
    compact_hour(location, location.path(FOLDER))  # and again: still each once
    assert ids_of(tmp_path) == sorted([f"a{k}-{i}" for k in range(3) for i in range(3)] + ["late0-0", "late0-1"])
    assert len(json.loads((folder / MANIFEST).read_text())["files"]) == 1


def test_a_compaction_that_crashed_before_its_commit_is_not_read(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    log_rows(tmp_path, "a", "a", 3)
    real = Location.put

    def crash_at_commit(location: Location, path: str, data: bytes) -> None:
        if path.endswith(MANIFEST):
            raise OSError("killed")
        real(location, path, data)

    monkeypatch.setattr(Location, "put", crash_at_commit)
    location = local_location(tmp_path)
    with pytest.raises(OSError):
        compact_hour(location, location.path(FOLDER))
    assert list((tmp_path / FOLDER).glob("compacted-*.parquet"))  # written, never committed
    assert ids_of(tmp_path) == sorted(f"a{k}-{i}" for k in range(3) for i in range(3))


def test_only_closed_hours_are_compacted(tmp_path: Path) -> None:
    log_rows(tmp_path, "a", "a", 2)
    window = (HOUR0 - timedelta(hours=1), HOUR0 + timedelta(hours=2))
    assert compact(tmp_path, *window, now=HOUR0 + timedelta(minutes=70)) == []  # ended 10 min ago: still open
    done = compact(tmp_path, *window, now=HOUR0 + timedelta(minutes=80))
    assert [d.hour for d in done] == ["date=2026-11-03/hour=09"]
