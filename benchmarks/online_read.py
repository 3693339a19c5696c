"""Online read latency: Quiver's in-process SDK vs Feast 0.67's Redis online store, with a raw floor.

The same data (N entities × 50 float64 features of one last-value view) goes into both stores on one
redis-server this script starts on a free port. For 1, 100 and 1000 entities × 50 features it times
`FeatureStore.get_online_features(...).to_dict()` (Quiver) and `feast.FeatureStore.get_online_features(...)
.to_dict()` (Feast), plus the floor: redis-py MGET of the same packed bytes with prebuilt keys and one
numpy.frombuffer. Systems are timed in 10 alternating rounds so machine noise hits all alike, each taking
a different place in each round and starting each turn with a garbage collection and WARMUP untimed calls;
p50 and a tail percentile over every call. `--server-gc` runs every side under the GC settings `quiver serve`
uses (start-up frozen, a collection every 100k allocations): at CPython's default (every 700) Quiver's call,
which allocates more objects than the floor's, meets more collections, and they are its 1-entity tail.
Target: Quiver's p99 ≤ 1.2× the floor's at every size (exit 1
when missed on a full run, which makes ≥ 2,000 calls a side; reported, not enforced, with --quick or
--no-targets). A p99 needs at least 100 calls; where a system gets fewer (Feast at 1000 entities takes
~0.6 s a call, so `--quick` gives it 10), the tail reported beside Feast at that size is p90 (needs 10
calls), and the output says so. Both stores must return the same values for the sampled
entities, or the script exits non-zero. Figures come from a busy, shared 2-core machine.

    python benchmarks/online_read.py [--quick] [--entities N] [--no-targets]
Last line: RESULT online_read ratio=<Feast p99 / Quiver p99, 1 entity> quiver=<p99>us peer=<p99>us
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

F = 50
RESULTS = Path(__file__).resolve().parent / "results"


def user_frame(n_entities: int, rng: np.random.Generator) -> pd.DataFrame:
    """The serving benchmarks' data: one row per user, F random float features, written an hour ago."""
    now = datetime.now(UTC).replace(microsecond=0)
    frame = pd.DataFrame({"user_id": np.arange(n_entities, dtype=np.int64),
                          "event_ts": pd.Timestamp(now - timedelta(hours=1))})
    for i in range(F):
        frame[f"f{i}"] = rng.random(n_entities)
    return frame


def quiver_setup(url: str, frame: pd.DataFrame) -> tuple[Any, Any, Any]:
    from quiver import Entity, FeatureView, Field, Float64, Source
    from quiver.catalog.validate import build_catalog
    from quiver.config import Config
    from quiver.offline.layout import last_values_schema
    from quiver.online.redis_store import RedisOnlineStore
    from quiver.serving.store import FeatureStore

    user = Entity("user", ["user_id"])
    source = Source("events", "unused", timestamp_field="event_ts")
    view = FeatureView("v", [user], source, ttl="30d", schema=[Field(f"f{i}", Float64) for i in range(F)])
    columns = {"user_id": "int64", "event_ts": "timestamp", **{f"f{i}": "float64" for i in range(F)}}
    catalog = build_catalog([user, source, view], schema_reader=lambda s: columns)
    spec = catalog.views["v"]
    online = RedisOnlineStore(url, "bench", timeout_s=5.0)
    online.write_last_values(spec, pa.Table.from_pandas(frame, preserve_index=False).cast(last_values_schema(spec)))
    return FeatureStore(config=Config(project="bench"), catalog=catalog, online_store=online), spec, online


def feast_setup(url: str, frame: pd.DataFrame, repo: Path, online_store: dict[str, Any] | None = None) -> Any:
    """Feast's repo over `frame`, materialized into the Redis at `url` (or the `online_store` settings given)."""
    import logging

    import yaml
    from feast import Entity, FeatureStore, FeatureView, Field, FileSource, ValueType
    from feast.types import Float64

    logging.getLogger("feast").setLevel(logging.ERROR)
    data = repo / "data"
    data.mkdir(parents=True)
    frame.to_parquet(data / "v.parquet")
    (repo / "feature_store.yaml").write_text(yaml.safe_dump({
        "project": "bench", "registry": str(data / "registry.db"), "provider": "local",
        "online_store": online_store or {"type": "redis", "connection_string": url.split("//", 1)[1].split("/", 1)[0]},
        "offline_store": {"type": "file"}, "entity_key_serialization_version": 3}))
    user = Entity(name="user", join_keys=["user_id"], value_type=ValueType.INT64)
    source = FileSource(path=str(data / "v.parquet"), timestamp_field="event_ts")
    view = FeatureView(name="v", entities=[user], ttl=timedelta(days=30), source=source, online=True,
                       schema=[Field(name=f"f{i}", dtype=Float64) for i in range(F)])
    store = FeatureStore(repo_path=str(repo))
    store.apply([user, view])
    # Feast's own materialize loads its Redis (faster here than write_to_online_store).
    newest = frame["event_ts"].max().to_pydatetime()
    store.materialize(newest - timedelta(days=1), newest + timedelta(seconds=1))
    return store


WARMUP = 5  # untimed calls each side makes at the start of each of its turns
TAIL_TARGET = 1.2  # Quiver's p99 / the raw floor's p99, at every size (checked on full runs: ≥ 2,000 calls)

# The fewest calls that give a percentile any meaning: at least one call beyond it.
MIN_CALLS = {"p99": 100, "p90": 10}


def tail_name(calls: int) -> str:
    """The highest tail percentile `calls` samples support (p99 from 100 calls, else p90)."""
    if calls < MIN_CALLS["p90"]:
        raise SystemExit(f"online_read: {calls} calls support no tail percentile (need ≥ {MIN_CALLS['p90']})")
    return "p99" if calls >= MIN_CALLS["p99"] else "p90"


def percentiles(samples: list[float]) -> dict[str, float | int | None]:
    arr = np.array(samples) * 1e6
    return {"p50_us": float(np.percentile(arr, 50)), "p90_us": float(np.percentile(arr, 90)),
            "p99_us": float(np.percentile(arr, 99)) if len(arr) >= MIN_CALLS["p99"] else None,
            "mean_us": float(arr.mean()), "calls": len(samples)}


def alternating_rounds(sides: dict[str, tuple[int, Any]], pool: int, rounds: int = 10) -> dict[str, list[float]]:
    """Time each side's calls (`(calls, call(k))`, k a request of the pool) in `rounds` rounds; the seconds
    of every call per side.

    Each side takes a different place each round and starts its turn with a collection and WARMUP untimed
    calls: whatever ran just before (Feast allocates a lot) leaves the next side cold caches and a garbage
    collector about to run, and with a fixed order that cost fell on one side only, enough of its calls to set
    its p99. Collections its own calls cause stay in."""
    samples: dict[str, list[float]] = {name: [] for name in sides}
    order = list(sides)
    for r in range(rounds):
        for name in order[r % len(order):] + order[:r % len(order)]:
            total, call = sides[name]
            per_round = max(1, total // rounds)
            gc.collect()
            for k in range(min(WARMUP, per_round)):
                call(k % pool)
            for _ in range(per_round):
                k = len(samples[name]) % pool
                t = time.perf_counter()
                call(k)
                samples[name].append(time.perf_counter() - t)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, under a minute")
    parser.add_argument("--entities", type=int, default=None, help="entities stored (default 100k, quick 10k)")
    parser.add_argument("--no-targets", action="store_true", help="report, but exit 0 when a target is missed")
    parser.add_argument("--server-gc", action="store_true",
                        help="this process's GC as `quiver serve` sets it (quiver.serving.runtime.tune_gc), for "
                             "every side alike; default: CPython's")
    args = parser.parse_args()
    n_entities = args.entities or (10_000 if args.quick else 100_000)
    # Calls per batch size: Quiver and the floor; Feast is 10-300x slower, so it gets fewer at 1000 — enough
    # for a p99 everywhere at full size, for a p90 at 1000 entities with --quick (see tail_name).
    # Quick runs give Quiver and the floor as many calls as full ones at 1 and 100 entities (a few seconds):
    # a p99 of 300-400 calls is its 3-4 slowest calls, and five quick runs spread by ±20-80 % with them.
    calls = {1: 3000, 100: 2000, 1000: 200} if args.quick else {1: 3000, 100: 2000, 1000: 2000}
    feast_calls = {1: 300, 100: 100, 1000: 10} if args.quick else {1: 2000, 100: 500, 1000: 100}

    from quiver.online.embedded import LocalRedis
    from quiver.online.layout import entity_keys, key_prefix

    rng = np.random.default_rng(7)
    frame = user_frame(n_entities, rng)
    features = [f"v:f{i}" for i in range(F)]
    if args.server_gc:
        from quiver.serving.runtime import tune_gc

        tune_gc()
    report: dict[str, Any] = {"entities_stored": n_entities, "features": F, "quick": args.quick,
                              "gc_thresholds": list(gc.get_threshold()), "sizes": {},
                              "warmup_calls_per_turn": WARMUP, "p99_target_over_raw": TAIL_TARGET}
    missed: list[str] = []
    with LocalRedis() as url, tempfile.TemporaryDirectory() as tmp:
        import redis

        t0 = time.perf_counter()
        quiver, spec, online = quiver_setup(url, frame)
        report["quiver_load_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        feast = feast_setup(url, frame, Path(tmp) / "repo")
        report["feast_load_s"] = time.perf_counter() - t0
        raw = redis.Redis.from_url(url)
        record = online._view(spec)[1].dtype
        prefix = key_prefix("bench", spec)

        # Same answers: every feature of a sample of entities, Quiver vs Feast vs the stored frame.
        sample = rng.choice(n_entities, 200, replace=False)
        ours = quiver.get_online_features(features, {"user_id": sample}).to_dict()
        theirs = feast.get_online_features(features=features, entity_rows=[{"user_id": int(u)} for u in sample])
        theirs_d = theirs.to_dict()
        wrong = [f"{who} f{i}" for i in range(F) for who, values in (("quiver", ours[f"f{i}"]),
                                                                     ("feast", theirs_d[f"f{i}"]))
                 if not np.array_equal(np.array(values, dtype=float), frame[f"f{i}"].to_numpy()[sample])]
        if wrong:
            sys.exit(f"online_read: answers differ from the stored values: {', '.join(wrong[:5])}")
        report["same_answers"] = True

        for size in (1, 100, 1000):
            pool = [rng.choice(n_entities, size, replace=False) for _ in range(64)]
            rows = [{"user_id": ids} for ids in pool]
            feast_rows = [[{"user_id": int(u)} for u in ids] for ids in pool]
            raw_keys = [entity_keys(prefix, spec, {"user_id": ids}) for ids in pool]
            samples: dict[str, list[float]] = {"quiver": [], "feast": [], "raw": []}
            sides: dict[str, tuple[int, Any]] = {
                "quiver": (calls[size], lambda k, rows=rows: quiver.get_online_features(features, rows[k]).to_dict()),
                "raw": (calls[size], lambda k, keys=raw_keys: np.frombuffer(b"".join(raw.mget(keys[k])), dtype=record)),
                "feast": (feast_calls[size], lambda k, entity_rows=feast_rows: feast.get_online_features(
                    features=features, entity_rows=entity_rows[k]).to_dict()),
            }
            samples.update(alternating_rounds(sides, len(pool)))
            stats: dict[str, Any] = {name: percentiles(values) for name, values in samples.items()}
            tail = tail_name(min(len(v) for v in samples.values()))  # one percentile for every system
            q_tail, f_tail, r_tail = (stats[k][f"{tail}_us"] for k in ("quiver", "feast", "raw"))
            stats["tail"] = tail
            stats[f"{tail}_ratio_feast_over_quiver"] = f_tail / q_tail
            stats["p50_ratio_feast_over_quiver"] = stats["feast"]["p50_us"] / stats["quiver"]["p50_us"]
            stats["p50_ratio_quiver_over_raw"] = stats["quiver"]["p50_us"] / stats["raw"]["p50_us"]
            stats[f"{tail}_ratio_quiver_over_raw"] = q_tail / r_tail
            tail_ratio = stats["p99_ratio_quiver_over_raw"] = stats["quiver"]["p99_us"] / stats["raw"]["p99_us"]
            if tail_ratio > TAIL_TARGET:
                missed.append(f"{size} entities: p99 {tail_ratio:.2f}x raw")
            report["sizes"][str(size)] = stats
            counts = "/".join(str(len(samples[k])) for k in ("quiver", "feast", "raw"))
            note = "" if tail == "p99" else f"  ({tail}: too few Feast calls for a p99)"
            print(f"{size:>5} entities × {F}: quiver p50 {stats['quiver']['p50_us']:8.0f}us "
                  f"{tail} {q_tail:8.0f}us | feast p50 {stats['feast']['p50_us']:8.0f}us "
                  f"{tail} {f_tail:8.0f}us | raw floor p50 {stats['raw']['p50_us']:6.0f}us "
                  f"{tail} {r_tail:6.0f}us | quiver/raw p50 {stats['p50_ratio_quiver_over_raw']:.2f}x "
                  f"p99 {tail_ratio:.2f}x | calls {counts}{note}", flush=True)
        quiver.close()
    report["load_average"] = os.getloadavg()
    report["note"] = "busy machine shared with other jobs"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "online_read.json").write_text(json.dumps(report, indent=2))
    one = report["sizes"]["1"]
    tail = one["tail"]  # p99: both systems get ≥ 100 calls at 1 entity
    report["targets_missed"] = missed
    (RESULTS / "online_read.json").write_text(json.dumps(report, indent=2))
    enforced = not args.quick and not args.no_targets
    if missed:
        print(f"TARGET {'MISSED' if enforced else 'missed (not enforced: --quick or --no-targets)'}: "
              f"{', '.join(missed)} (target: p99 ≤ {TAIL_TARGET}x the raw floor's at every size)")
    print(f"RESULT online_read ratio={one[f'{tail}_ratio_feast_over_quiver']:.1f} "
          f"quiver={one['quiver'][f'{tail}_us']:.0f}us peer={one['feast'][f'{tail}_us']:.0f}us")
    return 1 if missed and enforced else 0


if __name__ == "__main__":
    sys.exit(main())
