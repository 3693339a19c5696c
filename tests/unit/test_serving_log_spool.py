"""The serving log's spool (issue 50): files the store refuses wait in a bounded local folder, are uploaded
oldest first when it answers, survive a restart, and are counted when the bound drops them; the logger says
"spooling" meanwhile. Replicas name their files and rows; readers read every replica's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from quiver.catalog.locations import Location, local_location
from quiver.serving.logs import ServingLogger, Spool, read_serving_logs, replica_name
from quiver.serving.logs.files import parquet_bytes

T0 = 1_793_696_400_000_000  # 2026-11-03 09:00 UTC
H = 3_600_000_000


def batch(logger: ServingLogger, tag: str, ts: np.ndarray) -> None:
    n = len(ts)
    logger.log_batch([f"{tag}{i}" for i in range(n)], {"user_id": np.arange(n)}, {"amount": np.ones(n)},
                     "m:1", "champion", 1.0, np.full(n, 0.5), ts_us=ts.astype(np.int64))


class Outage:
    """The store's PUTs fail while `down` (a pure unit test's stand-in for an unreachable object store)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.down = False
        self.puts: list[str] = []
        real = Location.put

        def put(location: Location, path: str, data: bytes) -> None:
            if self.down and "/serving_logs/" in path:
                raise OSError("connection refused")
            self.puts.append(path)
            real(location, path, data)

        monkeypatch.setattr(Location, "put", put)


def file_bytes(rows: int) -> bytes:
    return parquet_bytes(pa.table({"x": np.arange(rows)}), "zstd")


def test_a_spooled_file_is_uploaded_oldest_first_and_only_then_leaves(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    for ns in (30, 10, 20):
        assert spool.add(f"serving_logs/date=2026-11-03/hour=09/part-{ns}-r-x.parquet", file_bytes(ns), ns) == []
    assert (spool.files, spool.rows) == (3, 60)
    uploaded: list[str] = []

    def fails_on_20(relative: str, data: bytes) -> None:
        if "part-20-" in relative:
            raise OSError("down again")
        uploaded.append(relative)

    rows, failure = spool.drain(fails_on_20)
    assert rows == 10 and isinstance(failure, OSError) and spool.rows == 50  # stops at the first failure
    rows, failure = spool.drain(lambda relative, data: uploaded.append(relative))
    assert (rows, failure, spool.files) == (50, None, 0)
    assert [u.split("/")[-1].split("-")[1] for u in uploaded] == ["10", "20", "30"]
    assert not list((tmp_path / "spool").rglob("*.parquet"))


def test_a_new_process_finds_and_uploads_what_an_earlier_one_spooled(tmp_path: Path) -> None:
    Spool(tmp_path).add("serving_logs/date=2026-11-03/hour=09/part-5-r-x.parquet", file_bytes(4), 4)
    again = Spool(tmp_path)
    assert (again.files, again.rows) == (1, 4)
    got: dict[str, bytes] = {}
    assert again.drain(lambda relative, data: got.update({relative: data})) == (4, None)
    assert list(got) == ["serving_logs/date=2026-11-03/hour=09/part-5-r-x.parquet"]


def test_a_full_spool_drops_the_oldest_files_and_says_so(tmp_path: Path) -> None:
    size = len(file_bytes(100))
    spool = Spool(tmp_path, max_bytes=int(size * 2.5))
    assert spool.add("serving_logs/d/part-1-r-a.parquet", file_bytes(100), 100) == []
    assert spool.add("serving_logs/d/part-2-r-a.parquet", file_bytes(100), 100) == []
    dropped = spool.add("serving_logs/d/part-3-r-a.parquet", file_bytes(100), 100)
    assert [d.relative for d in dropped] == ["serving_logs/d/part-1-r-a.parquet"] and spool.files == 2
    assert not (tmp_path / "serving_logs/d/part-1-r-a.parquet").exists()


def test_the_logger_spools_while_the_store_is_down_then_uploads_every_row_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    outage = Outage(monkeypatch)
    store = tmp_path / "store"
    logger = ServingLogger(local_location(store), flush_interval_s=3_600, replica="r1",
                           spool=Spool(tmp_path / "spool"))
    batch(logger, "before", T0 + np.arange(3))
    logger.flush()
    outage.down = True
    batch(logger, "during", T0 + H + np.arange(4))
    assert logger.flush() == 0
    health = logger.health()
    assert health["status"] == "spooling" and health["spooled_rows"] == 4 and health["spool_files"] == 1
    batch(logger, "still", T0 + np.arange(2))  # behind the spooled file, without a try of its own
    logger.flush()
    assert logger.health()["spooled_rows"] == 6 and logger.spooled == 6
    outage.down = False
    assert logger.flush() == 6
    assert logger.health()["status"] == "ok" and logger.health()["spooled_rows"] == 0
    logger.close()
    ids = read_serving_logs(store)["request_id"].to_pylist()
    assert sorted(ids) == sorted([f"before{i}" for i in range(3)] + [f"during{i}" for i in range(4)]
                                 + [f"still{i}" for i in range(2)])
    assert logger.written == 9 and logger.dropped == 0 and logger.quarantined == 0


def test_a_stop_while_the_store_is_down_keeps_the_rows_for_the_next_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    outage = Outage(monkeypatch)
    outage.down = True
    store, spool = tmp_path / "store", tmp_path / "spool"
    logger = ServingLogger(local_location(store), flush_interval_s=3_600, replica="r1", spool=Spool(spool))
    batch(logger, "r", T0 + np.arange(5))
    logger.close()  # the final flush cannot reach the store: the rows stay in the spool, not quarantined
    assert logger.quarantined == 0 and logger.dropped == 0 and read_serving_logs(store).num_rows == 0
    outage.down = False
    later = ServingLogger(local_location(store), flush_interval_s=3_600, replica="r1", spool=Spool(spool))
    later.close()
    assert sorted(read_serving_logs(store)["request_id"].to_pylist()) == [f"r{i}" for i in range(5)]


def test_every_reader_reads_every_replicas_rows_and_knows_whose_they_are(tmp_path: Path) -> None:
    for name in ("web-1", "web-2"):
        with ServingLogger(tmp_path, replica=name) as logger:
            batch(logger, f"{name}-", T0 + np.arange(3))
    table = read_serving_logs(tmp_path)
    assert sorted(table["request_id"].to_pylist()) == sorted([f"web-{k}-{i}" for k in (1, 2) for i in range(3)])
    assert sorted(set(table["replica"].to_pylist())) == ["web-1", "web-2"]
    names = [p.name for p in tmp_path.rglob("part-*.parquet")]
    assert sum("-web-1-" in n for n in names) == 1 and sum("-web-2-" in n for n in names) == 1


def test_a_replica_name_is_safe_in_a_file_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUIVER_REPLICA_ID", "pod/abc 1")
    assert replica_name() == "pod_abc_1"
    assert replica_name("given") == "given"
