"""HTTP feature server: requests/s and latency for 1-entity requests, Quiver vs Feast 0.67's feature server.

Both servers run as separate processes with one worker each, on loopback, reading the same data (N
entities × 50 float64 features of one view) from one redis-server this script starts. A bounded load
generator (a few threads, each with one keep-alive connection) sends single-entity requests for random
entities, first to one server then the other, in alternating rounds; throughput is requests completed
per second of wall time, latency is measured per request at the client. Both servers must return the
same values for sampled entities.

    python benchmarks/http_server.py [--quick]
Last line: RESULT http_server ratio=<Quiver req/s / Feast req/s> quiver=<req/s>req/s peer=<req/s>req/s
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

F = 50
KEY = "bench-key"
RESULTS = Path(__file__).resolve().parent / "results"
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from online_read import feast_setup, quiver_setup, user_frame  # noqa: E402  (same data as the read benchmark)

DEFS = f"""
from quiver import Entity, FeatureView, Field, Float64, Source
user = Entity("user", ["user_id"])
events = Source("events", "data/events.parquet", timestamp_field="event_ts")
v = FeatureView("v", [user], events, ttl="30d", schema=[Field(f"f{{i}}", Float64) for i in range({F})])
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float = 90) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer")


def start_quiver(root: Path, url: str, frame: pd.DataFrame) -> tuple[subprocess.Popen[bytes], str]:
    (root / "feature_defs").mkdir(parents=True)
    (root / "feature_defs" / "defs.py").write_text(DEFS)
    (root / "data").mkdir()
    pq.write_table(pa.Table.from_pandas(frame.head(10), preserve_index=False), root / "data" / "events.parquet")
    (root / "quiver.yaml").write_text(f"project: bench\nregistry_url: sqlite:///reg.db\nredis_url: {url}\n")
    port = free_port()
    env = {**os.environ, "QUIVER_API_KEY": KEY}
    proc = subprocess.Popen([sys.executable, "-c", "from quiver.cli import main; main()", "serve", "--port",
                             str(port), "--config", str(root / "quiver.yaml")], cwd=root, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    wait_http(base + "/health", proc)
    return proc, base


def start_feast(repo: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    feast = Path(sys.executable).with_name("feast")
    proc = subprocess.Popen([str(feast), "serve", "--port", str(port), "--no-access-log", "--workers", "1",
                             "--max-requests", "100000000"], cwd=repo, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    wait_http(base + "/health", proc)
    return proc, base


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def quiver_request(user: int) -> tuple[str, dict[str, Any], dict[str, str]]:
    return ("/features/online", {"features": [f"v:f{i}" for i in range(F)], "entities": {"user_id": [user]}},
            {"X-API-Key": KEY})


def feast_request(user: int) -> tuple[str, dict[str, Any], dict[str, str]]:
    return ("/get-online-features", {"features": [f"v:f{i}" for i in range(F)], "entities": {"user_id": [user]}},
            {})


def load(base: str, make: Any, n_entities: int, requests: int, concurrency: int) -> tuple[float, list[float]]:
    """Send `requests` requests with `concurrency` threads; (wall seconds, per-request latencies)."""
    import httpx

    latencies: list[float] = []
    lock = threading.Lock()
    per_thread = requests // concurrency

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        mine: list[float] = []
        with httpx.Client(base_url=base, timeout=30) as client:
            for user in rng.integers(0, n_entities, per_thread).tolist():
                path, body, headers = make(user)
                t = time.perf_counter()
                r = client.post(path, json=body, headers=headers)
                mine.append(time.perf_counter() - t)
                if r.status_code != 200:
                    raise RuntimeError(f"{base}{path}: {r.status_code} {r.text[:200]}")
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    t = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return time.perf_counter() - t, latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, under a minute")
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    n_entities = 2_000 if args.quick else 10_000  # Feast writes ~1k entities/s: keep its setup short
    requests = 800 if args.quick else 12_000
    rounds = 2 if args.quick else 4

    import httpx

    from quiver.online.embedded import LocalRedis

    rng = np.random.default_rng(11)
    frame = user_frame(n_entities, rng)
    report: dict[str, Any] = {"entities": n_entities, "features": F, "concurrency": args.concurrency,
                              "quick": args.quick}
    began = time.perf_counter()
    with LocalRedis() as url, tempfile.TemporaryDirectory() as tmp:
        sdk, _, _ = quiver_setup(url, frame)
        sdk.close()
        feast_setup(url, frame, Path(tmp) / "feast")
        quiver_proc, quiver_base = start_quiver(Path(tmp) / "quiver", url, frame)
        feast_proc, feast_base = start_feast(Path(tmp) / "feast")
        report["setup_s"] = time.perf_counter() - began
        try:
            for user in rng.integers(0, n_entities, 20).tolist():  # same answers from both servers
                path, body, headers = quiver_request(user)
                ours = httpx.post(quiver_base + path, json=body, headers=headers).json()["features"]
                path, body, headers = feast_request(user)
                theirs = httpx.post(feast_base + path, json=body).json()
                names = theirs["metadata"]["feature_names"]
                values = {n: r["values"][0] for n, r in zip(names, theirs["results"], strict=True)}
                for i in range(F):
                    want = float(frame[f"f{i}"].iloc[user])
                    assert ours[f"f{i}"] == [want] and values[f"f{i}"] == want, (user, i)
            report["same_answers"] = True
            for base, make in ((quiver_base, quiver_request), (feast_base, feast_request)):
                load(base, make, n_entities, 40 if args.quick else 400, args.concurrency)  # warm up
            totals = {"quiver": [0.0, []], "feast": [0.0, []]}
            for _ in range(rounds):
                for name, base, make in (("quiver", quiver_base, quiver_request), ("feast", feast_base, feast_request)):
                    seconds, lat = load(base, make, n_entities, requests // rounds, args.concurrency)
                    totals[name][0] += seconds
                    totals[name][1].extend(lat)
        finally:
            stop(quiver_proc)
            stop(feast_proc)
    for name, (seconds, lat) in totals.items():
        arr = np.array(lat) * 1e3
        report[name] = {"requests": len(lat), "seconds": seconds, "rps": len(lat) / seconds,
                        "p50_ms": float(np.percentile(arr, 50)), "p99_ms": float(np.percentile(arr, 99))}
        print(f"{name:>6}: {report[name]['rps']:7.0f} req/s  p50 {report[name]['p50_ms']:6.2f} ms  "
              f"p99 {report[name]['p99_ms']:6.2f} ms  ({len(lat)} requests, {args.concurrency} connections)")
    report["ratio_rps"] = report["quiver"]["rps"] / report["feast"]["rps"]
    report["load_average"] = os.getloadavg()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "http_server.json").write_text(json.dumps(report, indent=2))
    print(f"RESULT http_server ratio={report['ratio_rps']:.1f} quiver={report['quiver']['rps']:.0f}req/s "
          f"peer={report['feast']['rps']:.0f}req/s")


if __name__ == "__main__":
    sys.exit(main())
