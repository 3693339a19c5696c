"""Streaming on a Flink session cluster: events/s with 1 and 2 TaskManagers beside the embedded mini-cluster.

Same job, same events, same runner settings as benchmarks/streaming.py side (a): the example catalog on
synthetic transactions (50k users, 20k-line stream files), a bounded `quiver stream --fresh` run timed from
the job running until every batch is committed and loaded, plus the feeder's pass. Sides, interleaved:

    mini      the embedded mini-cluster (the default)
    tm1       a session cluster (quiver.streaming.cluster: JobManager + 1 TaskManager, 2 slots)
    tm2       the same with 2 TaskManagers (2 slots each; the job's slots spread over both)

Each side writes its own project in one Redis; the online values of every cluster side must equal the
mini-cluster's for a sample of entities (answers checked). Where the time goes: the cluster's JVM start
(once per cluster), the runner's submit (JVM + SQL planning + job submission), processing, and CPU seconds
of the runner's process tree and of the cluster's JVMs during processing. On 2 cores expect no speed-up from
a second TaskManager: the figure shows what the cluster costs.

`--quick`: 100k events, parallelism 1, one run per side (a few minutes: every Flink job spends 10-60 s
starting, as in streaming.py). Full size: 1M events, parallelism 2, 3 runs per side (median).

Last line: RESULT streaming_cluster ratio=<tm2 ev/s / mini ev/s> quiver=<tm2 ev/s> peer=<mini ev/s>
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]

from benchmarks import streaming as base  # noqa: E402  (after the path set-up)

RESULTS = ROOT / "benchmarks" / "results" / "streaming_cluster.json"
SIDES = ("mini", "tm1", "tm2")


def jvm_cpu_s(pids: list[int]) -> float:
    """CPU seconds (user + system) the given processes have used so far."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def cluster_pids(cluster: Any) -> list[int]:
    # Each component runs in the foreground of the process we started (the scripts exec the JVM).
    return [p.pid for p in [*cluster._taskmanagers, cluster._jobmanager] if p is not None]


def project_file(root: Path, side: str) -> str:
    name = f"quiver-{side}.yaml"
    text = (root / "quiver.yaml").read_text().replace("project: bench", f"project: {side}")
    (root / name).write_text(text)
    return name


def run_side(side: str, root: Path, tmp: Path, parallelism: int, events: int, cluster: Any) -> dict[str, Any]:
    extra = ["--config", str(root / project_file(root, side))]
    if cluster is not None:
        extra += ["--jobmanager", cluster.jobmanager]
    state = tmp / f"state-{side}"
    before = jvm_cpu_s(cluster_pids(cluster)) if cluster is not None else 0.0
    figure = base.side_quiver(root, state, parallelism, events, lambda: None, *extra)
    figure["side"] = side
    if cluster is not None:
        # The whole run's cluster CPU (an idle cluster uses a little too); the runner's tree no longer holds
        # Flink's work, so its cpu_s is the client: feeder, loader, and the planning JVM.
        figure["cluster_jvm_cpu_s"] = jvm_cpu_s(cluster_pids(cluster)) - before
    return figure


def same_answers(redis_url: str, root: Path, users: int, at_us: int) -> int:
    """Every cluster side's online values equal the mini-cluster's, for a sample of users at the backlog's end."""
    import numpy as np

    from quiver.catalog.loader import load_catalog
    from quiver.config import load_config
    from quiver.online.base import ViewRead
    from quiver.online.redis_store import RedisOnlineStore

    cfg = load_config(root / "quiver.yaml")
    cat = load_catalog(cfg.catalog_dir, root=cfg.root)
    checked = 0
    with RedisOnlineStore(redis_url, "mini") as mini:
        for side in SIDES[1:]:
            with RedisOnlineStore(redis_url, side) as other:
                for view in cat.views.values():
                    if view.source != "transactions":
                        continue
                    ids = np.arange(1, min(users, 2000) + 1, dtype=np.int64)
                    reads = [ViewRead(view, tuple(view.feature_names))]
                    key = view.key_names[0]
                    checked += base._compare(mini.read(reads, {key: ids}, at_us), other.read(reads, {key: ids}, at_us),
                                             ids)
    return checked


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--events", type=int, default=None)
    p.add_argument("--parallelism", type=int, default=None)
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    from quiver.streaming.cluster import SessionCluster

    events = a.events or (100_000 if a.quick else 1_000_000)
    parallelism = a.parallelism or (1 if a.quick else 2)
    repeats = a.repeats or (1 if a.quick else 3)
    users = 50_000
    if not base.STREAM_PY.exists():
        sys.exit(f"streaming virtualenv missing: {base.STREAM_PY} (run `make setup`)")
    tmp = Path(tempfile.mkdtemp(prefix="quiver-bench-cluster-"))
    redis_proc, url = base.start_redis(tmp)
    base.REDIS_PID[:] = [redis_proc.pid]
    import pyarrow as pa
    import pyarrow.compute as pc

    clusters: dict[str, Any] = {}
    try:
        root = tmp / "project"
        tx = base.make_project(root, url, events, users)
        end_us = int(pc.max(tx.column("event_ts")).cast(pa.int64()).as_py()) + 1
        print(f"data: {events:,} events, {users:,} users; parallelism {parallelism}; the machine is shared (load "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores): compare figures within this run", flush=True)
        startup: dict[str, float] = {}
        for side, count in (("tm1", 1), ("tm2", 2)):
            began = time.time()
            clusters[side] = SessionCluster(tmp / f"cluster-{side}", taskmanagers=count).start()
            startup[side] = time.time() - began
            print(f"  {side}: cluster up in {startup[side]:.1f} s ({clusters[side].jobmanager})", flush=True)
        runs: dict[str, list[dict[str, Any]]] = {s: [] for s in SIDES}
        for rep in range(repeats):
            for side in SIDES:
                fig = run_side(side, root, tmp, parallelism, events, clusters.get(side))
                runs[side].append(fig)
                extra = (f", cluster JVMs {fig['cluster_jvm_cpu_s']:.1f} CPU s" if "cluster_jvm_cpu_s" in fig else "")
                print(f"  run {rep + 1} {side:<4} {fig['events_per_s']:>9,.0f} ev/s ({fig['processing_s']:.1f} s; "
                      f"submit {fig['startup_s']:.1f} s; runner {fig.get('cpu_s') or 0:.1f} CPU s{extra})", flush=True)
        checked = same_answers(url, root, users, end_us)
        summary = {side: {"events_per_s": statistics.median(f["events_per_s"] for f in figs),
                          "processing_s": statistics.median(f["processing_s"] for f in figs),
                          "submit_s": statistics.median(f["startup_s"] for f in figs),
                          "runner_cpu_s": statistics.median((f.get("cpu_s") or 0.0) for f in figs),
                          "cluster_jvm_cpu_s": (statistics.median(f["cluster_jvm_cpu_s"] for f in figs)
                                                if side != "mini" else None),
                          "cluster_start_s": startup.get(side)}
                   for side, figs in runs.items()}
        out = Path(a.out) if a.out else RESULTS
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"events": events, "parallelism": parallelism, "repeats": repeats,
                                   "summary": summary, "runs": runs, "answers_checked": checked}, indent=2))
        for side in SIDES:
            s = summary[side]
            print(f"{side:<5} median {s['events_per_s']:>9,.0f} ev/s, submit {s['submit_s']:.1f} s", flush=True)
        print(f"answers: {checked:,} feature values of tm1 and tm2 equal the mini-cluster's", flush=True)
        mini, tm2 = summary["mini"]["events_per_s"], summary["tm2"]["events_per_s"]
        print(f"RESULT streaming_cluster ratio={tm2 / mini:.3f} quiver={tm2:.0f}ev/s peer={mini:.0f}ev/s")
        return 0
    finally:
        for cluster in clusters.values():
            cluster.stop()
        redis_proc.terminate()
        redis_proc.wait()


if __name__ == "__main__":
    raise SystemExit(main())
