"""Point-in-time join at scale on a Spark standalone cluster: Quiver's Spark engine beside Feast's Spark offline
store, 100k → 1M (→ 10M with --full) labels over events at 10× the labels.

Data: benchmarks/pit_join.py's generator (same seed, 8 days, entities = labels / 10): source events, Quiver's
offline store (last values and 5-minute tiles, layout.py) and Feast's one events file hold the same events.
Features: the 8 of pit_join's service — view `lv` (5 last values, ttl 1 d) and view `win` (count 1 h, mean
24 h, max 24 h of f0). Feast's feature views have no windowed aggregates, so Feast does the 5 last values:
  quiver_lv   get_historical_features(engine="spark"), the 5 last values (the same job as Feast's)
  quiver_all  the same with all 8 features (what a Quiver user runs)
  feast       Feast 0.67 SparkOfflineStore.get_historical_features, the 5 last values
Every job is its own Spark application on the same cluster (one master, --workers workers of --cores cores
and --executor-memory each, started here from pyspark's scripts), with the same session settings
(quiver.offline.engines.SPARK_CONF), the same labels handed over as a pandas frame on the driver, the same
untimed warm-up (the first 10 % of the labels) and the same --repeats timed runs (the median is reported).

Measured per run: wall time; executor CPU-seconds (user + system of the executor JVMs, GC and JIT
included, from /proc via psutil — the figure the target is about) beside Spark's own task CPU time (REST
API); shuffle bytes written (REST API); peak RSS of each executor JVM and of the driver (Python + its JVM).
Answers: --sample labels (default 20,000) are also joined by Quiver's embedded DuckDB engine, and every job's
values for them must equal it (floats to 1e-9); any difference fails the run (non-zero exit).

Feast's as-of rule is event_ts <= t, Quiver's event_ts < t; labels sit at odd and events at even µs, so both
select the same rows. The machine this ran on is a shared 2-core box: figures say what load it had.
Last line: RESULT pit_scale ratio=<feast/quiver_lv executor CPU at the largest size both finished> …
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pit_join  # the shared data generator and checks
from _spark_cluster import Cluster, Executors, free_port, settled_stage_totals

ROOT = Path(__file__).resolve().parents[1]
SIZES = {"100k": 100_000, "1m": 1_000_000, "10m": 10_000_000}
LV, WIN = pit_join.LV, pit_join.WIN
JOBS = ("quiver_lv", "quiver_all", "feast")


def data_for(base: Path, labels: int) -> Path:
    data = base / f"labels-{labels}"
    pit_join.generate(data, labels, labels * 10, max(labels // 10, 1))
    return data


def disk_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


# --- workers: one Spark application each ------------------------------------------------------------------


# The driver takes the labels in and every label's answer back (both products collect to it): 2g holds 1M
# labels; 10M needs more (the docs' model: ~1.5 GB per million labels, 8g with the Arrow transfer).
DRIVER_MEMORY = {"100k": "2g", "1m": "2g", "10m": "8g"}


def session_conf(ui_port: int, executor_memory: str, driver_memory: str = "2g") -> dict[str, str]:
    """The same settings for every job: Quiver's SPARK_CONF plus a UI for the REST API and fast metrics."""
    return {"spark.ui.enabled": "true", "spark.ui.port": str(ui_port), "spark.executor.memory": executor_memory,
            "spark.driver.memory": driver_memory,
            "spark.executor.heartbeatInterval": "2s", "spark.executor.metrics.pollingInterval": "500ms",
            "spark.app.name": "quiver-bench", "spark.sql.execution.arrow.pyspark.enabled": "true"}


def _quiver_job(data: Path, master: str, features: list[str]) -> Any:
    from quiver.offline.pit import get_historical_features

    catalog, config = pit_join.catalog_and_config(data / "project")
    config = replace(config, spark_master=master)

    def run(labels: Any) -> pa.Table:
        frame = get_historical_features(labels, features, catalog=catalog, config=config, engine="spark",
                                        timestamp_column="event_timestamp")
        return pa.Table.from_pandas(frame[["label_id", *[f.split(":")[1] for f in features]]], preserve_index=False)

    return run


def _feast_job(data: Path, master: str, _: list[str]) -> Any:
    import tempfile
    from datetime import timedelta

    from feast import Entity, FeatureStore, FeatureView, Field
    from feast.infra.offline_stores.contrib.spark_offline_store.spark_source import SparkSource
    from feast.types import Float64, Int64

    repo = Path(tempfile.mkdtemp(prefix="feast-spark-bench-"))
    (repo / "feature_store.yaml").write_text(
        "project: bench\nregistry: registry.db\nprovider: local\noffline_store:\n  type: spark\n"
        f"  spark_conf:\n    spark.master: \"{master}\"\n"
        "online_store:\n  type: sqlite\n  path: online.db\nentity_key_serialization_version: 3\n")
    user = Entity(name="user", join_keys=["user_id"])
    source = SparkSource(name="events", path=str(data / "feast_events.parquet"), file_format="parquet",
                         timestamp_field="event_ts")
    view = FeatureView(name="lv", entities=[user], ttl=timedelta(days=1), source=source,
                       schema=[*(Field(name=f"f{i}", dtype=Float64) for i in range(4)), Field(name="f4", dtype=Int64)])
    store = FeatureStore(repo_path=str(repo))
    store.apply([user, view])

    def run(labels: Any) -> pa.Table:
        job = store.get_historical_features(entity_df=labels[["label_id", "user_id", "event_timestamp"]],
                                            features=[f"lv:{f}" for f in LV])
        table: pa.Table = job.to_arrow()
        return table.select(["label_id", *LV])

    return run


def run_worker(name: str, data: Path, master: str, repeats: int, sample: np.ndarray, executor_memory: str,
               driver_memory: str = "2g") -> dict[str, Any]:
    import psutil

    from quiver.offline.engines import spark_session

    ui = free_port()
    driver_rss = pit_join.PeakRss()
    spark = spark_session(master, conf=session_conf(ui, executor_memory, driver_memory))  # Feast adopts it
    app = spark.sparkContext.applicationId
    features = [f"lv:{f}" for f in LV] + ([f"win:{f}" for f in WIN] if name == "quiver_all" else [])
    job = (_feast_job if name == "feast" else _quiver_job)(data, master, features)
    labels = pq.read_table(data / "labels.parquet").to_pandas()
    executors = Executors(app)
    job(labels.iloc[: max(len(labels) // 10, 1)])  # warm-up: JIT, class loading, file listing caches
    runs, answer = [], None
    me = psutil.Process()
    for _ in range(repeats):
        stages0, exec0 = settled_stage_totals(ui, app), executors.cpu_seconds()
        cpu0 = me.cpu_times()
        t0 = time.perf_counter()
        answer = job(labels)
        wall = time.perf_counter() - t0
        cpu1 = me.cpu_times()
        stages1, exec1 = settled_stage_totals(ui, app), executors.cpu_seconds()
        new = [v for k, v in stages1.items() if k not in stages0]
        runs.append({"wall_s": wall, "executor_cpu_s": exec1 - exec0,
                     "task_cpu_s": sum(s["cpu_ns"] for s in new) / 1e9,
                     "driver_python_cpu_s": (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system),
                     "shuffle_write_bytes": sum(s["shuffle_write"] for s in new),
                     "shuffle_read_bytes": sum(s["shuffle_read"] for s in new),
                     "input_bytes": sum(s["input"] for s in new)})
    peaks = executors.stop()
    assert answer is not None
    picked = answer.take(pc.index_in(pa.array(sample), answer["label_id"]))
    pq.write_table(picked, data / "answers" / f"scale_{name}.parquet")
    summary = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    return {**summary, "runs": runs, "executors": len(peaks),
            "peak_rss_per_executor_mb": max(peaks.values(), default=0) / 2**20,
            "peak_rss_driver_mb": driver_rss.stop() / 2**20, "rows": answer.num_rows}


def reference(data: Path, sample: np.ndarray) -> pa.Table:
    """Quiver's embedded DuckDB engine on the sampled labels: the answers every job must give."""
    from quiver.offline.pit import get_historical_features

    catalog, config = pit_join.catalog_and_config(data / "project")
    labels = pq.read_table(data / "labels.parquet")
    picked = labels.take(pc.index_in(pa.array(sample), labels["label_id"])).to_pandas()
    frame = get_historical_features(picked, [f"lv:{f}" for f in LV] + [f"win:{f}" for f in WIN], catalog=catalog,
                                    config=config, timestamp_column="event_timestamp")
    return pa.Table.from_pandas(frame[["label_id", *LV, *WIN]], preserve_index=False)


def differences(data: Path, sample: np.ndarray, done: list[str]) -> dict[str, int]:
    expected = reference(data, sample)
    out = {}
    for name in done:
        got = pq.read_table(data / "answers" / f"scale_{name}.parquet")
        missing = int(pc.sum(pc.is_null(pc.index_in(pa.array(sample), got["label_id"]))).as_py() or 0)
        got = got.take(pc.index_in(expected["label_id"], got["label_id"]))
        columns = LV + (WIN if name == "quiver_all" else [])
        out[name] = missing + sum(pit_join._same(got[c], expected[c]) for c in columns)
    return out


# --- driver ----------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100k,1m", help="comma-separated: 100k, 1m, 10m (default 100k,1m)")
    parser.add_argument("--full", action="store_true", help="add 10m (10M labels / 100M events)")
    parser.add_argument("--jobs", default=",".join(JOBS))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cores", type=int, default=1, help="cores per worker")
    parser.add_argument("--executor-memory", default="1500m")
    parser.add_argument("--driver-memory", default="", help="each job's driver JVM (default by size: "
                        + ", ".join(f"{k} {v}" for k, v in DRIVER_MEMORY.items()) + ")")
    parser.add_argument("--sample", type=int, default=20_000)
    parser.add_argument("--data", type=Path, default=ROOT / "data" / "bench" / "pit_scale")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--master", help=argparse.SUPPRESS)
    parser.add_argument("--size", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        data = data_for(args.data, SIZES[args.size])
        sample = pq.read_table(data / "sample.parquet")["label_id"].to_numpy()
        print(json.dumps(run_worker(args.worker, data, args.master, args.repeats, sample, args.executor_memory,
                                    args.driver_memory or DRIVER_MEMORY[args.size])))
        return
    sizes = [s for s in args.sizes.split(",") if s] + (["10m"] if args.full and "10m" not in args.sizes else [])
    jobs = [j for j in args.jobs.split(",") if j]
    results: dict[str, Any] = {"sizes": {}, "load_average_at_start": os.getloadavg(), "cpus": os.cpu_count(),
                               "cluster": {"workers": args.workers, "cores_per_worker": args.cores,
                                           "executor_memory": args.executor_memory,
                                           "driver_memory": args.driver_memory or DRIVER_MEMORY}}
    failures: dict[str, Any] = {}
    began = time.perf_counter()
    with Cluster(args.data / "cluster", workers=args.workers, cores=args.cores, memory="3g") as cluster:
        for size in sizes:
            n = SIZES[size]
            t0 = time.perf_counter()
            data = data_for(args.data, n)
            (data / "answers").mkdir(exist_ok=True)
            rng = np.random.default_rng(3)
            sample = np.sort(rng.choice(n, size=min(args.sample, n), replace=False))
            pq.write_table(pa.table({"label_id": pa.array(sample)}), data / "sample.parquet")
            entry: dict[str, Any] = {"labels": n, "events": 10 * n, "generate_s": time.perf_counter() - t0,
                                     "disk_bytes": disk_bytes(data), "jobs": {}}
            for job in jobs:
                cmd = [sys.executable, __file__, "--worker", job, "--master", cluster.url, "--size", size,
                       "--data", str(args.data), "--repeats", str(args.repeats),
                       "--executor-memory", args.executor_memory,
                       "--driver-memory", args.driver_memory or DRIVER_MEMORY[size]]
                env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYTHONPATH": str(ROOT / "platform")}
                out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
                if out.returncode:
                    entry["jobs"][job] = {"failed": out.stderr[-3000:]}
                    print(f"{size} {job}: FAILED\n{out.stderr[-3000:]}", flush=True)
                    continue
                run = entry["jobs"][job] = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"{size:5s} {job:10s} wall {run['wall_s']:8.1f} s  executor CPU {run['executor_cpu_s']:8.1f} s "
                      f"(tasks {run['task_cpu_s']:7.1f} s)  driver CPU {run['driver_python_cpu_s']:6.1f} s  "
                      f"shuffle {run['shuffle_write_bytes'] / 2**20:8.1f} MiB  peak/executor "
                      f"{run['peak_rss_per_executor_mb']:6.0f} MB  driver {run['peak_rss_driver_mb']:6.0f} MB  "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)
            finished = [j for j in jobs if "failed" not in entry["jobs"][j]]
            entry["differences"] = differences(data, sample, finished)
            entry["sample"] = len(sample)
            if any(entry["differences"].values()):
                failures[size] = entry["differences"]
            if "quiver_lv" in finished and "feast" in finished:
                entry["cpu_ratio_feast_over_quiver_lv"] = (entry["jobs"]["feast"]["executor_cpu_s"]
                                                           / entry["jobs"]["quiver_lv"]["executor_cpu_s"])
            print(f"{size}: answers on {len(sample):,} sampled labels vs DuckDB: {entry['differences']}", flush=True)
            results["sizes"][size] = entry
    results["wall_s"] = time.perf_counter() - began
    results["load_average_at_end"] = os.getloadavg()
    out_file = ROOT / "benchmarks" / "results" / "pit_scale.json"
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(json.dumps(results, indent=2))
    if failures:
        raise SystemExit(f"pit_scale: answers differ from DuckDB's: {failures}")
    both = [s for s in sizes if "cpu_ratio_feast_over_quiver_lv" in results["sizes"][s]]
    if both:
        last = results["sizes"][both[-1]]
        print(f"RESULT pit_scale ratio={last['cpu_ratio_feast_over_quiver_lv']:.2f} "
              f"quiver={last['jobs']['quiver_lv']['executor_cpu_s']:.1f}cpu_s "
              f"peer={last['jobs']['feast']['executor_cpu_s']:.1f}cpu_s size={both[-1]}")


if __name__ == "__main__":
    main()
