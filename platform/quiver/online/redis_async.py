"""A minimal asyncio Redis client for the feature server's reads: one pipelined connection per event loop.

Commands are written in order on one connection and the replies (parsed by hiredis) resolve the waiting
futures first-in first-out, so a read costs one write and one wakeup of the loop: no worker thread, no task
per command (redis.asyncio spends a task and a timeout context on each). A command without a reply within
the timeout aborts the connection (its replies can no longer be matched) and fails everything waiting on it;
the next command connects again. TLS (`rediss://`) is not supported here: use the thread path for it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from typing import Any

import hiredis
from redis.connection import parse_url


class AsyncRedisError(Exception):
    """Redis answered with an error reply."""


class AsyncRedisUnavailable(Exception):
    """No connection, or no reply within the timeout."""


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.reader = hiredis.Reader()
        self.waiting: deque[asyncio.Future[Any]] = deque()
        self.transport: asyncio.Transport | None = None
        self.lost: BaseException | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            if not self.waiting:  # a reply nobody waits for: the stream is out of step, start over
                self.abort(AsyncRedisUnavailable("unexpected reply"))
                return
            future = self.waiting.popleft()
            if not future.done():
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(exc or AsyncRedisUnavailable("connection closed by the server"))

    def fail(self, exc: BaseException) -> None:
        self.lost = self.lost or exc
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_exception(AsyncRedisUnavailable(str(exc)))

    def abort(self, exc: BaseException) -> None:
        self.fail(exc)
        if self.transport is not None:
            self.transport.abort()

    def send(self, command: bytes, loop: asyncio.AbstractEventLoop) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = loop.create_future()
        self.waiting.append(future)
        assert self.transport is not None
        self.transport.write(command)
        return future


class AsyncRedis:
    """Send packed commands to the Redis of `url` (redis:// or unix://) from coroutines."""

    def __init__(self, url: str, timeout_s: float):
        if url.startswith("rediss://"):
            raise ValueError("the asyncio client does not speak TLS (rediss://)")
        self.options: dict[str, Any] = parse_url(url)  # type: ignore[no-untyped-call]
        self.timeout_s = timeout_s
        self._protocol: _Protocol | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connecting: asyncio.Future[_Protocol] | None = None

    async def roundtrip(self, command: bytes) -> Any:
        """The reply to one packed command; a restarted server (a dead connection) is retried once."""
        for attempt in (0, 1):
            protocol = await self._connection()
            try:
                return await self._await(protocol, protocol.send(command, asyncio.get_running_loop()))
            except AsyncRedisUnavailable:
                if attempt or protocol.lost is None or isinstance(protocol.lost, TimeoutError):
                    raise
        raise AssertionError("unreachable")

    async def _await(self, protocol: _Protocol, future: asyncio.Future[Any]) -> Any:
        loop = asyncio.get_running_loop()
        timer = loop.call_later(self.timeout_s, self._expire, protocol, future)
        try:
            reply = await future
        finally:
            timer.cancel()
        if isinstance(reply, hiredis.ReplyError):
            raise AsyncRedisError(str(reply))
        return reply

    def _expire(self, protocol: _Protocol, future: asyncio.Future[Any]) -> None:
        if not future.done():
            protocol.abort(TimeoutError(f"no reply within {self.timeout_s:g}s"))

    async def _connection(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        protocol = self._protocol
        if protocol is not None and self._loop is loop and protocol.lost is None:
            return protocol
        if self._connecting is not None and self._loop is loop and not self._connecting.done():
            return await asyncio.shield(self._connecting)
        self._loop = loop
        self._connecting = asyncio.ensure_future(self._connect(loop))
        self._protocol = await asyncio.shield(self._connecting)
        return self._protocol

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> _Protocol:
        o = self.options
        try:
            if "path" in o:
                made = loop.create_unix_connection(_Protocol, o["path"])
            else:
                made = loop.create_connection(_Protocol, o.get("host", "localhost"), int(o.get("port", 6379)))
            _, protocol = await asyncio.wait_for(made, self.timeout_s)
        except (OSError, TimeoutError) as exc:
            raise AsyncRedisUnavailable(f"cannot connect: {exc}") from None
        setup = []
        if o.get("password"):
            user = o.get("username")
            setup.append([b"AUTH", *([user.encode()] if user else []), str(o["password"]).encode()])
        if int(o.get("db") or 0):
            setup.append([b"SELECT", str(o["db"]).encode()])
        for args in setup:
            packed = b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)
            await self._await(protocol, protocol.send(packed, loop))
        return protocol

    def close(self) -> None:
        """Drop the connection (futures still waiting fail); safe from any thread."""
        protocol, loop, self._protocol = self._protocol, self._loop, None
        if protocol is None or loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop stopped meanwhile: its sockets go with it
            loop.call_soon_threadsafe(protocol.abort, AsyncRedisUnavailable("client closed"))
