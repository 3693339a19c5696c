"""The Kafka route's late records reach the offline store's `_late_events/` like the file route's: on S3
(moto's server) the loader writes them there and rewrites rather than doubles; on a real broker, a job's late
records land in the store, leave the state folder, stay counted, and the next backfill of their day reads them."""

from __future__ import annotations

import contextlib
import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quiver.catalog.loader import load_catalog
from quiver.config import Config, load_config
from quiver.offline.backfill import backfill
from quiver.offline.pit import get_historical_features
from quiver.offline.store import open_store, store_for
from quiver.streaming.kafka_broker import KafkaBroker, create_topic, produce
from quiver.streaming.late import late_dir, late_events
from quiver.streaming.late_kafka import KafkaLateStore, late_layouts
from quiver.streaming.loader import Loader
from quiver.streaming.paths import StreamPaths, visible_files
from tests.harness import RedisServer
from tests.integration.object_store_support import BUCKET
from tests.integration.test_streaming_e2e import (
    DAY0,
    DAY0_US,
    H,
    M,
    redis_for_module,  # noqa: F401  (module-scoped Redis of our own)
)
from tests.integration.test_streaming_kafka import Run, wait_for
from tests.unit.test_flink_loader import RecordingStore
from tests.unit.test_late_kafka import catalog, lines, write_json

pytestmark = pytest.mark.integration


def test_late_files_go_to_the_bucket_once(tmp_path: Path, s3_server: Any) -> None:
    with contextlib.suppress(OSError):  # made by an earlier test of the session
        s3_server.create_bucket(BUCKET)
    store = open_store(s3_server.uri(BUCKET, f"offline-{uuid.uuid4().hex[:8]}"), tmp_path)
    cat = catalog()
    late_store = KafkaLateStore(store, late_layouts(cat, list(cat.views.values())))
    paths = StreamPaths.at(tmp_path / "state")
    folder = paths.sink("late", "tx")
    folder.mkdir(parents=True)
    write_json(folder / "part-b-0-0", lines())
    late_store.store_file("tx", folder / "part-b-0-0")  # a crash after the write: the JSON file stays
    loader = Loader([cat.views["spend"]], ["tx"], RecordingStore(), paths, late_store=late_store)
    loader.poll()
    assert loader.stats.late == {"tx": 3} and not visible_files(folder)
    assert [f.rpartition("/")[2] for f in store.late_event_files("tx")] == ["kafka-part-b-0-0.parquet"] * 2
    assert not (tmp_path / "offline").exists()  # nothing on the local disk
    table = late_events(store, "tx")
    assert table is not None and sorted(table.column("user_id").to_pylist(), key=str) == [1, 2, None]


# ---- a real job on a real broker ----

CATALOG = '''
from quiver import Aggregation, Entity, FeatureView, Source, StreamBinding

user = Entity(name="user", join_keys=["user_id"])
events = Source(name="events", path="data/events/events", timestamp_field="ts",
                stream=StreamBinding(kafka_topic="TOPIC", watermark_delay="0s", allowed_lateness="1m"))
spend = FeatureView(name="spend", entities=[user], source=events, tile="1h",
                    aggregations=[Aggregation("amount", "sum", "1d"), Aggregation("amount", "count", "1d")])
'''
SCHEMA = pa.schema([("user_id", pa.int64()), ("amount", pa.float64()), ("ts", pa.timestamp("us", tz="UTC"))])
ON_TIME = [(1, 1.5, DAY0_US + 10 * H), (2, 2.0, DAY0_US + 10 * H + M), (1, 4.0, DAY0_US + 11 * H),
           (2, 8.0, DAY0_US + 12 * H)]  # the last one moves the watermark to 12:00
LATE = [(1, 100.0, DAY0_US + 2 * H), (1, 200.0, DAY0_US + 3 * H + 7), (3, 0.25, DAY0_US + 5 * H)]  # hours behind


def record(user: int, amount: float, ts_us: int) -> tuple[bytes, bytes]:
    return str(user).encode(), json.dumps({"ts_us": ts_us, "user_id": user, "amount": amount}).encode()


def write_project(root: Path, redis_url: str, bootstrap: str, topic: str) -> Config:
    (root / "feature_defs").mkdir(parents=True)
    (root / "feature_defs" / "features.py").write_text(CATALOG.replace("TOPIC", topic))
    (root / "quiver.yaml").write_text(f"project: kafkalate\ncatalog: feature_defs\nregistry_url: "
                                      f"sqlite:///{root}/registry.db\noffline_root: offline\nredis_url: {redis_url}\n"
                                      f"kafka_bootstrap: {bootstrap}\n")
    batch = root / "data" / "events" / "events" / f"date={DAY0.isoformat()}"
    batch.mkdir(parents=True)
    rows = [{"user_id": u, "amount": a, "ts": datetime.fromtimestamp(t / 1e6, UTC)} for u, a, t in ON_TIME]
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), batch / "part-00000.parquet")
    return load_config(root / "quiver.yaml")


def spend_at_end_of_day(config: Config) -> dict[int, tuple[float, int]]:
    """Backfill DAY0, then each user's (sum, count) of the day at its end."""
    catalog = load_catalog(config.catalog_dir, root=config.root)
    backfill(config, catalog, DAY0, DAY0)
    labels = pd.DataFrame({"user_id": [1, 2, 3], "event_ts": pd.to_datetime([DAY0_US + 24 * H - 1] * 3, unit="us",
                                                                            utc=True)})
    values = get_historical_features(labels, ["spend:amount_sum_1d", "spend:amount_count_1d"], catalog=catalog,
                                     config=config)
    return {int(u): (float(s) if pd.notna(s) else 0.0, int(c) if pd.notna(c) else 0)
            for u, s, c in zip(values["user_id"], values["amount_sum_1d"], values["amount_count_1d"], strict=True)}


@pytest.mark.slow
def test_a_jobs_late_records_land_in_the_store_and_the_next_backfill(
        tmp_path: Path, redis_for_module: RedisServer, kafka_broker: KafkaBroker) -> None:  # noqa: F811
    redis_for_module.start()
    topic = f"late-{uuid.uuid4().hex[:8]}"
    config = write_project(tmp_path, redis_for_module.url, kafka_broker.bootstrap, topic)
    create_topic(kafka_broker.bootstrap, topic, 1)  # one partition, one reader: no idle partition to wait out
    produce(kafka_broker.bootstrap, topic, [record(*r) for r in ON_TIME])
    run = Run(config, "--parallelism", "1")
    try:
        run.wait_caught_up(len(ON_TIME))  # the watermark is at 12:00 once they are checkpointed
        produce(kafka_broker.bootstrap, topic, [record(*r) for r in LATE])
        run.wait_caught_up(len(ON_TIME) + len(LATE))
        # Their late file commits with a checkpoint at or after the one holding their offsets.
        wait_for(lambda: run.status().get("late", {}).get("events") == len(LATE), 120, "the late records", run)
        wait_for(lambda: run.status().get("loader", {}).get("late_files_stored"), 30, "the late file stored", run)
    finally:
        assert run.stop() == 0, run.output()
    assert run.status()["late"]["events"] == len(LATE)

    store = store_for(config)
    late = late_events(store, "events")
    assert late is not None
    got = sorted((r["user_id"], r["amount"], int(r["ts"].timestamp() * 1e6)) for r in late.to_pylist())
    assert got == sorted(LATE)
    assert late.column_names == ["user_id", "amount", "ts"] and late.schema.field("ts").type == SCHEMA.field("ts").type
    assert not visible_files(run.paths.sink("late", "events"))  # moved, not kept in the state folder

    # The next backfill of their day reads them with the source's files.
    late_folder = late_dir(config.offline_dir)
    aside = late_folder.with_name(".late-aside")
    late_folder.rename(aside)
    without = spend_at_end_of_day(config)
    aside.rename(late_folder)
    with_late = spend_at_end_of_day(config)
    assert without == {1: (5.5, 2), 2: (10.0, 2), 3: (0.0, 0)}
    assert with_late == {1: (305.5, 4), 2: (10.0, 2), 3: (0.25, 1)}
