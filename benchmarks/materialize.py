"""Materialization throughput: Quiver's `materialize` vs Feast 0.67's `materialize`, end to end, same data.

N entities × 50 float64 features, two events per entity (an older and a newer one), as Quiver's offline
last_values partition and as Feast's FileSource Parquet. Each system reads its offline data, keeps the
newest row per entity and writes it to a redis-server this script starts (flushed before every run).
Also timed: Quiver's Redis write stage alone (newer-wins Lua, pipelined) against a raw pipelined MSET of
the very same keys and bytes. Both stores must then return the newest values for sampled entities, or
the script exits non-zero. Both systems get the same conditions: one untimed warm-up run, then the same
number of timed runs (3; 7 with --quick), each on a flushed store, the two systems taking turns (the order
alternating); times are medians and the ratio the median of per-round ratios, on a shared 2-core machine.

    python benchmarks/materialize.py [--quick]
Last line: RESULT materialize ratio=<Feast time / Quiver time> quiver=<entities/s>/s peer=<entities/s>/s
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

F = 50
RESULTS = Path(__file__).resolve().parent / "results"


def make_frame(n: int, now: datetime) -> pd.DataFrame:
    rng = np.random.default_rng(3)
    ids = np.concatenate([np.arange(n), np.arange(n)])
    ts = np.concatenate([np.full(n, 2), np.full(n, 1)])  # hours ago: the second copy is the newest
    frame = pd.DataFrame({"user_id": ids.astype(np.int64),
                          "event_ts": pd.Timestamp(now) - pd.to_timedelta(ts, unit="h")})
    for i in range(F):
        frame[f"f{i}"] = rng.random(2 * n)
    return frame


def quiver_project(root: Path, url: str, frame: pd.DataFrame, now: datetime) -> tuple[Any, Any]:
    from quiver import Entity, FeatureView, Field, Float64, Source
    from quiver.catalog.validate import build_catalog
    from quiver.config import Config
    from quiver.offline import layout

    user = Entity("user", ["user_id"])
    source = Source("events", "unused", timestamp_field="event_ts")
    view = FeatureView("v", [user], source, ttl="30d", schema=[Field(f"f{i}", Float64) for i in range(F)])
    columns = {"user_id": "int64", "event_ts": "timestamp", **{f"f{i}": "float64" for i in range(F)}}
    catalog = build_catalog([user, source, view], schema_reader=lambda s: columns)
    config = Config(root=root, project="bench", registry_url=f"sqlite:///{root}/registry.db",
                    offline_root="offline", redis_url=url)
    spec = catalog.views["v"]
    folder = layout.partition_dir(config.offline_dir, "v", layout.LAST_VALUES, now.date())
    folder.mkdir(parents=True)
    table = pa.Table.from_pandas(frame, preserve_index=False).cast(layout.last_values_schema(spec))
    pq.write_table(table, folder / "part-00000.parquet")
    return config, catalog


def feast_repo(root: Path, url: str, frame: pd.DataFrame) -> Any:
    import logging

    import yaml
    from feast import Entity, FeatureStore, FeatureView, Field, FileSource, ValueType
    from feast.types import Float64

    logging.getLogger("feast").setLevel(logging.ERROR)
    data = root / "data"
    data.mkdir(parents=True)
    frame.to_parquet(data / "v.parquet")
    (root / "feature_store.yaml").write_text(yaml.safe_dump({
        "project": "bench", "registry": str(data / "registry.db"), "provider": "local",
        "online_store": {"type": "redis", "connection_string": url.split("//", 1)[1].split("/", 1)[0]},
        "offline_store": {"type": "file"}, "entity_key_serialization_version": 3}))
    user = Entity(name="user", join_keys=["user_id"], value_type=ValueType.INT64)
    source = FileSource(path=str(data / "v.parquet"), timestamp_field="event_ts")
    view = FeatureView(name="v", entities=[user], ttl=timedelta(days=30), source=source, online=True,
                       schema=[Field(name=f"f{i}", dtype=Float64) for i in range(F)])
    store = FeatureStore(repo_path=str(root))
    store.apply([user, view])
    return store


def raw_mset(url: str, keys: list[bytes], values: list[bytes], batch: int = 500, depth: int = 4) -> float:
    """Hand-packed pipelined MSET of the same keys and bytes on the same kind of connection (the floor)."""
    import redis

    from quiver.online.redis_store import pack

    conn = redis.ConnectionPool.from_url(url).make_connection()
    t = time.perf_counter()
    pending = 0
    for start in range(0, len(keys), batch):
        args = [b"MSET"]
        for k, v in zip(keys[start:start + batch], values[start:start + batch], strict=True):
            args += [k, v]
        conn.send_packed_command([pack(*args)], check_health=False)
        pending += 1
        if pending >= depth:
            conn.read_response()
            pending -= 1
    for _ in range(pending):
        conn.read_response()
    elapsed = time.perf_counter() - t
    conn.disconnect()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, under a minute")
    parser.add_argument("--entities", type=int, default=None, help="entities (default 100k, quick 10k)")
    parser.add_argument("--runs", type=int, default=None,
                        help="timed runs per system, after one warm-up (default 3; 7 with --quick)")
    args = parser.parse_args()
    n = args.entities or (10_000 if args.quick else 100_000)
    runs = args.runs or (7 if args.quick else 3)  # the same for both systems, after one warm-up each

    import redis

    from quiver.online.embedded import LocalRedis
    from quiver.online.layout import entity_keys, key_prefix
    from quiver.online.materialize import materialize
    from quiver.online.redis_store import RedisOnlineStore, newest_per_entity

    now = datetime.now(UTC).replace(microsecond=0)
    end = now + timedelta(seconds=1)
    frame = make_frame(n, now)
    report: dict[str, Any] = {"entities": n, "rows": len(frame), "features": F, "quick": args.quick}
    with LocalRedis() as url, tempfile.TemporaryDirectory() as tmp:
        client = redis.Redis.from_url(url)
        config, catalog = quiver_project(Path(tmp) / "quiver", url, frame, now)
        spec = catalog.views["v"]
        feast = feast_repo(Path(tmp) / "feast", url, frame)

        def quiver_run() -> float:
            client.flushall()
            t = time.perf_counter()
            result = materialize(config, catalog, end, full=True)
            took = time.perf_counter() - t
            if result.entities_written != n:
                sys.exit(f"materialize: quiver wrote {result.entities_written} entities, expected {n}")
            return took

        def feast_run() -> float:
            client.flushall()
            t = time.perf_counter()
            feast.materialize(now - timedelta(days=1), end)
            return time.perf_counter() - t

        # The two systems take turns, the order alternating (run 0 of each: the warm-up, untimed), so both
        # meet the same moments of a shared machine; the ratio is the median of the per-round ratios.
        quiver_times, feast_times = [], []
        for i in range(1 + runs):
            sides = (quiver_run, feast_run) if i % 2 == 0 else (feast_run, quiver_run)
            took = {side.__name__: side() for side in sides}
            if i:
                quiver_times.append(took["quiver_run"])
                feast_times.append(took["feast_run"])
        # The Redis write stage alone, against a raw MSET of the very same bytes.
        from quiver.offline.layout import last_values_schema

        table = newest_per_entity(spec, pa.Table.from_pandas(frame, preserve_index=False).cast(
            last_values_schema(spec)))
        store = RedisOnlineStore(url, "bench", timeout_s=10)
        values, _ = store._view(spec)[1].encode(table)
        keys = entity_keys(key_prefix("bench", spec), spec, {"user_id": table.column("user_id").to_numpy()})
        write_times, mset_times = [], []
        for _ in range(runs):
            client.flushall()
            t = time.perf_counter()
            store.write_last_values(spec, table)
            write_times.append(time.perf_counter() - t)
            client.flushall()
            mset_times.append(raw_mset(url, keys, values))
        # The newer-wins Lua path alone (what an incremental run over existing keys takes), same bytes.
        lua_times = []
        for _ in range(runs):
            client.flushall()
            t = time.perf_counter()
            store._run_scripts("last", keys, values, merge=True)
            lua_times.append(time.perf_counter() - t)
        client.flushall()  # both stores hold their values for the check below
        materialize(config, catalog, end, full=True)
        feast.materialize(now - timedelta(days=1), end)

        # Same answers: the newest values, from both stores.
        from quiver.serving.store import FeatureStore

        rng = np.random.default_rng(5)
        sample = rng.choice(n, 100, replace=False)
        features = [f"v:f{i}" for i in range(F)]
        with FeatureStore(config=config, catalog=catalog, online_store=store) as ours:
            got = ours.get_online_features(features, {"user_id": sample}, at=end).to_dict()
        theirs = feast.get_online_features(features=features,
                                           entity_rows=[{"user_id": int(u)} for u in sample]).to_dict()
        newest = frame.iloc[n:].set_index("user_id")
        wrong = [f"{who} f{i}" for i in range(F) for who, values in (("quiver", got[f"f{i}"]),
                                                                     ("feast", theirs[f"f{i}"]))
                 if not np.array_equal(np.array(values, dtype=float), newest[f"f{i}"].to_numpy()[sample])]
        if wrong:
            sys.exit(f"materialize: answers differ from the newest values: {', '.join(wrong[:5])}")
        report["same_answers"] = True

    q, fe = statistics.median(quiver_times), statistics.median(feast_times)
    ratio = statistics.median(f / t for f, t in zip(feast_times, quiver_times, strict=True))
    report.update({
        "warmup_runs": 1, "timed_runs": runs, "note": "busy machine shared with other jobs",
        "quiver_s": quiver_times, "feast_s": feast_times,
        "quiver_entities_per_s": n / q, "feast_entities_per_s": n / fe, "ratio": ratio,
        "ratio_note": "median over rounds of Feast's time / Quiver's time in the same round",
        "write_stage_s": write_times, "raw_mset_s": mset_times, "lua_only_s": lua_times,
        "write_stage_over_mset": statistics.median(write_times) / statistics.median(mset_times),
        "lua_over_mset": statistics.median(lua_times) / statistics.median(mset_times),
        "load_average": os.getloadavg(),
    })
    print(f"quiver materialize: {n / q:,.0f} entities/s (median of {runs}: {q:.2f}s)")
    print(f"feast materialize:  {n / fe:,.0f} entities/s (median of {runs}: {fe:.2f}s)")
    print("both: 1 untimed warm-up run, then the same timed runs; busy shared 2-core machine")
    print(f"write stage {statistics.median(write_times):.3f}s (dedupe + encode + MSETNX) vs raw MSET "
          f"{statistics.median(mset_times):.3f}s: {report['write_stage_over_mset']:.2f}x; newer-wins Lua path "
          f"(taken when keys exist) {report['lua_over_mset']:.2f}x")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "materialize.json").write_text(json.dumps(report, indent=2))
    print(f"RESULT materialize ratio={ratio:.1f} quiver={n / q:.0f}/s peer={n / fe:.0f}/s")


if __name__ == "__main__":
    sys.exit(main())
