"""Backfill throughput: tiles of one aggregation view with Quiver's DuckDB engine and Quiver's Spark engine.

What the ratio compares: the same `backfill()` of the same catalog on the same cores (`--cores`, default 2:
DuckDB `SET threads = N`, Spark `local[N]`). Both engines are Quiver's; the peer is Spark because it is the
scale-out path (standalone / Kubernetes), so the ratio is what Spark's overheads cost at one-machine size,
not a comparison with another product.

Workload (full): 10M synthetic events of 50k users over 7 days, written with numpy/pyarrow into 8 Parquet
files; view `spend` tiles `amount` (count/sum/mean/max/stddev/last over 1 h and 24 h) and a bool
(`mean`) into 5-minute tiles. `--quick`: 1M events. Each engine runs the whole `backfill()` (file checks,
stats, tiles, atomic swap of the 7 date partitions, registry run) `--repeats` times; the figure is the
median, in source events per second. Spark's session start and an untimed warm-up backfill of 20k events
(both engines) come first and are reported separately. Figures come from a busy, shared 2-core machine. Both stores are compared: same tile keys and counts, sums and maxima equal to 1e-9.

Each engine also runs with a contract on the source (checks every generated event passes), each contract
run right after a plain one: the tiles must equal those without it, and the slowdown is the row filter's cost
(target: at most 10 %).

Last line: RESULT backfill ratio=<spark_time/duckdb_time> quiver=<duckdb ev/s> peer=<spark ev/s>
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "platform"))
DAY0 = date(2026, 11, 1)
DAYS, USERS, FILES = 7, 50_000, 8
US_PER_DAY = 86_400_000_000


def generate(folder: Path, events: int, seed: int = 7) -> None:
    """Events in time order (as a log would be), split into FILES files."""
    rng = np.random.default_rng(seed)
    start = (DAY0 - date(1970, 1, 1)).days * US_PER_DAY
    ts = np.sort(start + rng.integers(0, DAYS * US_PER_DAY, events))
    users = rng.integers(1, USERS + 1, events)
    amount = np.round(rng.lognormal(3.5, 0.8, events), 2)
    online = rng.random(events) < 0.3
    folder.mkdir(parents=True, exist_ok=True)
    for i, chunk in enumerate(np.array_split(np.arange(events), FILES)):
        table = pa.table({"user_id": users[chunk], "amount": amount[chunk], "is_online": online[chunk],
                          "event_ts": pa.array(ts[chunk], pa.timestamp("us", tz="UTC"))})
        pq.write_table(table, folder / f"events-{i:02d}.parquet", row_group_size=1_000_000)


def catalog_and_config(project: Path, cores: int = 2, contract: bool = False) -> tuple[Any, Any]:
    """The benchmark's catalog; with `contract`, the source declares the checks a real feed would (every
    generated event passes them, so the tiles are the same: only their cost shows)."""
    from quiver import Aggregation, Check, Contract, Entity, FeatureView, Int64, Source
    from quiver.catalog.validate import build_catalog
    from quiver.config import Config

    user = Entity("user", ["user_id"], dtype=Int64)
    checks = Contract({"user_id": Check(not_null=True, min=1), "amount": Check(not_null=True, finite=True, min=0.0,
                                                                               max=1e9),
                       "event_ts": Check(max_future="5m")}) if contract else None
    events = Source("events", path="events", timestamp_field="event_ts", contract=checks)
    aggs = [Aggregation("amount", fn, w) for w in ("1h", "24h") for fn in ("count", "sum", "mean", "max")]
    aggs += [Aggregation("amount", "stddev", "24h"), Aggregation("amount", "last", "24h"),
             Aggregation("is_online", "mean", "24h")]
    spend = FeatureView("spend", [user], events, aggregations=aggs, tile="5m")
    config = Config(root=project, project="bench", offline_root="offline",
                    registry_url=f"sqlite:///{project}/registry.db", spark_master=f"local[{cores}]")
    return build_catalog([user, events, spend], project), config


def run(config: Any, catalog: Any, engine: str, repeats: int, cores: int) -> tuple[list[float], Any]:
    from quiver.offline.backfill import backfill

    times, report = [], None
    for _ in range(repeats):
        began = time.perf_counter()
        # DuckDB gets `cores` threads; Spark gets them from config.spark_master (local[cores]).
        report = backfill(config, catalog, DAY0, DAY0 + timedelta(days=DAYS - 1), engine=engine,
                          threads=cores if engine == "duckdb" else None)
        times.append(time.perf_counter() - began)
    return times, report


def read_tiles(root: Path) -> pa.Table:
    files = sorted((root / "spend" / "tiles").rglob("*.parquet"))
    table = pa.concat_tables(pq.read_table(f) for f in files)
    return table.sort_by([("user_id", "ascending"), ("tile_start", "ascending")])


def compare(a: pa.Table, b: pa.Table) -> dict[str, Any]:
    """Same tiles: keys and counts exactly, float partials to 1e-9."""
    if a.num_rows != b.num_rows:
        sys.exit(f"backfill: answers differ: {a.num_rows} tiles from duckdb, {b.num_rows} from spark")
    for column in a.column_names:
        x, y = a.column(column).to_numpy(zero_copy_only=False), b.column(column).to_numpy(zero_copy_only=False)
        if x.dtype.kind == "f":
            ok = np.allclose(x, y, rtol=1e-9, atol=0, equal_nan=True)
        else:
            ok = bool(np.array_equal(x, y))
        if not ok:
            sys.exit(f"backfill: answers differ: tile column {column} differs between engines")
    return {"tiles": a.num_rows, "events": int(pc.sum(a.column("n_events")).as_py()),
            "amount_sum": float(pc.sum(a.column("amount__sum")).as_py())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1M events instead of 10M")
    parser.add_argument("--events", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per engine (default 2 quick, 3 full)")
    parser.add_argument("--cores", type=int, default=2, help="cores for both engines (DuckDB threads, Spark local[N])")
    args = parser.parse_args()
    cores = args.cores
    events = args.events or (1_000_000 if args.quick else 10_000_000)
    repeats = args.repeats or (2 if args.quick else 3)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from quiver.offline.engines import spark_session, stop_spark

    with tempfile.TemporaryDirectory(prefix="quiver-bench-backfill-") as tmp:
        project = Path(tmp)
        began = time.perf_counter()
        generate(project / "events", events)
        gen_s = time.perf_counter() - began
        catalog, config = catalog_and_config(project, cores)
        duck_cfg = replace(config, offline_root="offline-duckdb")
        spark_cfg = replace(config, offline_root="offline-spark")
        # Untimed warm-up on 20k events of another project: loads classes and JITs Spark's code paths,
        # so the timed runs measure the backfill, not the JVM's first minute.
        generate(project / "warm" / "events", 20_000)
        warm_catalog, warm_config = catalog_and_config(project / "warm", cores)
        run(warm_config, warm_catalog, "duckdb", 1, cores)
        began = time.perf_counter()
        spark_session(f"local[{cores}]")
        spark_start_s = time.perf_counter() - began
        began = time.perf_counter()
        run(replace(warm_config, offline_root="offline-spark"), warm_catalog, "spark", 1, cores)
        spark_warmup_s = time.perf_counter() - began
        # The same backfills with the source's contract: what checking every row costs each engine. Runs
        # interleave (plain, contract, plain, …) so that a JVM still warming up or a neighbour's load lands on
        # both sides alike.
        checked, _ = catalog_and_config(project, cores, contract=True)
        duck_c_cfg, spark_c_cfg = (replace(config, offline_root=f"offline-{e}-contract") for e in ("duckdb", "spark"))
        duck_times, spark_times, duck_c_times, spark_c_times = [], [], [], []
        for _ in range(repeats):
            times, duck_report = run(duck_cfg, catalog, "duckdb", 1, cores)
            duck_times += times
            duck_c_times += run(duck_c_cfg, checked, "duckdb", 1, cores)[0]
            times, spark_report = run(spark_cfg, catalog, "spark", 1, cores)
            spark_times += times
            spark_c_times += run(spark_c_cfg, checked, "spark", 1, cores)[0]
        stop_spark()
        check = compare(read_tiles(duck_cfg.offline_dir), read_tiles(spark_cfg.offline_dir))
        compare(read_tiles(duck_cfg.offline_dir), read_tiles(duck_c_cfg.offline_dir))  # all valid: the same tiles
        compare(read_tiles(spark_cfg.offline_dir), read_tiles(spark_c_cfg.offline_dir))
        if not check["events"] == events == duck_report.views["spend"].events_read \
                or spark_report.views["spend"].rows_written != duck_report.views["spend"].rows_written:
            sys.exit(f"backfill: answers differ: {check['events']} events in tiles, {events} generated, "
                     f"{duck_report.views['spend'].events_read} read; rows written duckdb "
                     f"{duck_report.views['spend'].rows_written} spark {spark_report.views['spend'].rows_written}")

    duck_s, spark_s = statistics.median(duck_times), statistics.median(spark_times)
    duck_c_s, spark_c_s = statistics.median(duck_c_times), statistics.median(spark_c_times)
    contract = {"duckdb_s": [round(t, 3) for t in duck_c_times], "spark_s": [round(t, 3) for t in spark_c_times],
                "duckdb_events_per_s": round(events / duck_c_s), "spark_events_per_s": round(events / spark_c_s),
                "duckdb_slowdown": round(duck_c_s / duck_s - 1, 4), "spark_slowdown": round(spark_c_s / spark_s - 1, 4),
                "checks": "user_id not null and >= 1; amount not null, finite, in [0, 1e9]; event_ts at most 5m "
                          "after the clock", "target_slowdown": 0.10}
    result = {
        "contract": contract,
        "benchmark": "backfill", "mode": "quick" if args.quick else "full", "events": events, "users": USERS,
        "days": DAYS, "files": FILES, "repeats": repeats, "warmup_runs": 1, "cores": cores,
        "duckdb_threads": cores, "spark_master": f"local[{cores}]",
        "ratio_compares": "Quiver DuckDB engine vs Quiver Spark engine, same backfill, same cores",
        "generate_s": round(gen_s, 3),
        "duckdb_s": [round(t, 3) for t in duck_times], "spark_s": [round(t, 3) for t in spark_times],
        "spark_session_start_s": round(spark_start_s, 3), "spark_warmup_s": round(spark_warmup_s, 3),
        "duckdb_events_per_s": round(events / duck_s), "spark_events_per_s": round(events / spark_s),
        "ratio_spark_over_duckdb": round(spark_s / duck_s, 3), "check": check,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "note": "busy machine shared with other jobs"},
    }
    out = ROOT / "benchmarks" / "results" / "backfill.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{events:,} events → {check['tiles']:,} tiles; data generated in {gen_s:.1f} s")
    print(f"same cores on both sides: {cores} (DuckDB threads={cores}, Spark local[{cores}]); "
          f"the ratio compares Quiver's DuckDB engine with Quiver's own Spark engine (busy shared machine)")
    print(f"duckdb threads={cores}: median {duck_s:.2f} s of {duck_times} → {events / duck_s:,.0f} events/s")
    print(f"spark local[{cores}]: median {spark_s:.2f} s of {spark_times} → {events / spark_s:,.0f} events/s "
          f"(session start {spark_start_s:.1f} s and warm-up {spark_warmup_s:.1f} s, not timed)")
    print(f"with the source contract: duckdb {events / duck_c_s:,.0f} events/s ({contract['duckdb_slowdown']:+.1%}), "
          f"spark {events / spark_c_s:,.0f} events/s ({contract['spark_slowdown']:+.1%}); tiles equal")
    print(f"RESULT backfill ratio={spark_s / duck_s:.2f} quiver={events / duck_s:.0f}ev/s "
          f"peer={events / spark_s:.0f}ev/s")


if __name__ == "__main__":
    main()
