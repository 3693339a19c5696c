"""The HTTP prediction server (FastAPI): POST /predict, GET /health, GET /metrics, OpenAPI at /docs.

Conventions of the feature server (`quiver.serving.server`): `X-API-Key` when a key is configured (401
otherwise), strict JSON and pydantic bodies (422 naming the field, see `quiver.serving.edge`), bad entity keys
or unknown features 400, bodies over the limit 413, more than `ServerLimits.per_client_concurrency` requests
of one client in flight 429, the online store down or stalled 503 with Retry-After at once. Only the Redis
round trip leaves the event loop, under the store gate (`runtime.StoreGate`, the feature server's: the
asyncio client, or a worker thread for rediss://), so /health and /metrics answer from the gate's own probe
while Redis stalls; requests of up to INLINE_ROWS rows are scored on the loop (no thread hop), bigger ones
on a worker thread; the shadow arm runs on the service's own worker after the response. Error bodies and
/health never name hosts, socket paths or exception types (those go to the server log).
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import logging
import os
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from fastapi.security import APIKeyHeader
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictStr

from quiver.catalog.errors import QuiverError
from quiver.online.base import TIME_RANGE, OnlineStoreError
from quiver.serving.edge import (
    COMMON_RESPONSES,
    Busy,
    ClientCounts,
    FairSlots,
    client_key,
    create_fastapi,
    json_bytes,
)
from quiver.serving.prediction import PredictionService
from quiver.serving.runtime import ServerLimits, StoreGate, StoreUnavailable, metrics_text
from quiver.serving.schemas import IDENT, KEYS_SCHEMA, Int64, KeyValue
from quiver.serving.server import MAX_BODY_BYTES, install_edge
from quiver.serving.times import EpochOrIso, iso_time_us

log = logging.getLogger(__name__)
MAX_ROWS = 1_000  # rows per request: a bigger batch is several requests (fairness: see docs/prediction.md)
INLINE_ROWS = 128  # requests up to this many rows are scored on the event loop (see `score` in create_app)
_LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)

FieldName = Annotated[str, Field(pattern=IDENT)]
FieldValue = Int64 | Annotated[StrictFloat, Field(allow_inf_nan=False)] | StrictStr | StrictBool | None


class PredictRow(BaseModel):
    """One row to score: its id, the entity keys the model's features need, optional time and fields."""

    model_config = ConfigDict(extra="forbid")

    request_id: Annotated[str, Field(min_length=1, max_length=128)]
    entities: dict[FieldName, KeyValue] = Field(
        min_length=1, max_length=16, examples=[{"user_id": 7, "merchant_id": 3}], json_schema_extra=KEYS_SCHEMA)
    at: EpochOrIso | None = Field(
        None, description=f"event time: epoch microseconds (an integer) or ISO-8601 with a UTC offset "
                          f"(default: now), {TIME_RANGE}")
    fields: dict[FieldName, FieldValue] = Field(
        default_factory=dict, max_length=256, description="request-time values, e.g. the amount",
        json_schema_extra=KEYS_SCHEMA)

    def at_us(self) -> int | None:
        """The row's time in epoch µs (None: now)."""
        return self.at if self.at is None or isinstance(self.at, int) else iso_time_us(self.at)


class PredictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rows: list[PredictRow] = Field(min_length=1, max_length=MAX_ROWS)
    explain_missing: bool = Field(False, description="name the missing inputs of each prediction")


class PredictionOut(BaseModel):
    request_id: str
    score: float | None = Field(description="null when the model's missing-input policy refused the row")
    model_version: str
    arm: str = Field(description="champion or canary")
    fallback: bool = Field(description="routed to the canary but answered by the champion")
    missing: int = Field(description="inputs of the serving model that were missing (not found, too old, null)")
    flagged: bool = Field(description="more inputs missing than the model's policy allows; scored anyway")
    refused: bool = Field(description="more inputs missing than the model's policy allows; not scored")
    missing_features: list[str] = Field(default_factory=list, description="which, with explain_missing")


class PredictResponse(BaseModel):
    predictions: list[PredictionOut]


def create_app(service: PredictionService, api_key: str | None = None, *,
               max_body_bytes: int = MAX_BODY_BYTES, gate: StoreGate | None = None,
               limits: ServerLimits | None = None) -> FastAPI:
    """A FastAPI app over `service`. `api_key` defaults to QUIVER_API_KEY or the config's api_key; `gate`
    (default: one over the service's online store) runs the scoring calls; `limits` gives the per-client
    concurrency (default ServerLimits())."""
    limits = limits or ServerLimits()
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
    store_up = Gauge("quiver_online_store_up", "1 when the online store answered the last probe", registry=metrics)
    refused = Gauge("quiver_client_limit_refused", "Requests refused with 429 (per-client concurrency) since start",
                    registry=metrics)
    degraded = Gauge("quiver_serving_degraded", "1 while /health says degraded (see its `reasons`), else 0",
                     registry=metrics)
    fallback = Gauge("quiver_prediction_champion_fallback", "1 while the registry's champion (`wanted`) cannot "
                     "load and an earlier version (`serving`) answers instead", ["wanted", "serving"],
                     registry=metrics)

    def views() -> list[str]:  # stored views only: on-demand features are computed, never read
        refs = list(service.arms.feature_refs)
        return sorted({read.view.name for read in service.store.plan(refs).reads}) if refs else []

    gate = gate or StoreGate(lambda: service.store.online, views())
    client_counts = ClientCounts()
    client_header = limits.client_header.lower().encode()
    slots = FairSlots(limits.scoring_concurrency, max_waiting=gate.max_waiting)

    def on_probe(probe: Any) -> None:
        store_up.set(1 if probe.up else 0)
        if not probe.up:  # a stall was noticed: the calls waiting for a slot fail now, not after it
            slots.fail_waiting(StoreUnavailable("online store unavailable; retry later", gate.retry_after_s))

    gate.on_probe(on_probe)
    app = create_fastapi("Quiver prediction server",
                         f"Scores of model {service.model_name!r}: champion, canary and shadow arms.")
    header = APIKeyHeader(name="X-API-Key", auto_error=False, description="required when the server has a key")

    async def authorized(given: str | None = Depends(header)) -> None:
        if key and not (given and hmac.compare_digest(given.encode(), key.encode())):
            raise HTTPException(401, "missing or wrong X-API-Key", headers={"WWW-Authenticate": "X-API-Key"})

    fetch_async = service.store.online.async_fetch()

    async def score(rows: list[dict[str, Any]], explain_missing: bool) -> list[Any]:
        # Only the store round trip leaves the loop (the asyncio client, else a worker thread). A small
        # request is scored on the loop too: the model's few hundred µs cost less there than a thread hop
        # and a fight with the loop for the GIL. Big requests, and micro-batching (which waits for other
        # calls), score on a worker thread so the loop keeps answering.
        call = service.begin(rows)
        if call.read.pending is None:
            fetched = None
        elif fetch_async is not None:
            fetched = await gate.call_async(fetch_async, call.read.pending)
        else:
            fetched = await gate.call(service.store.online.fetch, call.read.pending)
        if len(rows) <= INLINE_ROWS and not service.micro_batch:
            return service.finish(call, fetched, explain_missing=explain_missing)
        return await asyncio.get_running_loop().run_in_executor(
            None, functools.partial(service.finish, call, fetched, explain_missing=explain_missing))

    async def predict_json(body: PredictRequest, scope: Any) -> bytes:
        rows = [{"request_id": r.request_id, "entities": r.entities, "at": r.at_us(), "fields": r.fields}
                for r in body.rows]
        try:
            # A fair slot first (a heavy client waits behind light ones), then the store round trip off the
            # loop: other requests keep being read and answered, and while the store is down every request
            # is refused at once instead of queueing.
            gate.refuse_if_down()
            await slots.acquire(client_key(scope, client_header), len(rows))
            try:
                predictions = await score(rows, body.explain_missing)
            finally:
                slots.release()
        except Busy as exc:
            raise HTTPException(503, str(exc), headers={"Retry-After": str(gate.retry_after_s)}) from None
        except StoreUnavailable as exc:
            raise HTTPException(503, str(exc), headers={"Retry-After": str(exc.retry_after_s)}) from None
        except OnlineStoreError as exc:
            log.error("online store error: %s", exc)
            raise HTTPException(502, "the online store refused the read; see the server log") from None
        except QuiverError as exc:
            raise HTTPException(400, str(exc)) from None
        payload = {"predictions": [{"request_id": p.request_id, "score": None if p.refused else p.score,
                                    "model_version": p.model_version, "arm": p.arm, "fallback": p.fallback,
                                    "missing": p.missing, "flagged": p.flagged, "refused": p.refused,
                                    "missing_features": list(p.missing_features)} for p in predictions]}
        return json_bytes(payload)

    @app.post("/predict", response_model=PredictResponse, dependencies=[Depends(authorized)],
              responses={400: {"description": "bad entity keys, duplicate request ids"},
                         **COMMON_RESPONSES})
    async def predict(body: PredictRequest, request: Request) -> Response:
        """Scores per row: the champion's, or the canary's for rows routed to it."""
        # Well-formed requests are answered by `predict_json` through LeanPost before they get here.
        return Response(await predict_json(body, request.scope), media_type="application/json")

    def reasons(probe: Any, log_health: dict[str, Any] | None) -> list[dict[str, Any]]:
        """Why the server is degraded (empty: it is not), for /health and /metrics alike."""
        out: list[dict[str, Any]] = []
        fell_back = service.champion_fallback
        if fell_back is not None:
            wanted, serving = f"{service.model_name}:{fell_back[0]}", service.arms.champion.label
            out.append({"reason": "champion_not_loaded", "version": wanted, "serving": serving, "error": fell_back[1],
                        "detail": f"the registry's champion {wanted} cannot be loaded; {serving} serves until it can"})
        if log_health is not None and log_health["status"] == "spooling":
            out.append({"reason": "serving_log_spooling", "spooled_rows": log_health["spooled_rows"],
                        "spool_bytes": log_health["spool_bytes"],
                        "detail": f"the store does not take serving logs: {log_health['spooled_rows']} rows wait "
                                  f"in the local spool, uploaded when it answers"})
        elif log_health is not None and log_health["status"] != "ok":
            out.append({"reason": "serving_log_failing", "detail": "serving logs cannot be written"})
        off_path_log = service.off_path_health().get("serving_log")
        if off_path_log is not None and off_path_log["status"] not in ("ok", "closed"):
            out.append({"reason": "serving_log_failing", "detail": "the off-path process cannot write its "
                                                                   "serving logs (shadow and paired rows)"})
        if probe.up and probe.views_without_data:
            out.append({"reason": "views_without_data", "views": probe.views_without_data,
                        "detail": "the online store holds no data for some views"})
        return out

    @app.get("/health", responses={503: {"description": "online store unavailable (see Retry-After)"}})
    async def health() -> Response:
        """200 "ok" with the versions served; 200 "degraded" with `reasons` (and `detail`, in words) when the
        registry's champion cannot load and an earlier version serves, serving logs cannot be written, or the
        store holds no data for a view the models read; 503 "unavailable" when the online store does not
        answer. Answers within the probe timeout even while the store is stalled."""
        arms = service.arms
        gate.views = views()
        probe = await gate.health()
        info: dict[str, Any] = {
            "project": service.store.config.project, "model": service.model_name, "champion": arms.champion.label,
            "canary": arms.canary.label if arms.canary else None, "canary_fraction": arms.fraction,
            "shadow": arms.shadow.label if arms.shadow else None}
        if service.logger is not None:
            info["serving_log"] = service.logger.health()
        info["off_path"] = service.off_path_health()
        problems = reasons(probe, info.get("serving_log"))
        if not probe.up:
            return JSONResponse({"status": "unavailable", "detail": "online store did not answer", **info,
                                 **({"reasons": problems} if problems else {})},
                                status_code=503, headers={"Retry-After": str(gate.retry_after_s)})
        if probe.views_without_data:
            info["views_without_data"] = probe.views_without_data
        if not problems:
            return JSONResponse({"status": "ok", **info})
        return JSONResponse({"status": "degraded", "detail": "; ".join(p["detail"] for p in problems),
                             "reasons": problems, **info})

    @app.get("/metrics", response_class=Response)
    async def prometheus() -> Response:
        """Prometheus metrics (text exposition format): the server's, and the process's default registry
        (serving-log counters and buffer gauges, monitoring metrics)."""
        probe = await gate.health()  # refreshes quiver_online_store_up; never waits on a stalled store
        degraded.set(1 if reasons(probe, service.logger.health() if service.logger is not None else None) else 0)
        fallback.clear()
        fell_back = service.champion_fallback
        if fell_back is not None:
            fallback.labels(f"{service.model_name}:{fell_back[0]}", service.arms.champion.label).set(1)
        for name, value in service.stats.snapshot().items():
            counters.labels(name).set(value)
        arms = service.arms
        serving.clear()
        for arm_name, arm in (("champion", arms.champion), ("canary", arms.canary), ("shadow", arms.shadow)):
            if arm is not None:
                serving.labels(arm_name, arm.label).set(1 if arm.model is not None else 0)
        fraction.set(arms.fraction if arms.canary else 0.0)
        refused.set(client_counts.refused)
        return Response(metrics_text(metrics), media_type=CONTENT_TYPE_LATEST)

    install_edge(app, path="/predict", model=PredictRequest, handler=predict_json, api_key=key, limits=limits,
                 client_counts=client_counts, max_body_bytes=max_body_bytes, latency=latency, requests=requests,
                 gate=gate, what="prediction server")
    return app


def print_swaps(say: Any) -> None:
    """Route the service's swap and load messages to `say` (uvicorn's log level leaves them out otherwise)."""

    class Say(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            say(f"{self.formatter.formatTime(record) if self.formatter else ''} {record.getMessage()}".strip())

    handler = Say(logging.INFO)
    handler.setFormatter(logging.Formatter())
    prediction_log = logging.getLogger("quiver.serving.prediction")
    prediction_log.addHandler(handler)
    prediction_log.setLevel(logging.INFO)
