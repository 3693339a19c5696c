"""Redis Cluster as the online store: the same keys, values and scripts as one server (layout.py), routed by
slot.

A cluster places each key by the CRC16 of its hash tag, which layout.py makes the entity, so every view of
one entity shares a slot; Redis refuses any multi-key command (MGET, MSETNX, a script) whose keys span
slots. This store keeps one `RedisOnlineStore` per master (its connections, timeouts and errors) and a
slot → master map read with CLUSTER SLOTS:

- **reads**: one MGET per slot the read touches. The MGETs of every master are sent before any reply is
  read, so the masters work at once; the replies are put back in the single server's order and decoded by
  the same code (`finish_read`);
- **writes**: every batch is split by slot; each slot's keys go as one MSETNX or script call, pipelined per
  master, with the single server's newer-wins and tile rules (the scripts are the same);
- **redirections and failover**: a MOVED, ASK, TRYAGAIN or CLUSTERDOWN reply, or a master that refuses the
  connection (dead), makes the map stale: it is read again from any node that answers and the call is
  retried. A read retries once, then a master still down refuses the read as unavailable (the server's fast
  503) while reads of the other masters' slots are served; a write retries until `3 × timeout_s` has passed
  (every write is idempotent). A master that does not answer within the timeout is never waited for twice.

URL: ``redis+cluster://[user:password@]host:port[,host:port…]`` (``rediss+cluster://`` for TLS): the seed
nodes; the others are learned from the cluster.
"""

from __future__ import annotations

import binascii
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import redis
from redis.crc import key_slot
from redis.exceptions import ResponseError

from quiver.online.base import OnlineStoreError, OnlineStoreUnavailable, ViewRead
from quiver.online.codec import empty_at
from quiver.online.layout import entity_keys, entity_tags, meta_key
from quiver.online.redis_store import _IO_ERRORS, RedisOnlineStore, _eval, _socket_of, pack, redact_url

CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")
SLOTS = 16384
_STALE = ("MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN")  # replies that mean: the map moved, read it again
_MIN_REFRESH_S = 0.1  # a dead master fails every read of its slots: read the map at most this often
_RECV_BYTES = 1 << 16
_MGET = b"*%d\r\n$4\r\nMGET\r\n"
_BULK = b"$%d\r\n%s\r\n"


def is_cluster_url(url: str) -> bool:
    return url.startswith(CLUSTER_SCHEMES)


class ClusterUrl(NamedTuple):
    scheme: str  # "redis" or "rediss"
    credentials: str  # "user:password@", ":password@" or ""
    seeds: list[tuple[str, int]]
    query: str  # "?…" or ""

    def node_url(self, host: str, port: int) -> str:
        return f"{self.scheme}://{self.credentials}{host}:{port}/0{self.query}"


def parse_cluster_url(url: str) -> ClusterUrl:
    """The parts of a ``redis+cluster://`` URL; a clear error names what is wrong."""
    if not is_cluster_url(url):
        raise OnlineStoreError(f"not a Redis Cluster URL: {redact_url(url)!r} (redis+cluster://host:port,…)")
    scheme, rest = url.split("://", 1)
    rest, _, query = rest.partition("?")
    credentials, _, hosts = rest.rpartition("@")
    hosts = hosts.split("/", 1)[0]
    seeds = []
    for part in filter(None, hosts.split(",")):
        host, _, port = part.rpartition(":")
        if not host or not port.isdigit():
            raise OnlineStoreError(f"invalid Redis Cluster URL {redact_url(url)!r}: {part!r} is not host:port")
        seeds.append((host.strip("[]"), int(port)))
    if not seeds:
        raise OnlineStoreError(f"invalid Redis Cluster URL {redact_url(url)!r}: no seed node (host:port,…)")
    return ClusterUrl(scheme.split("+")[0], f"{credentials}@" if credentials else "", seeds,
                      f"?{query}" if query else "")


class _ClusterRead(NamedTuple):
    spans: list[tuple[ViewRead, Any, int, int]]  # as the single server's: (read, codec, first key, end key)
    keys: list[bytes]  # every key of the read, grouped by slot
    order: np.ndarray  # position in the single server's order of each key in `keys`
    bounds: np.ndarray  # start of each slot's group in `keys`, and the end
    slots: np.ndarray  # each group's slot
    at: np.ndarray
    total: int


class _Stale(Exception):
    """The slot map no longer matches the cluster (a redirection, or a master gone)."""


class RedisClusterOnlineStore(RedisOnlineStore):
    """Online store on a Redis Cluster (see the module docstring). Everything a single server's store does,
    routed by slot; `cluster_nodes()` describes the cluster for `quiver redis status`."""

    def __init__(self, url: str, project: str = "default", *, timeout_s: float = 1.0, batch: int = 500):
        # Not the single server's __init__: there is no one pool; each master has a store of its own.
        self.url, self.project, self.batch, self.timeout_s = url, project, batch, timeout_s
        self._parsed = parse_cluster_url(url)
        self._views = {}
        self._nodes: dict[tuple[str, int], RedisOnlineStore] = {}
        self._nodes_lock = threading.Lock()
        self._map_lock = threading.Lock()
        self._owner: np.ndarray | None = None  # slot → index in self._masters
        self._masters: list[tuple[str, int]] = []
        self._refreshed = 0.0

    # ----- the map -----

    def _node(self, address: tuple[str, int]) -> RedisOnlineStore:
        with self._nodes_lock:
            store = self._nodes.get(address)
            if store is None:
                store = self._nodes[address] = RedisOnlineStore(
                    self._parsed.node_url(*address), self.project, timeout_s=self.timeout_s, batch=self.batch)
            return store

    def _slot_map(self) -> tuple[np.ndarray, list[tuple[str, int]]]:
        owner, masters = self._owner, self._masters
        if owner is None:
            self._refresh(force=True)
            owner, masters = self._owner, self._masters
            assert owner is not None
        return owner, masters

    def _refresh(self, force: bool = False) -> None:
        """Read the slot map again from the first node that answers (known masters first, then the seeds)."""
        with self._map_lock:
            if not force and time.monotonic() - self._refreshed < _MIN_REFRESH_S:
                return
            failures = []
            for address in dict.fromkeys([*self._masters, *self._parsed.seeds]):
                try:
                    reply = self._node(address)._call([pack(b"CLUSTER", b"SLOTS")])[0]
                except OnlineStoreUnavailable as exc:
                    failures.append(f"{address[0]}:{address[1]} ({str(exc).split('(')[-1].rstrip(')')})")
                    continue
                except OnlineStoreError as exc:
                    if "cluster support disabled" in str(exc):
                        raise OnlineStoreError(
                            f"Redis at {address[0]}:{address[1]} is not in cluster mode (cluster-enabled no): "
                            f"use redis://{address[0]}:{address[1]} for a single server") from None
                    raise
                self._owner, self._masters = _owners(reply, address[0], redact_url(self.url))
                self._refreshed = time.monotonic()
                return
            raise OnlineStoreUnavailable(f"online store unavailable: no node of the Redis Cluster "
                                         f"{redact_url(self.url)} answered within {self.timeout_s:g}s: "
                                         f"{'; '.join(failures)}")

    def _master_of(self, key: bytes) -> RedisOnlineStore:
        owner, masters = self._slot_map()
        return self._node(masters[owner[key_slot(key)]])

    def _on_master(self, key: bytes, call: Callable[[RedisOnlineStore], Any]) -> Any:
        """`call` on the master of `key`, again on the new master after a redirection or a dead master."""
        return self._retrying(lambda: call(self._master_of(key)))

    def _retrying(self, call: Callable[[], Any]) -> Any:
        deadline = time.monotonic() + 3 * self.timeout_s
        for attempt in itertools.count():
            try:
                return call()
            except OnlineStoreUnavailable as exc:
                hung = "did not answer within" in str(exc) and "ConnectionError" not in str(exc)
                if hung or time.monotonic() > deadline:  # a hang is never waited for twice
                    raise
            except OnlineStoreError as exc:
                if not any(word in str(exc) for word in _STALE) or time.monotonic() > deadline:
                    raise
            time.sleep(min(0.05 * 2 ** attempt, 0.5))
            self._refresh(force=True)
        raise AssertionError("unreachable")

    # ----- writes -----

    def _stream(self, name: str, chunks: Iterable[tuple[Sequence[bytes], Sequence[bytes]]],
                extra: Sequence[bytes] = (), progress: Callable[[int], None] | None = None,
                merge: bool = False) -> int:
        """The single server's batched writes, one call per slot's keys, pipelined per master; retried as a
        whole on a redirection or a failover (the writes are idempotent)."""
        keys: list[bytes] = []
        values: list[bytes] = []
        for chunk_keys, chunk_values in chunks:
            keys.extend(chunk_keys)
            values.extend(chunk_values)
        if not keys:
            return 0
        slots = np.fromiter(map(key_slot, keys), dtype=np.int64, count=len(keys))
        order = np.argsort(slots, kind="stable")
        sorted_slots = slots[order]
        bounds = np.flatnonzero(np.diff(sorted_slots)) + 1
        starts, ends = np.r_[0, bounds], np.r_[bounds, len(keys)]

        def write() -> int:
            owner, masters = self._slot_map()
            group_owner = owner[sorted_slots[starts]]
            written = 0
            for master in np.unique(group_owner).tolist():
                groups = np.flatnonzero(group_owner == master)

                def per_slot(groups: np.ndarray = groups) -> Iterator[tuple[list[bytes], list[bytes]]]:
                    for g in groups.tolist():
                        picked = order[starts[g]:ends[g]].tolist()
                        yield [keys[i] for i in picked], [values[i] for i in picked]

                written += self._node(masters[master])._stream(name, per_slot(), extra, progress, merge)
            return written

        return int(self._retrying(write))

    def _touch(self, view: str, max_event_ts: int) -> None:
        key = meta_key(self.project, view)
        self._on_master(key, lambda node: node._call([_eval("meta", [key], [b"%d" % max_event_ts])]))

    def set_meta(self, view: str, field: str, value: str) -> None:
        key = meta_key(self.project, view)
        self._on_master(key, lambda node: node._call([pack(b"HSET", key, field.encode(), value.encode())]))

    def get_meta(self, view: str, field: str) -> str | None:
        key = meta_key(self.project, view)
        reply = self._on_master(key, lambda node: node._call([pack(b"HGET", key, field.encode())])[0])
        return None if reply is None else bytes(reply).decode()

    def set_members(self, key: str) -> set[str]:
        raw = key.encode()
        return {m.decode() for m in self._on_master(raw, lambda node: node._call([pack(b"SMEMBERS", raw)])[0])}

    def remove_members(self, key: str, members: Sequence[str]) -> None:
        if members:
            raw = key.encode()
            self._on_master(raw, lambda node: node._call([pack(b"SREM", raw, *(m.encode() for m in members))]))

    # ----- reads -----

    def plan_read(self, reads: Sequence[ViewRead], entities: Mapping[str, np.ndarray],
                  at: int | np.ndarray) -> Any:
        """The keys of a read grouped by slot (no I/O): views with the same join keys share their slots."""
        spans: list[tuple[ViewRead, Any, int, int]] = []
        keys: list[bytes] = []
        slot_parts: list[np.ndarray] = []
        slots_of: dict[tuple[str, ...], np.ndarray] = {}
        for r in reads:
            prefix, codec = self._view(r.view)
            view_keys = entity_keys(prefix, r.view, entities)
            names = tuple(r.view.key_names)
            if names not in slots_of:  # the tag is the entity: CRC16 of it places every view's key
                tags = entity_tags(r.view, entities)
                slots_of[names] = np.fromiter((binascii.crc_hqx(t, 0) & (SLOTS - 1) for t in tags),
                                              dtype=np.int64, count=len(tags))
            spans.append((r, codec, len(keys), len(keys) + len(view_keys)))
            keys.extend(view_keys)
            slot_parts.append(slots_of[names])
        n = spans[0][3] - spans[0][2] if spans else 0
        if not keys:
            return _ClusterRead(spans, [], np.zeros(0, np.int64), np.zeros(1, np.int64), np.zeros(0, np.int64),
                                empty_at(at, n), 0)
        slots = np.concatenate(slot_parts)
        order = np.argsort(slots, kind="stable")
        sorted_slots = slots[order]
        starts = np.r_[0, np.flatnonzero(np.diff(sorted_slots)) + 1]
        ordered = [keys[i] for i in order.tolist()]
        return _ClusterRead(spans, ordered, order, np.r_[starts, len(keys)], sorted_slots[starts], empty_at(at, n),
                            len(keys))

    def fetch(self, pending: Any) -> list[bytes | None]:
        """Every master's MGETs sent, then every reply read; once more after a redirection or a dead master."""
        if not pending.total:
            return []
        try:
            return self._fetch_once(pending)
        except _Stale:
            self._refresh()
            try:
                return self._fetch_once(pending)
            except _Stale as exc:
                raise OnlineStoreUnavailable(f"online store unavailable: {exc}") from None

    def _fetch_once(self, pending: _ClusterRead) -> list[bytes | None]:
        owner, masters = self._slot_map()
        group_owner = owner[pending.slots]
        bounds, keys = pending.bounds, pending.keys
        sent: list[tuple[Any, Any, np.ndarray]] = []  # (connection, master, its groups)
        problems: list[str] = []
        for master in np.unique(group_owner).tolist():
            groups = np.flatnonzero(group_owner == master)
            node = self._node(masters[master])
            conn = node._connection()
            parts: list[bytes] = []
            flat: list[Any] = []
            for g in groups.tolist():
                a, b = int(bounds[g]), int(bounds[g + 1])
                parts.append(_MGET % (b - a + 1) + _BULK * (b - a))
                for key in keys[a:b]:
                    flat += (len(key), key)
            try:
                sock, _ = _socket_of(conn)
                sock.sendall(b"".join(parts) % tuple(flat))
            except _IO_ERRORS as exc:
                conn.disconnect()
                problems.append(self._down(masters[master], exc))
                continue
            sent.append((conn, masters[master], groups))
        out: list[bytes | None] = [None] * pending.total
        stale = None
        for conn, address, groups in sent:
            try:
                replies = _receive(conn, len(groups))
            except _IO_ERRORS as exc:
                conn.disconnect()
                problems.append(self._down(address, exc))
                continue
            for g, reply in zip(groups.tolist(), replies, strict=True):
                if isinstance(reply, ResponseError):
                    if str(reply).startswith(_STALE):
                        stale = f"{address[0]}:{address[1]} answered {str(reply)[:80]}"
                        continue
                    raise OnlineStoreError(f"Redis error: {reply}")
                for position, value in zip(pending.order[bounds[g]:bounds[g + 1]].tolist(), reply, strict=True):
                    out[position] = value
        if problems:
            raise _Stale("; ".join(problems))
        if stale is not None:
            raise _Stale(stale)
        return out

    def _down(self, address: tuple[str, int], exc: BaseException) -> str:
        if isinstance(exc, redis.TimeoutError | TimeoutError):
            # A master that hangs is never waited for twice: the caller's read is refused now.
            raise OnlineStoreUnavailable(
                f"online store unavailable: Redis Cluster master {address[0]}:{address[1]} did not answer "
                f"within {self.timeout_s:g}s") from None
        return f"Redis Cluster master {address[0]}:{address[1]} is down ({type(exc).__name__}: {exc})"

    def async_fetch(self) -> None:
        return None  # reads go through the server's worker threads (one pipelined send per master each)

    def read_raw(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """MGET of raw keys, per slot (diagnostics and benchmarks)."""
        if not keys:
            return []
        out: list[bytes | None] = []
        for key in keys:
            out.extend(self._on_master(key, _sends([pack(b"MGET", key)])))
        return out

    def freshness(self, views: Sequence[str], *, timeout_s: float | None = None) -> dict[str, int | None]:
        if not views:
            self.ping(timeout_s=timeout_s)
            return {}
        found: dict[str, int | None] = {}
        for view in views:
            key = meta_key(self.project, view)
            reply = self._on_master(key, _sends([pack(b"HGET", key, b"max_event_ts")], timeout_s))
            found[view] = None if reply is None else int(reply)
        return found

    def ping(self, *, timeout_s: float | None = None) -> None:
        """Raise OnlineStoreUnavailable unless every master answers PING and the map covers every slot."""
        _, masters = self._slot_map()
        for address in masters:
            try:
                self._node(address)._call([pack(b"PING")], timeout_s)
            except OnlineStoreUnavailable:
                self._refresh()
                raise

    def cluster_nodes(self) -> list[dict[str, Any]]:
        """Every node the cluster knows: address, role, slots, keys, memory (`quiver redis status`)."""
        _, masters = self._slot_map()
        reply = self._retrying(lambda: self._node(masters[0])._call([pack(b"CLUSTER", b"NODES")])[0])
        nodes = []
        for line in bytes(reply).decode().splitlines():
            fields = line.split()
            address, flags = fields[1].split("@")[0], fields[2].split(",")
            host, _, port = address.rpartition(":")
            row: dict[str, Any] = {"address": address, "role": "master" if "master" in flags else "replica",
                                   "failed": "fail" in flags or "fail?" in flags, "slots": 0, "keys": None,
                                   "used_memory": None}
            for spec in fields[8:]:
                if not spec.startswith("["):
                    first, _, last = spec.partition("-")
                    row["slots"] += int(last or first) - int(first) + 1
            if not row["failed"]:
                try:
                    node = self._node((host, int(port)))
                    keys, info = node._call([pack(b"DBSIZE"), pack(b"INFO", b"memory")], min(self.timeout_s, 1.0))
                    row["keys"] = int(keys)
                    memory = dict(item.split(":", 1) for item in bytes(info).decode().split("\r\n") if ":" in item)
                    row["used_memory"] = int(memory.get("used_memory", 0))
                except OnlineStoreError:
                    row["failed"] = True
            nodes.append(row)
        return sorted(nodes, key=lambda r: (r["role"] != "master", r["address"]))

    def flush_project(self) -> int:
        """Delete every key of this project on every master (tests, demos). Returns keys deleted."""
        _, masters = self._slot_map()
        deleted = 0
        for address in masters:
            node = self._node(address)
            with node._errors():
                client = redis.Redis(connection_pool=node._pool)
                found = list(client.scan_iter(match=f"q:{self.project}:*", count=1000))
            for start in range(0, len(found), 1000):  # one key per UNLINK: keys of many slots
                replies = node._call([pack(b"UNLINK", key) for key in found[start:start + 1000]])
                deleted += sum(int(r) for r in replies)
        return deleted

    def close(self) -> None:
        with self._nodes_lock:
            nodes, self._nodes = list(self._nodes.values()), {}
        for node in nodes:
            node.close()


def _sends(commands: list[bytes], timeout_s: float | None = None) -> Callable[[RedisOnlineStore], Any]:
    """A call of `_on_master`: send `commands` to the node, the first reply."""
    return lambda node: node._call(commands, timeout_s)[0]


def _receive(conn: Any, count: int) -> list[Any]:
    """`count` replies from a connection whose commands were sent (error replies returned, not raised)."""
    import hiredis

    sock, reader = _socket_of(conn)
    replies: list[Any] = []
    for _ in range(count):
        reply = reader.gets()
        while reply is False:
            data = sock.recv(_RECV_BYTES)
            if not data:
                raise ConnectionResetError("Redis closed the connection")
            reader.feed(data)
            reply = reader.gets()
        replies.append(ResponseError(str(reply)) if isinstance(reply, hiredis.ReplyError) else reply)
    return replies


def _owners(reply: Sequence[Any], asked: str, url: str) -> tuple[np.ndarray, list[tuple[str, int]]]:
    """CLUSTER SLOTS as slot → master index and the masters; every slot must have one."""
    owner = np.full(SLOTS, -1, dtype=np.int64)
    masters: list[tuple[str, int]] = []
    for entry in reply:
        first, last, master = int(entry[0]), int(entry[1]), entry[2]
        host = bytes(master[0]).decode() or asked  # empty: the node we asked
        address = (host, int(master[1]))
        if address not in masters:
            masters.append(address)
        owner[first:last + 1] = masters.index(address)
    missing = np.flatnonzero(owner < 0)
    if len(missing):
        raise OnlineStoreError(f"the Redis Cluster at {url} serves no node for {len(missing)} of {SLOTS} slots "
                               f"(first {int(missing[0])}): it answers CLUSTERDOWN until every slot is assigned "
                               f"(redis-cli --cluster fix)")
    return owner, masters

