"""Streaming end to end: stream files → Flink (PyFlink mini-cluster) → Redis, events/s and freshness.

Workload: the example catalog (feature_defs/: user_spend, merchant_traffic, user_last_transaction on the
`transactions` stream), synthetic transactions from pipelines/demo_data.py (50k users) written by
pipelines/stream_producer.py as 20k-line files. Figures:

* throughput: a bounded run over N pre-written events at each parallelism; events / (time from the job
  running to every batch committed and loaded into Redis). JVM start and SQL planning (the constant cost
  of a job, 10-40 s here) are reported separately. Repeats: the median.
* freshness: the same job kept running (restored from the bounded run's checkpoint) while a producer
  writes a file every 100 ms (background load + one probe event for a fresh user); latency = from the
  file's atomic rename to the probe's value being visible through the online SDK (`FeatureStore`).
* peer: the Python hand-off design it replaces (DESIGN.md §6): the same compiled Flink SQL, but each
  view's changes go to a vectorised pandas UDF that writes Redis through the same online writer. Both
  runs' online values are compared for a sample of users (must be equal).

`--quick`: 50k events, parallelism 2, 5 s of freshness probes, the peer on the same 50k events. It takes
2-3 minutes here, not < 60 s: each of its three Flink jobs spends 25-40 s starting on this loaded machine.

Last line: RESULT streaming ratio=<peer_time/quiver_time> quiver=<ev/s> peer=<ev/s>
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

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]
STREAM_PY = Path(os.environ.get("QUIVER_STREAM_PYTHON", ROOT / ".venv-stream" / "bin" / "python"))
RESULTS = ROOT / "benchmarks" / "results" / "streaming.json"
PROBE_BASE = 900_000_000
TARGET_EVENTS_S = 50_000
TARGET_P99_S = 2.0


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


def make_project(root: Path, redis_url: str, events: int, users: int, project: str = "bench") -> Any:
    """The example catalog over synthetic data; `events` transactions pre-written to the stream dir."""
    from pipelines.demo_data import generate
    from pipelines.stream_producer import produce, read_events

    shutil.copytree(ROOT / "feature_defs", root / "feature_defs")
    (root / "quiver.yaml").write_text(f"project: {project}\ncatalog: feature_defs\nregistry_url: sqlite:///"
                                      f"{root}/registry.db\noffline_root: offline\nredis_url: {redis_url}\n")
    generate(root / "data", days=1, users=users, merchants=2000, transactions_per_day=events)
    tx = read_events(root / "data" / "events" / "transactions")
    tx = tx.drop_columns([c for c in ("date",) if c in tx.column_names])
    produce(tx, root / "data" / "stream" / "transactions", rows_per_file=20_000)
    return tx


RUNNER_ARGS: list[str] = []  # --state-backend / --checkpoint-interval-ms from the command line


def run_quiver(root: Path, state: Path, parallelism: int, *extra: str, bounded: bool = True) -> subprocess.Popen[str]:
    cmd = [str(STREAM_PY), "-m", "quiver.streaming.runner", "--config", str(root / "quiver.yaml"),
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


def throughput(root: Path, state: Path, parallelism: int, events: int, flush: Any) -> dict[str, float]:
    flush()
    began = time.time()
    proc = run_quiver(root, state, parallelism, "--fresh")
    if proc.wait() != 0:
        raise RuntimeError(f"quiver stream failed, see {state.parent / (state.name + '.log')}")
    status = read_status(state)
    t = status["timings"]
    seconds = t["batches_done"] - t["running"]
    return {"parallelism": parallelism, "events": events, "events_per_s": events / seconds,
            "processing_s": seconds, "startup_s": t["running"] - began, "wall_s": t["finished"] - began,
            "loaded_rows": status["loader"]["rows"]}


# ---- freshness ----


def freshness(root: Path, state: Path, parallelism: int, seconds: float, rate: int) -> dict[str, Any]:
    """Keep the job running; write a file every 100 ms with `rate/10` events + one probe; time visibility."""
    import numpy as np
    import pyarrow as pa

    from pipelines.stream_producer import StreamWriter
    from quiver.serving.store import FeatureStore

    proc = run_quiver(root, state, parallelism, bounded=False)
    writer = StreamWriter(root / "data" / "stream" / "transactions")
    store = FeatureStore(root / "quiver.yaml")
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
        writer.write(table)
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


# ---- peer: Python hand-off (runs inside the streaming venv) ----


def peer_worker(config_path: str, state: str) -> None:
    """The compiled job, but each view's changes go through a pandas UDF that writes Redis itself."""
    import pandas as pd
    import pyarrow as pa
    from pyflink.table import DataTypes, EnvironmentSettings, TableEnvironment
    from pyflink.table.udf import ScalarFunction, udf

    from quiver.catalog.loader import load_catalog
    from quiver.compile.flink import FlinkTarget, compile_flink, streamed_views
    from quiver.config import load_config
    from quiver.offline.layout import last_values_schema, tile_schema
    from quiver.streaming.feeder import Feeder
    from quiver.streaming.paths import StreamPaths

    cfg = load_config(config_path)
    cat = load_catalog(cfg.catalog_dir, root=cfg.root)
    views = streamed_views(cat)
    paths = StreamPaths.at(state)
    sources = sorted({v.source for v in views})
    fed = Feeder({s: Path(cfg.root) / cat.sources[s].stream.path for s in sources}, paths).feed()  # type: ignore[union-attr]
    job = compile_flink(cat, FlinkTarget(inbox={s: paths.inbox(s).as_uri() for s in sources},
                                         sink_root=paths.sinks.as_uri()))

    class RedisWriter(ScalarFunction):  # type: ignore[misc]
        def __init__(self, view: Any, schema: pa.Schema, url: str, project: str):
            self.view, self.schema, self.url, self.project = view, schema, url, project

        def open(self, function_context: Any) -> None:
            from quiver.online.redis_store import RedisOnlineStore

            self.store = RedisOnlineStore(self.url, self.project, timeout_s=10)

        def eval(self, *columns: pd.Series) -> pd.Series:
            table = pa.table({f.name: pa.array(c.to_numpy(), type=pa.int64() if pa.types.is_timestamp(f.type)
                                                else f.type, from_pandas=True)
                              for f, c in zip(self.schema, columns, strict=True)})
            if self.view.kind == "agg":
                self.store.write_tiles(self.view, table)
            else:
                self.store.write_last_values(self.view, table.cast(self.schema))
            return pd.Series([0] * len(columns[0]))

    env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
    conf = env.get_config()
    for k, v in job.settings:
        conf.set(k, v)
    conf.set("parallelism.default", "1")
    conf.set("python.executable", sys.executable)
    conf.set("python.fn-execution.bundle.time", "100")
    for statement in job.statements:
        # A bounded scan: at parallelism 1 nothing finishes early, and the job ends when the data does.
        env.execute_sql(statement.replace(",\n  'source.monitor-interval' = '200 ms'", ""))
    ss = env.create_statement_set()
    for insert in job.inserts:
        head, _, body = insert.partition("\n")
        table = head.split("`")[1]
        kind, _, name = table.partition("__")
        if kind not in ("tiles", "last"):
            ss.add_insert_sql(insert)
            continue
        view = cat.views[name]
        schema = tile_schema(view) if kind == "tiles" else last_values_schema(view)
        fn = udf(RedisWriter(view, schema, cfg.redis_url, cfg.project), result_type=DataTypes.BIGINT(),
                 func_type="pandas")
        env.create_temporary_function(f"write_{name}", fn)
        env.execute_sql(f"CREATE TABLE `peer_{name}` (x BIGINT) WITH ('connector' = 'blackhole')")
        cols = ", ".join(f"`{f.name}`" for f in schema)
        ss.add_insert_sql(f"INSERT INTO `peer_{name}` SELECT write_{name}({cols}) FROM (\n{body}\n)")
    began = time.time()
    result = ss.execute()
    running = time.time()
    result.wait()
    print(json.dumps({"submit_s": running - began, "processing_s": time.time() - running, "lines": fed.total_lines}))


def run_peer(root: Path, events: int, flush: Any) -> dict[str, Any]:
    flush()
    (root / "quiver-peer.yaml").write_text((root / "quiver.yaml").read_text().replace("project: bench",
                                                                                        "project: peer"))
    state = root / "peer-state"
    shutil.rmtree(state, ignore_errors=True)
    out = subprocess.run([str(STREAM_PY), __file__, "--peer-worker", str(root / "quiver-peer.yaml"), str(state)],
                         capture_output=True, text=True, cwd=str(ROOT), timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"peer failed:\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}")
    figures = json.loads(out.stdout.strip().splitlines()[-1])
    return {"events": figures["lines"], "events_per_s": figures["lines"] / figures["processing_s"], **figures}


def same_answers(redis_url: str, root: Path, users: int, backlog_end_us: int) -> int:
    """Online values of both projects for a sample of entities at the backlog's end and now: equal
    (floats to 1e-9: the two paths sum tile partials in different orders)."""

    import numpy as np

    from quiver.catalog.loader import load_catalog
    from quiver.config import load_config
    from quiver.online.base import ViewRead
    from quiver.online.redis_store import RedisOnlineStore

    cfg = load_config(root / "quiver.yaml")
    cat = load_catalog(cfg.catalog_dir, root=cfg.root)
    checked = 0
    with RedisOnlineStore(redis_url, "bench") as ours, RedisOnlineStore(redis_url, "peer") as peer:
        for view in cat.views.values():
            if view.source != "transactions":
                continue
            key = view.key_names[0]
            ids = np.arange(1, min(users, 2000) + 1, dtype=np.int64)
            reads = [ViewRead(view, tuple(view.feature_names))]
            for at in (backlog_end_us, int(time.time() * 1e6)):
                checked += _compare(ours.read(reads, {key: ids}, at), peer.read(reads, {key: ids}, at), ids)
    return checked


def _compare(a: Any, b: Any, ids: Any) -> int:
    import math

    checked = 0
    for name in a:
        for i in range(len(ids)):
            va, vb = a[name].valid[i], b[name].valid[i]
            assert va == vb, f"{name} entity {ids[i]}: valid {va} vs {vb}"
            if va:
                x, y = a[name].values[i], b[name].values[i]
                ok = x == y or (isinstance(x, float) and math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-9))
                assert ok, f"{name} entity {ids[i]}: {x!r} vs {y!r}"
                checked += 1
    return checked


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--events", type=int, default=None)
    p.add_argument("--parallelism", default=None, help="comma-separated, e.g. 1,2")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--no-peer", action="store_true")
    p.add_argument("--state-backend", choices=("rocksdb", "hashmap"), default="rocksdb")
    p.add_argument("--checkpoint-interval-ms", type=int, default=250)
    p.add_argument("--runner-args", default="", help="extra runner options, e.g. '--roll-interval-ms 100'")
    p.add_argument("--fresh-rate", type=int, default=None, help="background events/s during the freshness probes")
    p.add_argument("--peer-worker", nargs=2, metavar=("CONFIG", "STATE"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.peer_worker:
        peer_worker(*a.peer_worker)
        return 0
    events = a.events or (50_000 if a.quick else 1_000_000)
    levels = [int(x) for x in (a.parallelism or ("2" if a.quick else "1,2")).split(",")]
    repeats = a.repeats or (1 if a.quick else 3)
    users = 50_000
    RUNNER_ARGS[:] = ["--state-backend", a.state_backend, "--checkpoint-interval-ms", str(a.checkpoint_interval_ms),
                      *a.runner_args.split()]
    if not STREAM_PY.exists():
        sys.exit(f"streaming virtualenv missing: {STREAM_PY} (run `make setup`)")
    tmp = Path(tempfile.mkdtemp(prefix="quiver-bench-stream-"))
    redis_proc, url = start_redis(tmp)
    import pyarrow as pa
    import pyarrow.compute as pc
    import redis

    flush = redis.Redis.from_url(url).flushall
    try:
        began = time.time()
        tx_end: dict[Path, int] = {}
        tx = make_project(tmp / "project", url, events, users)
        tx_end[tmp / "project"] = pc.max(tx.column("event_ts")).cast(pa.int64()).as_py()
        print(f"data: {events:,} events, {users:,} users ({time.time() - began:.1f} s)", flush=True)
        root = tmp / "project"
        runs: dict[int, list[dict[str, float]]] = {}
        for level in levels:
            for r in range(repeats):
                fig = throughput(root, tmp / f"state-p{level}", level, events, flush)
                runs.setdefault(level, []).append(fig)
                print(f"quiver p={level} run {r + 1}: {fig['events_per_s']:,.0f} ev/s "
                      f"(processing {fig['processing_s']:.1f} s, job start {fig['startup_s']:.1f} s)", flush=True)
        best_level = levels[-1]
        fresh = freshness(root, tmp / f"state-p{best_level}", best_level, 5.0 if a.quick else 30.0,
                          rate=a.fresh_rate or (2_000 if a.quick else 5_000))
        print(f"freshness p={best_level}: p50 {fresh['p50_s']:.2f} s, p99 {fresh['p99_s']:.2f} s "
              f"({fresh['probes']} probes, {fresh['missing']} not seen)", flush=True)
        median = {lvl: statistics.median(f["events_per_s"] for f in figs) for lvl, figs in runs.items()}
        quiver_eps = median[best_level]
        peer: dict[str, Any] | None = None
        checked = 0
        if not a.no_peer:
            peer_events = events if a.quick else min(events, 200_000)
            if peer_events != events:  # the peer reads the same stream dir: give it a smaller one
                shutil.rmtree(tmp / "peer", ignore_errors=True)
                tx = make_project(tmp / "peer", url, peer_events, users)
                root_peer = tmp / "peer"
                tx_end[root_peer] = pc.max(tx.column("event_ts")).cast(pa.int64()).as_py()
            else:
                root_peer = root
            keep = flush if root_peer != root else (lambda: None)  # same data: keep our run's values to compare
            peer = run_peer(root_peer, peer_events, keep)
            if root_peer != root:  # same answers: our job over the peer's (smaller) stream too
                throughput(root_peer, tmp / "state-check", best_level, peer_events, lambda: None)
            end_us = int(tx_end[root_peer]) + 1
            checked = same_answers(url, root_peer, users, end_us)
            print(f"peer (pandas UDF sink, p=1): {peer['events_per_s']:,.0f} ev/s; {checked:,} values equal",
                  flush=True)
        result = {"events": events, "users": users, "quick": a.quick, "runner_args": RUNNER_ARGS, "throughput": runs,
                  "median_events_per_s": median, "freshness": fresh, "peer": peer, "values_compared": checked,
                  "targets": {"events_per_s": TARGET_EVENTS_S, "freshness_p99_s": TARGET_P99_S},
                  "host": {"cpus": os.cpu_count(), "load": os.getloadavg()}}
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(result, indent=2, default=str))
        if peer:
            ratio = quiver_eps / peer["events_per_s"]
            print(f"RESULT streaming ratio={ratio:.2f} quiver={quiver_eps:.0f}ev/s peer={peer['events_per_s']:.0f}ev/s")
        else:
            print(f"RESULT streaming ratio={quiver_eps / TARGET_EVENTS_S:.2f} quiver={quiver_eps:.0f}ev/s "
                  f"peer={TARGET_EVENTS_S}ev/s")
    finally:
        redis_proc.terminate()
        redis_proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
