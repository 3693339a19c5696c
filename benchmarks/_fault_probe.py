"""Fault probe of `quiver serve` (not a peer benchmark, so `make bench` skips it): what clients see while
Redis is stalled (SIGSTOP) and after it comes back, and how long recovery takes after a Redis restart.

One `quiver serve` process (redis_timeout_s 1.0, the default) on a redis-server this script starts, with
N entities × 50 float64 features. Phases: normal load; Redis paused for `--pause` seconds under the same
load, with /health and /metrics polled every 100 ms; resume; then Redis restarted (empty, no persistence).
Load: 4 threads, each one keep-alive connection, single-entity requests, 2 s client timeout.

    python benchmarks/_fault_probe.py [--pause 5]
Writes benchmarks/results/fault_probe.json; figures depend on the machine (a busy shared one here).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from http_server import F, free_port, quiver_request, start_quiver, stop  # noqa: E402
from online_read import quiver_setup  # noqa: E402

RESULTS = HERE / "results"


def start_redis(port: int, directory: Path) -> subprocess.Popen[bytes]:
    import redis

    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-server not on PATH")
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(directory)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            if redis.Redis(port=port, socket_timeout=1).ping():
                return proc
        except redis.RedisError:
            time.sleep(0.02)
    raise SystemExit("redis-server did not start")


def hammer(base: str, n: int, seconds: float, threads: int = 4) -> dict[str, Any]:
    """Requests for `seconds` from `threads` connections: statuses and latencies."""
    import httpx

    statuses: Counter[str] = Counter()
    latencies: list[float] = []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        mine, lat = Counter[str](), []
        with httpx.Client(base_url=base, timeout=2.0) as client:
            while time.monotonic() < deadline:
                path, body, headers = quiver_request(int(rng.integers(0, n)))
                began = time.perf_counter()
                try:
                    mine[str(client.post(path, json=body, headers=headers).status_code)] += 1
                except httpx.TimeoutException:
                    mine["client timeout"] += 1
                lat.append(time.perf_counter() - began)
        with lock:
            statuses.update(mine)
            latencies.extend(lat)

    began = time.monotonic()
    workers = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall = time.monotonic() - began
    arr = np.array(latencies) * 1e3
    return {"seconds": wall, "responses_per_s": len(latencies) / wall, "statuses": dict(statuses),
            "p50_ms": float(np.percentile(arr, 50)), "p99_ms": float(np.percentile(arr, 99))}


def poll(base: str, path: str, stop_at: float) -> dict[str, Any]:
    import httpx

    lat, codes = [], Counter[str]()
    with httpx.Client(base_url=base, timeout=5.0) as client:
        while time.monotonic() < stop_at:
            began = time.perf_counter()
            try:
                codes[str(client.get(path).status_code)] += 1
            except httpx.TimeoutException:
                codes["client timeout (5 s)"] += 1
            lat.append(time.perf_counter() - began)
            time.sleep(0.1)
    arr = np.array(lat) * 1e3
    return {"polls": len(lat), "statuses": dict(codes), "p50_ms": float(np.percentile(arr, 50)),
            "max_ms": float(arr.max())}


def until_ok(base: str, timeout: float = 30.0) -> float:
    """Seconds until a feature request answers 200 again."""
    import httpx

    began = time.monotonic()
    path, body, headers = quiver_request(1)
    with httpx.Client(base_url=base, timeout=2.0) as client:
        while time.monotonic() - began < timeout:
            try:
                if client.post(path, json=body, headers=headers).status_code == 200:
                    return time.monotonic() - began
            except httpx.HTTPError:
                pass
            time.sleep(0.01)
    raise SystemExit("no recovery within 30 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pause", type=float, default=5.0, help="seconds Redis stays stopped")
    parser.add_argument("--entities", type=int, default=2_000)
    args = parser.parse_args()
    n = args.entities
    rng = np.random.default_rng(3)
    frame = pd.DataFrame({"user_id": np.arange(n, dtype=np.int64),
                          "event_ts": pd.Timestamp(datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1))})
    for i in range(F):
        frame[f"f{i}"] = rng.random(n)
    report: dict[str, Any] = {"entities": n, "features": F, "pause_s": args.pause, "redis_timeout_s": 1.0}
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        redis_proc = start_redis(port, Path(tmp))
        url = f"redis://127.0.0.1:{port}/0"
        sdk, _, _ = quiver_setup(url, frame)
        sdk.close()
        server, base = start_quiver(Path(tmp) / "quiver", url, frame)
        try:
            hammer(base, n, 2.0)  # warm up
            report["normal"] = hammer(base, n, args.pause)
            redis_proc.send_signal(signal.SIGSTOP)
            stop_at = time.monotonic() + args.pause
            polls: dict[str, Any] = {}
            pollers = [threading.Thread(target=lambda p=p: polls.setdefault(p, poll(base, p, stop_at)))
                       for p in ("/health", "/metrics")]
            for t in pollers:
                t.start()
            report["paused"] = hammer(base, n, args.pause)
            for t in pollers:
                t.join()
            report["paused"]["health"], report["paused"]["metrics"] = polls["/health"], polls["/metrics"]
            redis_proc.send_signal(signal.SIGCONT)
            report["recovery_after_resume_s"] = until_ok(base)
            redis_proc.terminate()
            redis_proc.wait(10)
            redis_proc = start_redis(port, Path(tmp))  # answers PING from here on
            report["recovery_after_restart_s"] = until_ok(base)
        finally:
            stop(server)
            redis_proc.send_signal(signal.SIGCONT)
            redis_proc.terminate()
            redis_proc.wait(10)
    report["load_average"] = os.getloadavg()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "fault_probe.json").write_text(json.dumps(report, indent=2))
    normal, paused = report["normal"], report["paused"]
    print(f"normal:  {normal['responses_per_s']:.0f} responses/s {normal['statuses']}")
    print(f"paused:  {paused['responses_per_s']:.0f} responses/s {paused['statuses']}  p99 {paused['p99_ms']:.1f} ms")
    print(f"/health while paused: p50 {paused['health']['p50_ms']:.1f} ms, max {paused['health']['max_ms']:.1f} ms "
          f"{paused['health']['statuses']}; /metrics p50 {paused['metrics']['p50_ms']:.1f} ms, "
          f"max {paused['metrics']['max_ms']:.1f} ms")
    print(f"recovery: {report['recovery_after_resume_s'] * 1e3:.0f} ms after SIGCONT, "
          f"{report['recovery_after_restart_s'] * 1e3:.0f} ms after a restart answered PING")


if __name__ == "__main__":
    main()
