"""What every Quiver HTTP server shares: blocking store calls off the event loop, fail-fast while the store
is down, connection limits for uvicorn, and one /metrics text for the server's and the process's metrics.

    gate = StoreGate(store.online, views=["user_spend"])
    result = await gate.call(store.get_online_features, refs, entities)   # 503-ready OnlineStoreUnavailable
    probe = await gate.health()                                            # never waits on a stalled store
    uvicorn.run(app, **ServerLimits().uvicorn_kwargs())

Why a thread pool: a store read is a blocking socket round trip (redis-py under our hand-packed RESP,
`online/redis_store.py`). Run inline in an async handler, a stalled Redis stalls the loop, and with it
/health, /metrics and every other request. `StoreGate.call` runs the call on a small pool of worker threads,
bounded: when Redis stops answering, the first probe or timed-out call marks the store down, and from then
on requests fail at once with `StoreUnavailable` (the servers answer 503 + Retry-After) instead of queueing
behind the stall; a probe (at most every `probe_interval_s`, started by the traffic itself, no background
task) marks it up again.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from quiver.online.base import OnlineStore, OnlineStoreError, OnlineStoreUnavailable

log = logging.getLogger(__name__)
T = TypeVar("T")


class StoreUnavailable(OnlineStoreUnavailable):
    """The store is down or saturated; answer 503 with `Retry-After: retry_after_s`. The message is safe to
    show to clients (no hosts, no credentials): details go to the log."""

    def __init__(self, message: str, retry_after_s: int = 1):
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class Probe:
    """The result of one health probe of the online store."""

    up: bool
    checked_at: float  # time.monotonic()
    newest: dict[str, int | None] = field(default_factory=dict)  # view → newest event time (µs) held
    seconds: float = 0.0

    @property
    def views_without_data(self) -> list[str]:
        """Online views the store holds no marker for (never materialized, flushed, or a new Redis)."""
        return sorted(v for v, ts in self.newest.items() if ts is None)


class StoreGate:
    """Runs blocking online-store calls on worker threads; fails fast while the store is down.

    - `call(fn, ...)`: `fn` runs on one of `workers` threads; more than `workers + max_waiting` calls at once
      are refused (StoreUnavailable, "busy"). While the store is marked down every call is refused at once.
      A call still running after `stall_after_s` starts a probe, so a stall is noticed in about
      `probe_timeout_s` instead of the store's full timeout.
    - `health()`: a probe with its own short timeout on its own thread and connection (single flight); while
      the store is down it answers from the last probe at once and probes again in the background.
    """

    def __init__(self, store: OnlineStore | Callable[[], OnlineStore], views: Iterable[str] = (), *,
                 workers: int = 16, max_waiting: int = 256, probe_timeout_s: float | None = None,
                 probe_interval_s: float = 0.5, retry_after_s: int = 1):
        # `store` may be a factory: building an app (e.g. for its OpenAPI schema) must not connect anywhere.
        is_store = isinstance(store, OnlineStore) or hasattr(store, "freshness")
        self._store: OnlineStore | None = store if is_store else None  # type: ignore[assignment]
        self._factory: Callable[[], OnlineStore] | None = None if is_store else store  # type: ignore[assignment]
        self.views = sorted(views)
        self.workers = workers
        self.max_waiting = max_waiting
        self._probe_timeout_s = probe_timeout_s
        self.probe_interval_s = probe_interval_s
        self.retry_after_s = retry_after_s
        self.up = True
        self.last = Probe(True, time.monotonic())
        self.down_since: float | None = None
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="quiver-store")
        self._probe_pool = ThreadPoolExecutor(1, thread_name_prefix="quiver-probe")
        self._in_flight = 0
        self._count_lock = threading.Lock()
        self._probing: asyncio.Future[Probe] | None = None
        self._listeners: list[Callable[[Probe], None]] = []

    @property
    def store(self) -> OnlineStore:
        if self._store is None:
            assert self._factory is not None
            self._store = self._factory()
        return self._store

    @property
    def probe_timeout_s(self) -> float:
        """Shorter than the store's timeout, so /health answers before a stalled read would."""
        if self._probe_timeout_s is None:
            self._probe_timeout_s = min(0.5, float(getattr(self.store, "timeout_s", 1.0)) / 2)
        return self._probe_timeout_s

    @property
    def stall_after_s(self) -> float:
        """A store call running this long starts a probe."""
        return self.probe_timeout_s

    def on_probe(self, listener: Callable[[Probe], None]) -> None:
        """Call `listener(probe)` after every probe (metrics gauges)."""
        self._listeners.append(listener)

    # ----- calls -----

    def refuse_if_down(self) -> None:
        """StoreUnavailable at once while the store is marked down (and a probe soon, so the traffic itself
        brings the server back): for callers that queue for something else before `call`."""
        if not self.up:
            self._probe_soon()
            raise StoreUnavailable("online store unavailable; retry later", self.retry_after_s)

    async def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` on a worker thread; StoreUnavailable at once while the store is down or the
        pool is saturated. OnlineStoreUnavailable raised by `fn` marks the store down."""
        if not self.up:
            self._probe_soon()
            raise StoreUnavailable("online store unavailable; retry later", self.retry_after_s)
        with self._count_lock:
            if self._in_flight >= self.workers + self.max_waiting:
                busy = True
            else:
                busy = False
                self._in_flight += 1
        if busy:
            raise StoreUnavailable("server busy: too many requests waiting for the online store",
                                   self.retry_after_s)
        loop = asyncio.get_running_loop()
        suspect = loop.call_later(self.stall_after_s, self._probe_soon)
        try:
            return await loop.run_in_executor(self._pool, functools.partial(self._run, fn, args, kwargs))
        finally:
            suspect.cancel()

    async def call_async(self, fn: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> T:
        """`await fn(*args, **kwargs)` (an asyncio store call) under the same rules as `call`: refused at once
        while the store is down or too many calls wait; a stall starts a probe; unavailability marks it down."""
        if not self.up:
            self._probe_soon()
            raise StoreUnavailable("online store unavailable; retry later", self.retry_after_s)
        if self._in_flight >= self.workers + self.max_waiting:
            raise StoreUnavailable("server busy: too many requests waiting for the online store",
                                   self.retry_after_s)
        with self._count_lock:
            self._in_flight += 1
        suspect = asyncio.get_running_loop().call_later(self.stall_after_s, self._probe_soon)
        try:
            return await fn(*args, **kwargs)
        except OnlineStoreUnavailable as exc:
            self._mark_down(str(exc))
            raise StoreUnavailable("online store unavailable; retry later", self.retry_after_s) from None
        finally:
            suspect.cancel()
            with self._count_lock:
                self._in_flight -= 1

    def _run(self, fn: Callable[..., T], args: Sequence[Any], kwargs: dict[str, Any]) -> T:
        try:
            if not self.up:  # queued behind a stall that has been noticed meanwhile: do not join it
                raise StoreUnavailable("online store unavailable; retry later", self.retry_after_s)
            return fn(*args, **kwargs)
        except StoreUnavailable:
            raise
        except OnlineStoreUnavailable as exc:
            self._mark_down(str(exc))
            raise StoreUnavailable("online store unavailable; retry later", self.retry_after_s) from None
        finally:
            with self._count_lock:
                self._in_flight -= 1

    def _mark_down(self, detail: str) -> None:
        if self.up:
            log.warning("online store marked down: %s", detail)
            self.down_since = time.monotonic()
        self.up = False
        self._record(Probe(False, time.monotonic(), dict(self.last.newest)))

    def _record(self, probe: Probe) -> None:
        self.last = probe
        for listener in self._listeners:
            listener(probe)

    # ----- probes -----

    async def health(self) -> Probe:
        """The store's state, never waiting longer than `probe_timeout_s`: a fresh probe, except while the store
        is down and the last probe is younger than `probe_interval_s` (then that one, at once)."""
        if not self.up and time.monotonic() - self.last.checked_at < self.probe_interval_s:
            return self.last
        return await self.probe()

    async def probe(self) -> Probe:
        """Probe now (joining a probe already running)."""
        if self._probing is None or self._probing.done():
            loop = asyncio.get_running_loop()
            self._probing = asyncio.ensure_future(loop.run_in_executor(self._probe_pool, self._probe_sync))
        return await asyncio.shield(self._probing)

    def _probe_soon(self) -> None:
        if (self._probing is None or self._probing.done()) and \
                time.monotonic() - self.last.checked_at >= self.probe_interval_s:
            self._probing = asyncio.ensure_future(
                asyncio.get_running_loop().run_in_executor(self._probe_pool, self._probe_sync))

    def _probe_sync(self) -> Probe:
        began = time.monotonic()
        try:
            newest = self.store.freshness(self.views, timeout_s=self.probe_timeout_s)
        except OnlineStoreError as exc:  # unavailable, or refusing us (credentials): either way, down
            self._mark_down(str(exc))
            return self.last
        if not self.up:
            log.warning("online store answers again after %.1f s down", began - (self.down_since or began))
        self.up = True
        self.down_since = None
        self._record(Probe(True, time.monotonic(), newest, time.monotonic() - began))
        return self.last

    def close(self) -> None:
        """Stop the worker threads (calls still running finish first)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._probe_pool.shutdown(wait=False, cancel_futures=True)


@dataclass(frozen=True)
class ServerLimits:
    """Connection limits for uvicorn (the defaults are the servers' defaults; see docs/serving.md).

    - `max_header_bytes`: request line plus headers; more is a 431 and the connection closes.
    - `request_timeout_s`: a request's head and body must arrive within this after it starts (or after the
      connection opens); else the connection closes (slow or half-sent requests, idle new connections).
    - `keep_alive_s`: an idle keep-alive connection closes after this.
    - `max_concurrency`: open connections plus requests in flight; beyond it new requests get 503.
    - `per_client_concurrency`: requests of one client in flight on the data routes (/predict,
      /features/online); beyond it 429 + Retry-After at once, so one heavy client cannot hold every worker.
      The client is its peer address, or the value of `client_header` when set (behind a proxy that sets,
      say, X-Forwarded-For and overwrites what clients send).
    - `scoring_concurrency` (prediction server): scoring calls at once (default: the CPU count, at least 2);
      the next slot goes to the waiting client served the fewest rows lately (`edge.FairSlots`).
    - `heavy_body_bytes`: a request whose body is bigger (or of unknown size) goes through the heavy lane
      (`edge.HeavyLane`): one at a time, and no more than its share of the server's time while other
      clients are active; 0: no lane. 32 KiB is ~200 rows of a /predict body.
    """

    max_header_bytes: int = 16 * 1024
    request_timeout_s: float = 10.0
    keep_alive_s: float = 5.0
    max_concurrency: int = 1024
    backlog: int = 2048
    per_client_concurrency: int = 8
    client_header: str = ""
    scoring_concurrency: int = field(default_factory=lambda: max(2, os.cpu_count() or 2))
    heavy_body_bytes: int = 32 * 1024

    def uvicorn_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `uvicorn.run` / `uvicorn.Config` applying these limits."""
        return {"http": guarded_protocol(self), "timeout_keep_alive": self.keep_alive_s,
                "limit_concurrency": self.max_concurrency, "backlog": self.backlog,
                "h11_max_incomplete_event_size": self.max_header_bytes}


# The cyclic GC's generation-0 threshold (CPython's default: 700), then how many of the younger collections
# trigger the next older one. A 1,000-row request allocates ~100k objects (dicts, floats): at the default,
# gen-2 passes over every live object ran several times a second under such traffic, and every request
# waited for them (light clients' p99 137 → 14.5 ms, heavy throughput 38 → 64 requests/s with these).
GC_THRESHOLDS = (100_000, 50, 1_000)


def tune_gc() -> None:
    """Set the server's GC: what start-up loaded (models, the catalog, libraries) is frozen out of every
    collection (`gc.freeze`), and collections come after GC_THRESHOLDS allocations, not 700. Request handling
    makes few reference cycles; what it makes is still collected, less often."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def run_uvicorn(app: Any, host: str, port: int, log_level: str,
                limits: ServerLimits | None = None) -> signal.Signals | None:
    """Serve `app` with uvicorn until SIGTERM or SIGINT, under `limits` (default: ServerLimits()): the one way
    both the feature server and the prediction server run. Returns the signal that stopped it (None: it
    stopped otherwise), after uvicorn finished the requests in flight.

    uvicorn re-raises a captured signal once it has shut down; with SIGTERM's default action that kills the
    process there, before the caller's cleanup (closing the serving log, draining the shadow queue) runs.
    This server keeps the signal instead and returns it, so the caller's `finally` and `with` blocks run."""
    import uvicorn

    class Server(uvicorn.Server):
        stopped_by: signal.Signals | None = None

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            with super().capture_signals():
                try:
                    yield
                finally:
                    captured = getattr(self, "_captured_signals", [])
                    if captured:
                        self.stopped_by = signal.Signals(captured[0])
                        captured.clear()  # nothing left for uvicorn to re-raise

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            **(limits or ServerLimits()).uvicorn_kwargs())
    server = Server(config)
    tune_gc()
    server.run()
    if not server.started and server.stopped_by is None:
        from uvicorn.config import STARTUP_FAILURE

        raise SystemExit(STARTUP_FAILURE)  # uvicorn could not start (port taken, …): it logged why
    return server.stopped_by


def guarded_protocol(limits: ServerLimits) -> type:
    """uvicorn's httptools protocol with a header-size limit and a read deadline per request."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class GuardedProtocol(HttpToolsProtocol):
        _head_bytes = 0
        _too_large = False
        _deadline: asyncio.TimerHandle | None = None
        _running: Any = None  # the request cycle whose app runs now (pipelined ones wait in `self.pipeline`)

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            # uvicorn marks only the newest parsed cycle disconnected. With pipelined requests that is a queued
            # one, and the cycle still running then writes its answer to the closed transport: uvloop raises
            # RuntimeError and uvicorn logs a traceback per connection. Mark the running one too, so its
            # send() returns quietly, as it does for an unpipelined request.
            running = self._running
            if running is not None and not running.response_complete:
                running.disconnected = True
                running.message_event.set()
                if self.pipeline:
                    log.debug("client closed a connection with %d pipelined requests unanswered",
                              len(self.pipeline) + 1)
            self.pipeline.clear()  # never started once the transport closes: drop them
            super().connection_lost(exc)

        def _start_asgi_task(self, cycle: Any, app: Any) -> None:
            self._running = cycle
            super()._start_asgi_task(cycle, app)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._head_bytes = 0
            self._arm()

        def on_url(self, url: bytes) -> None:
            self._count(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count(len(name) + len(value) + 4)
            super().on_header(name, value)

        def on_message_complete(self) -> None:
            self._disarm()
            super().on_message_complete()

        def send_400_response(self, msg: str) -> None:
            if not self._too_large:
                super().send_400_response(msg)
                return
            body = f"request headers larger than {limits.max_header_bytes} bytes".encode()
            self.transport.write(b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain\r\n"
                                 b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body))
            self.transport.close()

        def _count(self, size: int) -> None:
            self._head_bytes += size
            if self._head_bytes > limits.max_header_bytes:
                self._too_large = True
                raise ValueError("request head too large")  # httptools stops parsing: send_400_response

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(limits.request_timeout_s, self._read_timed_out)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _read_timed_out(self) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                log.info("closing a connection whose request did not arrive within %gs", limits.request_timeout_s)
                self.transport.close()

    return GuardedProtocol


class MergedRegistry:
    """Collects several Prometheus registries as one (the first to name a metric family wins), so a server's
    /metrics shows its own metrics and everything the process registered in the default registry
    (monitoring metrics, the serving log, the Python process collector)."""

    def __init__(self, *registries: Any):
        self.registries = registries

    def collect(self) -> Iterable[Any]:
        seen: set[str] = set()
        for registry in self.registries:
            for family in registry.collect():
                if family.name not in seen:
                    seen.add(family.name)
                    yield family


def metrics_text(own: Any) -> bytes:
    """Prometheus text of `own` (a CollectorRegistry) merged with the process's default registry."""
    from prometheus_client import REGISTRY, generate_latest

    return bytes(generate_latest(MergedRegistry(own, REGISTRY)))  # type: ignore[arg-type]


def export_metrics(destination: str, job: str = "quiver", registry: Any = None) -> None:
    """Hand a short-lived process's metrics (default: prometheus_client's default registry, where the
    monitoring metrics live) to Prometheus: a path ending in `.prom` is written atomically for node_exporter's
    textfile collector; an http(s) URL is a Pushgateway, pushed to under `job`."""
    from prometheus_client import REGISTRY, push_to_gateway, write_to_textfile

    registry = registry if registry is not None else REGISTRY
    if destination.startswith(("http://", "https://")):
        push_to_gateway(destination, job=job, registry=registry)
    elif destination.endswith(".prom"):
        write_to_textfile(destination, registry)
    else:
        raise ValueError(f"metrics destination {destination!r}: give a textfile path ending in .prom or a "
                         f"Pushgateway URL (http://host:9091)")
