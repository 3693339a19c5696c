"""The Kafka job's late files (JSON lines, as Flink's filesystem sink writes them) → the offline store's
`_late_events/`, typed and laid out like the feeder's, named after the JSON file (a rewrite never doubles),
counted once across restarts, and kept or removed by a fresh start depending on whether it replays them."""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quiver import Aggregation, Entity, FeatureView, Source, StreamBinding
from quiver.catalog.ir import Catalog
from quiver.catalog.validate import build_catalog
from quiver.offline.store import OfflineStore, open_store
from quiver.streaming.feeder import Feeder, source_feeds
from quiver.streaming.late import late_events
from quiver.streaming.late_kafka import (
    REPLACED_DIR,
    KafkaLateStore,
    forget_on_fresh,
    late_layouts,
    late_parquet_name,
    move_committed,
)
from quiver.streaming.loader import Loader
from quiver.streaming.paths import StreamPaths
from tests.unit.test_flink_loader import RecordingStore

# `note` is read by no streamed view: the feeder keeps it for the batch route all the same.
COLUMNS = {"user_id": "int64", "amount": "float64", "cat": "string", "paid_at": "timestamp", "note": "string",
           "ts": "timestamp"}
DAY1_US = 1_793_491_200_000_000  # 2026-11-01T00:00:00Z
H = 3_600_000_000


def catalog() -> Catalog:
    user = Entity("user", ["user_id"])
    tx = Source("tx", "tx", timestamp_field="ts", stream=StreamBinding(kafka_topic="tx"))
    spend = FeatureView("spend", [user], tx, aggregations=[Aggregation("amount", "sum", "1h"),
                                                            Aggregation("cat", "last", "1h"),
                                                            Aggregation("paid_at", "last", "1h")])
    return build_catalog([user, tx, spend], schema_reader=lambda s: dict(COLUMNS))


def lines() -> list[dict[str, object]]:
    """Late records as the job writes them: `ts_us` + the columns it parsed (`note` is not among them)."""
    return [{"ts_us": DAY1_US - 2 * H, "user_id": 1, "amount": 2.5, "cat": "a", "paid_at": DAY1_US - 3 * H},
            {"ts_us": DAY1_US + 5 * H, "user_id": 2, "amount": "NaN", "cat": None, "paid_at": None},
            {"ts_us": DAY1_US + 6 * H, "user_id": None, "amount": 1, "cat": "NaN", "paid_at": DAY1_US}]


def setup(tmp_path: Path) -> tuple[OfflineStore, KafkaLateStore, StreamPaths, Path]:
    cat = catalog()
    store = open_store("offline", tmp_path)
    late_store = KafkaLateStore(store, late_layouts(cat, list(cat.views.values())))
    paths = StreamPaths.at(tmp_path / "state")
    folder = paths.sink("late", "tx")
    folder.mkdir(parents=True)
    return store, late_store, paths, folder


def write_json(path: Path, rows: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))


def test_a_late_file_becomes_parquet_per_day_with_the_feeders_columns_and_a_name_from_the_file(tmp_path: Path) -> None:
    store, late_store, _, folder = setup(tmp_path)
    write_json(folder / "part-5e1f-0-3", lines())
    assert late_store.store_file("tx", folder / "part-5e1f-0-3") == 3
    base = store.path("_late_events", "tx")
    assert [p[len(base) + 1:] for p in store.late_event_files("tx")] == [
        "date=2026-10-31/kafka-part-5e1f-0-3.parquet", "date=2026-11-01/kafka-part-5e1f-0-3.parquet"]
    assert late_parquet_name("part-5e1f-0-3", "2026-11-01") == "date=2026-11-01/kafka-part-5e1f-0-3.parquet"

    # The feeder's late file of the same source: the same columns, order and types.
    cat = catalog()
    feed = source_feeds(cat, list(cat.views.values()))["tx"]
    checked = pa.table({"ts_us": [DAY1_US], "user_id": [1], "amount": [1.0], "cat": ["x"], "paid_at": [DAY1_US],
                        "note": ["n"]})
    feeder_store = open_store("feeder-offline", tmp_path)
    Feeder._write_late(SimpleNamespace(late=feeder_store), feed, "upto-x", checked)  # type: ignore[arg-type]
    (feeder_file,) = feeder_store.late_event_files("tx")
    assert pq.read_schema(feeder_file).remove_metadata() == pq.read_schema(store.late_event_files("tx")[0]) \
        .remove_metadata()

    table = late_events(store, "tx")
    assert table is not None
    assert table.column_names == ["user_id", "amount", "cat", "paid_at", "note", "ts"]
    rows = table.sort_by("ts").to_pylist()
    assert [r["ts"].timestamp() * 1e6 for r in rows] == [DAY1_US - 2 * H, DAY1_US + 5 * H, DAY1_US + 6 * H]
    assert [r["user_id"] for r in rows] == [1, 2, None]
    assert rows[0]["amount"] == 2.5 and math.isnan(rows[1]["amount"]) and rows[2]["amount"] == 1.0
    assert [r["cat"] for r in rows] == ["a", None, "NaN"]  # a string "NaN" stays a string
    assert rows[0]["paid_at"].timestamp() * 1e6 == DAY1_US - 3 * H and rows[1]["paid_at"] is None
    assert [r["note"] for r in rows] == [None, None, None]  # not parsed by the job: nulls, the column is there

    # A crash before the JSON file's deletion: the next poll writes the same objects again, nothing doubles.
    late_store.store_file("tx", folder / "part-5e1f-0-3")
    assert len(store.late_event_files("tx")) == 2
    again = late_events(store, "tx")
    assert again is not None and again.num_rows == 3


def test_the_loader_moves_committed_late_files_and_counts_them_once_across_restarts(tmp_path: Path) -> None:
    store, late_store, paths, folder = setup(tmp_path)
    write_json(folder / "part-a-0-0", lines()[:2])
    write_json(folder / ".part-a-0-1.inprogress.77", lines()[2:])  # not committed yet: left alone
    cat = catalog()
    spend = cat.views["spend"]
    loader = Loader([spend], ["tx"], RecordingStore(), paths, late_store=late_store)
    loader.poll()
    assert loader.stats.late == {"tx": 2} and loader.stats.late_files_stored == 1
    assert [p.name for p in folder.iterdir()] == [".part-a-0-1.inprogress.77"]
    assert late_events(store, "tx").num_rows == 2  # type: ignore[union-attr]

    # Committed later; then a crash after its rows were counted but before the JSON file was deleted.
    (folder / ".part-a-0-1.inprogress.77").rename(folder / "part-a-0-1")
    counts = json.loads((paths.root / "counts.json").read_text())
    counts["late/tx/part-a-0-1"] = {"rows": 1, "stored": True}
    (paths.root / "counts.json").write_text(json.dumps(counts))
    restarted = Loader([spend], ["tx"], RecordingStore(), paths, late_store=late_store)
    assert restarted.stats.late == {"tx": 3}
    restarted.poll()
    assert restarted.stats.late == {"tx": 3} and not list(folder.iterdir())
    assert late_events(store, "tx").num_rows == 3  # type: ignore[union-attr]
    # Moved files' counts fold into one total per source, which survives the next restart.
    assert json.loads((paths.root / "counts.json").read_text()) == {"late/tx/_stored": {"rows": 3, "stored": True}}
    assert Loader([spend], ["tx"], RecordingStore(), paths, late_store=late_store).stats.late == {"tx": 3}


def test_without_a_late_store_the_loader_only_counts_the_file_routes_logs(tmp_path: Path) -> None:
    store, _, paths, folder = setup(tmp_path)
    write_json(folder / "part-a-0-0", lines())
    loader = Loader([catalog().views["spend"]], ["tx"], RecordingStore(), paths)
    loader.poll()
    assert loader.stats.late == {"tx": 3} and (folder / "part-a-0-0").exists()
    assert store.late_event_files("tx") == []


def test_a_fresh_start_keeps_late_files_unless_it_replays_them(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    store, late_store, paths, folder = setup(tmp_path)
    write_json(folder / "part-a-0-0", lines())
    # A start at the topics' end: the last job's committed late files go to the store before the state goes.
    assert move_committed(late_store, paths, ["tx"]) == 1 and not list(folder.iterdir())
    caplog.set_level(logging.INFO, logger="quiver")
    assert forget_on_fresh(store, ["tx"], replayed=False, startup="latest") == 0
    assert len(store.late_event_files("tx")) == 2
    assert "kept 2 late-event file(s) of tx" in caplog.text and "starts at latest" in caplog.text
    before = {p.rsplit("/_late_events/", 1)[1]: Path(p).read_bytes() for p in store.late_event_files("tx")}
    assert forget_on_fresh(store, ["tx"], replayed=True, startup="earliest") == 2
    assert store.late_event_files("tx") == []  # the backfill no longer reads them: the replay writes them again
    # ... but nothing is deleted: a record gone from the topic has its late file as its only copy.
    [stamp] = os.listdir(store.path(REPLACED_DIR))
    aside = {str(p.relative_to(Path(store.path(REPLACED_DIR, stamp)))): p.read_bytes()
             for p in Path(store.path(REPLACED_DIR, stamp)).rglob("*.parquet")}
    assert aside == before
    assert "set 2 late-event file(s) of tx aside" in caplog.text and "writes again" in caplog.text
    assert forget_on_fresh(store, ["tx"], replayed=True, startup="earliest") == 0  # nothing left: silent
    assert caplog.text.count("aside in") == 1


@pytest.mark.parametrize(("kafka", "startup", "kept"), [(True, "latest", True), (True, "timestamp:1", True),
                                                         (True, "group-offsets", True), (True, "earliest", False),
                                                         (False, "earliest", False)])
def test_a_fresh_run_keeps_the_late_records_it_will_not_replay(tmp_path: Path, kafka: bool, startup: str,
                                                                kept: bool) -> None:
    """`StreamRunner._start_fresh`: a Kafka job that does not start at the topics' beginning keeps the store's
    late files and moves the last job's committed ones there before the state goes; a replay removes them."""
    from quiver.streaming.runner import StreamRunner

    store, late_store, paths, folder = setup(tmp_path)
    write_json(folder / "part-old-0-0", lines()[:1])
    late_store.store_file("tx", folder / "part-old-0-0")  # an earlier run's, in the store already
    write_json(folder / "part-new-0-0", lines()[1:])  # committed by the last job, not yet moved
    (folder / "part-old-0-0").unlink()
    runner = SimpleNamespace(paths=paths, kafka=kafka, options=SimpleNamespace(startup=startup), sources=["tx"],
                             config=SimpleNamespace(offline_root="offline", root=tmp_path), topics=None,
                             _late_store=lambda: late_store if kafka else None)
    StreamRunner._start_fresh(runner)  # type: ignore[arg-type]
    assert not paths.sinks.exists()
    table = late_events(store, "tx")
    if kept:
        assert table is not None and sorted(table.column("user_id").to_pylist(), key=str) == [1, 2, None]
    else:
        assert table is None
