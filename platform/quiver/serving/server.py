"""The HTTP feature server (FastAPI): POST /features/online, GET /health, GET /metrics, OpenAPI at /docs.

- Auth: when an API key is configured (QUIVER_API_KEY, or `api_key` passed in), /features/online needs the
  header `X-API-Key`; a missing or wrong key is a 401. /health and /metrics stay open for probes and
  scrapers (they reveal no feature values and no hosts; details go to the log).
- Input: strict JSON and pydantic models (`quiver.serving.edge`); malformed bodies (NaN, 1e400, lone
  surrogates, times outside the supported range, keys beyond int64) are 422 naming the field, unknown
  features or wrong key types 400, bodies over the limit 413 (checked on Content-Length and on the bytes
  actually received), request heads over the limit 431, more than `per_client_concurrency` requests of one
  client in flight 429 (see `runtime.ServerLimits`).
- The store: only the Redis round trip leaves the event loop, under `runtime.StoreGate` (the asyncio client,
  or a worker thread). While Redis is down or stalled requests get 503 + Retry-After at once, /health and
  /metrics keep answering, and the first probe that gets an answer brings the server back.
- Well-formed /features/online requests are answered through `edge.LeanPost` (no FastAPI routing or
  dependency solving); every other request, errors included, is FastAPI's.
- Every returned value has a status (`status` in the response: PRESENT, NULL_VALUE, NOT_FOUND,
  OUTSIDE_MAX_AGE); /metrics counts entity reads per view and status.
- /metrics (Prometheus): request latency histogram per route, request counts per route and status, reads
  per view and status, online store up/down, feature freshness per view (now − newest event time the
  store holds; absent when it holds none) and whatever else the process registered in prometheus_client's
  default registry (the monitoring metrics).
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from typing import Any

import numpy as np
from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import JSONResponse, Response
from fastapi.security import APIKeyHeader
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from quiver.catalog.errors import QuiverError
from quiver.online.base import STATUS_NAMES, OnlineStoreError, now_us
from quiver.serving.edge import (
    COMMON_RESPONSES,
    ClientCounts,
    ClientLimit,
    LeanPost,
    create_fastapi,
    json_bytes,
)
from quiver.serving.result import OnlineResult
from quiver.serving.runtime import Probe, ServerLimits, StoreGate, StoreUnavailable, metrics_text, run_uvicorn
from quiver.serving.schemas import OnlineRequest, OnlineResponse
from quiver.serving.store import FeatureStore

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1 << 20
_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def create_app(store: FeatureStore, api_key: str | None = None, *, max_body_bytes: int = MAX_BODY_BYTES,
               gate: StoreGate | None = None, store_io: str = "async",
               limits: ServerLimits | None = None) -> FastAPI:
    """A FastAPI app serving `store`. `api_key` defaults to QUIVER_API_KEY or the config's api_key;
    `gate` (default: one over `store.online`) runs the store calls off the event loop: on its worker
    with the asyncio client for a store with `fetch_async` (Redis; `store_io="async"`, the default: on a quiet
    machine benchmarks/_serve_modes.py measured it within 5 % of the blocking inline read and 20 % ahead of
    worker threads, at the lowest server CPU per request), or on its worker threads (`store_io="thread"`);
    `limits` gives the per-client concurrency (default ServerLimits())."""
    limits = limits or ServerLimits()
    if store_io not in ("thread", "async"):
        raise QuiverError(f"store_io must be 'thread' or 'async', got {store_io!r}")
    key = api_key if api_key is not None else (os.environ.get("QUIVER_API_KEY")
                                               or store.config.api_key or "")
    metrics = CollectorRegistry()
    latency = Histogram("quiver_request_seconds", "HTTP request latency", ["route"], registry=metrics,
                        buckets=_LATENCY_BUCKETS)
    requests = Counter("quiver_requests", "HTTP requests", ["route", "status"], registry=metrics)
    freshness = Gauge("quiver_feature_freshness_seconds",
                      "Now minus the newest event time the online store holds, per view", ["view"], registry=metrics)
    present = Gauge("quiver_online_view_present", "1 when the online store holds data of the view, else 0",
                    ["view"], registry=metrics)
    store_up = Gauge("quiver_online_store_up", "1 when the online store answered the last probe", registry=metrics)
    reads = Counter("quiver_online_reads", "Entity reads per view and FieldStatus (NOT_FOUND: nothing stored)",
                    ["view", "status"], registry=metrics)
    version = Gauge("quiver_catalog_version", "Registry catalog version served (0: read from disk, unapplied)",
                    registry=metrics)
    version.set(store.catalog_version or 0)
    online_views = sorted(v.name for v in store.catalog.views.values() if v.online)
    gate = gate or StoreGate(lambda: store.online, online_views)
    read_counters = {(view, code): reads.labels(view, STATUS_NAMES[code - 1])
                     for view in online_views for code in range(1, len(STATUS_NAMES) + 1)}

    def publish(probe: Probe) -> None:
        store_up.set(1 if probe.up else 0)
        if not probe.up:
            return  # keep the last known freshness: the store did not say anything new
        now = now_us()
        for view, ts in probe.newest.items():
            present.labels(view).set(0 if ts is None else 1)
            if ts is None:  # lost or never written: no age to report, rather than a frozen one
                with contextlib.suppress(KeyError):
                    freshness.remove(view)
            else:
                freshness.labels(view).set(max(0.0, (now - ts) / 1e6))

    gate.on_probe(publish)
    app = create_fastapi("Quiver feature server", "Online feature values from the Quiver online store.")
    client_counts = ClientCounts()
    header = APIKeyHeader(name="X-API-Key", auto_error=False, description="required when the server has a key")

    async def authorized(given: str | None = Depends(header)) -> None:
        if key and not (given and hmac.compare_digest(given.encode(), key.encode())):
            raise HTTPException(401, "missing or wrong X-API-Key", headers={"WWW-Authenticate": "X-API-Key"})

    def encode(result: OnlineResult, views: Sequence[str]) -> bytes:
        for view in views:
            codes = result.batch.view_status(view)
            if codes is None or not len(codes):
                continue
            if len(codes) == 1:  # most requests: one entity, one count
                counter = read_counters.get((view, int(codes[0])))
                if counter is not None:
                    counter.inc()
                continue
            for code, count in enumerate(np.bincount(codes, minlength=len(STATUS_NAMES) + 1).tolist()):
                if count and (view, code) in read_counters:
                    read_counters[view, code].inc(count)
        lists = result.to_lists()
        entities = {k: lists.pop(k) for k in result.entities}
        # All PRESENT (the usual case): one list serves every feature, as the encoder only reads it.
        status = dict.fromkeys(lists, ["PRESENT"] * len(result)) if result.all_present() else result.status_lists()
        payload = {"at": result.at if isinstance(result.at, int) else result.at.tolist(),
                   "entities": entities, "features": lists, "status": status}
        return json_bytes(payload)

    fetch_async = store.online.async_fetch() if store_io == "async" else None

    async def online(body: OnlineRequest, scope: Any = None) -> bytes:
        # Only the store round trip leaves the loop, on a worker thread (or the asyncio client); planning and
        # decoding stay on the loop: decoding on the workers too made them fight the loop for the GIL.
        features: Any = body.feature_service if body.feature_service is not None else body.features
        try:
            call = store.prepare_online(features, body.entities, at=body.at_us_value(),
                                        full_feature_names=body.full_feature_names)
            if body.request or call.plan.request_fields:
                check_request_columns(body.request, dict(call.plan.request_fields),
                                      len(next(iter(call.entities.values()), ())))
            if call.pending is None:
                fetched = None
            elif fetch_async is not None:
                fetched = await gate.call_async(fetch_async, call.pending)
            else:
                fetched = await gate.call(store.online.fetch, call.pending)
            return encode(store.finish_online(call, fetched, body.request), call.plan.output_views)
        except StoreUnavailable as exc:
            raise HTTPException(503, str(exc), headers={"Retry-After": str(exc.retry_after_s)}) from None
        except OnlineStoreError as exc:
            log.error("online store error: %s", exc)
            raise HTTPException(502, "the online store refused the read; see the server log") from None
        except QuiverError as exc:
            raise HTTPException(400, str(exc)) from None

    @app.post("/features/online", response_model=OnlineResponse, dependencies=[Depends(authorized)],
              responses={400: {"description": "unknown features or bad entity keys"}, **COMMON_RESPONSES})
    async def features_online(body: OnlineRequest) -> Response:
        """Feature values and their statuses for the given entities as of `at` (default: now)."""
        # Well-formed requests are answered by `online` through LeanPost before they get here (see below).
        return Response(await online(body), media_type="application/json")

    @app.get("/health", responses={503: {"description": "online store unavailable (see Retry-After)"}})
    async def health() -> Response:
        """200 when the online store answers ("degraded" when it holds no data for some views), else 503.
        Answers within the probe timeout even while the store is stalled."""
        probe = await gate.health()
        info: dict[str, Any] = {"project": store.config.project, "catalog_version": store.catalog_version}
        if not probe.up:
            return JSONResponse({"status": "unavailable", "detail": "online store did not answer", **info},
                                status_code=503, headers={"Retry-After": str(gate.retry_after_s)})
        missing = probe.views_without_data
        status = "degraded" if missing else "ok"
        return JSONResponse({"status": status, **info, **({"views_without_data": missing} if missing else {})})

    @app.get("/metrics", response_class=Response)
    async def prometheus() -> Response:
        """Prometheus metrics (text exposition format)."""
        await gate.health()  # refreshes the gauges; never waits on a stalled store
        return Response(metrics_text(metrics), media_type=CONTENT_TYPE_LATEST)

    install_edge(app, path="/features/online", model=OnlineRequest, handler=online, api_key=key, limits=limits,
                 client_counts=client_counts, max_body_bytes=max_body_bytes, latency=latency, requests=requests,
                 gate=gate, what="feature server")
    return app


def install_edge(app: FastAPI, *, path: str, model: Any, handler: Any, api_key: str, limits: ServerLimits,
                 client_counts: ClientCounts, max_body_bytes: int, latency: Any, requests: Any, gate: Any,
                 what: str) -> None:
    """The edge both servers (this one and the prediction server) put in front of their one hot route `path`,
    innermost first: the lean JSON path (LeanPost), the per-client limit, the body limit, then metrics around
    everything. Also the state the routes read, and a warning when no API key is set ("" is none)."""
    app.add_middleware(LeanPost, path=path, model=model, handler=handler, api_key=api_key)
    app.add_middleware(ClientLimit, per_client=limits.per_client_concurrency, paths=frozenset({path}),
                       client_header=limits.client_header, counts=client_counts,
                       heavy_body_bytes=limits.heavy_body_bytes)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.add_middleware(Observe, latency=latency, requests=requests, routes=frozenset({path, "/health", "/metrics"}))
    app.state.api_key_required = bool(api_key)
    app.state.gate = gate
    if not api_key:
        log.warning("%s runs without an API key: set QUIVER_API_KEY to require X-API-Key", what)


def check_request_columns(request: Mapping[str, Sequence[Any]], fields: dict[str, str], n: int) -> None:
    """The feature server's `request` (field → one value per entity) against the fields the features read."""
    from quiver.catalog.errors import RequestFieldError
    from quiver.compile.on_demand import check_request_rows, request_field

    for name, values in request.items():
        if name in fields and len(values) != n:
            raise RequestFieldError(f"request.{name}: {len(values)} values for {n} entities")
    rows = [{name: values[i] for name, values in request.items() if i < len(values)} for i in range(n)]
    check_request_rows(rows, fields, request_field)  # named as this body holds it: request.<field>[i]


class Observe:
    """Time every request and count it by route and status (pure ASGI: no per-request task hop)."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], latency: Any, requests: Any,
                 routes: frozenset[str]):
        self.app = app
        self.latency = latency
        self.requests = requests
        self.routes = routes
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        began = time.perf_counter()
        status = 500

        async def capture(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, capture)
        finally:
            route = scope["path"] if scope["path"] in self.routes else "other"
            self._child(self.latency, route).observe(time.perf_counter() - began)
            self._child(self.requests, route, str(status)).inc()

    def _child(self, metric: Any, *labels: str) -> Any:
        # prometheus_client's labels() takes a lock and validates each time; the children never change.
        child = self._children.get((id(metric), labels))
        if child is None:
            child = self._children[id(metric), labels] = metric.labels(*labels)
        return child


class BodyLimit:
    """Refuse request bodies over `max_bytes` with 413, by Content-Length and by bytes received."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None:
            try:
                too_big = int(declared) > self.max_bytes
            except ValueError:
                await _plain_response(send, 400, "invalid Content-Length")
                return
            if too_big:
                await _plain_response(send, 413, f"body larger than {self.max_bytes} bytes")
                return
        received = 0

        async def limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    # FastAPI re-raises HTTPExceptions from body reading as they are: a clean 413.
                    raise HTTPException(413, f"body larger than {self.max_bytes} bytes")
            return message

        await self.app(scope, limited, send)


async def _plain_response(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def serve(config_path: str | None = None, host: str = "127.0.0.1", port: int = 8000, *,
          api_key: str | None = None, log_level: str = "warning", limits: ServerLimits | None = None) -> None:
    """Run the feature server with uvicorn until interrupted (connection limits: `limits`)."""
    store = FeatureStore(config_path)
    app = create_app(store, api_key, limits=limits)
    if not app.state.api_key_required and host not in ("127.0.0.1", "localhost", "::1"):
        raise QuiverError(f"refusing to serve on {host} without an API key: set QUIVER_API_KEY")
    try:
        store.online.ping()
    except OnlineStoreError as exc:  # serve anyway: requests get 503 until Redis answers, then recover
        log.warning("online store not reachable yet: %s", exc)
    log.warning("serving catalog version %s of project %r%s", store.catalog_version or "(unapplied, from disk)",
                store.config.project, "; the definitions on disk differ (not served until `quiver apply`)"
                if store.disk_differs else "")
    try:
        run_uvicorn(app, host, port, log_level, limits)
    finally:
        app.state.gate.close()
        store.close()
