"""A stream's tile write into Redis: the tile script's in-place path beside a whole-value merge, per key.

What the streaming job's Redis sink sends at each flush: for every entity it touched, its newest tile or
two (the same tile grown, a new tile, now and then an older one, or one never stored just before the
newest, which Kafka partitions read a little apart in time bring a merchant). Both sides run the same tile script
(online/lua/tile.lua) on the same keys, values and writes, against one private redis-server:

- `in_place`  the script as shipped: a few fixed-width records change the stored value in place;
- `whole`     the same script with its in-place limit set to 0, so every write takes the merge path that
              moves the whole stored value through Lua and back (what every write did before).

Keys hold 5 to 1,000 tiles of the example catalog's `user_spend` width (64 bytes; 7 days of 10-minute
tiles is 1,008). After each case the stored bytes of both sides must be equal, or the run fails. Reported:
µs per key written (median of the runs), and the ratio whole / in_place.

Usage: benchmarks/tile_write.py [--quick]   Last line: RESULT tile_write ratio=<whole/in_place at 200 tiles>
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "platform")]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _spark_cluster import free_port  # noqa: E402

from quiver.online.redis_scripts import TILE_SCRIPT  # noqa: E402

WIDTH = 64
HORIZON_US = 7 * 86_400_000_000 + 600_000_000
TILE_US = 600_000_000
KEYS = 500  # the sink's keys per script call
CASES = ("grown newest tile", "new newest tile", "older tile", "new tile before newest")


def record(ts: int, events: int) -> bytes:
    return struct.pack("<qq", ts, events) + b"\x00" * (WIDTH - 16)


def incoming(case: str, tiles: int, run: int, base: int) -> bytes:
    if case == "grown newest tile":
        return record(base + (tiles - 1) * TILE_US, 10 + run)
    if case == "new newest tile":
        return record(base + (tiles + run) * TILE_US, 1)
    if case == "older tile":
        return record(base + (tiles // 2) * TILE_US, 10 + run)
    # never stored, just before the newest (another partition's events a little behind): an insertion
    return record(base + (tiles - 2) * TILE_US + TILE_US // 2 + run, 1)


def measure(client: object, sha: str, tiles: int, case: str, runs: int, prefix: str) -> tuple[float, list[bytes]]:
    base = 1_700_000_000_000_000
    keys = [f"{prefix}:{i}".encode() for i in range(KEYS)]
    stored = b"".join(record(base + j * TILE_US, 3) for j in range(tiles))
    client.mset({k: stored for k in keys})  # type: ignore[attr-defined]
    times = []
    for run in range(runs):
        values = [incoming(case, tiles, run, base)] * KEYS
        began = time.perf_counter()
        client.evalsha(sha, KEYS, *keys, WIDTH, 0, HORIZON_US, *values)  # type: ignore[attr-defined]
        times.append((time.perf_counter() - began) / KEYS * 1e6)
    return statistics.median(times), client.mget(keys)  # type: ignore[attr-defined]


def main() -> int:
    import redis

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    sizes = (5, 200) if args.quick else (5, 50, 200, 1000)
    runs = 5 if args.quick else 15
    whole_script = TILE_SCRIPT.replace(b"local IN_PLACE = 8\n", b"local IN_PLACE = 0\n")
    if whole_script == TILE_SCRIPT:
        sys.exit("tile_write: online/lua/tile.lua no longer sets `local IN_PLACE = 8`")
    port = free_port()
    with tempfile.TemporaryDirectory() as folder:
        server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                   "--appendonly", "no", "--dir", folder], stdout=subprocess.DEVNULL)
        try:
            client = redis.Redis(port=port)
            for _ in range(200):
                try:
                    client.ping()
                    break
                except redis.ConnectionError:
                    time.sleep(0.05)
            shas = {"in_place": client.script_load(TILE_SCRIPT), "whole": client.script_load(whole_script)}
            rows, failed = [], False
            print(f"{'tiles':>6} {'write':<22} {'in_place µs/key':>16} {'whole µs/key':>13} {'whole/in_place':>15}")
            for tiles in sizes:
                for case in CASES:
                    client.flushall()
                    fast, fast_values = measure(client, shas["in_place"], tiles, case, runs, "a")
                    slow, slow_values = measure(client, shas["whole"], tiles, case, runs, "b")
                    if fast_values != slow_values:
                        print(f"FAIL: {tiles} tiles, {case}: the two sides stored different bytes")
                        failed = True
                    rows.append({"tiles": tiles, "write": case, "in_place_us": fast, "whole_us": slow,
                                 "ratio": slow / fast})
                    print(f"{tiles:>6} {case:<22} {fast:>16.1f} {slow:>13.1f} {slow / fast:>14.1f}×")
        finally:
            server.terminate()
            server.wait()
    out = ROOT / "benchmarks" / "results" / "tile_write.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"width": WIDTH, "keys_per_call": KEYS, "runs": runs, "rows": rows}, indent=2))
    mid = next(r for r in rows if r["tiles"] == 200 and r["write"] == "grown newest tile")
    print(f"RESULT tile_write ratio={mid['ratio']:.2f} quiver={mid['in_place_us']:.1f}us/key "
          f"peer={mid['whole_us']:.1f}us/key")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
