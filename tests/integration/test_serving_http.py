"""The HTTP feature server over real HTTP (uvicorn on loopback) on a real Redis: values, API key, input
validation, body limit, Redis down → 503 and recovery, metrics, OpenAPI (fuzzed in test_serving_openapi.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pyarrow as pa
import pytest
import uvicorn

from quiver import Aggregation, Entity, FeatureService, FeatureView, Field, Float64, Int64, Source, String
from quiver.catalog.validate import build_catalog
from quiver.config import Config
from quiver.offline.layout import last_values_schema
from quiver.online.redis_store import RedisOnlineStore
from quiver.serving.runtime import ServerLimits
from quiver.serving.server import create_app
from quiver.serving.store import FeatureStore
from tests.harness import free_port

pytestmark = pytest.mark.integration

KEY = "test-key-123"
H = 3_600_000_000
T0 = 1_800_000_000_000_000 // H * H
COLUMNS = {"user_id": "int64", "event_ts": "timestamp", "amount": "float64", "category": "string", "n": "int64"}


def catalog():
    user = Entity("user", ["user_id"])
    src = Source("tx", "unused")
    last = FeatureView("last", [user], src, ttl="1h",
                       schema=[Field("amount", Float64), Field("category", String), Field("n", Int64)])
    agg = FeatureView("agg", [user], src, aggregations=[Aggregation("amount", "sum", "1h")])
    svc = FeatureService("model", [last, agg])
    return build_catalog([user, src, last, agg, svc], schema_reader=lambda s: COLUMNS)


class Server:
    """uvicorn on a free loopback port in a thread, with the production limits unless told otherwise."""

    def __init__(self, app, limits: ServerLimits | None = None) -> None:
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error",
                                                    **(limits or ServerLimits()).uvicorn_kwargs()))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> httpx.Client:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=10)
        return self.client

    def __exit__(self, *exc: object) -> None:
        self.client.close()
        self.server.should_exit = True
        self.thread.join(10)


def write_rows(online: RedisOnlineStore, cat) -> None:
    """Users 1 and 2 in view `last` at T0 (user 2's amount null); nothing in view `agg`."""
    view = cat.views["last"]
    table = pa.table({"user_id": [1, 2], "event_ts": pa.array([T0, T0], pa.timestamp("us", tz="UTC")),
                      "amount": [1.5, None], "category": ["a", "b"], "n": [7, 8]}).cast(last_values_schema(view))
    online.write_last_values(view, table)


@pytest.fixture
def store(redis_url) -> Iterator[FeatureStore]:
    cat = catalog()
    online = RedisOnlineStore(redis_url, "h", timeout_s=1.0)
    write_rows(online, cat)
    with FeatureStore(config=Config(project="h", redis_url=redis_url), catalog=cat, online_store=online) as fs:
        yield fs


@pytest.fixture
def http(store) -> Iterator[httpx.Client]:
    with Server(create_app(store, api_key=KEY, max_body_bytes=64 * 1024)) as client:
        yield client


def post(http: httpx.Client, body: object, key: str | None = KEY, **kwargs) -> httpx.Response:
    headers = {"X-API-Key": key} if key is not None else {}
    return http.post("/features/online", json=body, headers=headers, **kwargs)


def test_values_over_http(http):
    r = post(http, {"features": ["last:amount", "last:category", "agg:amount_sum_1h"],
                    "entities": {"user_id": [1, 2, 3]}, "at_us": T0 + 10})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["entities"] == {"user_id": [1, 2, 3]}
    assert body["features"] == {"amount": [1.5, None, None], "category": ["a", "b", None],
                                "amount_sum_1h": [0.0, 0.0, 0.0]}
    assert body["at"] == T0 + 10
    # A service name and ISO time; full names keep same-named features of two views apart.
    r = post(http, {"feature_service": "model", "entities": {"user_id": [1]}, "at": "2027-01-15T08:00:00.000010Z",
                    "full_feature_names": True})
    assert r.status_code == 200, r.text
    assert r.json()["features"]["last__n"] == [7]
    # Expired by TTL at a later time.
    assert post(http, {"features": ["last:n"], "entities": {"user_id": [1]}, "at_us": T0 + 2 * H}).json()[
        "features"] == {"n": [None]}


def test_api_key_is_required(http):
    body = {"features": ["last:amount"], "entities": {"user_id": [1]}}
    assert post(http, body, key=None).status_code == 401
    assert post(http, body, key="wrong").status_code == 401
    assert post(http, body).status_code == 200
    assert http.get("/health").status_code == 200  # probes need no key


@pytest.mark.parametrize(("body", "status"), [
    ({"entities": {"user_id": [1]}}, 422),  # neither features nor a service
    ({"features": ["last:amount"], "feature_service": "model", "entities": {"user_id": [1]}}, 422),
    ({"features": ["last:amount"], "entities": {"user_id": [1]}, "surprise": 1}, 422),
    ({"features": ["last amount"], "entities": {"user_id": [1]}}, 422),
    ({"features": ["last:amount"], "entities": {"user_id": [1]}, "at": "soon"}, 422),
    ({"features": ["last:nope"], "entities": {"user_id": [1]}}, 400),
    ({"features": ["nope:amount"], "entities": {"user_id": [1]}}, 400),
    ({"feature_service": "nope", "entities": {"user_id": [1]}}, 400),
    ({"features": ["last:amount"], "entities": {"user_id": ["abc"]}}, 400),
    ({"features": ["last:amount"], "entities": {"merchant_id": [1]}}, 400),
    ({"features": ["last:amount"], "entities": {"user_id": [2**70]}}, 422),  # beyond int64: never wrapped
    ({"features": ["last:amount"], "entities": {"user_id": [2**63]}}, 422),
])
def test_bad_input_is_a_clear_4xx(http, body, status):
    r = post(http, body)
    assert r.status_code == status, r.text
    assert r.json()["detail"]


def test_body_limit(http):
    big = {"features": ["last:amount"], "entities": {"user_id": list(range(20_000))}}
    assert post(http, big).status_code == 413

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit applies to the bytes received
        yield b'{"features": ["last:amount"], "entities": {"user_id": ['
        for _ in range(10):
            yield b"1," * 5000
        yield b"1]}}"

    r = http.post("/features/online", content=chunks(),
                  headers={"X-API-Key": KEY, "content-type": "application/json"})
    assert r.status_code == 413


def test_redis_down_gives_503_and_recovers(http, redis_server):
    body = {"features": ["last:amount"], "entities": {"user_id": [1]}, "at_us": T0 + 10}
    assert post(http, body).status_code == 200
    redis_server.stop()
    try:
        r = post(http, body)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert "unavailable" in r.json()["detail"]
        assert http.get("/health").status_code == 503
        assert "quiver_online_store_up 0.0" in http.get("/metrics").text
    finally:
        redis_server.start()
    assert until_ok(lambda: http.get("/health")).json()["status"] == "degraded"  # restarted empty
    r = until_ok(lambda: post(http, body))
    assert r.json()["features"]["amount"] == [None] and r.json()["status"]["amount"] == ["NOT_FOUND"]


def until_ok(send, attempts: int = 200) -> httpx.Response:
    """Send until a 200 (the server probes the store again at most every half second after an outage)."""
    for _ in range(attempts):
        r = send()
        if r.status_code == 200:
            return r
        assert r.status_code == 503, r.text
        time.sleep(0.05)
    raise AssertionError(f"no recovery after {attempts} attempts: {r.status_code} {r.text}")


def test_metrics(http):
    for _ in range(3):
        post(http, {"features": ["last:amount"], "entities": {"user_id": [1]}})
    text = http.get("/metrics").text
    # Metric names, not timings: the histogram counted three requests and freshness is exported.
    expected = ['quiver_request_seconds_count{route="/features/online"} 3.0',
                'quiver_requests_total{route="/features/online",status="200"} 3.0',
                'quiver_feature_freshness_seconds{view="last"}']
    missing = [line for line in expected if line not in text]
    assert not missing, missing
    assert "quiver_online_store_up 1.0" in text


def test_openapi_documents_the_api(http):
    spec = http.get("/openapi.json").json()
    assert {"/features/online", "/health", "/metrics"} <= set(spec["paths"])
    assert spec["components"]["securitySchemes"]["APIKeyHeader"]["name"] == "X-API-Key"
    assert "OnlineRequest" in spec["components"]["schemas"]


def test_no_key_configured_means_open(store, monkeypatch):
    monkeypatch.delenv("QUIVER_API_KEY", raising=False)
    with Server(create_app(store, api_key="")) as client:
        assert client.post("/features/online", json={"features": ["last:n"], "entities": {"user_id": [1]},
                                                     "at_us": T0 + 1}).json()["features"] == {"n": [7]}
