"""Fair under load: light clients of `quiver serve-model` alone, then beside one heavy client, in one run.

The light clients (`--light` connections from 127.0.0.1, 1-row requests back to back) run `--seconds` alone,
then again while a heavy client (`--heavy` connections from 127.0.0.2, each sending the largest request the
server takes, `--heavy-rows` rows, back to back) hammers the same server. Each client is its own process with
the same minimal keep-alive client (`_http_client.py`), so the light side's numbers are not its own GIL's; the
heavy bodies are built once, so the heavy client spends its CPU sending, not encoding JSON.

Fair: the light clients keep ≥ 0.7× their alone-throughput and their p99 stays ≤ 2× alone
(docs/prediction.md, "Fair under load"). The answers are checked: every light reply is a 200 with one
prediction, and the same light request scores the same with and without the heavy client (it fails otherwise).

    python benchmarks/fairness.py [--quick] [--seconds 10] [--light 2] [--heavy 8] [--heavy-rows 1000]
Last line: RESULT fairness ratio=<light req/s with heavy / alone> quiver=<with> peer=<alone>
           p99_ratio=<with / alone>  (the peer is the same server without the heavy client)
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
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT), str(ROOT / "platform")]
RESULTS = HERE / "results"
TARGET_RATIO = 0.7
TARGET_P99 = 2.0
N_USERS = 2_000

from _http_client import KeepAliveClient  # noqa: E402
from _serving_fault_probe import KEY, start, start_redis, stop  # noqa: E402
from http_server import free_port, wait_http  # noqa: E402
from online_read import quiver_setup, user_frame  # noqa: E402
from predict import MODEL, body, quiver_project  # noqa: E402


def request_body(users: list[int], tag: str) -> bytes:
    return json.dumps(body(users, tag)).encode()


def client_main(a: argparse.Namespace) -> int:
    """One client process: `--connections` threads posting prebuilt bodies until `--seconds` have passed."""
    rng = np.random.default_rng(a.seed)
    bodies = [request_body(rng.integers(0, N_USERS, a.rows).tolist(), f"{a.client}{k}") for k in range(16)]
    probe = request_body([7], "probe")  # one fixed light request: its score is compared across phases
    statuses: Counter[str] = Counter()
    latencies: list[float] = []
    answers: list[bytes] = []
    errors: list[str] = []
    lock = threading.Lock()
    deadline = time.perf_counter() + a.seconds

    def worker(k: int) -> None:
        client = KeepAliveClient(f"http://127.0.0.1:{a.port}", {"X-API-Key": KEY}, source=a.source)
        mine: list[float] = []
        seen: Counter[str] = Counter()
        n = 0
        try:
            if k == 0 and a.client == "light":
                status, answer = client.post(probe)
                with lock:
                    answers.append(answer)
            while time.perf_counter() < deadline:
                began = time.perf_counter()
                status, answer = client.post(bodies[n % len(bodies)])
                mine.append(time.perf_counter() - began)
                seen[str(status)] += 1
                if a.client == "light" and (status != 200 or answer.count(b'"request_id"') != a.rows):
                    raise RuntimeError(f"light request answered {status}: {answer[:200]!r}")
                n += 1
        except Exception as exc:
            with lock:
                errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            client.close()
            with lock:
                latencies.extend(mine)
                statuses.update(seen)

    began = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(a.connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - began
    if errors:
        print(f"{a.client} client failed: {errors[0]}", file=sys.stderr)
        return 1
    ms = np.asarray(latencies or [0.0]) * 1e3
    ok = statuses.get("200", 0)
    print(json.dumps({"requests_per_s": len(latencies) / wall, "ok_per_s": ok / wall, "statuses": dict(statuses),
                      "ok_rows_per_s": ok * a.rows / wall, "p50_ms": float(np.percentile(ms, 50)),
                      "p99_ms": float(np.percentile(ms, 99)),
                      "probe": answers[0].decode() if answers else None}))
    return 0


def run_client(port: int, role: str, seconds: float, connections: int, rows: int, source: str,
               seed: int) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, __file__, "--client", role, "--port", str(port), "--seconds",
                             str(seconds), "--connections", str(connections), "--rows", str(rows), "--source", source,
                             "--seed", str(seed)], stdout=subprocess.PIPE, text=True)


def result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"a client failed (exit {proc.returncode}): {out[-2000:]}")
    return dict(json.loads(out.strip().splitlines()[-1]))


def scores(answer: str) -> list[float]:
    return [p["score"] for p in json.loads(answer)["predictions"]]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="3-second phases")
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--light", type=int, default=2, help="light connections (1-row requests)")
    p.add_argument("--heavy", type=int, default=8, help="heavy connections (--heavy-rows rows each)")
    p.add_argument("--heavy-rows", type=int, default=1_000)
    p.add_argument("--no-targets", action="store_true", help="report only; exit 0 when the targets are missed")
    # a client process (internal)
    p.add_argument("--client", choices=("light", "heavy"))
    p.add_argument("--port", type=int)
    p.add_argument("--connections", type=int)
    p.add_argument("--rows", type=int)
    p.add_argument("--source", default="127.0.0.1")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.client:
        return client_main(a)
    seconds = 3.0 if a.quick else a.seconds

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        redis_port = free_port()
        redis_proc = start_redis(redis_port, base)
        url = f"redis://127.0.0.1:{redis_port}/0"
        frame = user_frame(N_USERS, np.random.default_rng(3))
        root = base / "project"
        quiver_project(root, url, frame)
        sdk, _, _ = quiver_setup(url, frame)
        sdk.close()
        server, port = start(ROOT, root, "serve-model", MODEL)
        try:
            wait_http(f"http://127.0.0.1:{port}/health", server)
            result(run_client(port, "light", 2.0, a.light, 1, "127.0.0.1", 1))  # warm-up: both paths
            result(run_client(port, "heavy", 2.0, 1, a.heavy_rows, "127.0.0.2", 2))
            alone = result(run_client(port, "light", seconds, a.light, 1, "127.0.0.1", 1))
            heavy_proc = run_client(port, "heavy", seconds + 2.0, a.heavy, a.heavy_rows, "127.0.0.2", 2)
            time.sleep(1.0)  # the heavy client at full pace first
            shared = result(run_client(port, "light", seconds, a.light, 1, "127.0.0.1", 1))
            heavy = result(heavy_proc)
        finally:
            stop(server)
            redis_proc.terminate()
            redis_proc.wait(10)
    if scores(alone["probe"]) != scores(shared["probe"]):
        print(f"FAIL: the same request scored {scores(alone['probe'])} alone and {scores(shared['probe'])} beside "
              "the heavy client", flush=True)
        return 1
    ratio = shared["ok_per_s"] / alone["ok_per_s"]
    p99_ratio = shared["p99_ms"] / alone["p99_ms"]
    report = {"seconds": seconds, "light_connections": a.light, "heavy_connections": a.heavy,
              "heavy_rows": a.heavy_rows, "alone": alone, "with_heavy": shared, "heavy": heavy,
              "throughput_ratio": ratio, "p99_ratio": p99_ratio, "targets": {"ratio": TARGET_RATIO,
                                                                             "p99_ratio": TARGET_P99},
              "host": {"cpus": os.cpu_count(), "load": os.getloadavg()}}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "fairness.json").write_text(json.dumps(report, indent=2))
    print(f"light ({a.light} connections, 1 row): alone {alone['ok_per_s']:.0f} req/s, p50 {alone['p50_ms']:.1f} ms, "
          f"p99 {alone['p99_ms']:.1f} ms", flush=True)
    print(f"beside the heavy client: {shared['ok_per_s']:.0f} req/s ({ratio:.2f}×), p50 {shared['p50_ms']:.1f} ms, "
          f"p99 {shared['p99_ms']:.1f} ms ({p99_ratio:.2f}×)", flush=True)
    print(f"heavy ({a.heavy} connections, {a.heavy_rows} rows): {heavy['ok_per_s']:.1f} ok/s = "
          f"{heavy['ok_rows_per_s']:,.0f} rows/s, statuses {heavy['statuses']}, p50 {heavy['p50_ms']:.0f} ms",
          flush=True)
    met = ratio >= TARGET_RATIO and p99_ratio <= TARGET_P99
    print(f"targets: ≥ {TARGET_RATIO}× throughput, p99 ≤ {TARGET_P99}× alone: {'met' if met else 'missed'}")
    print(f"RESULT fairness ratio={ratio:.2f} quiver={shared['ok_per_s']:.0f}req/s peer={alone['ok_per_s']:.0f}req/s "
          f"p99_ratio={p99_ratio:.2f}")
    return 0 if met or a.no_targets else 1


if __name__ == "__main__":
    sys.exit(main())
