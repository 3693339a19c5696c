"""Streaming end to end: stream files or a Kafka topic → Flink (PyFlink mini-cluster) → Redis, events/s and
freshness.

Workload: the example catalog (feature_defs/: user_spend, merchant_traffic, user_last_transaction on the
`transactions` stream), synthetic transactions from pipelines/demo_data.py (50k users), written by
pipelines/stream_producer.py as 20k-line files and, for the Kafka route, produced as the same events (strict
JSON, keyed by user) to a 4-partition topic on a local KRaft broker (`_stream_kafka.py`). Every side gets
the same events, parallelism, runner settings and number of runs (interleaved; the median is reported), all
bounded runs over the pre-loaded backlog:

files route
(a)  quiver      files → feeder (checks, late split) → Flink SQL → the JVM Redis sink → Redis, timed from
                 the job running until every batch's marker is committed, plus the feeder's pass;
(a') the same over the catalog without the `transactions` contract: what its row checks cost (every
                 generated event is valid, so both feed and load the same; target: at most 10 % slower);
(b)  blackhole   the same compiled job on the same feeder output, its tile and last-value sinks swapped for
                 `blackhole`: Flink's own floor for our SQL on this machine (no answers to check);
(c)  pysink      the same job with each view's changes handed to a pandas UDF that writes Redis (a Python
                 hand-off design); its Redis values must equal Quiver's.
kafka route (the same events in the topic; no feeder: the job parses and checks in SQL)
(k)  quiver_kafka     topic → Flink SQL → the JVM Redis sink → Redis, until the job has committed every
                      partition's offset up to the end it saw at start; its values must equal (a)'s;
(kb) blackhole_kafka  the same job with blackhole sinks, its Kafka scan bounded at the offsets it finds.

JVM start and SQL planning (10-60 s per job here) are reported apart. Also: events per CPU second of each
side's process tree, Quiver's CPU split (`cpu_profile`: the Flink JVM, the runner's Python threads,
redis-server), and freshness per route: Quiver's job kept running while every 100 ms a producer sends (a file,
or records to the topic) at half of Quiver's measured rate; latency = from sent to its probe event readable
through the SDK. `--candidates`: every tuning candidate measured on its own in the same run.

Targets (issue 37): per route ≥ 50k events/s and ≥ 0.8× blackhole at 1M events, freshness p99 ≤ 1 s.
`--quick`: 100k events, parallelism 1, one run per side, 10 s of freshness probes (start-up dominates:
figures there are not comparable with the targets). Full size (`make bench`): 1M events, parallelism 1 and
2, 3 runs per side. `--sources files` or `kafka` runs one route.

Last line: RESULT streaming ratio=<files ev/s / 50000> quiver=<ev/s> peer=<blackhole ev/s> kafka=… kafka_peer=…
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import _stream_kafka

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]
STREAM_PY = Path(os.environ.get("QUIVER_STREAM_PYTHON", ROOT / ".venv-stream" / "bin" / "python"))
RESULTS = ROOT / "benchmarks" / "results" / "streaming.json"
NO_CONTRACT = "quiver-no-contract.yaml"  # the project's config over the catalog without the source contract
PROBE_BASE = 900_000_000
TARGET_EVENTS_S = 50_000
TARGET_P99_S = 1.0
TARGET_RATIO = 0.8


# ---- project and data ----


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_redis(folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    import redis

    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(folder)], stdout=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    for _ in range(200):
        try:
            if redis.Redis.from_url(url).ping():
                return proc, url
        except redis.ConnectionError:
            time.sleep(0.05)
    raise RuntimeError("redis-server did not start")


REDIS_PID: list[int] = []  # the benchmark's redis-server (its CPU is part of Quiver's profile)


def redis_cpu() -> float:
    """CPU seconds the benchmark's redis-server has used so far (0 where /proc is not readable)."""
    try:
        fields = Path(f"/proc/{REDIS_PID[0]}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def make_project(root: Path, redis_url: str, events: int, users: int, project: str = "bench") -> Any:
    """The example catalog over synthetic data; `events` transactions pre-written to the stream dir."""
    from quiver.pipelines.demo_data import generate
    from quiver.pipelines.stream_producer import produce, read_events

    shutil.copytree(ROOT / "feature_defs", root / "feature_defs")
    (root / "quiver.yaml").write_text(f"project: {project}\ncatalog: feature_defs\nregistry_url: sqlite:///"
                                      f"{root}/registry.db\noffline_root: offline\nredis_url: {redis_url}\n")
    # The same catalog without the source contract: what its row checks cost the stream (side a').
    shutil.copytree(ROOT / "feature_defs", root / "feature_defs_no_contract")
    sources = root / "feature_defs_no_contract" / "sources.py"
    text = sources.read_text()
    if "    contract=transaction_checks,\n" not in text:
        sys.exit("streaming: feature_defs/sources.py no longer declares `contract=transaction_checks`")
    sources.write_text(text.replace("    contract=transaction_checks,\n", ""))
    (root / NO_CONTRACT).write_text((root / "quiver.yaml").read_text().replace(
        "catalog: feature_defs\n", "catalog: feature_defs_no_contract\n"))
    generate(root / "data", days=1, users=users, merchants=2000, transactions_per_day=events)
    tx = read_events(root / "data" / "events" / "transactions")
    tx = tx.drop_columns([c for c in ("date",) if c in tx.column_names])
    produce(tx, root / "data" / "stream" / "transactions", rows_per_file=20_000)
    return tx


# route → (Quiver's side, the blackhole side, Quiver's state folder at a parallelism)
ROUTES = {"files": ("quiver", "blackhole", "state-p{}"), "kafka": ("quiver_kafka", "blackhole_kafka", "state-kafka-p{}")}
RUNNER_ARGS: list[str] = []  # the runner options of every side (same settings for a, b and c)


def run_quiver(root: Path, state: Path, parallelism: int, *extra: str, bounded: bool = True,
               config: str = "quiver.yaml") -> subprocess.Popen[str]:
    cmd = [str(STREAM_PY), "-m", "quiver.streaming.runner", "--config", str(root / config),
           "--state-dir", str(state), "--parallelism", str(parallelism), *RUNNER_ARGS, *extra]
    if bounded:
        cmd.append("--bounded")
    log = (state.parent / f"{state.name}.log").open("a")
    return subprocess.Popen(cmd, cwd=str(ROOT), stdout=log, stderr=subprocess.STDOUT, text=True)


def read_status(state: Path) -> dict[str, Any]:
    try:
        return dict(json.loads((state / "status.json").read_text()))
    except (OSError, ValueError):
        return {}


def side_quiver(root: Path, state: Path, parallelism: int, events: int, flush: Any, *extra: str,
                config: str = "quiver.yaml", side: str = "quiver") -> dict[str, Any]:
    """(a) source → Flink → the JVM Redis sink → Redis (files: through the feeder), until every batch or
    every record at the topic's end is committed."""
    flush()
    began = time.time()
    redis_began = redis_cpu()
    proc = run_quiver(root, state, parallelism, "--fresh", *extra, config=config)
    if proc.wait() != 0:
        raise RuntimeError(f"quiver stream failed, see {state.parent / (state.name + '.log')}")
    status = read_status(state)
    t, cpu = status["timings"], status.get("cpu_s") or {}
    if "batches_done" not in t:
        log = (state.parent / f"{state.name}.log").read_text()[-3000:]
        raise RuntimeError(f"the bounded run ended ({status.get('job_state')}) before every batch was done:\n{log}")
    # The feeder checks and splits the backlog before the job starts: its time counts too.
    seconds = t["batches_done"] - t["running"] + status["feed_s"]
    used = (cpu["batches_done"] - cpu["running"]) if cpu.get("running") is not None else None
    python = cpu["python_batches_done"] - cpu["python_running"] if "python_running" in cpu else None
    profile = {"flink_jvm_cpu_s": used - python if used and python is not None else None,
               "loader_feeder_python_cpu_s": python, "redis_server_cpu_s": redis_cpu() - redis_began,
               "loader_busy_s": status["loader"].get("busy_s")}
    return {"side": side, "parallelism": parallelism, "events": events, "events_per_s": events / seconds,
            "processing_s": seconds, "feed_s": status["feed_s"], "cpu_s": used,
            "events_per_cpu_s": events / used if used else None, "cpu_profile": profile,
            "startup_s": t["running"] - began,
            "loaded_rows": status["loader"]["rows"], "fed_lines": status["feeder"]["lines"],
            "loader_busy_s": status["loader"].get("busy_s"), "loader_polls": status["loader"]["polls"]}


def side_worker(kind: str, root: Path, state: Path, parallelism: int, events: int, *extra: str,
                config: str = "quiver.yaml", side: str | None = None) -> dict[str, Any]:
    """(b) blackhole or (c) Python sink: the same compiled job with other sinks, in the streaming venv."""
    shutil.rmtree(state, ignore_errors=True)
    cmd = [str(STREAM_PY), str(Path(__file__).with_name("_stream_worker.py")), kind, str(root / config), str(state),
           str(parallelism), json.dumps([*RUNNER_ARGS, *extra])]
    out = subprocess.run(cmd, capture_output=True, text=True, cwd=str(ROOT), timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"{kind} worker failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    used = figures["cpu_s"]
    # The same clock as Quiver's side: the feeder's pass over the backlog, then the job until done.
    seconds = figures["job_s"] + figures["feed_s"]
    return {"side": side or kind, "parallelism": parallelism, "events": events, "events_per_s": events / seconds,
            "events_per_cpu_s": events / used if used else None, "processing_s": seconds, **figures}


# ---- freshness ----


def freshness(root: Path, state: Path, parallelism: int, seconds: float, rate: int, config: str = "quiver.yaml",
              send: Any = None) -> dict[str, Any]:
    """Keep the job running; every 100 ms send `rate/10` events + one probe (a stream file, or with `send`
    records to the topic); time from sent to readable through the SDK."""
    import numpy as np
    import pyarrow as pa

    from quiver.pipelines.stream_producer import StreamWriter
    from quiver.serving.store import FeatureStore

    proc = run_quiver(root, state, parallelism, bounded=False, config=config)
    write = send or StreamWriter(root / "data" / "stream" / "transactions").write
    store = FeatureStore(root / config)
    probe_view = store.catalog.views["user_last_transaction"]
    probe_feature = next(f.name for f in probe_view.fields if f.column == "amount")
    deadline = time.time() + 120
    while read_status(state).get("state") != "running":
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError("the unbounded job did not start")
        time.sleep(0.2)
    time.sleep(3.0)  # let the restored job settle (first checkpoints, idle loader)
    rng = np.random.default_rng(1)
    written: dict[int, float] = {}
    seen: dict[int, float] = {}
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set() or len(seen) < len(written):
            pending = [p for p in list(written) if p not in seen]
            if pending:
                out = store.get_online_features([f"{probe_view.name}:{probe_feature}"],
                                                {"user_id": pending}).to_dict()
                now = time.time()
                for probe, value in zip(pending, out[probe_feature], strict=True):
                    if value == value and value is not None:  # not NaN: visible
                        seen[probe] = now
            if stop.is_set() and time.time() > stop_at[0] + 15:
                return
            time.sleep(0.005)

    stop_at = [0.0]
    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    per_file = max(rate // 10, 1)
    i = 0
    end = time.time() + seconds
    while time.time() < end:
        now_ms = int(time.time() * 1000)
        n = per_file
        probe = PROBE_BASE + i
        users = np.append(rng.integers(1, 50_000, n), probe)
        table = pa.table({
            "transaction_id": [f"live-{i}-{k}" for k in range(n + 1)],
            "user_id": pa.array(users, pa.int64()),
            "merchant_id": pa.array(rng.integers(1, 2000, n + 1), pa.int64()),
            "amount": pa.array(np.round(rng.lognormal(3.5, 0.8, n + 1), 2)),
            "category": ["grocery"] * (n + 1),
            "is_online": pa.array(rng.random(n + 1) < 0.3),
            "event_ts": pa.array(np.full(n + 1, now_ms * 1000), pa.timestamp("us", tz="UTC")),
        })
        write(table)
        written[probe] = time.time()
        i += 1
        time.sleep(max(0.0, 0.1 - (time.time() - written[probe])))
    stop_at[0] = time.time()
    stop.set()
    poller.join()
    time.sleep(2.0)  # a few more checkpoints: every view's changes of the last files are committed and loaded
    proc.terminate()
    proc.wait(timeout=60)
    store.close()
    lat = sorted(seen[p] - written[p] for p in seen)
    missing = len(written) - len(seen)
    q = (lambda f: lat[min(len(lat) - 1, int(f * len(lat)))]) if lat else (lambda f: float("nan"))
    return {"parallelism": parallelism, "probes": len(written), "missing": missing, "rate_events_s": rate,
            "p50_s": statistics.median(lat) if lat else float("nan"), "p99_s": q(0.99), "max_s": lat[-1] if lat else None}


def same_answers(root: Path, users: int, backlog_end_us: int, other: str = "quiver-peer.yaml") -> int:
    """Online values of this project and `other`'s (another route over the same events) for a sample of
    entities at the backlog's end and now: equal (floats to 1e-9: the routes sum tile partials in different
    orders). Each project reads with its own catalog (their view hashes may differ)."""

    import numpy as np

    from quiver.serving.store import FeatureStore

    checked = 0
    with FeatureStore(root / "quiver.yaml") as ours, FeatureStore(root / other) as theirs:
        for view in ours.catalog.views.values():
            if view.source != "transactions":
                continue
            ids = np.arange(1, min(users, 2000) + 1, dtype=np.int64)
            features = [f"{view.name}:{f}" for f in view.feature_names]
            for at in (backlog_end_us, int(time.time() * 1e6)):
                a = ours.get_online_features(features, {view.key_names[0]: ids}, at=at).to_dict()
                b = theirs.get_online_features(features, {view.key_names[0]: ids}, at=at).to_dict()
                checked += _compare(a, b, ids)
    return checked


def _compare(a: dict[str, list[Any]], b: dict[str, list[Any]], ids: Any) -> int:
    """Values compared (both missing: not counted); raises AssertionError naming the first difference."""
    import math

    def missing(v: Any) -> bool:
        return v is None or (isinstance(v, float) and math.isnan(v))

    checked = 0
    for name, column in a.items():
        for i, (x, y) in enumerate(zip(column, b[name], strict=True)):
            assert missing(x) == missing(y), f"{name} entity {ids[i]}: {x!r} vs {y!r}"
            if not missing(x):
                ok = x == y or (isinstance(x, float) and math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9))
                assert ok, f"{name} entity {ids[i]}: {x!r} vs {y!r}"
                checked += 1
    return checked


CANDIDATES: list[tuple[str, str, list[str]]] = [
    # (name, side, runner options) — each measured on its own against the defaults, in one run.
    ("defaults", "blackhole", []),
    ("mini-batch off", "blackhole", ["--mini-batch-ms", "0"]),
    ("hashmap state", "blackhole", ["--state-backend", "hashmap"]),
    ("object reuse off", "blackhole", ["--flink-set", "pipeline.object-reuse=false"]),
    ("rocksdb compression on", "blackhole", ["--flink-set", "state.backend.rocksdb.compression.per.level=SNAPPY_COMPRESSION"]),
    ("two-phase aggregation", "blackhole", ["--table-set", "table.optimizer.agg-phase-strategy=TWO_PHASE"]),
    ("checkpoints 250 ms", "blackhole", ["--checkpoint-interval-ms", "250"]),
    ("quiver defaults", "quiver", []),
    ("quiver checkpoints 250 ms", "quiver", ["--checkpoint-interval-ms", "250"]),
    ("quiver mini-batch off", "quiver", ["--mini-batch-ms", "0"]),
    ("quiver sink writes in the task thread", "quiver", ["--sink-in-flight", "0"]),
]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--events", type=int, default=None)
    p.add_argument("--parallelism", default=None, help="comma-separated, e.g. 1,2 (every side at each)")
    p.add_argument("--repeats", type=int, default=None, help="runs per side (the median is reported)")
    p.add_argument("--no-peer", action="store_true", help="skip (c), the Python sink")
    p.add_argument("--sources", default="files,kafka", help="routes to measure: files, kafka or both (default)")
    p.add_argument("--candidates", action="store_true", help="also measure each tuning candidate on its own")
    p.add_argument("--runner-args", default="", help="runner options for every side, e.g. '--state-backend hashmap'")
    p.add_argument("--fresh-seconds", type=float, default=None)
    p.add_argument("--out", default=None, help=f"results file (default {RESULTS.relative_to(ROOT)})")
    p.add_argument("--keep", action="store_true", help="keep the temporary project and state folders")
    a = p.parse_args()
    events = a.events or (100_000 if a.quick else 1_000_000)
    levels = [int(x) for x in (a.parallelism or ("1" if a.quick else "1,2")).split(",")]
    repeats = a.repeats or (1 if a.quick else 3)
    users = 50_000
    RUNNER_ARGS[:] = a.runner_args.split()
    if not STREAM_PY.exists():
        sys.exit(f"streaming virtualenv missing: {STREAM_PY} (run `make setup`)")
    routes = set(a.sources.split(","))
    if "kafka" in routes and (why := _stream_kafka.available()):
        sys.exit(f"streaming: the Kafka route cannot run: {why} (or pass --sources files)")
    tmp = Path(tempfile.mkdtemp(prefix="quiver-bench-stream-"))
    redis_proc, url = start_redis(tmp)
    broker = None
    REDIS_PID[:] = [redis_proc.pid]
    import pyarrow as pa
    import pyarrow.compute as pc
    import redis

    flush = redis.Redis.from_url(url).flushall
    failed = False
    try:
        began = time.time()
        root = tmp / "project"
        tx = make_project(root, url, events, users)
        end_us = int(pc.max(tx.column("event_ts")).cast(pa.int64()).as_py()) + 1
        (root / "quiver-peer.yaml").write_text((root / "quiver.yaml").read_text().replace("project: bench",
                                                                                           "project: peer"))
        print(f"data: {events:,} events, {users:,} users ({time.time() - began:.1f} s); the machine is shared "
              f"(load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores): compare figures within this run", flush=True)
        kafka_config = None
        if "kafka" in routes:
            broker = _stream_kafka.start_broker(tmp / "kafka")
            began = time.time()
            sent = _stream_kafka.load_topic(broker.bootstrap, tx)
            kafka_config = _stream_kafka.make_config(root, broker.bootstrap)
            print(f"kafka: {sent:,} records keyed by user in topic {_stream_kafka.TOPIC!r} "
                  f"({_stream_kafka.PARTITIONS} partitions, {time.time() - began:.1f} s)", flush=True)
        runs: dict[str, dict[int, list[dict[str, Any]]]] = {
            "quiver": {}, "quiver_no_contract": {}, "blackhole": {}, "pysink": {}, "quiver_kafka": {},
            "blackhole_kafka": {}}
        kafka_checked = 0
        checked = 0
        for level in levels:
            for r in range(repeats):  # interleaved, so a change in the machine's load hits every side alike
                figs = []
                if "files" in routes:
                    figs += [side_quiver(root, tmp / f"state-p{level}", level, events, flush),
                             side_quiver(root, tmp / f"state-nc-p{level}", level, events, flush, config=NO_CONTRACT,
                                         side="quiver_no_contract"),
                             side_worker("blackhole", root, tmp / "state-blackhole", level, events)]
                if kafka_config:  # its own keys: the file route's values stay for the comparison below
                    figs += [side_quiver(root, tmp / f"state-kafka-p{level}", level, events,
                                         lambda: _delete_project(url, _stream_kafka.PROJECT), config=kafka_config,
                                         side="quiver_kafka"),
                             side_worker("blackhole", root, tmp / "state-blackhole-kafka", level, events,
                                         config=kafka_config, side="blackhole_kafka")]
                    if "files" in routes:
                        kafka_checked += same_answers(root, users, end_us, other=kafka_config)
                if "files" in routes and (figs[0]["loaded_rows"] != figs[1]["loaded_rows"]
                                          or figs[0]["fed_lines"] != figs[1]["fed_lines"]):
                    print(f"FAIL: with and without the contract the answers differ: {figs[0]['fed_lines']} / "
                          f"{figs[1]['fed_lines']} lines fed, {figs[0]['loaded_rows']} / {figs[1]['loaded_rows']} rows "
                          "loaded (every generated event is valid)", flush=True)
                    failed = True
                if not a.no_peer and "files" in routes:
                    figs.append(_peer(root, tmp, level, events))
                for fig in figs:
                    runs[fig["side"]].setdefault(level, []).append(fig)
                    prof = fig.get("cpu_profile") or {}
                    split = (f"; Flink {prof['flink_jvm_cpu_s']:.1f}, loader+feeder {prof['loader_feeder_python_cpu_s']:.1f}"
                             f", Redis {prof['redis_server_cpu_s']:.1f}") if prof.get("flink_jvm_cpu_s") else ""
                    print(f"p={level} run {r + 1} {fig['side']:>9}: {fig['events_per_s']:>8,.0f} ev/s  "
                          f"({fig['processing_s']:.1f} s, {fig.get('cpu_s') or 0:.1f} CPU s{split})", flush=True)
            if not a.no_peer and "files" in routes:  # Quiver's Redis values == the Python sink's (same events)
                checked += same_answers(root, users, end_us)
        median = {side: {lvl: statistics.median(f["events_per_s"] for f in figs) for lvl, figs in by.items()}
                  for side, by in runs.items() if by}
        per_cpu = {side: {lvl: statistics.median(f["events_per_cpu_s"] or 0 for f in figs) for lvl, figs in by.items()}
                   for side, by in runs.items() if by}
        seconds = a.fresh_seconds or (10.0 if a.quick else 30.0)
        summary: dict[str, dict[str, Any]] = {}
        for route, (ours, floor, state) in ROUTES.items():
            if route not in routes:
                continue
            best = max(levels, key=lambda lvl: median[ours][lvl])
            eps, floor_eps = median[ours][best], median[floor][best]
            live = {} if route == "files" else {"config": kafka_config, "send": _stream_kafka.send(broker.bootstrap)}
            fresh = freshness(root, tmp / state.format(best), best, seconds, rate=max(int(eps / 2), 100), **live)
            if fresh["missing"]:
                failed = True
                print(f"FAIL ({route}): probe events never became visible online", flush=True)
            met = {"events_per_s": eps >= TARGET_EVENTS_S, "ratio_to_blackhole": eps / floor_eps >= TARGET_RATIO,
                   "freshness_p99_s": fresh["p99_s"] <= TARGET_P99_S}
            summary[route] = {"best_parallelism": best, "events_per_s": eps, "blackhole_events_per_s": floor_eps,
                              "ratio_to_blackhole": eps / floor_eps, "freshness": fresh, "met": met}
            print(f"{route} (p={best}): {eps:,.0f} ev/s = {eps / floor_eps:.2f}× blackhole ({floor_eps:,.0f}); "
                  f"freshness at {fresh['rate_events_s']:,} ev/s (half): p50 {fresh['p50_s']:.2f} s, p99 "
                  f"{fresh['p99_s']:.2f} s ({fresh['probes']} probes, {fresh['missing']} not seen); targets "
                  f"≥ {TARGET_EVENTS_S:,} ev/s, ≥ {TARGET_RATIO}×, p99 ≤ {TARGET_P99_S} s: "
                  + ", ".join(f"{k} {'met' if v else 'missed'}" for k, v in met.items()), flush=True)
        if kafka_config and "files" in routes:
            print(f"kafka route == file route: {kafka_checked:,} online values equal", flush=True)
        main_route = summary.get("files") or summary["kafka"]
        best, quiver_eps = main_route["best_parallelism"], main_route["events_per_s"]
        floor_eps = main_route["blackhole_events_per_s"]
        candidates = []
        if a.candidates and "files" in routes:
            for name, side, extra in CANDIDATES:
                if side == "quiver":
                    fig = side_quiver(root, tmp / "state-candidate", best, events, flush, *extra)
                else:
                    fig = side_worker(side, root, tmp / "state-candidate", best, events, *extra)
                candidates.append({"name": name, "options": extra, **fig})
                print(f"candidate {name:>28} ({side}): {fig['events_per_s']:>8,.0f} ev/s, "
                      f"{fig['events_per_cpu_s'] or 0:,.0f} ev/CPU s", flush=True)
        contract = None
        if "files" in routes:
            with_c, without_c = median["quiver"][best], median["quiver_no_contract"][best]
            feed_with = statistics.median(f["feed_s"] for f in runs["quiver"][best])
            feed_without = statistics.median(f["feed_s"] for f in runs["quiver_no_contract"][best])
            contract = {"with_events_per_s": with_c, "without_events_per_s": without_c,
                        "slowdown": without_c / with_c - 1.0, "feed_s_with": feed_with,
                        "feed_s_without": feed_without, "target_slowdown": 0.10}
            print(f"contract (p={best}): {with_c:,.0f} ev/s with, {without_c:,.0f} without "
                  f"({contract['slowdown']:+.1%}); feeder {feed_with:.2f} s with, {feed_without:.2f} s without",
                  flush=True)
        result = {
            "contract": contract, "routes": summary,
            "events": events, "users": users, "quick": a.quick, "parallelism": levels, "runs_per_side": repeats,
            "runner_args": RUNNER_ARGS, "sides": runs, "median_events_per_s": median,
            "median_events_per_cpu_s": per_cpu, "best_parallelism": best,
            "quiver_events_per_s": quiver_eps, "blackhole_events_per_s": floor_eps,
            "ratio_to_target": quiver_eps / TARGET_EVENTS_S, "ratio_to_blackhole": quiver_eps / floor_eps,
            "ratio_to_python_sink": (quiver_eps / median["pysink"][best]) if "pysink" in median else None,
            "freshness": main_route["freshness"], "freshness_p50_s": main_route["freshness"]["p50_s"],
            "freshness_p99_s": main_route["freshness"]["p99_s"],
            "values_compared": checked, "kafka_values_compared": kafka_checked, "candidates": candidates,
            "targets": {"events_per_s": TARGET_EVENTS_S, "ratio_to_blackhole": TARGET_RATIO,
                        "freshness_p99_s": TARGET_P99_S},
            "host": {"cpus": os.cpu_count(), "load": os.getloadavg(),
                     "note": "shared machine (several agents): figures are noisy; compare within one run"}}
        out = Path(a.out) if a.out else RESULTS
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2, default=str))
        kafka = summary.get("kafka")
        print(f"RESULT streaming ratio={quiver_eps / TARGET_EVENTS_S:.2f} quiver={quiver_eps:.0f}ev/s "
              f"peer={floor_eps:.0f}ev/s" + (f" kafka={kafka['events_per_s']:.0f}ev/s "
                                             f"kafka_peer={kafka['blackhole_events_per_s']:.0f}ev/s" if kafka else ""))
    finally:
        if broker is not None:
            broker.stop()
        redis_proc.terminate()
        redis_proc.wait()
        if a.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failed else 0


def _delete_project(url: str, project: str) -> None:
    """Delete one project's keys (the other routes' values stay for the comparison)."""
    import redis

    client = redis.Redis.from_url(url)
    for key in client.scan_iter(match=f"q:{project}:*", count=1000):
        client.delete(key)


def _peer(root: Path, tmp: Path, level: int, events: int) -> dict[str, Any]:
    """(c) on the same events into its own project's keys (so both answers can be compared)."""
    import redis

    from quiver.config import load_config

    cfg = load_config(root / "quiver-peer.yaml")
    client = redis.Redis.from_url(cfg.redis_url)
    for key in client.scan_iter(match="q:peer:*", count=1000):
        client.delete(key)
    return side_worker("pysink", root, tmp / "state-pysink", level, events, config="quiver-peer.yaml")


if __name__ == "__main__":
    raise SystemExit(main())
