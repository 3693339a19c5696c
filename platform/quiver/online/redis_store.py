"""The Redis online store: pipelined, vectorised reads and idempotent Lua writes over layout.py's keys.

Commands are packed as RESP by hand and sent on a per-thread connection: redis-py's per-command
machinery costs more than the whole round trip for a one-entity read (docs/architecture.md, "Online read path"). Connection
problems become `OnlineStoreUnavailable` within the configured timeout; a dead connection (a restarted
server) is reopened on the next call, so the store recovers without a restart.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, NamedTuple

import hiredis
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import redis
from redis.backoff import NoBackoff
from redis.exceptions import AuthenticationError, ResponseError
from redis.retry import Retry

from quiver.catalog.ir import ViewSpec
from quiver.offline.layout import EVENT_TS
from quiver.online.base import (
    Batch,
    EntityPresence,
    OnlineStore,
    OnlineStoreError,
    OnlineStoreUnavailable,
    ViewRead,
)
from quiver.online.codec import LastCodec, TileCodec, codec_for, empty_at, newest_per_entity
from quiver.online.layout import INT64_MIN, entity_keys, key_prefix, meta_key
from quiver.online.redis_scripts import SCRIPTS

log = logging.getLogger(__name__)

_IO_ERRORS = (AuthenticationError, redis.ConnectionError, redis.TimeoutError, OSError)
_DEPTH = 8  # commands in flight while the next batch is packed: the server works while we pack
_ENCODE_ROWS = 4_000  # rows encoded at a time, between sends, so encoding overlaps Redis' work


def _bulk(args: Sequence[bytes]) -> bytes:
    # One %-format over all arguments runs in C: ~1.7x faster than formatting them one by one.
    flat: list[Any] = [None] * (2 * len(args))
    flat[0::2] = map(len, args)
    flat[1::2] = args
    return b"$%d\r\n%s\r\n" * len(args) % tuple(flat)


# 10**1 … 10**19: how many of them are <= |v| is the number of decimal digits of v, less one.
_POWERS_OF_TEN = np.array([10**k for k in range(1, 20)], dtype=np.uint64)
_FEW_KEYS = 16  # up to this many keys, formatting them one by one beats the numpy set-up


def _bulk_keys(prefix: bytes, view: ViewSpec, entities: Mapping[str, np.ndarray]) -> tuple[bytes, int]:
    """The entities' keys of `view` as RESP bulk strings (the arguments of an MGET), and how many: the bytes
    `_bulk(entity_keys(...))` gives. A single int64 join key (the usual case) is formatted in one C-level
    %-format over all keys, its lengths counted with numpy, instead of one format per key and one per length."""
    if len(view.keys) != 1 or view.keys[0][1] != "int64":
        keys = entity_keys(prefix, view, entities)
        return _bulk(keys), len(keys)
    values = np.asarray(entities[view.keys[0][0]], dtype=np.int64)
    n = len(values)
    template = b"$%d\r\n" + prefix.replace(b"%", b"%%") + b"%d}\r\n"
    ids = values.tolist()
    if n <= _FEW_KEYS:
        width = len(prefix) + 1  # and the closing brace
        return b"".join([template % (width + len(b"%d" % v), v) for v in ids]), n
    digits = np.searchsorted(_POWERS_OF_TEN, np.abs(values).view(np.uint64), side="right") + 1
    flat: list[Any] = [None] * (2 * n)
    flat[0::2] = (digits + (values < 0) + (len(prefix) + 1)).tolist()
    flat[1::2] = ids
    return template * n % tuple(flat), n


def pack(*args: bytes) -> bytes:
    """One command in RESP."""
    return b"*%d\r\n" % len(args) + _bulk(args)


def _eval(name: str, keys: Sequence[bytes], args: Sequence[bytes]) -> bytes:
    # EVAL, not EVALSHA: Redis caches the compiled script anyway, and a restarted or flushed server can
    # never answer NOSCRIPT in the middle of a pipelined write.
    body, n = SCRIPTS[name], b"%d" % len(keys)
    return b"*%d\r\n$4\r\nEVAL\r\n" % (3 + len(keys) + len(args)) + _bulk([body, n, *keys, *args])


class _PendingRead(NamedTuple):
    spans: list[tuple[ViewRead, Any, int, int]]  # (read, codec, first key, end key)
    command: bytes  # the packed MGET (b"" for no keys)
    at: np.ndarray


class RedisOnlineStore(OnlineStore):
    """Online store on one Redis server (redis://, rediss:// for TLS, :password@ or user:password@ for AUTH)."""

    def __init__(self, url: str, project: str = "default", *, timeout_s: float = 1.0, batch: int = 500):
        self.url = url
        self.project = project
        self.batch = batch
        self.timeout_s = timeout_s
        try:
            self._pool = redis.ConnectionPool.from_url(
                url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                retry=Retry(NoBackoff(), 0), health_check_interval=0)
        except ValueError as exc:
            raise OnlineStoreError(f"invalid Redis URL {redact_url(url)!r}: {exc}") from None
        self._local = threading.local()
        self._all: list[Any] = []
        self._lock = threading.Lock()
        self._probe: Any = None  # one connection for short-timeout health probes, never a reader's
        self._aio: Any = None  # the asyncio client of `fetch_async`, made on first use
        self._probe_lock = threading.Lock()
        self._views: dict[int, tuple[ViewSpec, bytes, LastCodec | TileCodec]] = {}

    # ----- plumbing -----

    def _connection(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._pool.make_connection()
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        return conn

    @contextmanager
    def _errors(self, timeout_s: float | None = None) -> Iterator[None]:
        try:
            yield
        except _IO_ERRORS as exc:
            raise self._refusal(exc, timeout_s) from None

    def _refusal(self, exc: BaseException, timeout_s: float | None) -> OnlineStoreError:
        """What a connection problem means for the caller: refused credentials, or the store unavailable."""
        if isinstance(exc, AuthenticationError):
            return OnlineStoreError(f"Redis at {redact_url(self.url)} refused the credentials: {exc}")
        return OnlineStoreUnavailable(
            f"online store unavailable: Redis at {redact_url(self.url)} did not answer within "
            f"{timeout_s or self.timeout_s:g}s ({type(exc).__name__}: {exc})")

    def _roundtrip(self, commands: Sequence[bytes], conn: Any = None) -> list[Any]:
        """Send commands in one write, read every reply; error replies come back as exceptions.

        redis-py connects (handshake, AUTH, SELECT, TLS) and times out; the bytes go straight through its
        socket and hiredis: its per-reply Python layers cost a third of a one-entity read."""
        conn = conn if conn is not None else self._connection()
        for attempt in (0, 1):
            try:
                sock, reader = _socket_of(conn)
                sock.sendall(commands[0] if len(commands) == 1 else b"".join(commands))
                replies: list[Any] = []
                for _ in commands:
                    reply = reader.gets()
                    while reply is False:
                        data = sock.recv(_RECV_BYTES)
                        if not data:
                            raise ConnectionResetError("Redis closed the connection")
                        reader.feed(data)
                        reply = reader.gets()
                    # One bad reply must not leave the others unread: it is returned, not raised.
                    replies.append(ResponseError(str(reply)) if isinstance(reply, hiredis.ReplyError) else reply)
                return replies
            except AuthenticationError:
                conn.disconnect()
                raise
            except (redis.ConnectionError, ConnectionError):
                # A server restart kills idle sockets: reconnect once (every command here is idempotent).
                conn.disconnect()
                if attempt:
                    raise
            except (redis.TimeoutError, OSError):
                conn.disconnect()
                raise
        raise AssertionError("unreachable")

    def _call(self, commands: Sequence[bytes], timeout_s: float | None = None) -> list[Any]:
        try:  # (not `_errors`: a generator context costs more than the rest of this call)
            if timeout_s is None:
                replies = self._roundtrip(commands)
            else:
                with self._probe_lock:
                    replies = self._roundtrip(commands, self._probe_connection(timeout_s))
        except _IO_ERRORS as exc:
            raise self._refusal(exc, timeout_s) from None
        for reply in replies:
            if isinstance(reply, ResponseError):
                if str(reply).startswith(("NOAUTH", "WRONGPASS")):
                    raise OnlineStoreError(f"Redis at {redact_url(self.url)} needs credentials: {reply}")
                raise OnlineStoreError(f"Redis error: {reply}")
        return replies

    def _probe_connection(self, timeout_s: float) -> Any:
        # Its own socket with its own timeout: a probe must never wait behind (or as long as) a reader.
        conn = self._probe
        if conn is None or conn.socket_timeout != timeout_s:
            if conn is not None:
                conn.disconnect()
            conn = self._pool.make_connection()
            fresh: Any = conn  # the concrete Connection (the pool's type hints name only the interface)
            fresh.socket_timeout = fresh.socket_connect_timeout = timeout_s
            self._probe = conn
        return conn

    def _view(self, view: ViewSpec) -> tuple[bytes, Any]:
        cached = self._views.get(id(view))
        if cached is None or cached[0] is not view:
            cached = (view, key_prefix(self.project, view), codec_for(view))
            self._views[id(view)] = cached
        return cached[1], cached[2]

    # ----- writes -----

    def _run_scripts(self, name: str, keys: Sequence[bytes], values: Sequence[bytes],
                     extra: Sequence[bytes] = (), progress: Callable[[int], None] | None = None,
                     merge: bool = False) -> int:
        """Write keys in batches (see `_stream`); `merge=True` skips the MSETNX attempt."""
        return self._stream(name, [(keys, values)], extra, progress, merge)

    def _stream(self, name: str, chunks: Iterable[tuple[Sequence[bytes], Sequence[bytes]]],
                extra: Sequence[bytes] = (), progress: Callable[[int], None] | None = None,
                merge: bool = False) -> int:
        """Write batches of `self.batch` keys from `chunks` with several batches in flight; `chunks` may be a
        generator that packs the next chunk while Redis still works on the batches sent.

        Each batch first goes as MSETNX, which writes all of its keys when none exists yet and nothing
        otherwise: a bulk load into empty keys runs at raw MSET speed and can never overwrite a value.
        When a batch finds keys present, it is re-sent as the EVAL of `name` (newer-wins / tile merge),
        and so is every later batch of this call. Returns the keys written.
        """
        written = 0
        pending: list[tuple[bool, Sequence[bytes], Sequence[bytes]]] = []  # (was MSETNX, keys, values)
        with self._errors():
            conn = self._connection()

            def send(as_merge: bool, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
                if as_merge:
                    command = _eval(name, keys, [*extra, *values])
                else:
                    pairs: list[bytes] = [b""] * (2 * len(keys))
                    pairs[0::2], pairs[1::2] = keys, values
                    command = pack(b"MSETNX", *pairs)
                conn.send_packed_command([command], check_health=False)
                pending.append((not as_merge, keys, values))

            def settle() -> None:
                nonlocal written, merge
                was_nx, keys, values = pending.pop(0)
                try:
                    reply = int(conn.read_response())
                except ResponseError as exc:
                    # The replies of the batches still in flight would be read as answers to later commands.
                    conn.disconnect()
                    raise OnlineStoreError(f"Redis refused a write: {exc}") from None
                if was_nx and reply == 0:  # some key exists: merge this batch, and assume later ones too
                    merge = True
                    send(True, keys, values)
                    return
                written += len(keys) if was_nx else reply
                if progress:
                    progress(len(keys))

            try:
                for keys, values in chunks:
                    for start in range(0, len(keys), self.batch):
                        send(merge, keys[start:start + self.batch], values[start:start + self.batch])
                        while len(pending) >= _DEPTH:
                            settle()
                while pending:
                    settle()
            except (redis.ConnectionError, redis.TimeoutError, OSError):
                conn.disconnect()
                raise
        return written

    def write_last_values(self, view: ViewSpec, table: pa.Table,
                          progress: Callable[[int], None] | None = None) -> int:
        """Newest row per entity, newer-wins (see OnlineStore)."""
        if view.kind != "last":
            raise OnlineStoreError(f"view {view.name!r} is an aggregation view; write its tiles")
        prefix, codec = self._view(view)
        table = newest_per_entity(view, _drop_null_keys(view, table, EVENT_TS))
        if table.num_rows == 0:
            return 0
        keys = entity_keys(prefix, view, _key_columns(view, table))
        newest = [INT64_MIN]

        def chunks() -> Iterator[tuple[Sequence[bytes], Sequence[bytes]]]:
            for start in range(0, table.num_rows, _ENCODE_ROWS):
                values, ts = codec.encode(table.slice(start, _ENCODE_ROWS))
                newest[0] = max(newest[0], int(ts.max()))
                yield keys[start:start + _ENCODE_ROWS], values

        self._stream("last", chunks(), progress=progress)
        self._touch(view.name, newest[0])
        return len(keys)

    def write_tiles(self, view: ViewSpec, table: pa.Table,
                    progress: Callable[[int], None] | None = None) -> int:
        """Upsert whole tiles per entity (see OnlineStore)."""
        if view.kind != "agg":
            raise OnlineStoreError(f"view {view.name!r} holds last values; write rows, not tiles")
        prefix, codec = self._view(view)
        table = _drop_null_keys(view, table, "tile_start")
        if table.num_rows == 0:
            return 0
        firsts, values, newest = codec.encode(table)
        keys = entity_keys(prefix, view, _key_columns(view, firsts))
        extra = [b"%d" % codec.width, b"%d" % codec.var_offset, b"%d" % codec.horizon]
        self._run_scripts("tile", keys, values, extra, progress=progress)
        self._touch(view.name, int(newest.max()))
        return len(keys)

    def _touch(self, view: str, max_event_ts: int) -> None:
        self._call([_eval("meta", [meta_key(self.project, view)], [b"%d" % max_event_ts])])

    def raise_freshness(self, view: str, max_event_ts_us: int) -> None:
        """Raise `max_event_ts` atomically (one script): a concurrent writer's higher value is kept."""
        self._touch(view, max_event_ts_us)

    def set_meta(self, view: str, field: str, value: str) -> None:
        """Set one field of a view's metadata hash (e.g. the materialization marker)."""
        self._call([pack(b"HSET", meta_key(self.project, view), field.encode(), value.encode())])

    def get_meta(self, view: str, field: str) -> str | None:
        reply = self._call([pack(b"HGET", meta_key(self.project, view), field.encode())])[0]
        return None if reply is None else bytes(reply).decode()

    # ----- reads -----

    def read(self, reads: Sequence[ViewRead], entities: Mapping[str, np.ndarray],
             at: int | np.ndarray) -> Batch:
        """One MGET for every view and entity, decoded per view (see OnlineStore)."""
        pending = self.plan_read(reads, entities, at)
        return self.finish_read(pending, self.fetch(pending))

    def plan_read(self, reads: Sequence[ViewRead], entities: Mapping[str, np.ndarray],
                  at: int | np.ndarray) -> _PendingRead:
        """The keys and codecs of a read, and its one MGET packed (no I/O)."""
        spans: list[tuple[ViewRead, Any, int, int]] = []
        parts: list[bytes] = []
        total = 0
        for r in reads:
            prefix, codec = self._view(r.view)
            packed, count = _bulk_keys(prefix, r.view, entities)
            parts.append(packed)
            spans.append((r, codec, total, total + count))
            total += count
        n = spans[0][3] - spans[0][2] if spans else 0
        command = b"*%d\r\n$4\r\nMGET\r\n" % (total + 1) + b"".join(parts) if total else b""
        return _PendingRead(spans, command, empty_at(at, n))

    def fetch(self, pending: Any) -> list[bytes | None]:
        """The blocking part of a read: its MGET round trip (and nothing else, so a server can run just this
        on a worker thread while the decoding stays on its event loop)."""
        return list(self._call([pending.command])[0]) if pending.command else []

    def async_fetch(self) -> Callable[[Any], Awaitable[list[bytes | None]]] | None:
        # The asyncio client speaks no TLS: rediss:// reads go through the server's worker threads.
        return None if self.url.startswith("rediss://") else self.fetch_async

    async def fetch_async(self, pending: Any) -> list[bytes | None]:
        """`fetch` from a coroutine, on one pipelined asyncio connection (`online/redis_async.py`): no worker
        thread, the loop free while Redis works; errors and timeouts as `fetch`."""
        if not pending.command:
            return []
        from quiver.online.redis_async import AsyncRedis, AsyncRedisError, AsyncRedisUnavailable

        if self._aio is None:
            self._aio = AsyncRedis(self.url, self.timeout_s)
        try:
            reply = await self._aio.roundtrip(pending.command)
        except AsyncRedisUnavailable as exc:
            raise OnlineStoreUnavailable(
                f"online store unavailable: Redis at {redact_url(self.url)} did not answer within "
                f"{self.timeout_s:g}s ({exc})") from None
        except AsyncRedisError as exc:
            if str(exc).startswith(("NOAUTH", "WRONGPASS")):
                raise OnlineStoreError(f"Redis at {redact_url(self.url)} needs credentials: {exc}") from None
            raise OnlineStoreError(f"Redis error: {exc}") from None
        return list(reply)

    def finish_read(self, pending: Any, fetched: Any) -> Batch:
        """Decode the fetched values per view (no I/O)."""
        batch = Batch()
        spans, at_arr, values = pending.spans, pending.at, fetched
        for r, codec, start, stop in spans:
            chunk = values[start:stop] if len(spans) > 1 else values
            if isinstance(codec, LastCodec):
                codec.decode(chunk, r.features, at_arr, r.view.ttl_us, batch)
                batch.presence[r.view.name] = EntityPresence(chunk, at_arr, r.view.ttl_us, True)
            else:
                codec.decode(chunk, r.features, at_arr, batch)
                batch.presence[r.view.name] = EntityPresence(chunk, at_arr, None, False)
        return batch

    def set_members(self, key: str) -> set[str]:
        """The members of a Redis SET (the JVM sink's batch markers, online/jvm_sink.py)."""
        return {m.decode() for m in self._call([pack(b"SMEMBERS", key.encode())])[0]}

    def remove_members(self, key: str, members: Sequence[str]) -> None:
        if members:
            self._call([pack(b"SREM", key.encode(), *(m.encode() for m in members))])

    def read_raw(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """MGET of raw keys (diagnostics and benchmarks)."""
        return list(self._call([pack(b"MGET", *keys)])[0]) if keys else []

    def freshness(self, views: Sequence[str], *, timeout_s: float | None = None) -> dict[str, int | None]:
        """Newest event time written per view (epoch µs) from the meta hashes, one round trip."""
        if not views:
            self.ping(timeout_s=timeout_s)
            return {}
        replies = self._call([pack(b"HGET", meta_key(self.project, v), b"max_event_ts") for v in views],
                             timeout_s)
        return {v: (int(r) if r is not None else None) for v, r in zip(views, replies, strict=True)}

    def ping(self, *, timeout_s: float | None = None) -> None:
        """Raise OnlineStoreUnavailable unless Redis answers PING (within `timeout_s` when given)."""
        self._call([pack(b"PING")], timeout_s)

    def flush_project(self) -> int:
        """Delete every key of this project (tests, demos). Returns keys deleted."""
        deleted = 0
        with self._errors():
            client = redis.Redis(connection_pool=self._pool)
            for chunk in _chunks(client.scan_iter(match=f"q:{self.project}:*", count=1000), 1000):
                deleted += int(client.unlink(*chunk))
        return deleted

    def close(self) -> None:
        with self._lock:
            for conn in self._all:
                conn.disconnect()
            self._all.clear()
        with self._probe_lock:
            if self._probe is not None:
                self._probe.disconnect()
                self._probe = None
        if self._aio is not None:
            self._aio.close()
            self._aio = None
        self._local = threading.local()
        self._pool.disconnect()


_RECV_BYTES = 1 << 16


def _socket_of(conn: Any) -> tuple[Any, Any]:
    """The connected socket of a redis-py connection (connecting it first) and a hiredis reader of its own, made
    anew with each socket so that no byte of an earlier connection is ever read as a reply."""
    sock = conn._sock
    if sock is None:
        conn.connect()
        sock = conn._sock
    pair = getattr(conn, "_quiver_io", None)
    if pair is None or pair[0] is not sock:
        pair = conn._quiver_io = (sock, hiredis.Reader())
    return pair


def _drop_null_keys(view: ViewSpec, table: pa.Table, time_column: str) -> pa.Table:
    valid = None
    for name in [*view.key_names, time_column]:
        ok = pc.is_valid(table.column(name))
        valid = ok if valid is None else pc.and_(valid, ok)
    if valid is None or pc.all(valid).as_py():
        return table
    dropped = table.num_rows - int(pc.sum(valid).as_py() or 0)
    log.warning("online store: skipped %d rows of view %s with a null key or time", dropped, view.name)
    return table.filter(valid)


def _key_columns(view: ViewSpec, table: pa.Table) -> dict[str, np.ndarray]:
    return {k: table.column(k).to_numpy(zero_copy_only=False) for k in view.key_names}


def _chunks(items: Any, size: int) -> Iterator[list[Any]]:
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def redact_url(url: str) -> str:
    """The URL without its password."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0] if ":" in creds else ""
    return f"{scheme}://{user}:***@{host}"
