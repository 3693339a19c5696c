"""Fault probe of `quiver serve-model` and `quiver serve` (not a peer benchmark, so `make bench` skips it): the
fault table of docs/prediction.md and docs/serving.md, measured on real processes and a redis-server this
script starts.

    python benchmarks/_serving_fault_probe.py [--code DIR] [--seconds 5]

`--code DIR` runs the servers from another checkout of the repository (e.g. an older commit exported with
`git archive`), so before and after are measured by the same probe on the same machine. Phases:

1. Redis paused (SIGSTOP) for `--seconds` under load: 4 threads per server, one keep-alive connection each,
   1-row requests, 2 s client timeout: responses/s and statuses; /health polled every 100 ms: p50 and max.
2. Poison: one request with `at` = 4·10^18, then 200 requests of 5 rows; after 12 s, serving-log rows
   written vs rows answered, and the poison's status.
3. Heavy client: 4 light clients (1 row, from 127.0.0.1) alone, then with a heavy one from 127.0.0.2
   (8 connections sending the largest request the server takes: 10,000 rows before, 1,000 now): the light
   clients' responses/s (ratio to alone) and p99, and the heavy client's statuses.
4. 48 light clients (4 per loopback address, 12 addresses) on a healthy Redis: statuses (false 503s?).

Writes benchmarks/results/serving_fault_probe.json; figures depend on the machine (a busy shared one here).
"""

from __future__ import annotations

import argparse
import http.client
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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path[:0] = [str(HERE), str(ROOT), str(ROOT / "platform")]
RESULTS = HERE / "results"
KEY = "probe-key"
N_USERS = 2_000

from http_server import free_port, wait_http  # noqa: E402
from online_read import quiver_setup, user_frame  # noqa: E402
from predict import MODEL, quiver_project  # noqa: E402


class Client:
    """One keep-alive HTTP/1.1 connection from a chosen local address (stdlib: no client-side overhead to
    speak of next to the servers)."""

    def __init__(self, port: int, source: str = "127.0.0.1", timeout: float = 2.0):
        self.port, self.source, self.timeout = port, source, timeout
        self.conn: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body: Any = None) -> int:
        payload = json.dumps(body).encode() if body is not None else None
        for attempt in (0, 1):
            if self.conn is None:
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout,
                                                       source_address=(self.source, 0))
            try:
                self.conn.request(method, path, body=payload, headers={"X-API-Key": KEY,
                                                                       "Content-Type": "application/json"})
                response = self.conn.getresponse()
                response.read()
                if response.getheader("connection", "").lower() == "close":
                    self.close()
                return response.status
            except TimeoutError:
                self.close()
                raise
            except (ConnectionError, http.client.HTTPException, OSError):
                self.close()
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def hammer(port: int, make_body: Any, seconds: float, threads: int, sources: list[str],
           path: str) -> dict[str, Any]:
    statuses: Counter[str] = Counter()
    latencies: list[float] = []
    lock = threading.Lock()
    deadline = time.monotonic() + seconds

    def worker(k: int) -> None:
        client = Client(port, sources[k % len(sources)])
        rng = np.random.default_rng(k)
        mine: Counter[str] = Counter()
        lat = []
        while time.monotonic() < deadline:
            began = time.perf_counter()
            try:
                mine[str(client.request("POST", path, make_body(rng, k)))] += 1
            except TimeoutError:
                mine["client timeout"] += 1
            except OSError as exc:
                mine[type(exc).__name__] += 1
            lat.append(time.perf_counter() - began)
        client.close()
        with lock:
            statuses.update(mine)
            latencies.extend(lat)

    began = time.monotonic()
    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    wall = time.monotonic() - began
    arr = np.array(latencies or [0.0]) * 1e3
    ok = statuses.get("200", 0)
    return {"responses_per_s": len(latencies) / wall, "ok_per_s": ok / wall, "statuses": dict(statuses),
            "p50_ms": float(np.percentile(arr, 50)), "p99_ms": float(np.percentile(arr, 99))}


def poll_health(port: int, stop_at: float) -> dict[str, Any]:
    client = Client(port, timeout=5.0)
    lat, codes = [], Counter[str]()
    while time.monotonic() < stop_at:
        began = time.perf_counter()
        try:
            codes[str(client.request("GET", "/health"))] += 1
        except TimeoutError:
            codes["client timeout (5 s)"] += 1
        lat.append(time.perf_counter() - began)
        time.sleep(0.1)
    arr = np.array(lat) * 1e3
    return {"polls": len(lat), "statuses": dict(codes), "p50_ms": float(np.percentile(arr, 50)),
            "max_ms": float(arr.max())}


def predict_body(rows: int, tag: str = "p") -> Any:
    def make(rng: np.random.Generator, k: int) -> dict[str, Any]:
        users = rng.integers(0, N_USERS, rows).tolist()
        stamp = time.perf_counter_ns()
        return {"rows": [{"request_id": f"{tag}{k}-{stamp}-{i}", "entities": {"user_id": u}}
                         for i, u in enumerate(users)]}
    return make


def feature_body(rng: np.random.Generator, k: int) -> dict[str, Any]:
    return {"features": [f"v:f{i}" for i in range(50)], "entities": {"user_id": [int(rng.integers(0, N_USERS))]}}


# Another checkout's code: drop this venv's editable finder (it maps quiver.monitoring and quiver.pipelines to
# this checkout) and import everything from that tree's folders instead.
_BOOT = ("import sys; sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f)]; "
         "sys.path[:0] = {paths!r}; from quiver.cli import main; main()")


def start(code: Path, root: Path, *args: str) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    if code != ROOT:
        for name in ("monitoring", "pipelines"):  # the layout installs them inside the quiver namespace
            link = code / "platform" / "quiver" / name
            if not link.exists():
                link.symlink_to(code / name)
    boot = _BOOT.format(paths=[str(code), str(code / "platform")]) if code != ROOT else \
        "from quiver.cli import main; main()"
    env = {**os.environ, "QUIVER_API_KEY": KEY}
    proc = subprocess.Popen([sys.executable, "-c", boot, *args, "--port", str(port),
                             "--config", str(root / "quiver.yaml")], cwd=root, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_http(f"http://127.0.0.1:{port}/health", proc, timeout=180)
    return proc, port


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


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


def logged_rows(offline: Path) -> int:
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(p).metadata.num_rows for p in offline.glob("serving_logs/date=*/hour=*/part-*.parquet"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--code", type=Path, default=ROOT, help="checkout whose servers run (default: this one)")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--max-rows", type=int, default=None, help="rows of a heavy request (default: the "
                                                                   "server's limit: 10,000 before, 1,000 now)")
    args = parser.parse_args()
    code = args.code.resolve()
    heavy_rows = args.max_rows or (1_000 if (code / "platform/quiver/serving/edge.py").exists() else 10_000)
    report: dict[str, Any] = {"code": str(code), "seconds": args.seconds, "heavy_rows": heavy_rows,
                              "started": datetime.now(UTC).isoformat()}
    frame = user_frame(N_USERS, np.random.default_rng(3))
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        redis_port = free_port()
        redis_proc = start_redis(redis_port, base)
        url = f"redis://127.0.0.1:{redis_port}/0"
        root = base / "project"
        quiver_project(root, url, frame)
        sdk, _, _ = quiver_setup(url, frame)
        sdk.close()
        (root / "quiver.yaml").write_text(f"project: bench\nregistry_url: sqlite:///reg.db\nredis_url: {url}\n")
        predict, p_port = start(code, root, "serve-model", MODEL)
        features, f_port = start(code, root, "serve")
        try:
            # 1. Redis paused.
            for name, port, path, body in (("predict", p_port, "/predict", predict_body(1)),
                                           ("features", f_port, "/features/online", feature_body)):
                hammer(port, body, 1.0, 4, ["127.0.0.1"], path)  # warm up
                normal = hammer(port, body, args.seconds, 4, ["127.0.0.1"], path)
                redis_proc.send_signal(signal.SIGSTOP)
                stop_at = time.monotonic() + args.seconds
                polls: dict[str, Any] = {}
                poller = threading.Thread(target=lambda p=port, s=stop_at, out=polls: out.setdefault(
                    "h", poll_health(p, s)))
                poller.start()
                paused = hammer(port, body, args.seconds, 4, ["127.0.0.1"], path)
                poller.join()
                redis_proc.send_signal(signal.SIGCONT)
                paused["health"] = polls["h"]
                report[f"{name}_redis_paused"] = {"normal": normal, "paused": paused}
                time.sleep(2.0)  # let the server notice Redis is back
            # 2. Poison.
            poison = Client(p_port, timeout=10)
            status = poison.request("POST", "/predict", {"rows": [{"request_id": "poison", "entities": {"user_id": 1},
                                                                   "at": 4 * 10**18}]})
            before = logged_rows(root / "data" / "offline")
            answered = 0
            for k in range(200):
                if poison.request("POST", "/predict", predict_body(5, "poison-after")(np.random.default_rng(k), k)) \
                        == 200:
                    answered += 5
            time.sleep(12.0)
            report["poison"] = {"poison_status": status, "rows_answered": answered,
                                "rows_written": logged_rows(root / "data" / "offline") - before}
            # 3. Heavy client.
            alone = hammer(p_port, predict_body(1), args.seconds, 4, ["127.0.0.1"], "/predict")
            heavy_result: dict[str, Any] = {}
            heavy = threading.Thread(target=lambda: heavy_result.setdefault("r", hammer(
                p_port, predict_body(heavy_rows, "heavy"), args.seconds + 1, 8, ["127.0.0.2"], "/predict")))
            heavy.start()
            time.sleep(0.5)
            shared = hammer(p_port, predict_body(1), args.seconds, 4, ["127.0.0.1"], "/predict")
            heavy.join()
            report["heavy_client"] = {"alone": alone, "with_heavy": shared, "heavy": heavy_result["r"],
                                      "throughput_ratio": shared["ok_per_s"] / max(alone["ok_per_s"], 1e-9)}
            # 4. 48 clients.
            sources = [f"127.0.0.{i}" for i in range(10, 22)]
            report["clients_48"] = hammer(p_port, predict_body(1), args.seconds, 48, sources, "/predict")
        finally:
            stop(predict)
            stop(features)
            redis_proc.send_signal(signal.SIGCONT)
            redis_proc.terminate()
            redis_proc.wait(10)
    report["load_average"] = os.getloadavg()
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "serving_fault_probe.json"
    out.write_text(json.dumps(report, indent=2))
    for name in ("predict", "features"):
        r = report[f"{name}_redis_paused"]
        print(f"{name}: Redis up {r['normal']['responses_per_s']:.0f} resp/s; paused {r['paused']['responses_per_s']:.0f} "
              f"resp/s {r['paused']['statuses']}; /health p50 {r['paused']['health']['p50_ms']:.1f} ms, max "
              f"{r['paused']['health']['max_ms']:.0f} ms {r['paused']['health']['statuses']}")
    p = report["poison"]
    print(f"poison: status {p['poison_status']}; rows answered {p['rows_answered']}, written {p['rows_written']}")
    h = report["heavy_client"]
    print(f"heavy client ({heavy_rows} rows): others {h['alone']['ok_per_s']:.0f} → {h['with_heavy']['ok_per_s']:.0f} "
          f"ok/s ({h['throughput_ratio']:.2f}x), p99 {h['alone']['p99_ms']:.0f} → {h['with_heavy']['p99_ms']:.0f} ms; "
          f"heavy {h['heavy']['statuses']}")
    print(f"48 clients: {report['clients_48']['statuses']}, p99 {report['clients_48']['p99_ms']:.0f} ms")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
