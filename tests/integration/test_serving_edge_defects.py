"""The serving edge, against the reproductions of issue 34 on real `quiver serve` / `quiver serve-model`
processes and a real Redis: a client that pipelines requests and hangs up, a fresh server that could not load
its champion, a refused request value named as it was sent, the time range the OpenAPI documents state,
entity keys in other scripts' digits, and the modes of the registry and artifact files."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from quiver.artifacts import ArtifactStore
from quiver.catalog.definitions import Check, Contract
from quiver.config import Config, load_config
from quiver.online.redis_store import RedisOnlineStore
from quiver.registry import Registry
from quiver.registry.models import ModelRegistry
from quiver.serving.server import create_app
from quiver.serving.store import FeatureStore
from tests.harness import RedisServer
from tests.integration.test_request_features import odfv_catalog
from tests.integration.test_serving_hardening import Stack, until
from tests.integration.test_serving_http import Server
from tests.serving_processes import (
    KEY,
    MODEL,
    make_project,
    rows,
    serve_features,
    serve_model,
)

pytestmark = pytest.mark.integration
FEATURES = {"features": ["stats:f0"], "entities": {"user_id": [1]}}


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    binary = shutil.which("redis-server")
    assert binary, "redis-server not on PATH: run `make setup`"
    server = RedisServer(binary, tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def stack(redis: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    project = make_project(tmp_path_factory.mktemp("project"), redis.url, shadow=False)
    predict = serve_model(project)
    try:
        features = serve_features(project)
    except BaseException:
        predict.stop()
        raise
    yield Stack(redis, project, predict, features)
    predict.stop()
    features.stop()


# ----- a client that pipelines and hangs up -----

def pipelined(port: int, path: str, body: dict[str, Any], count: int) -> None:
    """`count` requests written at once on one connection, which then closes without reading an answer."""
    data = json.dumps(body).encode()
    request = (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nX-API-Key: {KEY}\r\n"
               f"Content-Length: {len(data)}\r\n\r\n").encode() + data
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(request * count)


def test_a_client_that_pipelines_and_closes_leaves_no_traceback(stack: Stack) -> None:
    """The reproduction: each such connection logged a ~35-line `RuntimeError: unable to perform operation on
    <TCPTransport closed=True>` (uvicorn marked only the last queued request disconnected, not the running
    one, which then wrote to the closed socket)."""
    predict, features = serve_model(stack.project), serve_features(stack.project)  # their own logs, stopped here
    try:
        for process, path, body in ((predict, "/predict", rows([1], "pipe")), (features, "/features/online", FEATURES)):
            for _ in range(5):
                pipelined(process.port, path, body, 20)
            r = process.client.post(path, json=body)  # still answering
            assert r.status_code == 200, r.text
    finally:
        for process in (predict, features):
            process.signal(signal.SIGTERM)  # uvicorn finishes every request in flight first: all is logged
            process.stop()
    for process in (predict, features):
        log = process.log.read_text()
        assert "Traceback" not in log and "RuntimeError" not in log, log[-3000:]


# ----- a fresh server on an earlier champion -----

def test_a_server_that_fell_back_to_an_earlier_champion_says_degraded_and_why(redis: RedisServer,
                                                                             tmp_path: Path) -> None:
    """The reproduction: with champion 2's weights damaged, a fresh server served fraud:1 and answered /health
    `"status": "ok", "champion": "fraud:1"` while the registry said 2. A server already running when the alias
    moved to the damaged version kept fraud:1 and said "ok" as well."""
    project = make_project(tmp_path / "project", redis.url)  # versions 1 (champion) and 2
    config = load_config(project.config_file)
    registry = Registry(config.registry, project="p")
    # Without the alias check (which refuses a damaged artifact): the file was damaged after the alias moved.
    models = ModelRegistry(registry, ArtifactStore.from_config(config), verify_artifacts=False)
    weights = models.artifacts.local_dir(models.get(MODEL, 2).artifact_path) / "weights.pt"
    good = weights.read_bytes()
    weights.write_bytes(b"damaged")
    running = serve_model(project)
    fresh = None
    try:
        assert running.client.get("/health").json()["status"] == "ok"
        models.set_alias(MODEL, "champion", 2, expected=1, reason="test")  # the running server polls it
        fresh = serve_model(project)
        for process in (running, fresh):
            health = until(lambda p=process: (lambda r: r if r.json()["status"] != "ok" else None)(
                p.client.get("/health")))
            assert health.status_code == 200, health.text  # still serving: readiness is unchanged
            body = health.json()
            assert body["status"] == "degraded" and body["champion"] == f"{MODEL}:1", body
            (reason,) = body["reasons"]
            assert reason["reason"] == "champion_not_loaded" and reason["version"] == f"{MODEL}:2", reason
            assert reason["serving"] == f"{MODEL}:1" and "checksum mismatch" in reason["error"], reason
            assert "QuiverError" not in health.text  # exception types go to the log only
            assert f"{MODEL}:2" in body["detail"]
            metrics = process.client.get("/metrics").text
            assert "quiver_serving_degraded 1.0" in metrics
            assert f'quiver_prediction_champion_fallback{{serving="{MODEL}:1",wanted="{MODEL}:2"}} 1.0' in metrics
        weights.write_bytes(good)  # repaired: each poller loads it at its next try, and the server says so
        for process in (running, fresh):
            assert until(lambda p=process: p.client.get("/health").json()["status"] == "ok", timeout_s=120)
            assert process.client.get("/health").json()["champion"] == f"{MODEL}:2"
            metrics = process.client.get("/metrics").text
            assert "quiver_serving_degraded 0.0" in metrics and "quiver_prediction_champion_fallback{" not in metrics
    finally:
        weights.write_bytes(good)
        registry.close()
        for process in (running, fresh):
            if process is not None:
                process.stop()


# ----- a refused request value, named as it was sent -----

def test_the_feature_server_names_a_refused_request_value_as_it_was_sent(redis: RedisServer) -> None:
    """The reproduction: a contract refusal of `request.amount` was named `rows[0].fields.amount`, a /predict
    spelling that does not exist in this body."""
    catalog = odfv_catalog(Contract({"amount": Check(finite=True, min=0.0)}))
    online = RedisOnlineStore(redis.url, "odfv")
    with FeatureStore(config=Config(project="odfv", redis_url=redis.url), catalog=catalog, online_store=online) as fs, \
            Server(create_app(fs, api_key="")) as client:
        def post(amounts: list[Any]) -> httpx.Response:
            return client.post("/features/online", json={
                "features": ["ctx:amount_x_f0"], "entities": {"user_id": [1, 2]},
                "request": {"amount": amounts, "channel": ["web", "web"]}})

        refused = post([3.0, -3.0])
        mistyped = post([3.0, "3"])
        assert post([3.0, 4.0]).status_code == 200
    assert refused.status_code == 400, refused.text
    assert refused.json()["detail"].startswith("request.amount[1]: refused by the contract of 'order' (min:amount")
    assert mistyped.status_code == 400, mistyped.text
    assert mistyped.json()["detail"].startswith("request.amount[1]: expected float64, got str")


# ----- times: what the OpenAPI documents say is what the servers accept -----

def at_schemas(stack: Stack) -> dict[str, dict[str, Any]]:
    """The ISO-string schema of `at` in each server's OpenAPI document."""
    out = {}
    for process, model in ((stack.predict, "PredictRow"), (stack.features, "OnlineRequest")):
        schema = process.client.get("/openapi.json").json()["components"]["schemas"][model]["properties"]["at"]
        strings: list[dict[str, Any]] = []
        pending = [schema]
        while pending:  # anyOf nests (an optional union of integer and string)
            part = pending.pop()
            pending += part.get("anyOf", [])
            strings += [part] if part.get("type") == "string" else []
        (out[model],) = strings
    return out


ACCEPTED = ["1900-01-01T00:00:00Z", "2199-12-31T23:59:59.999999Z", "2000-02-29T12:00:00+14:00",
            "2026-11-03t12:00:00.5-03:30"]
REFUSED = ["0380-11-15T00:00:00Z", "2200-01-01T00:00:00Z", "1900-01-01T00:30:00+01:00",
           "2199-12-31T23:30:00-01:00", "2100-02-29T00:00:00Z", "2026-04-31T00:00:00Z"]


def test_the_openapi_documents_state_the_time_range_the_servers_accept(stack: Stack) -> None:
    """The reproduction: both documents said `format: date-time` and nothing more, so "0380-11-15T…" was
    schema-valid and a 422."""
    for model, schema in at_schemas(stack).items():
        assert "1900-01-01T00:00:00Z" in schema["description"] and "2200-01-01T00:00:00Z" in schema["description"]
        checker = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
        for at in ACCEPTED:
            assert checker.is_valid(at), (model, at)
        for at in REFUSED:
            assert not checker.is_valid(at), (model, at)
    for at in ACCEPTED:
        r = stack.predict.client.post("/predict", json={"rows": [{"request_id": "t", "entities": {"user_id": 1},
                                                                  "at": at}]})
        assert r.status_code == 200, (at, r.text)
        r = stack.features.client.post("/features/online", json={**FEATURES, "at": at})
        assert r.status_code == 200, (at, r.text)
    for at in REFUSED:
        r = stack.features.client.post("/features/online", json={**FEATURES, "at": at})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "at"], (at, r.text)


@pytest.mark.parametrize(("at", "says"), [
    ("0380-11-15T00:00:00Z", "outside the supported range 1900-01-01T00:00:00Z <= t < 2200-01-01T00:00:00Z"),
    (4 * 10**18, "outside the supported range"),
    (True, "epoch microseconds (an integer) or an ISO-8601 string"),
    ({"t": 1}, "epoch microseconds (an integer) or an ISO-8601 string"),
    ("2026-11-03T12:00:00", "needs a UTC offset"),
    (1.5, "whole number"),
])
def test_a_bad_at_on_predict_is_one_problem_at_a_clean_loc(stack: Stack, at: Any, says: str) -> None:
    """The reproduction: `loc` carried pydantic's union tags (`…, "at", "function-before[whole_number(), …]"`)
    and an ISO string's first message was "must be an integer"."""
    r = stack.predict.client.post("/predict", json={"rows": [{"request_id": "t", "entities": {"user_id": 1},
                                                              "at": at}]})
    assert r.status_code == 422, r.text
    (problem,) = r.json()["detail"]
    assert problem["loc"] == ["body", "rows", 0, "at"] and says in problem["msg"], problem


# ----- entity keys: ASCII digits only -----

def test_an_integer_key_in_other_digits_is_refused_naming_the_key(stack: Stack) -> None:
    """The reproduction: `"user_id": "３６９"` (fullwidth digits) was scored as user 369 (int() reads any
    Unicode digits)."""
    for user in ("３６９", "٣٦٩", " 369", "3_69", "+369"):
        r = stack.predict.client.post("/predict", json={"rows": [{"request_id": "k", "entities": {"user_id": user}}]})
        assert r.status_code == 400 and "join key 'user_id'" in r.text and "ASCII" in r.text, (user, r.text)
        r = stack.features.client.post("/features/online", json={**FEATURES, "entities": {"user_id": [1, user]}})
        assert r.status_code == 400 and "join key 'user_id'" in r.text and "ASCII" in r.text, (user, r.text)
    ok = stack.predict.client.post("/predict", json={"rows": [{"request_id": "k", "entities": {"user_id": "42"}}]})
    assert ok.status_code == 200, ok.text  # digits as text stay fine (how an id beyond 2^53 travels)


# ----- files -----

def test_the_registry_and_the_artifacts_are_owner_only(stack: Stack) -> None:
    """The reproduction: the registry file and the model artifacts were 0644 / 0755, readable by every user."""
    def mode(path: Path) -> int:
        return stat.S_IMODE(path.stat().st_mode)

    assert mode(stack.project.root / "reg.db") == 0o600
    models = stack.project.root / ".quiver" / "models"
    found = list(models.rglob("*"))
    assert any(p.name == "weights.pt" for p in found)
    for path in [models, *found]:
        assert mode(path) == (0o700 if path.is_dir() else 0o600), (path, oct(mode(path)))
