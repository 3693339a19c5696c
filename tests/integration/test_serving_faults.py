"""Faults under real HTTP and a real Redis: a stalled Redis (SIGSTOP) must not stall the server, data lost
in Redis must show in statuses, /health and /metrics, and /health must not reveal where Redis lives."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest

from quiver.config import Config
from quiver.online.redis_store import RedisOnlineStore
from quiver.serving.server import create_app
from quiver.serving.store import FeatureStore
from tests.integration.test_serving_http import KEY, T0, Server, catalog, post, until_ok, write_rows

pytestmark = pytest.mark.integration

STORE_TIMEOUT_S = 6.0  # long, so "answered before the store timeout" is far from the probe's 0.5 s
BODY = {"features": ["last:amount", "last:n"], "entities": {"user_id": [1, 999_999]}, "at_us": T0 + 10}


@pytest.fixture
def slow_store(redis_url) -> Iterator[FeatureStore]:
    cat = catalog()
    online = RedisOnlineStore(redis_url, "h", timeout_s=STORE_TIMEOUT_S)
    write_rows(online, cat)
    with FeatureStore(config=Config(project="h", redis_url=redis_url), catalog=cat, online_store=online) as fs:
        yield fs


@pytest.fixture(params=["thread", "async"])
def http(slow_store, request) -> Iterator[httpx.Client]:
    # Both ways a Redis read leaves the event loop: the worker threads (default) and the asyncio client.
    with Server(create_app(slow_store, api_key=KEY, store_io=request.param)) as client:
        yield client


def test_stalled_redis_does_not_stall_the_server(http, redis_server):
    assert post(http, BODY).status_code == 200
    # Client timeouts shorter than the store's: an answer at all proves the server did not wait on Redis.
    quick = STORE_TIMEOUT_S / 3
    stalled: dict[str, httpx.Response] = {}
    redis_server.pause()
    try:
        # A read that reaches the stalled Redis first holds a worker thread until the store timeout...
        first = threading.Thread(target=lambda: stalled.setdefault(
            "r", post(http, BODY, timeout=STORE_TIMEOUT_S + 10)))
        first.start()
        # ...while /health, /metrics and new reads answer on the event loop, well before that timeout.
        health = http.get("/health", timeout=quick)
        assert health.status_code == 503 and health.json()["status"] == "unavailable"
        assert health.headers["retry-after"] == "1"
        metrics = http.get("/metrics", timeout=quick)
        assert metrics.status_code == 200 and "quiver_online_store_up 0.0" in metrics.text
        for _ in range(20):
            r = post(http, BODY, timeout=quick)
            assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
        first.join(STORE_TIMEOUT_S + 15)
        assert stalled["r"].status_code == 503 and stalled["r"].headers["retry-after"] == "1"
    finally:
        redis_server.resume()
    r = until_ok(lambda: post(http, BODY, timeout=quick))
    assert r.json()["features"]["n"] == [7, None]
    assert until_ok(lambda: http.get("/health", timeout=quick)).json()["status"] in ("ok", "degraded")
    assert "quiver_online_store_up 1.0" in http.get("/metrics").text


def test_health_reveals_no_host(http, redis_server):
    redis_server.stop()
    try:
        r = http.get("/health")
        assert r.status_code == 503
        assert "127.0.0.1" not in r.text and str(redis_server.port) not in r.text, r.text
        r = post(http, BODY)
        assert r.status_code == 503 and str(redis_server.port) not in r.text, r.text
    finally:
        redis_server.start()


def test_flushed_redis_shows_in_statuses_health_and_metrics(http, redis_server):
    r = post(http, BODY)
    assert r.json()["status"] == {"amount": ["PRESENT", "NOT_FOUND"], "n": ["PRESENT", "NOT_FOUND"]}
    text = http.get("/metrics").text
    assert 'quiver_online_reads_total{status="NOT_FOUND",view="last"} 1.0' in text
    assert 'quiver_online_view_present{view="last"} 1.0' in text
    assert 'quiver_feature_freshness_seconds{view="last"}' in text
    with redis_server.client() as client:
        client.flushall()
    r = post(http, BODY)
    assert r.json()["features"]["n"] == [None, None]
    assert r.json()["status"]["n"] == ["NOT_FOUND", "NOT_FOUND"]
    health = http.get("/health").json()
    assert health["status"] == "degraded" and "last" in health["views_without_data"]
    text = http.get("/metrics").text
    assert 'quiver_online_reads_total{status="NOT_FOUND",view="last"} 3.0' in text
    assert 'quiver_online_view_present{view="last"} 0.0' in text
    # No age for data the store no longer holds (a frozen gauge would claim it is fresh).
    assert 'quiver_feature_freshness_seconds{view="last"}' not in text
