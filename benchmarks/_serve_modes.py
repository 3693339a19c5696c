"""How a Redis read leaves the event loop, measured (not a peer benchmark, so `make bench` skips it).

The same feature server app, data (2,000 entities × 50 float64 features), uvicorn limits and load (4
threads, one keep-alive connection each, single-entity requests, rounds interleaved) with only the way the
handler waits for the Redis round trip changed:
  inline  the blocking read on the event loop (what the server did before: a stall stops everything)
  thread  the read on StoreGate's worker threads (the server's default)
  anyio   the read on starlette's thread pool (what a sync `def` endpoint does)
  async   the read on the loop with the pipelined asyncio client (create_app(store_io="async"))
Reports req/s, client p50/p99 and the server process's CPU time per request.

    python benchmarks/_serve_modes.py [rounds] [requests per round]
Writes benchmarks/results/serve_modes.json; a busy machine moves every figure, compare within one run.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
KEY = "bench-key"
F = 50


def serve(mode: str, port: int, url: str) -> None:
    import uvicorn

    from quiver import Entity, FeatureView, Field, Float64, Source
    from quiver.catalog.validate import build_catalog
    from quiver.config import Config
    from quiver.online.redis_store import RedisOnlineStore
    from quiver.serving.runtime import ServerLimits, StoreGate
    from quiver.serving.server import create_app
    from quiver.serving.store import FeatureStore

    user = Entity("user", ["user_id"])
    source = Source("events", "unused", timestamp_field="event_ts")
    view = FeatureView("v", [user], source, ttl="30d", schema=[Field(f"f{i}", Float64) for i in range(F)])
    columns = {"user_id": "int64", "event_ts": "timestamp", **{f"f{i}": "float64" for i in range(F)}}
    catalog = build_catalog([user, source, view], schema_reader=lambda s: columns)
    online = RedisOnlineStore(url, "bench", timeout_s=5.0)
    store = FeatureStore(config=Config(project="bench"), catalog=catalog, online_store=online)

    class Inline(StoreGate):  # before: the blocking read on the event loop
        async def call_async(self, fn, /, pending):
            return online.fetch(pending)

    class Thread(StoreGate):  # the read on the gate's worker threads
        async def call_async(self, fn, /, pending):
            return await self.call(online.fetch, pending)

    class AnyioPool(StoreGate):  # what a sync `def` endpoint does: starlette's threadpool
        async def call_async(self, fn, /, pending):
            from starlette.concurrency import run_in_threadpool
            return await run_in_threadpool(online.fetch, pending)

    gate_cls = {"inline": Inline, "thread": Thread, "anyio": AnyioPool, "async": StoreGate}[mode]
    gate = gate_cls(online, ["v"])
    app = create_app(store, api_key=KEY, gate=gate, store_io="async")
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="error", access_log=False,
                **ServerLimits().uvicorn_kwargs())


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    requests = int(sys.argv[2]) if len(sys.argv) > 2 else 600
    from http_server import free_port, load, quiver_request, stop, wait_http
    from online_read import quiver_setup

    from quiver.online.embedded import LocalRedis

    rng = np.random.default_rng(11)
    n = 2000
    now = datetime.now(UTC).replace(microsecond=0)
    frame = pd.DataFrame({"user_id": np.arange(n, dtype=np.int64), "event_ts": pd.Timestamp(now - timedelta(hours=1))})
    for i in range(F):
        frame[f"f{i}"] = rng.random(n)
    modes = ["inline", "thread", "anyio", "async"]
    out = {m: [0.0, []] for m in modes}
    cpu = {m: 0.0 for m in modes}

    def cpu_s(pid):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    with LocalRedis() as url:
        sdk, _, _ = quiver_setup(url, frame)
        sdk.close()
        procs = {}
        for m in modes:
            port = free_port()
            p = subprocess.Popen([sys.executable, __file__, "serve", m, str(port), url])
            base = f"http://127.0.0.1:{port}"
            wait_http(base + "/health", p)
            procs[m] = (p, base)
        try:
            import httpx
            for m, (_, base) in procs.items():
                path, body, headers = quiver_request(5)
                got = httpx.post(base + path, json=body, headers=headers).json()["features"]
                assert got["f3"] == [float(frame["f3"].iloc[5])], m
                load(base, quiver_request, n, 100, 4)
            for _ in range(rounds):
                for m, (proc, base) in procs.items():
                    c0 = cpu_s(proc.pid)
                    s, lat = load(base, quiver_request, n, requests, 4)
                    cpu[m] += cpu_s(proc.pid) - c0
                    out[m][0] += s
                    out[m][1].extend(lat)
        finally:
            for p, _ in procs.values():
                stop(p)
    res = {}
    for m, (s, lat) in out.items():
        arr = np.array(lat) * 1e3
        res[m] = {"rps": len(lat) / s, "p50_ms": float(np.percentile(arr, 50)), "p99_ms": float(np.percentile(arr, 99)),
                  "server_cpu_us_per_request": cpu[m] / len(lat) * 1e6}
        print(f"{m:>7}: {res[m]['rps']:7.0f} req/s  p50 {res[m]['p50_ms']:.2f} ms  p99 {res[m]['p99_ms']:.2f} ms  "
              f"server CPU {res[m]['server_cpu_us_per_request']:.0f} us/request")
    res["load_average"] = os.getloadavg()
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "serve_modes.json").write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        serve(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        main()
