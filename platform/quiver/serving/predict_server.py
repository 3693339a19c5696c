"""The HTTP prediction server (FastAPI): POST /predict, GET /health, GET /metrics, OpenAPI at /docs.

Conventions of the feature server (`quiver.serving.server`): `X-API-Key` when a key is configured (401
otherwise), pydantic bodies (422), bad entity keys or unknown features 400, bodies over the limit 413, the
online store down 503 with Retry-After. Scoring (Redis round trip, torch) is blocking work: it runs in the
thread pool, never on the event loop; the shadow arm runs on the service's own worker after the response.
"""

from __future__ import annotations

import hmac
import logging
import os
from datetime import datetime
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from fastapi.security import APIKeyHeader
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

from quiver.catalog.errors import QuiverError
from quiver.online.base import OnlineStoreError, OnlineStoreUnavailable
from quiver.serving.prediction import PredictionService
from quiver.serving.runtime import ServerLimits, run_uvicorn
from quiver.serving.server import MAX_BODY_BYTES, BodyLimit, Observe

log = logging.getLogger(__name__)
MAX_ROWS = 10_000
_US_LIMIT = 2**62
_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_IDENT = r"^[A-Za-z_][A-Za-z0-9_]{0,62}$"

KeyValue = StrictInt | StrictStr | StrictBool
FieldValue = StrictInt | StrictFloat | StrictStr | StrictBool | None


class PredictRow(BaseModel):
    """One row to score: its id, the entity keys the model's features need, optional time and fields."""

    model_config = ConfigDict(extra="forbid")

    request_id: Annotated[str, Field(min_length=1, max_length=128)]
    entities: dict[Annotated[str, Field(pattern=_IDENT)], KeyValue] = Field(
        min_length=1, max_length=16, examples=[{"user_id": 7, "merchant_id": 3}])
    at: Annotated[int, Field(ge=-_US_LIMIT, le=_US_LIMIT)] | datetime | None = Field(
        None, description="event time: epoch microseconds or ISO-8601 (default: now)")
    fields: dict[Annotated[str, Field(pattern=_IDENT)], FieldValue] = Field(
        default_factory=dict, max_length=256, description="request-time values, e.g. the amount")


class PredictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rows: list[PredictRow] = Field(min_length=1, max_length=MAX_ROWS)


class PredictionOut(BaseModel):
    request_id: str
    score: float
    model_version: str
    arm: str = Field(description="champion or canary")
    fallback: bool = Field(description="routed to the canary but answered by the champion")


class PredictResponse(BaseModel):
    predictions: list[PredictionOut]


def create_app(service: PredictionService, api_key: str | None = None, *,
               max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    """A FastAPI app over `service`. `api_key` defaults to QUIVER_API_KEY or the config's api_key."""
    key = api_key if api_key is not None else (os.environ.get("QUIVER_API_KEY")
                                               or service.store.config.api_key or "")
    metrics = CollectorRegistry()
    latency = Histogram("quiver_request_seconds", "HTTP request latency", ["route"], registry=metrics,
                        buckets=_LATENCY_BUCKETS)
    requests = Counter("quiver_requests", "HTTP requests", ["route", "status"], registry=metrics)
    counters = Gauge("quiver_prediction_rows", "Prediction service counters since start", ["counter"],
                     registry=metrics)
    serving = Gauge("quiver_prediction_model_info", "1 for the version serving each arm", ["arm", "version"],
                    registry=metrics)
    fraction = Gauge("quiver_prediction_canary_fraction", "Traffic share routed to the canary", registry=metrics)
    store_up = Gauge("quiver_online_store_up", "1 when the online store answered the last check", registry=metrics)

    app = FastAPI(title="Quiver prediction server", version="1",
                  description=f"Scores of model {service.model_name!r}: champion, canary and shadow arms.")
    header = APIKeyHeader(name="X-API-Key", auto_error=False, description="required when the server has a key")

    async def authorized(given: str | None = Depends(header)) -> None:
        if key and not (given and hmac.compare_digest(given.encode(), key.encode())):
            raise HTTPException(401, "missing or wrong X-API-Key", headers={"WWW-Authenticate": "X-API-Key"})

    @app.post("/predict", response_model=PredictResponse, dependencies=[Depends(authorized)],
              responses={400: {"description": "bad entity keys, duplicate request ids"},
                         401: {"description": "missing or wrong X-API-Key"},
                         413: {"description": "body too large"},
                         503: {"description": "online store unavailable"}})
    async def predict(body: PredictRequest) -> Response:
        """Scores per row: the champion's, or the canary's for rows routed to it."""
        rows = [{"request_id": r.request_id, "entities": r.entities, "at": r.at, "fields": r.fields}
                for r in body.rows]
        try:
            # Redis and torch block: off the event loop, so other requests keep being read and answered.
            predictions = await run_in_threadpool(service.predict, rows)
        except OnlineStoreUnavailable as exc:
            raise HTTPException(503, str(exc), headers={"Retry-After": "1"}) from None
        except OnlineStoreError as exc:
            raise HTTPException(502, str(exc)) from None
        except QuiverError as exc:
            raise HTTPException(400, str(exc)) from None
        payload = {"predictions": [{"request_id": p.request_id, "score": p.score, "model_version": p.model_version,
                                    "arm": p.arm, "fallback": p.fallback} for p in predictions]}
        return Response(_dumps(payload), media_type="application/json")

    @app.get("/health", responses={503: {"description": "online store unavailable"}})
    async def health() -> Response:
        """200 when the online store answers (with the versions served), else 503."""
        arms = service.arms
        status = {"project": service.store.config.project, "model": service.model_name,
                  "champion": arms.champion.label, "canary": arms.canary.label if arms.canary else None,
                  "canary_fraction": arms.fraction, "shadow": arms.shadow.label if arms.shadow else None}
        try:
            await run_in_threadpool(service.store.online.ping)
        except OnlineStoreError as exc:
            store_up.set(0)
            return JSONResponse({"status": "unavailable", "detail": str(exc), **status}, status_code=503)
        store_up.set(1)
        return JSONResponse({"status": "ok", **status})

    @app.get("/metrics", response_class=Response)
    async def prometheus() -> Response:
        """Prometheus metrics (text exposition format)."""
        for name, value in service.stats.snapshot().items():
            counters.labels(name).set(value)
        arms = service.arms
        serving.clear()
        for arm_name, arm in (("champion", arms.champion), ("canary", arms.canary), ("shadow", arms.shadow)):
            if arm is not None:
                serving.labels(arm_name, arm.label).set(1 if arm.model is not None else 0)
        fraction.set(arms.fraction if arms.canary else 0.0)
        return Response(generate_latest(metrics), media_type=CONTENT_TYPE_LATEST)

    app.add_middleware(BodyLimit, max_bytes=max_body_bytes)
    app.add_middleware(Observe, latency=latency, requests=requests,
                       routes=frozenset({"/predict", "/health", "/metrics"}))
    app.state.api_key_required = bool(key)
    if not key:
        log.warning("prediction server runs without an API key: set QUIVER_API_KEY to require X-API-Key")
    return app


try:  # ujson round-trips floats exactly and is faster than the stdlib here
    import ujson

    def _dumps(payload: Any) -> str:
        return str(ujson.dumps(payload))
except ImportError:  # pragma: no cover
    import json

    def _dumps(payload: Any) -> str:
        return json.dumps(payload, separators=(",", ":"))


def serve_model(model_name: str, config_path: str | None = None, host: str = "127.0.0.1", port: int = 8001, *,
                api_key: str | None = None, poll_interval_s: float = 2.0, shadow_queue_size: int = 256,
                torch_threads: int = 1, micro_batch: bool = False, log_level: str = "warning",
                limits: ServerLimits | None = None, say: Any = None) -> None:
    """Run the prediction server with uvicorn until interrupted (serving logs under the offline root), with
    the feature server's connection limits (`limits`, default ServerLimits()). `say` (a print function)
    hears what it serves at start and every swap of models or routing afterwards."""
    from quiver.monitoring.alerts import AlertManager, sinks_from_config
    from quiver.monitoring.serving_log import ServingLogger
    from quiver.monitoring.settings import load_settings
    from quiver.serving.store import FeatureStore

    if torch_threads > 0:
        import torch

        # Many small concurrent requests: one intra-op thread each beats threads fighting over 2 cores.
        torch.set_num_threads(torch_threads)
    from quiver.registry import Registry
    from quiver.registry.models import ModelRegistry

    store = FeatureStore(config_path)
    registry = Registry(store.config.registry, project=store.config.project)
    alerts = AlertManager(registry, sinks_from_config(load_settings(store.config).alert_sinks))
    service = PredictionService(store, model_name, models=ModelRegistry(registry), alerts=alerts,
                                poll_interval_s=poll_interval_s, shadow_queue_size=shadow_queue_size,
                                micro_batch=micro_batch,
                                logger=ServingLogger(store.config.offline_dir))
    app = create_app(service, api_key)
    if not app.state.api_key_required and host not in ("127.0.0.1", "localhost", "::1"):
        raise QuiverError(f"refusing to serve on {host} without an API key: set QUIVER_API_KEY")
    with service:
        if say is not None:
            say(f"serving {model_name} of project {store.config.project!r} on http://{host}:{port}/predict "
                f"({'X-API-Key required' if app.state.api_key_required else 'no API key'}): "
                f"{service.arms.describe()}; polling the registry every {poll_interval_s:g} s")
            _print_swaps(say)
        try:
            run_uvicorn(app, host, port, log_level, limits)
        finally:
            if service.logger is not None:
                service.logger.close()


def _print_swaps(say: Any) -> None:
    """Route the service's swap and load messages to `say` (uvicorn's log level leaves them out otherwise)."""

    class Say(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            say(f"{self.formatter.formatTime(record) if self.formatter else ''} {record.getMessage()}".strip())

    handler = Say(logging.INFO)
    handler.setFormatter(logging.Formatter())
    prediction_log = logging.getLogger("quiver.serving.prediction")
    prediction_log.addHandler(handler)
    prediction_log.setLevel(logging.INFO)
