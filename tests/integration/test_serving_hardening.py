"""The prediction and feature servers as users run them (`quiver serve-model`, `quiver serve`: real
processes) on a real Redis, against the reproductions of a hostile review: a poisoned time, JSON numbers and
strings Python accepts but JSON does not, ids beyond int64, a stalled Redis, error bodies naming internals,
a log folder that takes no files, a heavy client, and a graceful stop on SIGTERM and SIGINT."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from quiver.serving.logs import read_quarantine, read_serving_logs
from tests.harness import RedisServer
from tests.serving_processes import (
    KEY,
    USERS,
    Process,
    ServingProject,
    make_project,
    rows,
    serve_features,
    serve_model,
    write_online,
)

pytestmark = pytest.mark.integration
QUICK = 2.5  # client timeout: far below the store's 6 s, so any answer at all means "did not wait on Redis"


@dataclass
class Stack:
    redis: RedisServer
    project: ServingProject
    predict: Process
    features: Process


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    binary = shutil.which("redis-server")
    assert binary, "redis-server not on PATH: run `make setup`"
    redis = RedisServer(binary, tmp_path_factory.mktemp("redis"))  # its own: these tests pause and stop it
    redis.start()
    project = make_project(tmp_path_factory.mktemp("project"), redis.url)
    predict = serve_model(project, "--log-flush-interval", "0.2")
    try:
        features = serve_features(project)
    except BaseException:
        predict.stop()
        raise
    yield Stack(redis, project, predict, features)
    predict.stop()
    features.stop()
    redis.stop()


@pytest.fixture
def up(stack: Stack) -> Stack:
    stack.redis.start()  # a test that stopped it and failed must not break the next one
    stack.redis.resume()
    return stack


def post_raw(process: Process, path: str, body: bytes, **kwargs: object) -> httpx.Response:
    return process.client.post(path, content=body, headers={"content-type": "application/json",
                                                            "X-API-Key": KEY}, **kwargs)


def until(check, timeout_s: float = 30.0, every_s: float = 0.1):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(every_s)


def logged_ids(project: ServingProject, prefix: str, arm: str = "champion") -> list[str]:
    table = read_serving_logs(project.offline, arm=arm)
    return [r for r in table["request_id"].to_pylist() if r.startswith(prefix)]


# ----- times, numbers, strings, ids -----

@pytest.mark.parametrize("at", [4 * 10**18, -4 * 10**18, 2**62, True, "2026-11-03T12:00:00", "2300-01-01T00:00:00Z",
                                "1800-01-01T00:00:00+00:00", 1.5, "1700000000000000"])
def test_a_time_outside_the_range_is_422_naming_the_field(up: Stack, at: object) -> None:
    r = up.predict.client.post("/predict", json={"rows": [{"request_id": "t", "entities": {"user_id": 1}, "at": at}]})
    assert r.status_code == 422, r.text
    assert any(problem["loc"][:4] == ["body", "rows", 0, "at"] for problem in r.json()["detail"]), r.text
    r = up.features.client.post("/features/online", json={"features": ["stats:f0"], "entities": {"user_id": [1]},
                                                          **({"at_us": at} if not isinstance(at, str) else {"at": at})})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][:2] in (["body", "at"], ["body", "at_us"]), r.text


def test_a_poisoned_request_never_reaches_the_logs(up: Stack) -> None:
    """The reproduction: `at` = 4e18 got a 200 and every later flush failed; rows were written many times."""
    bad = up.predict.client.post("/predict", json={"rows": [{"request_id": "poison-0", "entities": {"user_id": 1},
                                                             "at": 4 * 10**18}]})
    assert bad.status_code == 422
    answered = []
    for k in range(20):
        r = up.predict.client.post("/predict", json=rows([k, k + 1, k + 2], f"after-{k}"))
        assert r.status_code == 200, r.text
        answered += [p["request_id"] for p in r.json()["predictions"]]
    written = until(lambda: (lambda ids: ids if len(ids) >= len(answered) else None)(logged_ids(up.project, "after-")))
    time.sleep(0.5)  # a few more flushes: nothing may be written twice
    assert sorted(logged_ids(up.project, "after-")) == sorted(answered) == sorted(written)
    assert not logged_ids(up.project, "poison")
    assert read_quarantine(up.project.offline).num_rows == 0  # refused at the edge: nothing to quarantine


def test_ids_beyond_int64_are_422_never_wrapped(up: Stack) -> None:
    for user in (2**63, 2**64 - 1, -(2**63) - 1, 2**70):
        r = up.predict.client.post("/predict", json={"rows": [{"request_id": "big", "entities": {"user_id": user}}]})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"][:5] == ["body", "rows", 0, "entities",
                                                                              "user_id"], r.text
        r = up.features.client.post("/features/online", json={"features": ["stats:f0"],
                                                              "entities": {"user_id": [1, user]}})
        assert r.status_code == 422, r.text
    # A large int64 id goes as digits (JSON numbers are exact only to 2^53); beyond int64 it is refused too.
    r = up.predict.client.post("/predict", json={"rows": [{"request_id": "s", "entities": {"user_id": str(2**63 - 1)}}]})
    assert r.status_code == 200, r.text
    r = up.predict.client.post("/predict", json={"rows": [{"request_id": "s", "entities": {"user_id": str(2**63)}}]})
    assert r.status_code == 400 and "outside the int64 range" in r.text, r.text


PREDICT_BODIES = [
    b'{"rows": [{"request_id": "a", "entities": {"user_id": 1}, "fields": {"amount": NaN}}]}',
    b'{"rows": [{"request_id": "a", "entities": {"user_id": Infinity}}]}',
    b'{"rows": [{"request_id": "a", "entities": {"user_id": 1}, "fields": {"amount": -Infinity}}]}',
    b'{"rows": [{"request_id": "a", "entities": {"user_id": 1e400}}]}',
    b'{"rows": [{"request_id": "\\ud800", "entities": {"user_id": "\\udfff"}}]}',
]
FEATURE_BODIES = [
    b'{"features": ["stats:f0"], "entities": {"user_id": [NaN]}}',
    b'{"features": ["stats:f0"], "entities": {"user_id": [1]}, "at_us": Infinity}',
    b'{"features": ["stats:f0"], "entities": {"user_id": [-Infinity]}}',
    b'{"features": ["stats:f0"], "entities": {"user_id": [1e400]}}',
    b'{"features": ["stats:f0"], "entities": {"user_id": ["\\ud800"]}}',
]


@pytest.mark.parametrize("case", range(5))
def test_json_that_is_not_json_is_422_never_500(up: Stack, case: int) -> None:
    for process, path, body in ((up.predict, "/predict", PREDICT_BODIES[case]),
                                (up.features, "/features/online", FEATURE_BODIES[case])):
        r = post_raw(process, path, body)
        assert r.status_code == 422, (path, r.status_code, r.text)
        problem = r.json()["detail"][0]
        assert problem["type"] == "json_invalid" and problem["loc"][0] == "body", r.text
        assert "input" not in problem  # never echoed back
    # Raw invalid UTF-8 (a surrogate encoded as bytes) too.
    r = post_raw(up.features, "/features/online", b'{"features": ["stats:f0"], "entities": {"user_id": ["\xed\xa0\x80"]}}')
    assert r.status_code == 422 and "UTF-8" in r.text


# ----- the store -----

def assert_reveals_nothing(response: httpx.Response, redis: RedisServer) -> None:
    text = response.text
    for secret in ("127.0.0.1", str(redis.port), "redis://", "unix://", ".sock", "Error", "Timeout", "Exception"):
        assert secret not in text, (secret, text)


def test_a_stalled_redis_fails_fast_on_both_servers(up: Stack) -> None:
    body = rows([1, 2], "stall")
    assert up.predict.client.post("/predict", json=body).status_code == 200
    up.redis.pause()
    try:
        stalled = []
        for _ in range(10):  # after the first probe notices the stall, every answer is an immediate 503
            for process, path, request in ((up.predict, "/predict", body),
                                           (up.features, "/features/online",
                                            {"features": ["stats:f0"], "entities": {"user_id": [1]}})):
                try:
                    stalled.append(process.client.post(path, json=request, timeout=QUICK + 5))
                except httpx.TimeoutException:  # pragma: no cover - the failure this test exists for
                    raise AssertionError(f"{path} waited on the stalled Redis") from None
        assert {r.status_code for r in stalled[-6:]} == {503}
        assert all(r.headers["retry-after"] == "1" for r in stalled if r.status_code == 503)
        for process in (up.predict, up.features):
            health = process.client.get("/health", timeout=QUICK)  # its own probe, never a blocking call
            assert health.status_code == 503 and health.json()["status"] == "unavailable"
            assert_reveals_nothing(health, up.redis)
            assert "quiver_online_store_up 0.0" in process.client.get("/metrics", timeout=QUICK).text
        for r in stalled:
            assert_reveals_nothing(r, up.redis)
    finally:
        up.redis.resume()
    until(lambda: up.predict.client.post("/predict", json=body).status_code == 200)
    assert until(lambda: up.predict.client.get("/health").json()["status"] == "ok")


def test_a_stopped_redis_names_no_host_or_exception(up: Stack) -> None:
    up.redis.stop()
    try:
        for process, path, request in ((up.predict, "/predict", rows([1], "down")),
                                       (up.features, "/features/online",
                                        {"features": ["stats:f0"], "entities": {"user_id": [1]}})):
            r = process.client.post(path, json=request, timeout=QUICK + 5)
            assert r.status_code == 503
            assert_reveals_nothing(r, up.redis)
            assert_reveals_nothing(until(lambda p=process: (lambda h: h if h.status_code == 503 else None)(
                p.client.get("/health", timeout=QUICK))), up.redis)
    finally:
        up.redis.start()
        write_online(up.project)  # it restarted empty
    until(lambda: up.predict.client.post("/predict", json=rows([1], "back")).status_code == 200)


# ----- the serving log -----

def test_log_write_failures_are_counted_shown_and_recovered(up: Stack) -> None:
    folder = up.project.offline / "serving_logs"
    until(lambda: up.predict.client.get("/health").json()["serving_log"]["buffered_rows"] == 0)
    aside = folder.with_name("serving_logs.aside")
    folder.rename(aside)
    folder.write_text("not a folder: every hour file fails to be written")
    try:
        answered = []
        for k in range(5):
            r = up.predict.client.post("/predict", json=rows([k], f"frozen-{k}"))
            assert r.status_code == 200  # serving goes on
            answered += [p["request_id"] for p in r.json()["predictions"]]
        health = until(lambda: (lambda h: h if h["serving_log"]["status"] == "failing" else None)(
            up.predict.client.get("/health").json()))
        assert health["status"] == "degraded" and health["serving_log"]["failed_writes"] >= 1
        assert "serving logs cannot be written" in health["detail"]
        assert "serving_logs" not in json.dumps(health) and "NotADirectory" not in json.dumps(health)
        metrics = up.predict.client.get("/metrics").text
        assert "quiver_serving_log_writable 0.0" in metrics
        assert any(line.startswith("quiver_serving_log_failed_writes_total ") and float(line.split()[1]) >= 1
                   for line in metrics.splitlines())
        assert any(line.startswith("quiver_serving_log_buffered_rows ") and float(line.split()[1]) >= 1
                   for line in metrics.splitlines())
    finally:
        folder.unlink()
        aside.rename(folder)
    until(lambda: up.predict.client.get("/health").json()["status"] == "ok", timeout_s=60)
    assert sorted(logged_ids(up.project, "frozen-")) == sorted(answered)  # written after the fix, once each


# ----- fairness -----

def test_one_client_cannot_hold_every_worker(up: Stack) -> None:
    held = []
    try:
        for _ in range(8):  # 8 requests in flight from 127.0.0.1: headers sent, body never finished
            sock = socket.create_connection(("127.0.0.1", up.predict.port))
            sock.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-API-Key: "
                         + KEY.encode() + b"\r\nContent-Length: 1000\r\n\r\n{\"rows\": [")
            held.append(sock)
        time.sleep(0.3)
        r = up.predict.client.post("/predict", json=rows([1], "ninth"))
        assert r.status_code == 429 and r.headers["retry-after"] == "1", r.text
        # Another client (another loopback address) is served as usual.
        with httpx.Client(base_url=up.predict.base, headers={"X-API-Key": KEY}, timeout=10,
                          transport=httpx.HTTPTransport(local_address="127.0.0.2")) as other:
            r = other.post("/predict", json=rows([1], "other"))
        assert r.status_code == 200, r.text
        assert "quiver_client_limit_refused 1.0" in up.predict.client.get("/metrics").text
    finally:
        for sock in held:
            sock.close()
    # The server frees a closed connection's slot when its event loop sees the close, not when the test
    # closes it: wait for that (a request that is not refused) rather than race it.
    deadline = time.monotonic() + 10
    while up.predict.client.post("/predict", json=rows([1], "freed")).status_code == 429:
        assert time.monotonic() < deadline, "the closed connections' slots were never freed"
        time.sleep(0.05)
    big = rows(list(range(USERS)) * 6, "big")  # 1,200 rows: over the 1,000 a request may hold
    r = up.predict.client.post("/predict", json=big)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "rows"], r.text



# ----- docs -----

def test_docs_load_without_a_cdn(up: Stack) -> None:
    for process in (up.predict, up.features):
        page = process.client.get("/docs")
        assert page.status_code == 200
        assert "cdn." not in page.text and "https://" not in page.text, page.text
        assets = [part.split('"')[0] for part in page.text.split('src="')[1:] + page.text.split('href="')[1:]]
        assert any(a.endswith("swagger-ui-bundle.js") for a in assets)
        for asset in assets:
            r = process.client.get(asset)
            assert r.status_code == 200 and len(r.content) > 1_000, asset
        assert process.client.get("/openapi.json").json()["openapi"].startswith("3.")


def browser() -> str:
    found = shutil.which("chromium-headless-shell") or shutil.which("chromium")
    if found is None:  # fail, never skip: `make setup` installs it (as root)
        pytest.fail("no headless Chromium: run `make setup` (apt-get install chromium)", pytrace=False)
    return found


def test_docs_render_in_a_real_browser_offline(up: Stack, tmp_path: Path) -> None:
    """Swagger UI runs in headless Chromium and lists the operations: its script came from the server (this
    machine reaches no CDN, so a page that needed one would render nothing)."""
    import subprocess

    for process, path in ((up.predict, "/predict"), (up.features, "/features/online")):
        # --headless: Chromium 150 no longer implies it from --dump-dom ("The platform failed to initialize").
        result = subprocess.run([browser(), "--headless", "--no-sandbox", "--disable-gpu",
                                 f"--user-data-dir={tmp_path / 'profile'}",
                                 "--virtual-time-budget=20000", "--dump-dom", f"{process.base}/docs"],
                                capture_output=True, text=True, timeout=120)
        dom = result.stdout
        assert "opblock-summary-path" in dom and f'data-path="{path}"' in dom, (result.stderr[-2000:], dom[-2000:])


# ----- a graceful stop -----

@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_writes_every_buffered_row_and_drains_the_shadow(up: Stack, sig: signal.Signals,
                                                               tmp_path: Path) -> None:
    """The reproduction: SIGTERM lost the rows logged since the last flush (uvicorn re-raised the signal
    before the logger was closed)."""
    process = serve_model(up.project, "--log-flush-interval", "3600")  # nothing is written before the stop
    tag = f"stop-{sig.name}"
    try:
        answered = []
        for k in range(30):
            r = process.client.post("/predict", json=rows([k % 200, (k + 7) % 200], f"{tag}-{k}"))
            assert r.status_code == 200, r.text
            answered += [p["request_id"] for p in r.json()["predictions"]]
        assert not logged_ids(up.project, tag)
        assert process.signal(sig) == 0, process.log.read_text()[-2000:]
    finally:
        process.stop()
    assert sorted(logged_ids(up.project, tag)) == sorted(answered)
    assert sorted(logged_ids(up.project, tag, arm="shadow")) == sorted(answered)  # the shadow queue drained
