"""Serving logs on an object store: the request path's cost, and compaction's pay-off for readers.

Part 1, serving. Two `quiver serve-model` processes over the same model, data and Redis, which this script
starts with a moto S3 server: one logs under a local folder, the other under `s3://…` on moto (the store
root of a project with several replicas). The same client drives each at 1 row per request, one connection
(latency: p50/p99) and four connections (throughput), for the same duration, alternating which goes first
round by round, after the same warm-up. Both must return the same scores for the same requests, and after
a SIGTERM each store must hold every row it answered, else the script fails. moto runs at nice 19: a real
object store is on other hosts, and its CPU must not be billed to the request path on a two-core machine.

Part 2, compaction. A day of two replicas' serving logs written as the servers write them (one file per
replica and flush, every `--flush-s` seconds) into moto S3; the whole day read back (`read_serving_logs`),
compacted (`quiver logs compact`'s function: one file an hour), and read again. The two reads must return
the same rows, else the script fails.

    python benchmarks/serving_log_store.py [--quick] [--no-targets]
Last line: RESULT serving_log_store ratio=<p99 S3 / p99 folder, 1 row> throughput=<S3 / folder req/s>
           compaction_s=<s> read_speedup=<read before / read after>
Targets (issue 50): p99 ≤ 1.05× and throughput ≥ 0.95× the folder's (the upload is off the request path);
reads after compaction ≥ 3× faster (exit 1 when missed, unless --no-targets).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT), str(ROOT / "platform")]
RESULTS = HERE / "results"
P99_MAX, RPS_MIN, READ_SPEEDUP_MIN = 1.05, 0.95, 3.0

from http_server import wait_http  # noqa: E402
from online_read import quiver_setup, user_frame  # noqa: E402
from predict import KEY, body, load, quiver_project, start_quiver  # noqa: E402


def stats(latencies: list[float], n: int, wall: float) -> dict[str, float]:
    ms = np.array(latencies) * 1000
    return {"requests": n, "rps": n / wall, "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99))}


def serving(args: argparse.Namespace, s3: Any, url: str, tmp: Path) -> dict[str, Any]:
    import httpx

    from quiver.config import load_config
    from quiver.offline.store import store_for
    from quiver.serving.logs import read_serving_logs

    n_entities = 1_000 if args.quick else 10_000
    seconds, rounds = (2.0, 2) if args.quick else (8.0, args.rounds)
    frame = user_frame(n_entities, np.random.default_rng(5))
    quiver_setup(url, frame)[0].close()
    roots = {"folder": "data/offline", "s3": s3.uri("bench-logs", f"serving-{os.getpid()}")}
    servers: dict[str, tuple[Any, str]] = {}
    for side, offline_root in roots.items():
        quiver_project(tmp / side, url, frame)
        with open(tmp / side / "quiver.yaml", "a") as out:
            out.write(f"offline_root: {offline_root}\n")
        servers[side] = start_quiver(tmp / side)
    headers = {"X-API-Key": KEY}
    results: dict[str, dict[str, list[Any]]] = {s: {"c1": [0, 0.0, []], "c4": [0, 0.0, []]} for s in servers}
    try:
        for proc, base in servers.values():
            wait_http(base + "/health", proc)
        users = list(range(0, n_entities, max(1, n_entities // 50)))
        answers = [httpx.post(base + "/predict", json=body(users, f"check-{side}"), headers=headers).json()
                   for side, (_, base) in servers.items()]
        scores = [[p["score"] for p in a["predictions"]] for a in answers]
        if scores[0] != scores[1]:
            raise SystemExit("MISMATCH: the two servers scored the same rows differently")
        for _, base in servers.values():  # the same warm-up for both
            load(base, headers, n_entities, 1, seconds / 2, 4)
        for r in range(rounds):
            order = list(servers) if r % 2 == 0 else list(reversed(servers))
            for side in order:
                base = servers[side][1]
                for key, concurrency in (("c1", 1), ("c4", 4)):
                    n, wall, lat = load(base, headers, n_entities, 1, seconds, concurrency)
                    acc = results[side][key]
                    acc[0], acc[1] = acc[0] + n, acc[1] + wall
                    acc[2].extend(lat)
    finally:
        for proc, _ in servers.values():
            proc.send_signal(signal.SIGTERM)  # a stop writes every buffered row
        for proc, _ in servers.values():
            proc.wait(60)
    out: dict[str, Any] = {"entities": n_entities, "seconds_per_run": seconds, "rounds": rounds}
    for side in servers:
        out[side] = {key: stats(acc[2], acc[0], acc[1]) for key, acc in results[side].items()}
        logged = read_serving_logs(store_for(load_config(tmp / side / "quiver.yaml")))
        answered = sum(acc[0] for acc in results[side].values())
        out[side]["rows_logged"] = logged.num_rows
        if logged.num_rows < answered:  # warm-up and checks come on top
            raise SystemExit(f"LOST ROWS: {side} logged {logged.num_rows} rows for {answered} answered requests")
    out["p99_ratio"] = out["s3"]["c1"]["p99_ms"] / out["folder"]["c1"]["p99_ms"]
    out["rps_ratio"] = out["s3"]["c4"]["rps"] / out["folder"]["c4"]["rps"]
    return out


def compaction(args: argparse.Namespace, s3: Any) -> dict[str, Any]:
    from quiver.catalog.locations import as_location
    from quiver.serving.logs import ServingLogger, read_serving_logs
    from quiver.serving.logs.compact import compact

    rows_per_day = 200_000 if args.quick else 1_000_000
    replicas, flush_s = 2, args.flush_s or (120 if args.quick else 30)  # quick: a quarter of the files
    flushes = 86_400 // flush_s
    per_file = rows_per_day // (replicas * flushes)
    store = as_location(s3.uri("bench-logs", f"compaction-{os.getpid()}"))
    day = datetime(2026, 11, 3, tzinfo=UTC)
    rng = np.random.default_rng(3)
    began = time.perf_counter()
    for replica in range(replicas):
        with ServingLogger(store, replica=f"replica-{replica}", flush_interval_s=3_600) as logger:
            for k in range(flushes):
                ts = int((day + timedelta(seconds=k * flush_s)).timestamp() * 1e6)
                ids = [f"r{replica}-{k}-{i}" for i in range(per_file)]
                logger.log_batch(ids, {"user_id": rng.integers(0, 10_000, per_file)},
                                 {f"f{j}": rng.random(per_file) for j in range(10)}, "m:1", "champion",
                                 rng.random(per_file) * 5, rng.random(per_file),
                                 ts_us=ts + np.arange(per_file, dtype=np.int64) * (flush_s * 1_000_000 // per_file))
                logger.flush()
    written_s = time.perf_counter() - began
    end = day + timedelta(days=1)
    t = time.perf_counter()
    before = read_serving_logs(store, day, end)
    read_before = time.perf_counter() - t
    t = time.perf_counter()
    done = compact(store, day, end)
    compaction_s = time.perf_counter() - t
    t = time.perf_counter()
    after = read_serving_logs(store, day, end)
    read_after = time.perf_counter() - t
    key = [("request_id", "ascending")]
    if not before.sort_by(key).select(after.column_names).equals(after.sort_by(key)):
        raise SystemExit("MISMATCH: the day reads differently after compaction")
    return {"rows": before.num_rows, "replicas": replicas, "files_before": replicas * flushes,
            "files_after": sum(1 for _ in done), "flush_s": flush_s, "write_s": written_s,
            "compaction_s": compaction_s, "read_before_s": read_before, "read_after_s": read_after,
            "read_speedup": read_before / read_after}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes, a few minutes")
    parser.add_argument("--no-targets", action="store_true", help="report, but exit 0 when a target is missed")
    parser.add_argument("--flush-s", type=int, default=0,
                        help="seconds between a replica's files (part 2; default 30, --quick 120)")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of part 1 (full size)")
    parser.add_argument("--serving-only", action="store_true", help="part 1 only")
    args = parser.parse_args()

    from quiver.online.embedded import LocalRedis
    from tests.harness import S3Server

    report: dict[str, Any] = {"quick": args.quick}
    with tempfile.TemporaryDirectory() as folder, LocalRedis() as url:
        tmp = Path(folder)
        s3 = S3Server(tmp)
        s3.start()
        # A real object store runs on other hosts; here moto shares the two cores with the servers and the
        # client, so it runs at the lowest priority: its parsing must not be billed to the request path.
        assert s3.proc is not None
        os.setpriority(os.PRIO_PROCESS, s3.proc.pid, 19)
        os.environ.update(s3.env)  # the servers inherit the credentials (never in a URI)
        try:
            s3.create_bucket("bench-logs")
            report["serving"] = serving(args, s3, url, tmp)
            if not args.serving_only:
                report["compaction"] = compaction(args, s3)
        finally:
            s3.stop()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "serving_log_store.json").write_text(json.dumps(report, indent=2))
    s = report["serving"]
    print(f"serving, 1 row: folder p50 {s['folder']['c1']['p50_ms']:.2f} ms p99 {s['folder']['c1']['p99_ms']:.2f} ms, "
          f"{s['folder']['c4']['rps']:.0f} req/s at 4 connections; S3 p50 {s['s3']['c1']['p50_ms']:.2f} ms "
          f"p99 {s['s3']['c1']['p99_ms']:.2f} ms, {s['s3']['c4']['rps']:.0f} req/s")
    if args.serving_only:
        print(f"RESULT serving_log_store ratio={s['p99_ratio']:.3f} throughput={s['rps_ratio']:.3f}")
        return 0 if args.no_targets or (s["p99_ratio"] <= P99_MAX and s["rps_ratio"] >= RPS_MIN) else 1
    c = report["compaction"]
    print(f"compaction: {c['rows']:,} rows of {c['replicas']} replicas in {c['files_before']:,} files → "
          f"{c['files_after']} in {c['compaction_s']:.1f} s; the day read in {c['read_before_s']:.2f} s before, "
          f"{c['read_after_s']:.2f} s after")
    print(f"RESULT serving_log_store ratio={s['p99_ratio']:.3f} throughput={s['rps_ratio']:.3f} "
          f"compaction_s={c['compaction_s']:.1f} read_speedup={c['read_speedup']:.1f}")
    missed = [name for name, ok in (("p99", s["p99_ratio"] <= P99_MAX), ("throughput", s["rps_ratio"] >= RPS_MIN),
                                    ("read speedup", c["read_speedup"] >= READ_SPEEDUP_MIN)) if not ok]
    if missed and not args.no_targets:
        print(f"missed: {', '.join(missed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
