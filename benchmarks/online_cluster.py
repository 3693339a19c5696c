"""The online store on a Redis Cluster against one Redis server: reads (p50/p99) and bulk writes (rows/s),
with Feast's Redis store in `redis_type: redis_cluster` mode on the same cluster beside them, and the raw floor
of each store (the read's commands packed beforehand, sent on a plain socket, parsed by hiredis, not decoded).

One run starts a single redis-server and a six-process Redis Cluster (3 masters, 3 replicas, as
tests/harness.py makes it) on free loopback ports. The same N entities × 50 float64 features (online_read.py's
data) go into each. Reads: `FeatureStore.get_online_features(...).to_dict()` of 1, 100 and 1000 entities on the
single server and on the cluster, and Feast's `get_online_features` on the cluster, timed in alternating rounds
(each side a different place each round, a collection and WARMUP untimed calls at the start of each turn, as
online_read.py). Writes: `write_last_values` of every entity into an empty store, then again over the stored
values (the newer-wins script path), each side `--write-runs` times. The answers must agree (the sampled
entities' values from all three reads equal the frame), or the script exits non-zero. The per-master keys,
memory and commands during the reads show how the load spread. Last, one master is killed (SIGKILL) and reads
go on: how fast reads of its slots are refused, and when every read answers again.

Targets (issue 51): cluster p99 ≤ 1.3× single at 100 and 1000 entities, ≤ 1.5× at 1; Feast / Quiver on the
cluster ≥ 5× at 100 entities; cluster writes ≥ 0.7× single rows/s. Reported, not enforced.

    python benchmarks/online_cluster.py [--quick] [--entities N]
Last line: RESULT online_cluster ratio=<cluster p99 / single p99 at 100 entities> quiver=<cluster p99>us
peer=<Feast cluster p99>us
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.online_read import F, alternating_rounds, feast_setup, percentiles, tail_name, user_frame
from tests.harness import RedisCluster, RedisServer

RESULTS = Path(__file__).resolve().parent / "results"


def quiver_side(url: str, frame: Any) -> tuple[Any, Any, Any]:
    from quiver import Entity, FeatureView, Field, Float64, Source
    from quiver.catalog.validate import build_catalog
    from quiver.config import Config
    from quiver.offline.layout import last_values_schema
    from quiver.online.factory import redis_store_for
    from quiver.serving.store import FeatureStore

    user = Entity("user", ["user_id"])
    source = Source("events", "unused", timestamp_field="event_ts")
    view = FeatureView("v", [user], source, ttl="30d", schema=[Field(f"f{i}", Float64) for i in range(F)])
    columns = {"user_id": "int64", "event_ts": "timestamp", **{f"f{i}": "float64" for i in range(F)}}
    spec = build_catalog([user, source, view], schema_reader=lambda s: columns).views["v"]
    online = redis_store_for(url, "bench", timeout_s=10.0)
    table = pa.Table.from_pandas(frame, preserve_index=False).cast(last_values_schema(spec))
    catalog = build_catalog([user, source, view], schema_reader=lambda s: columns)
    return FeatureStore(config=Config(project="bench"), catalog=catalog, online_store=online), spec, table


def feast_cluster(cluster: RedisCluster, frame: Any, repo: Path) -> Any:
    """online_read.py's Feast repo, its Redis store in cluster mode on every node of the cluster."""
    nodes = ",".join(f"127.0.0.1:{p}" for p in cluster.ports)
    return feast_setup("", frame, repo, {"type": "redis", "redis_type": "redis_cluster", "connection_string": nodes})


class RawFloor:
    """The bytes alone: the read's commands packed beforehand, sent on a plain socket and parsed by hiredis, no
    decoding. One MGET on the single server; on the cluster, one MGET per slot, every master's sent before any
    reply is read (what Quiver sends). Their ratio is what the cluster costs the servers on this machine."""

    def __init__(self, single_port: int, cluster: RedisCluster, spec: Any, ids: np.ndarray):
        from redis.crc import key_slot

        from quiver.online.layout import entity_keys, key_prefix
        from quiver.online.redis_store import pack

        keys = entity_keys(key_prefix("bench", spec), spec, {"user_id": ids})
        self.single_command = pack(b"MGET", *keys)
        owner = {}
        for port in cluster.masters():
            with cluster.client(port) as c:
                for first, last, master, *_ in c.execute_command("CLUSTER", "SLOTS"):
                    owner.update(dict.fromkeys(range(int(first), int(last) + 1), int(master[1])))
                break
        by_slot: dict[int, list[bytes]] = {}
        for key in keys:
            by_slot.setdefault(key_slot(key), []).append(key)
        per_master: dict[int, list[bytes]] = {}
        for slot, slot_keys in by_slot.items():
            per_master.setdefault(owner[slot], []).append(pack(b"MGET", *slot_keys))
        self.cluster_commands = [(port, b"".join(commands), len(commands)) for port, commands in per_master.items()]
        self.single_port = single_port

    def single(self) -> Any:
        return _exchange([(_socket(self.single_port), self.single_command, 1)])

    def cluster(self) -> Any:
        return _exchange([(_socket(port), data, count) for port, data, count in self.cluster_commands])


_SOCKETS: dict[int, Any] = {}


def _socket(port: int) -> Any:
    import socket

    if port not in _SOCKETS:
        _SOCKETS[port] = socket.create_connection(("127.0.0.1", port))
        _SOCKETS[port].setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return _SOCKETS[port]


def _exchange(sends: list[tuple[Any, bytes, int]]) -> list[Any]:
    import hiredis

    for sock, data, _ in sends:
        sock.sendall(data)
    out = []
    for sock, _, count in sends:
        reader = hiredis.Reader()
        reader.feed(b"*%d\r\n" % count)
        reply = reader.gets()
        while reply is False:
            reader.feed(sock.recv(1 << 16))
            reply = reader.gets()
        out.append(reply)
    return out


def failover(cluster: RedisCluster, store: Any, features: list[str], n_entities: int) -> dict[str, Any]:
    """Kill one master with SIGKILL and read all of a batch of entities every 20 ms until every read answers
    again: how fast reads of its slots are refused meanwhile, and how long until its replica serves them."""
    from quiver.online.base import OnlineStoreUnavailable

    users = np.arange(min(n_entities, 1000))
    victim = cluster.masters()[0]
    cluster.kill(victim)
    killed = time.perf_counter()
    refused, slowest = 0, 0.0
    while time.perf_counter() - killed < 60:
        began = time.perf_counter()
        try:
            store.get_online_features(features[:1], {"user_id": users}).to_dict()
            break
        except OnlineStoreUnavailable:
            refused += 1
            slowest = max(slowest, time.perf_counter() - began)
        time.sleep(0.02)
    else:
        sys.exit("online_cluster: reads did not recover within 60 s of the failover")
    recovered = time.perf_counter() - killed
    cluster.restart(victim)
    cluster.wait_until_ok()
    return {"killed": victim, "refused": refused, "slowest_refusal_ms": slowest * 1000,
            "recovered_after_s": recovered}


def node_counters(cluster: RedisCluster) -> dict[int, dict[str, int]]:
    out = {}
    for port in cluster.masters():
        with cluster.client(port) as c:
            stats, memory = c.info("stats"), c.info("memory")
            out[port] = {"keys": int(c.dbsize()), "used_memory": int(memory["used_memory"]),
                         "commands": int(stats["total_commands_processed"])}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, a few minutes")
    parser.add_argument("--entities", type=int, default=None, help="entities stored (default 100k, quick 10k)")
    parser.add_argument("--write-runs", type=int, default=None, help="timed writes per side (default 3, quick 2)")
    args = parser.parse_args()
    n_entities = args.entities or (10_000 if args.quick else 100_000)
    write_runs = args.write_runs or (2 if args.quick else 3)
    calls = {1: 400, 100: 300, 1000: 200} if args.quick else {1: 3000, 100: 2000, 1000: 1000}
    feast_calls = {1: 300, 100: 100, 1000: 10} if args.quick else {1: 1000, 100: 300, 1000: 30}
    rng = np.random.default_rng(7)
    frame = user_frame(n_entities, rng)
    features = [f"v:f{i}" for i in range(F)]
    binary = shutil.which("redis-server") or "redis-server"
    report: dict[str, Any] = {"entities_stored": n_entities, "features": F, "quick": args.quick, "sizes": {},
                              "writes": {}}
    with tempfile.TemporaryDirectory() as tmp:
        single_server = RedisServer(binary, Path(tmp) / "single")
        (Path(tmp) / "single").mkdir()
        cluster = RedisCluster(binary, Path(tmp) / "cluster")
        single_server.start()
        cluster.start()
        try:
            single, spec, table = quiver_side(single_server.url, frame)
            clustered, _, _ = quiver_side(cluster.url, frame)
            # Writes: into an empty store (MSETNX path), then over what is there (the newer-wins script).
            for name in ("single", "cluster"):
                report["writes"][name] = {"empty_s": [], "over_s": []}
            for _ in range(write_runs):
                for name, store in (("single", single), ("cluster", clustered)):
                    store.online.flush_project()
                    gc.collect()
                    t = time.perf_counter()
                    store.online.write_last_values(spec, table)
                    report["writes"][name]["empty_s"].append(time.perf_counter() - t)
                    t = time.perf_counter()
                    store.online.write_last_values(spec, table)
                    report["writes"][name]["over_s"].append(time.perf_counter() - t)
            for kind in ("empty_s", "over_s"):
                best = {name: min(report["writes"][name][kind]) for name in ("single", "cluster")}
                ratio = best["single"] / best["cluster"]
                report["writes"][f"{kind[:-2]}_rows_per_s"] = {k: n_entities / v for k, v in best.items()}
                report["writes"][f"{kind[:-2]}_cluster_over_single"] = ratio
                print(f"write {n_entities} rows ({kind[:-2]}): single {n_entities / best['single']:9.0f} rows/s, "
                      f"cluster {n_entities / best['cluster']:9.0f} rows/s: cluster/single {ratio:.2f}x", flush=True)
            feast = feast_cluster(cluster, frame, Path(tmp) / "feast")

            sample = rng.choice(n_entities, 200, replace=False)
            truth = {f"f{i}": frame[f"f{i}"].to_numpy()[sample] for i in range(F)}
            answers = {"single": single.get_online_features(features, {"user_id": sample}).to_dict(),
                       "cluster": clustered.get_online_features(features, {"user_id": sample}).to_dict(),
                       "feast": feast.get_online_features(features=features,
                                                          entity_rows=[{"user_id": int(u)} for u in sample]).to_dict()}
            wrong = [f"{who} {name}" for who, got in answers.items() for name, want in truth.items()
                     if not np.array_equal(np.array(got[name], dtype=float), want)]
            if wrong:
                sys.exit(f"online_cluster: answers differ from the stored values: {', '.join(wrong[:5])}")
            report["same_answers"] = True
            before = node_counters(cluster)

            for size in (1, 100, 1000):
                pool = [rng.choice(n_entities, size, replace=False) for _ in range(64)]
                rows = [{"user_id": ids} for ids in pool]
                feast_rows = [[{"user_id": int(u)} for u in ids] for ids in pool]
                floors = [RawFloor(single_server.port, cluster, spec, ids) for ids in pool]
                got_single, got_cluster = floors[0].single()[0][0], floors[0].cluster()
                if sorted(got_single) != sorted(v for master in got_cluster for reply in master for v in reply) \
                        or None in got_single:
                    sys.exit("online_cluster: the raw floors read different bytes from the two stores")
                sides: dict[str, tuple[int, Any]] = {
                    "single": (calls[size], lambda k, rows=rows: single.get_online_features(features, rows[k]).to_dict()),
                    "single_floor": (calls[size], lambda k, floors=floors: floors[k].single()),
                    "cluster_floor": (calls[size], lambda k, floors=floors: floors[k].cluster()),
                    "cluster": (calls[size],
                                lambda k, rows=rows: clustered.get_online_features(features, rows[k]).to_dict()),
                    "feast_cluster": (feast_calls[size], lambda k, entity_rows=feast_rows: feast.get_online_features(
                        features=features, entity_rows=entity_rows[k]).to_dict()),
                }
                samples = alternating_rounds(sides, len(pool))
                stats: dict[str, Any] = {name: percentiles(values) for name, values in samples.items()}
                tail = tail_name(min(len(v) for v in samples.values()))
                ours = tail_name(min(len(samples["single"]), len(samples["cluster"])))
                stats["tail"], stats["ours_tail"] = tail, ours
                stats[f"{ours}_cluster_over_single"] = stats["cluster"][f"{ours}_us"] / stats["single"][f"{ours}_us"]
                stats["p50_cluster_over_single"] = stats["cluster"]["p50_us"] / stats["single"]["p50_us"]
                stats[f"{tail}_feast_over_cluster"] = (stats["feast_cluster"][f"{tail}_us"]
                                                       / stats["cluster"][f"{tail}_us"])
                stats[f"{ours}_floor_cluster_over_single"] = (stats["cluster_floor"][f"{ours}_us"]
                                                              / stats["single_floor"][f"{ours}_us"])
                report["sizes"][str(size)] = stats
                print(f"{size:>5} entities × {F}: single p50 {stats['single']['p50_us']:7.0f}us {ours} "
                      f"{stats['single'][f'{ours}_us']:7.0f}us | cluster p50 {stats['cluster']['p50_us']:7.0f}us "
                      f"{ours} {stats['cluster'][f'{ours}_us']:7.0f}us ({stats[f'{ours}_cluster_over_single']:.2f}x) | "
                      f"feast on the cluster p50 {stats['feast_cluster']['p50_us']:8.0f}us {tail} "
                      f"{stats['feast_cluster'][f'{tail}_us']:8.0f}us (feast/quiver {tail} "
                      f"{stats[f'{tail}_feast_over_cluster']:.1f}x) | raw floors: single p50 "
                      f"{stats['single_floor']['p50_us']:6.0f}us, cluster p50 {stats['cluster_floor']['p50_us']:6.0f}us, "
                      f"cluster/single {ours} {stats[f'{ours}_floor_cluster_over_single']:.2f}x", flush=True)
            after = node_counters(cluster)
            report["masters"] = {str(port): {**after[port], "commands": after[port]["commands"]
                                             - before[port]["commands"]} for port in after}
            for port, row in report["masters"].items():
                print(f"master 127.0.0.1:{port}: {row['keys']} keys, {row['used_memory'] / 2**20:.1f} MiB, "
                      f"{row['commands']} commands during the reads", flush=True)
            report["failover"] = failover(cluster, clustered, features, n_entities)
            print(f"failover: SIGKILL of master {report['failover']['killed']} (node timeout "
                  f"{cluster.node_timeout_ms} ms): reads of its slots refused {report['failover']['refused']} times, "
                  f"the slowest refusal {report['failover']['slowest_refusal_ms']:.1f} ms; "
                  f"every read answered again {report['failover']['recovered_after_s']:.2f} s after the kill, "
                  f"the same store object", flush=True)
            single.close()
            clustered.close()
        finally:
            cluster.stop()
            single_server.stop()
    report["load_average"] = os.getloadavg()
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "online_cluster.json").write_text(json.dumps(report, indent=2))
    hundred = report["sizes"]["100"]
    ours, tail = hundred["ours_tail"], hundred["tail"]
    print(f"RESULT online_cluster ratio={hundred[ours + '_cluster_over_single']:.2f} "
          f"quiver={hundred['cluster'][ours + '_us']:.0f}us peer={hundred['feast_cluster'][tail + '_us']:.0f}us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
