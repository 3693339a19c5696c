"""The HTTP feature server (FastAPI): POST /features/online, GET /health, GET /metrics, OpenAPI at /docs.

- Auth: when an API key is configured (QUIVER_API_KEY, or `api_key` passed in), /features/online needs the
  header `X-API-Key`; a missing or wrong key is a 401. /health and /metrics stay open for probes and
  scrapers (they reveal no feature values).
- Input: pydantic models; malformed bodies are 422, unknown features or wrong key types 400, bodies over
  the limit 413 (checked on Content-Length and on the bytes actually received).
- Redis down: 503 with Retry-After within the store's timeout; the next request after Redis is back works.
- /metrics (Prometheus): request latency histogram per route, request counts per route and status,
  feature freshness per view (now − newest event time written) and online store up/down.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import JSONResponse, Response
from fastapi.security import APIKeyHeader
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from quiver.catalog.errors import QuiverError
from quiver.online.base import OnlineStoreError, OnlineStoreUnavailable, now_us
from quiver.serving.schemas import OnlineRequest, OnlineResponse
from quiver.serving.store import FeatureStore

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1 << 20
_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def create_app(store: FeatureStore, api_key: str | None = None, *, max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    """A FastAPI app serving `store`. `api_key` defaults to QUIVER_API_KEY or the config's api_key."""
    key = api_key if api_key is not None else (os.environ.get("QUIVER_API_KEY")
                                               or store.config.api_key or "")
    metrics = CollectorRegistry()
    latency = Histogram("quiver_request_seconds", "HTTP request latency", ["route"], registry=metrics,
                        buckets=_LATENCY_BUCKETS)
    requests = Counter("quiver_requests", "HTTP requests", ["route", "status"], registry=metrics)
    freshness = Gauge("quiver_feature_freshness_seconds", "Now minus the newest event time written, per view",
                      ["view"], registry=metrics)
    store_up = Gauge("quiver_online_store_up", "1 when the online store answered the last check", registry=metrics)
    online_views = sorted(v.name for v in store.catalog.views.values() if v.online)

    app = FastAPI(title="Quiver feature server", version="1",
                  description="Online feature values from the Quiver online store.")
    header = APIKeyHeader(name="X-API-Key", auto_error=False, description="required when the server has a key")

    async def authorized(given: str | None = Depends(header)) -> None:
        if key and not (given and hmac.compare_digest(given.encode(), key.encode())):
            raise HTTPException(401, "missing or wrong X-API-Key", headers={"WWW-Authenticate": "X-API-Key"})

    @app.post("/features/online", response_model=OnlineResponse, dependencies=[Depends(authorized)],
              responses={400: {"description": "unknown features or bad entity keys"},
                         401: {"description": "missing or wrong X-API-Key"},
                         413: {"description": "body too large"},
                         503: {"description": "online store unavailable"}})
    async def features_online(body: OnlineRequest) -> Response:
        # Async on purpose: the read is one ~0.1 ms Redis round trip (bounded by the store's timeout),
        # cheaper to run inline than to hop to a worker thread and back.
        """Feature values for the given entities as of `at` (default: now)."""
        features: Any = body.feature_service if body.feature_service is not None else body.features
        try:
            result = store.get_online_features(features, body.entities, at=body.at,
                                               full_feature_names=body.full_feature_names)
        except OnlineStoreUnavailable as exc:
            raise HTTPException(503, str(exc), headers={"Retry-After": "1"}) from None
        except OnlineStoreError as exc:
            raise HTTPException(502, str(exc)) from None
        except QuiverError as exc:
            raise HTTPException(400, str(exc)) from None
        lists = result.to_lists()
        payload = {"at": result.at if isinstance(result.at, int) else result.at.tolist(),
                   "entities": {k: lists.pop(k) for k in result.entities},
                   "features": lists}
        return Response(_dumps(payload), media_type="application/json")

    @app.get("/health", responses={503: {"description": "online store unavailable"}})
    async def health() -> Response:
        """200 when the online store answers, else 503."""
        try:
            store.online.ping()
        except OnlineStoreError as exc:
            store_up.set(0)
            return JSONResponse({"status": "unavailable", "detail": str(exc)}, status_code=503)
        store_up.set(1)
        return JSONResponse({"status": "ok", "project": store.config.project})

    @app.get("/metrics", response_class=Response)
    async def prometheus() -> Response:
        """Prometheus metrics (text exposition format)."""
        try:
            newest = store.online.freshness(online_views)
            store_up.set(1)
            now = now_us()
            for view, ts in newest.items():
                if ts is not None:
                    freshness.labels(view).set(max(0.0, (now - ts) / 1e6))
        except OnlineStoreError:
            store_up.set(0)
        return Response(generate_latest(metrics), media_type=CONTENT_TYPE_LATEST)

    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.add_middleware(Observe, latency=latency, requests=requests,
                       routes=frozenset({"/features/online", "/health", "/metrics"}))
    app.state.api_key_required = bool(key)
    if not key:
        log.warning("feature server runs without an API key: set QUIVER_API_KEY to require X-API-Key")
    return app


def _json_dumps(payload: Any) -> str:
    return json.dumps(payload, separators=(",", ":"))


try:  # ujson (pinned in requirements/main.txt) round-trips floats exactly and is ~2.5x faster here
    import ujson

    _dumps: Callable[[Any], str] = ujson.dumps
except ImportError:  # pragma: no cover - the stdlib is enough, only slower
    _dumps = _json_dumps


class Observe:
    """Time every request and count it by route and status (pure ASGI: no per-request task hop)."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], latency: Any, requests: Any,
                 routes: frozenset[str]):
        self.app = app
        self.latency = latency
        self.requests = requests
        self.routes = routes

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
            self.latency.labels(route).observe(time.perf_counter() - began)
            self.requests.labels(route, str(status)).inc()


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
          api_key: str | None = None, log_level: str = "warning") -> None:
    """Run the feature server with uvicorn until interrupted."""
    import uvicorn

    store = FeatureStore(config_path)
    app = create_app(store, api_key)
    if not app.state.api_key_required and host not in ("127.0.0.1", "localhost", "::1"):
        raise QuiverError(f"refusing to serve on {host} without an API key: set QUIVER_API_KEY")
    try:
        store.online.ping()
    except OnlineStoreError as exc:  # serve anyway: requests get 503 until Redis answers, then recover
        log.warning("online store not reachable yet: %s", exc)
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=False)
