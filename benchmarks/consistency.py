"""Serving logs as truth: the consistency job's speed, and the time log and wait saves against a full backfill.

World: N users, source events over 8 days; views `lv` (4 last values, ttl 1 d), `win` (f0 count 1 h and
mean 24 h, 5 min tiles) and `added` (f1 max 24 h, 5 min tiles): the feature a new model version wants and
the serving logs never held. R requests of the last day are logged with the `lv` and `win` values a fresh
online store serves (the point-in-time values, through the real `ServingLogger`), and each gets a label
in the label store. `--quick`: 2k users, 200k events, 20k requests; full: 50k users, 5M events, 500k.

Timed, medians of `--repeats` runs after one untimed warm-up, the same threads for every side:
  consistency   `run_consistency` over every logged row (no sample), nothing recorded: rows compared / s
  full          the full backfill a new feature costs without logs: `backfill` of all three views over the
                8 days, then `get_historical_features` of the 7 features on the logged requests
  log_and_wait  `backfill` of the added view only, then `get_logged_features` of the same 7 features
                (6 from the logs, 1 point-in-time)
Checks (each fails the run): the consistency report finds every compared value equal; the two training
sets are equal value for value. RESULT: full time / log-and-wait time, and consistency rows per second.

    python benchmarks/consistency.py [--quick] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
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

US, DAY = 1_000_000, 86_400_000_000
START = datetime(2026, 11, 1, tzinfo=UTC)
DAYS = 8
SIZES = {"quick": (2_000, 200_000, 20_000), "full": (50_000, 5_000_000, 500_000)}
RESULTS = Path(__file__).resolve().parent / "results"
DEFINITIONS = '''
from quiver import Aggregation, Entity, FeatureService, FeatureView, Field, Float64, Int64, Source

user = Entity(name="user", join_keys=["user_id"], dtype=Int64)
events = Source(name="events", path="data/events", timestamp_field="event_ts")
lv = FeatureView(name="lv", entities=[user], source=events, ttl="1d",
                 schema=[Field("f0", Float64), Field("f1", Float64), Field("f2", Float64), Field("f3", Float64)])
win = FeatureView(name="win", entities=[user], source=events, tile="5m",
                  aggregations=[Aggregation("f0", "count", "1h"), Aggregation("f0", "mean", "24h")])
added = FeatureView(name="added", entities=[user], source=events, tile="5m",
                    aggregations=[Aggregation("f1", "max", "24h")])
served = FeatureService(name="served", features=[lv, win])
wanted = FeatureService(name="wanted", features=[lv, win, added])
'''
SERVED = ["f0", "f1", "f2", "f3", "f0_count_1h", "f0_mean_24h"]
WANTED = [*SERVED, "f1_max_24h"]


def build(root: Path, users: int, n_events: int, n_requests: int) -> tuple[Any, Any, datetime, datetime]:
    """The project, its offline store (all views backfilled), the serving logs and the labels."""
    from quiver.catalog.loader import load_catalog
    from quiver.config import load_config
    from quiver.monitoring.labels import write_labels
    from quiver.offline.backfill import backfill
    from quiver.offline.pit import get_historical_features
    from quiver.serving.logs import ServingLogger, log_schema

    (root / "feature_defs").mkdir(parents=True)
    (root / "feature_defs" / "definitions.py").write_text(DEFINITIONS)
    (root / "quiver.yaml").write_text(f"project: bench\nregistry_url: sqlite:///{root}/registry.db\n"
                                      f"offline_root: data/offline\n")
    config = load_config(root / "quiver.yaml")
    rng = np.random.default_rng(11)
    start_us = int(START.timestamp()) * US
    ts = np.sort(start_us + rng.integers(0, DAYS * DAY // 2, n_events) * 2)  # even µs; requests are odd
    table = pa.table({"user_id": pa.array(rng.integers(0, users, n_events)),
                      "event_ts": pa.array(ts).cast(pa.timestamp("us", tz="UTC")),
                      **{f"f{i}": pa.array(rng.normal(size=n_events)) for i in range(4)}})
    day = (ts - start_us) // DAY
    for d in range(DAYS):
        folder = root / "data" / "events" / f"date={(START + timedelta(days=d)).date()}"
        folder.mkdir(parents=True)
        pq.write_table(table.take(pa.array(np.flatnonzero(day == d))), folder / "part-0.parquet")
    catalog = load_catalog(config.catalog_dir, root=config.root)
    backfill(config, catalog, START.date(), (START + timedelta(days=DAYS - 1)).date())
    begin, end = START + timedelta(days=DAYS - 1), START + timedelta(days=DAYS)
    request_us = np.sort(int(begin.timestamp()) * US + rng.integers(0, DAY // 2, n_requests) * 2 + 1)
    rows = pd.DataFrame({"user_id": rng.integers(0, users, n_requests),
                         "event_ts": pd.to_datetime(request_us, unit="us", utc=True)})
    served = get_historical_features(rows, "served", catalog=catalog, config=config)  # a fresh store serves these
    ids = np.array([f"r{i}" for i in range(n_requests)], dtype=object)
    with ServingLogger(config.offline_dir, schema=log_schema(catalog), flush_rows=100_000,
                       max_buffer_bytes=4 << 30) as logger:  # every row kept: the check counts them
        for chunk in np.array_split(np.arange(n_requests), max(1, n_requests // 50_000)):
            logger.log_batch(ids[chunk].tolist(), {"user_id": rows["user_id"].to_numpy()[chunk]},
                             {f: served[f].to_numpy()[chunk] for f in SERVED}, model_version="bench:1",
                             predictions=rng.random(len(chunk)), ts_us=request_us[chunk])
    write_labels(config.offline_dir, ids.tolist(), rng.binomial(1, 0.1, n_requests).astype(float).tolist(), end)
    return config, catalog, begin, end


def timed(fn: Any, repeats: int) -> tuple[float, Any]:
    fn()  # warm-up: imports, page cache
    times, out = [], None
    for _ in range(repeats):
        began = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times), out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="DuckDB threads of every backfill")
    args = parser.parse_args(argv)
    from quiver.monitoring.consistency_job import ConsistencySettings, run_consistency
    from quiver.monitoring.logged_features import get_logged_features
    from quiver.offline.backfill import backfill
    from quiver.offline.pit import get_historical_features

    users, n_events, n_requests = SIZES["quick" if args.quick else "full"]
    with tempfile.TemporaryDirectory(prefix="quiver-consistency-bench-") as tmp:
        began = time.perf_counter()
        config, catalog, begin, end = build(Path(tmp) / "project", users, n_events, n_requests)
        print(f"setup: {n_events:,} events, {n_requests:,} logged requests ({time.perf_counter() - began:.0f} s)",
              flush=True)
        first, last = START.date(), (START + timedelta(days=DAYS - 1)).date()
        settings = ConsistencySettings(sample_rows=n_requests)

        def consistency() -> Any:
            return run_consistency(config, service="served", start=begin, end=end, settings=settings,
                                   catalog=catalog, record=False).report

        def full() -> pd.DataFrame:
            backfill(config, catalog, first, last, threads=args.threads)
            rows = get_logged_labels(config, begin, end)
            return get_historical_features(rows, "wanted", catalog=catalog, config=config)

        def log_and_wait() -> pd.DataFrame:
            backfill(config, catalog, first, last, views=["added"], threads=args.threads)
            return get_logged_features("wanted", config=config, catalog=catalog, start=begin, end=end).frame

        t_cons, report = timed(consistency, args.repeats)
        t_full, full_frame = timed(full, args.repeats)
        t_logs, logs_frame = timed(log_and_wait, args.repeats)
    failures = check(report, full_frame, logs_frame, n_requests)
    result = {"size": "quick" if args.quick else "full", "users": users, "events": n_events,
              "requests": n_requests, "repeats": args.repeats, "threads": args.threads,
              "consistency_s": round(t_cons, 3), "consistency_rows_per_s": round(n_requests / t_cons),
              "full_backfill_s": round(t_full, 3), "log_and_wait_s": round(t_logs, 3),
              "ratio": round(t_full / t_logs, 2), "failures": failures}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"consistency{'-quick' if args.quick else ''}.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    print(f"RESULT consistency ratio={result['ratio']} (full backfill {t_full:.2f} s / log and wait {t_logs:.2f} s) "
          f"consistency={result['consistency_rows_per_s']:,} rows/s")
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    return 1 if failures else 0


def get_logged_labels(config: Any, begin: datetime, end: datetime) -> pd.DataFrame:
    """The full backfill's label rows: each logged request's user and time, read from the logs directly."""
    from quiver.serving.logs import read_serving_logs

    logged = read_serving_logs(config.offline_dir, begin, end)
    return pd.DataFrame({"request_id": logged["request_id"].to_pandas(),
                         "user_id": logged["key.user_id"].to_numpy(),
                         "event_ts": logged["ts"].to_pandas()})


def check(report: Any, full: pd.DataFrame, logs: pd.DataFrame, n: int) -> list[str]:
    failures = []
    if report.rows_compared != n:
        failures.append(f"consistency compared {report.rows_compared:,} rows of {n:,}")
    compared = sorted(f.feature.partition(":")[2] for f in report.features)
    if compared != sorted(SERVED):
        failures.append(f"consistency compared {compared}, not the served features {sorted(SERVED)}")
    for feature in report.features:
        if feature.equal != feature.compared or feature.compared != n:
            failures.append(f"consistency: {feature.feature} {feature.equal:,} equal of {feature.compared:,}")
    a = full.set_index("request_id")[WANTED].sort_index()
    b = logs.set_index("request_id")[WANTED].sort_index()
    try:
        pd.testing.assert_frame_equal(a, b)
    except AssertionError as exc:
        failures.append(f"the log-and-wait training set differs from the full backfill's: {exc}")
    return failures


if __name__ == "__main__":
    sys.exit(main())
