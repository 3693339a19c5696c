"""The demo's step 8 through the embedded Kafka broker puts the same online values as its file route.

Two copies of the demo project (the example catalog, quiver.yaml, the venvs linked in) hold the same small
demo data. In one, step 8 (`quiver.pipelines.demo.run.stream`) starts the project's embedded broker, produces
the two-hour window to the catalog's topic and runs `quiver stream --bounded` against it; in the other it
writes the window as stream files (`--no-kafka`). Both jobs write their project's embedded Redis themselves,
through the JVM sink over its Unix socket (no change files for the Python loader). The two Redis servers must
hold the same keys and values (float tile sums up to their last bits, see `same_value`), and the Kafka run must say it
streamed through Kafka, every record committed.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from quiver.catalog.ir import Catalog
from quiver.catalog.loader import load_catalog
from quiver.config import Config, load_config
from quiver.online.layout import tile_record_dtype
from quiver.pipelines.demo import run
from quiver.pipelines.demo_data import generate
from tests.harness import copy_demo_project

pytestmark = [pytest.mark.integration, pytest.mark.slow]

DAYS = 2


@dataclass
class Streamed:
    config: Config
    said: str  # what step 8 printed
    redis: dict[bytes, Any]  # every key of the project's Redis and its value
    status: dict[str, Any]  # the stream run's status.json


def project(root: Path, data: Path) -> Config:
    copy_demo_project(root)
    shutil.copytree(data, root / "data")
    return load_config(root / "quiver.yaml")


def redis_contents(config: Config) -> dict[bytes, Any]:
    import redis

    from quiver.online.embedded import ensure_redis

    with redis.Redis.from_url(ensure_redis(config)) as client:
        out: dict[bytes, Any] = {}
        for key in client.scan_iter(count=1000):
            kind = client.type(key)
            out[key] = {b"hash": client.hgetall, b"string": client.get, b"set": client.smembers,
                        b"zset": lambda k: client.zrange(k, 0, -1, withscores=True)}[kind](key)
        return out


def stream_step(config: Config, kafka: bool) -> Streamed:
    from quiver.cli import console

    catalog = load_catalog(config.catalog_dir, root=config.root)
    with console.capture() as said:
        run.stream(config, catalog, DAYS, kafka=kafka)
    status = json.loads((Path(config.root) / ".quiver/stream/status.json").read_text())
    return Streamed(config, said.get(), redis_contents(config), status)


@pytest.fixture(scope="module")
def routes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Streamed]]:
    from quiver.online.embedded import stop_embedded
    from quiver.streaming.embedded_kafka import stop_embedded_broker

    data = tmp_path_factory.mktemp("demo-data")
    # Two days of a small demo world: the step's window (12:00–14:00 of the last day) holds ~1,700 events.
    generate(data, days=DAYS, users=300, transactions_per_day=15_000, drift_from_day=1, late_fraction=0.01,
             malformed_fraction=0.001, seed=7)
    configs = {route: project(tmp_path_factory.mktemp(f"demo-{route}"), data) for route in ("kafka", "files")}
    try:
        yield {route: stream_step(config, kafka=route == "kafka") for route, config in configs.items()}
    finally:
        for config in configs.values():
            stop_embedded(config)
            stop_embedded_broker(config)


def test_the_demo_streams_through_the_embedded_broker(routes: dict[str, Streamed]) -> None:
    said = routes["kafka"].said
    produced = re.search(r"([\d,]+) events → Kafka topic 'transactions' \(4 partitions, keyed by user_id\) on the "
                         r"embedded broker at 127\.0\.0\.1:\d+", said)
    assert produced, said
    records = produced.group(1)
    assert f"streamed through Kafka: topic 'transactions', 4 partitions, {records} records; the job read and " \
           f"committed {records}" in said, said
    assert "streaming from files" not in said and "files → Flink" not in said
    assert not (Path(routes["kafka"].config.root) / "data/stream/transactions").exists()  # no stream files written
    files = routes["files"].said
    assert "streaming from files (--no-kafka)" in files and "files → Flink" in files
    assert "Kafka topic" not in files and "streamed through Kafka" not in files


def test_both_routes_write_the_embedded_redis_through_the_jvm_sink(routes: dict[str, Streamed]) -> None:
    for route, streamed in routes.items():
        assert streamed.status["sink"] == "redis (JVM sink)", (route, streamed.status["sink"])
        assert streamed.status["loader"]["files"] == 0, route  # no change file went through the Python loader
        assert streamed.status["loader"]["rows"] == 0, route


def same_value(catalog: Catalog, key: bytes, kafka: Any, files: Any) -> bool:
    """Equal, but for the wall-clock time of the last write, and for the last bits of float partials of
    tiles: Kafka partitions the events by user, so a merchant's events reach the job in another order than the
    time-ordered files give them, and a float sum depends on the order (one ulp here and there)."""
    if isinstance(files, dict):  # q:<project>:_meta:<view>
        return {f: v for f, v in kafka.items() if f != b"updated_at_ms"} == \
            {f: v for f, v in files.items() if f != b"updated_at_ms"}
    if kafka == files:
        return True
    view = catalog.views[key.split(b":")[2].decode()]
    if view.kind != "agg" or view.key_names == ["user_id"]:  # the partition key: the same order both ways
        return False
    dtype = tile_record_dtype(view)
    a, b = np.frombuffer(kafka, dtype), np.frombuffer(files, dtype)
    return a.shape == b.shape and all(
        np.allclose(a[name], b[name], rtol=1e-12, atol=0, equal_nan=True) if dtype[name].kind == "f"
        else np.array_equal(a[name], b[name]) for name in dtype.names or ())


def test_the_kafka_route_puts_the_same_online_values_as_the_file_route(routes: dict[str, Streamed]) -> None:
    kafka, files = routes["kafka"].redis, routes["files"].redis
    # The file route's sink records the feeder's batch markers in Redis (a Kafka job has no batches): bookkeeping.
    files = {k: v for k, v in files.items() if b":_markers:" not in k}
    assert len(files) > 500, "the file route wrote too little to compare"
    assert kafka.keys() == files.keys(), sorted(kafka.keys() ^ files.keys())[:10]
    config = routes["files"].config
    catalog = load_catalog(config.catalog_dir, root=config.root)
    differ = [key for key in files if not same_value(catalog, key, kafka[key], files[key])]
    assert not differ, f"{len(differ)} of {len(files)} keys differ, e.g. {differ[:5]}"
    # The user's views, read by the partition key, are the same to the byte.
    by_user = [key for key in files
               if b":_meta:" not in key and catalog.views[key.split(b":")[2].decode()].key_names == ["user_id"]]
    assert by_user and all(kafka[key] == files[key] for key in by_user)
