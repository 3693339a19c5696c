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
import functools
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import hiredis
import numpy as np
import redis
from redis.crc import key_slot

from quiver.online.base import OnlineStoreError, OnlineStoreUnavailable, ViewRead
from quiver.online.cluster_wire import (
    SLOTS,
    in_order,
    interleaved,
    key_slots,
    mget_template,
    pack_calls,
    parse_cluster_url,
    receive_array,
    slot_owners,
)
from quiver.online.codec import empty_at
from quiver.online.layout import entity_keys, meta_key
from quiver.online.redis_store import _IO_ERRORS, RedisOnlineStore, _eval, _socket_of, pack, redact_url

_STALE = ("MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN")  # replies that mean: the map moved, read it again
_MIN_REFRESH_S = 0.1  # a dead master fails every read of its slots: read the map at most this often
_WINDOW_KEYS = 20_000  # keys per exchange of a write: its memory stays bounded


class _ClusterRead(NamedTuple):
    spans: list[tuple[ViewRead, Any, int, int]]  # as the single server's: (read, codec, first key, end key)
    keys: list[bytes]  # every key of the read, in the single server's order
    slots: np.ndarray  # each key's slot
    at: np.ndarray
    total: int
    one_slot: bool  # every key in one slot (a read of one entity)


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
                self._owner, self._masters = slot_owners(reply, address[0], redact_url(self.url))
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
                if not _moved(exc) or time.monotonic() > deadline:  # a hang is never waited for twice
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
        """Write the keys with the single server's rules, one call per slot, `_WINDOW_KEYS` keys at a time
        (memory stays bounded): first MSETNX (sets every key of the slot when none exists), and where a
        slot's keys exist the script (EVALSHA, EVAL after NOSCRIPT); once a slot needed the script, later
        windows start with it, as one server's batches do. Every master's calls are sent before any reply is
        read. A window is retried as a whole on a redirection or a failover (the writes are idempotent)."""
        blob = b"".join(b"$%d\r\n%s\r\n" % (len(e), e) for e in extra).replace(b"%", b"%%")
        state = {"merge": merge}
        written = 0
        for chunk_keys, chunk_values in chunks:
            for start in range(0, len(chunk_keys), _WINDOW_KEYS):
                keys = list(chunk_keys[start:start + _WINDOW_KEYS])
                values = list(chunk_values[start:start + _WINDOW_KEYS])
                written += int(self._retrying(functools.partial(self._write_window, name, keys, values, extra,
                                                                blob, progress, state)))
        return written

    def _write_window(self, name: str, keys: list[bytes], values: list[bytes], extra: Sequence[bytes],
                      blob: bytes, progress: Callable[[int], None] | None, state: dict[str, bool]) -> int:
        slots = key_slots(keys)
        order = np.argsort(slots, kind="stable")
        sorted_slots = slots[order]
        starts = np.flatnonzero(np.r_[True, sorted_slots[1:] != sorted_slots[:-1]])
        sizes = np.diff(np.r_[starts, len(keys)])
        picked = order.tolist()
        keys, values = [keys[i] for i in picked], [values[i] for i in picked]
        group_slots = sorted_slots[starts]

        def calls(how: str, groups: np.ndarray) -> list[Any]:
            """One call per group (slot), every master's sent at once; the replies in `groups`' order."""
            owner, masters = self._slot_map()
            group_owner = owner[group_slots[groups]]
            runs = np.r_[np.flatnonzero(np.r_[True, group_owner[1:] != group_owner[:-1]]), len(groups)].tolist()
            payloads = []
            for r0, r1 in itertools.pairwise(runs):
                mine = groups[r0:r1]
                counts = sizes[mine]
                at = (np.repeat(starts[mine] - np.r_[0, np.cumsum(counts)[:-1]], counts)
                      + np.arange(int(counts.sum()))).tolist()
                data = pack_calls(how, name, blob, [keys[i] for i in at], [values[i] for i in at],
                                  counts.tolist(), extra)
                payloads.append((masters[int(group_owner[r0])], data, r1 - r0))
            return list(itertools.chain.from_iterable(self._exchange(payloads)))

        written = 0
        todo = {"eval" if state["merge"] else "nx": np.arange(len(starts))}
        while todo:
            again: dict[str, list[int]] = {}
            for how, groups in todo.items():
                for g, reply in zip(groups.tolist(), calls(how, groups), strict=True):
                    if isinstance(reply, hiredis.ReplyError):
                        if str(reply).startswith("NOSCRIPT"):
                            again.setdefault("body", []).append(g)
                            continue
                        raise OnlineStoreError(f"Redis refused a write: {reply}")
                    if how == "nx" and int(reply) == 0:  # a key of the slot exists: the script merges
                        state["merge"] = True
                        again.setdefault("eval", []).append(g)
                        continue
                    written += int(sizes[g]) if how == "nx" else int(reply)
                    if progress:
                        progress(int(sizes[g]))
            todo = {how: np.asarray(groups) for how, groups in again.items()}
        return written

    def _exchange(self, payloads: Sequence[tuple[tuple[str, int], list[bytes], int]]) -> list[list[Any]]:
        """Send every (master, data, calls in it) before reading any reply, then read each master's replies
        (error replies returned as hiredis.ReplyError, not raised). A redirection or a master that refused the
        connection raises `_MapMoved` after every reply was read, so the connections stay in step (`_retrying`
        and `fetch` read the map again); a master that did not answer in time, `OnlineStoreUnavailable`."""
        sent: list[tuple[Any, tuple[str, int], int, int]] = []  # (connection, master, commands, payload)
        problems: list[tuple[str, bool]] = []  # (what, whether a master hung)
        for number, (address, data, count) in enumerate(payloads):
            conn = self._node(address)._connection()
            try:
                sock, _ = _socket_of(conn)
                for piece in data:
                    sock.sendall(piece)
            except _IO_ERRORS as exc:
                conn.disconnect()
                problems.append(self._down(address, exc))
                continue
            sent.append((conn, address, count, number))
        replies: list[list[Any]] = [[] for _ in payloads]
        for conn, address, count, number in sent:
            try:
                got = replies[number] = receive_array(conn, count)
            except _IO_ERRORS as exc:
                conn.disconnect()
                problems.append(self._down(address, exc))
                continue
            if hiredis.ReplyError in map(type, got):  # rare: scan for a redirection only then
                moved = next((r for r in got if isinstance(r, hiredis.ReplyError) and str(r).startswith(_STALE)),
                             None)
                if moved is not None:
                    problems.append((f"{address[0]}:{address[1]} answered {str(moved)[:80]}", False))
        if problems:
            what = "; ".join(dict.fromkeys(text for text, _ in problems))
            if any(hung for _, hung in problems):  # never waited for twice: refused now
                raise OnlineStoreUnavailable(f"online store unavailable: {what}")
            raise _MapMoved(f"online store unavailable: {what}")
        return replies

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
                tags = [key[len(prefix):-1] for key in view_keys]  # the keys' entity, not formatted again
                crc = np.fromiter(map(binascii.crc_hqx, tags, itertools.repeat(0, len(tags))), dtype=np.int64,
                                  count=len(tags))
                slots_of[names] = crc & (SLOTS - 1)
            spans.append((r, codec, len(keys), len(keys) + len(view_keys)))
            keys.extend(view_keys)
            slot_parts.append(slots_of[names])
        n = spans[0][3] - spans[0][2] if spans else 0
        slots = np.concatenate(slot_parts) if keys else np.zeros(0, np.int64)
        one_slot = bool(len(slots)) and int(slots.min()) == int(slots.max())
        return _ClusterRead(spans, keys, slots, empty_at(at, n), len(keys), one_slot)

    def fetch(self, pending: Any) -> list[bytes | None]:
        """One MGET per slot, every master's sent before any reply is read; once more after a redirection or
        a dead master (then a master still down refuses the read as unavailable)."""
        if not pending.total:
            return []
        try:
            return self._fetch_by_slot(pending)
        except OnlineStoreUnavailable as exc:
            if not _moved(exc):
                raise
            self._refresh()
            return self._fetch_by_slot(pending)

    def _fetch_by_slot(self, pending: _ClusterRead) -> list[bytes | None]:
        """One MGET per slot (a script reading a master's keys of many slots in one call, Redis 7's
        allow-cross-slot-keys, was no faster: 778 µs against 589 µs at 100 entities, equal at 1000)."""
        owner, masters = self._slot_map()
        if pending.one_slot:  # one entity (the request path's usual read): one MGET, nothing to reorder
            reply = self._exchange([(masters[int(owner[pending.slots[0]])],
                                     [mget_template(pending.total) % tuple(interleaved(pending.keys))], 1)])[0][0]
            if type(reply) is not list:
                raise OnlineStoreError(f"Redis error: {reply}")
            return reply
        order = np.argsort(pending.slots, kind="stable")
        sorted_slots = pending.slots[order]
        starts = np.flatnonzero(np.r_[True, sorted_slots[1:] != sorted_slots[:-1]])
        sizes = np.diff(np.r_[starts, len(order)])
        group_owner = owner[sorted_slots[starts]]
        # Runs of slots on one master (a master's slots are usually one range: one run, one send, each).
        runs = np.r_[np.flatnonzero(np.r_[True, group_owner[1:] != group_owner[:-1]]), len(starts)].tolist()
        key_at = np.r_[0, np.cumsum(sizes)].tolist()
        keys = pending.keys
        flat = interleaved([keys[i] for i in order.tolist()])
        counts = sizes.tolist()
        payloads = []
        for g0, g1 in itertools.pairwise(runs):
            template = b"".join(map(mget_template, counts[g0:g1]))
            payloads.append((masters[int(group_owner[g0])], [template % tuple(flat[2 * key_at[g0]:2 * key_at[g1]])],
                             g1 - g0))
        replies = list(itertools.chain.from_iterable(self._exchange(payloads)))
        if set(map(type, replies)) - {list}:
            raise OnlineStoreError(f"Redis error: {next(r for r in replies if type(r) is not list)}")
        return in_order(pending.total, order, list(itertools.chain.from_iterable(replies)))

    def _down(self, address: tuple[str, int], exc: BaseException) -> tuple[str, bool]:
        """What a connection problem with a master means: (the sentence, whether it hung)."""
        if isinstance(exc, redis.TimeoutError | TimeoutError):
            return (f"Redis Cluster master {address[0]}:{address[1]} did not answer within {self.timeout_s:g}s",
                    True)
        return f"Redis Cluster master {address[0]}:{address[1]} is down ({type(exc).__name__}: {exc})", False

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


class _MapMoved(OnlineStoreUnavailable):
    """A redirection or a master that refused the connection: the slot map moved, read it again."""


def _moved(exc: OnlineStoreUnavailable) -> bool:
    """Whether the store was unavailable because the map moved (try the new map) rather than because a
    master did not answer in time (never waited for twice)."""
    return isinstance(exc, _MapMoved) or "ConnectionError" in str(exc)


def _sends(commands: list[bytes], timeout_s: float | None = None) -> Callable[[RedisOnlineStore], Any]:
    """A call of `_on_master`: send `commands` to the node, the first reply."""
    return lambda node: node._call(commands, timeout_s)[0]


