"""Redis memory per entity per view, for the capacity model in docs/operations.md.

Materializes benchmarks/pit_join.py's two views (view `lv`: 5 last values; view `win`: 3 windowed aggregates
of one column over 5-minute tiles, 24 h horizon) into a private redis-server, one view at a time, as of the
end of the generated data, and reports `used_memory` growth per entity written (INFO memory, after the
write; keys, values and Redis' own per-key overhead included).
Usage: benchmarks/redis_memory.py [--labels 100000]   (entities = labels / 10; the data is pit_scale's)
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pit_join  # the shared data generator
from _spark_cluster import free_port

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    import redis

    from quiver.online.materialize import materialize

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--labels", type=int, default=100_000)
    parser.add_argument("--data", type=Path, default=ROOT / "data" / "bench" / "pit_scale")
    args = parser.parse_args()
    data = args.data / f"labels-{args.labels}"
    pit_join.generate(data, args.labels, args.labels * 10, max(args.labels // 10, 1))
    catalog, config = pit_join.catalog_and_config(data / "project")
    port, folder = free_port(), Path(tempfile.mkdtemp(prefix="redis-mem-"))
    server = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", str(port), "--bind",
                               "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(folder)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    try:
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.exceptions.ConnectionError:
                time.sleep(0.1)
        end = datetime.fromtimestamp((pit_join.START + pit_join.DAYS * pit_join.DAY) / 1e6, UTC)
        config = replace(config, redis_url=url, registry_url=f"sqlite:///{folder}/registry.db")
        out = {}
        for view in ("lv", "win"):
            before = int(client.info("memory")["used_memory"])
            report = materialize(config, catalog, end=end, views=[view])
            grown = int(client.info("memory")["used_memory"]) - before
            entities = report.views[view].entities_written
            out[view] = {"entities": entities, "bytes": grown, "bytes_per_entity": grown / max(entities, 1),
                         "rows_read": report.views[view].rows_read}
            print(f"{view}: {entities:,} entities, {grown / 2**20:.1f} MiB, {grown / max(entities, 1):.0f} B/entity",
                  flush=True)
        (ROOT / "benchmarks" / "results").mkdir(exist_ok=True)
        (ROOT / "benchmarks" / "results" / "redis_memory.json").write_text(json.dumps(out, indent=2))
    finally:
        server.terminate()
        server.wait()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
