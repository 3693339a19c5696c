"""`POST /predict` over real HTTP (uvicorn on loopback) with a real Redis and real artifacts: scores, API key,
input validation, body limit, Redis down → 503 and recovery, metrics, OpenAPI; and the CLI's user errors."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from quiver.serving.predict_server import INLINE_ROWS, create_app
from tests.integration.test_prediction_service import MODEL, Project, Server, project, register

pytestmark = pytest.mark.integration
__all__ = ["project"]
KEY = "predict-key"


@pytest.fixture
def served(project: Project) -> Iterator[tuple[httpx.Client, Project, int]]:
    v1 = register(project.models, project.root, seed=1)
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="first")
    service = project.service()
    with service, Server(create_app(service, api_key=KEY, max_body_bytes=32 * 1024)) as client:
        yield client, project, v1


def post(client: httpx.Client, body: object, key: str | None = KEY) -> httpx.Response:
    return client.post("/predict", json=body, headers={"X-API-Key": key} if key else {})


def test_scores_over_http(served: tuple[httpx.Client, Project, int]) -> None:
    client, project, v1 = served
    users = [3, 1, 4, 1, 5]
    body = {"rows": [{"request_id": f"q{i}", "entities": {"user_id": u}} for i, u in enumerate(users)]}
    r = post(client, body)
    assert r.status_code == 200, r.text
    predictions = r.json()["predictions"]
    assert [p["request_id"] for p in predictions] == [f"q{i}" for i in range(5)]
    assert {(p["model_version"], p["arm"], p["fallback"]) for p in predictions} == {(f"{MODEL}:{v1}", "champion",
                                                                                    False)}
    np.testing.assert_allclose([p["score"] for p in predictions], project.scores(v1, users), atol=1e-12)
    assert post(client, body, key=None).status_code == 401
    assert post(client, body, key="wrong").status_code == 401
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["champion"] == f"{MODEL}:{v1}"


def test_requests_scored_on_the_loop_and_on_a_worker_thread_answer_alike(
        served: tuple[httpx.Client, Project, int]) -> None:
    client, project, v1 = served
    users = [i % 7 for i in range(INLINE_ROWS + 40)]  # one request over the inline limit, then small ones
    big = post(client, {"rows": [{"request_id": f"b{i}", "entities": {"user_id": u}} for i, u in enumerate(users)]})
    assert big.status_code == 200, big.text
    small = []
    for start in range(0, len(users), 10):
        r = post(client, {"rows": [{"request_id": f"s{i}", "entities": {"user_id": users[i]}}
                                   for i in range(start, min(start + 10, len(users)))]})
        assert r.status_code == 200, r.text
        small += r.json()["predictions"]
    want = project.scores(v1, users)
    np.testing.assert_allclose([p["score"] for p in big.json()["predictions"]], want, atol=1e-12)
    np.testing.assert_allclose([p["score"] for p in small], want, atol=1e-12)
    assert [p["request_id"] for p in small] == [f"s{i}" for i in range(len(users))]


@pytest.mark.parametrize(("body", "status"), [
    ({"rows": []}, 422),
    ({"rows": [{"entities": {"user_id": 1}}]}, 422),  # no request_id
    ({"rows": [{"request_id": "a", "entities": {"user_id": 1}, "surprise": 1}]}, 422),
    ({"rows": [{"request_id": "a", "entities": {"user_id": 1}, "at": "soon"}]}, 422),
    ({"rows": [{"request_id": "a", "entities": {"user_id": [1]}}]}, 422),
    ({"rows": [{"request_id": "a", "entities": {"merchant_id": 1}}]}, 400),  # the model needs user_id
    ({"rows": [{"request_id": "a", "entities": {"user_id": "x"}}]}, 400),
    ({"rows": [{"request_id": "a", "entities": {"user_id": 1}, "fields": {"amount": 1.0}}]}, 400),  # read by none
    ({"rows": [{"request_id": "a", "entities": {"user_id": 1}}, {"request_id": "a", "entities": {"user_id": 2}}]},
     400),
])
def test_bad_input_is_a_clear_4xx(served: tuple[httpx.Client, Project, int], body: object, status: int) -> None:
    r = post(served[0], body)
    assert r.status_code == status, r.text
    assert r.json()["detail"]


def test_body_limit(served: tuple[httpx.Client, Project, int]) -> None:
    rows = [{"request_id": f"r{i}", "entities": {"user_id": 1}} for i in range(2_000)]
    assert post(served[0], {"rows": rows}).status_code == 413


def test_redis_down_gives_503_and_recovers(served: tuple[httpx.Client, Project, int], redis_server) -> None:
    client, _, _ = served
    body = {"rows": [{"request_id": "a", "entities": {"user_id": 1}}]}
    assert post(client, body).status_code == 200
    redis_server.stop()
    try:
        r = post(client, body)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert client.get("/health").status_code == 503
    finally:
        redis_server.start()
    for _ in range(200):  # the restarted Redis is empty: the features are missing, the model still scores
        r = post(client, body)
        if r.status_code == 200:
            break
        assert r.status_code == 503
        time.sleep(0.05)
    assert r.status_code == 200 and 0 <= r.json()["predictions"][0]["score"] <= 1


def test_metrics_and_openapi(served: tuple[httpx.Client, Project, int]) -> None:
    client, _, v1 = served
    for _ in range(3):
        post(client, {"rows": [{"request_id": "a", "entities": {"user_id": 1}}]})
    text = client.get("/metrics").text
    expected = ['quiver_requests_total{route="/predict",status="200"} 3.0',
                'quiver_prediction_rows{counter="rows"} 3.0',
                f'quiver_prediction_model_info{{arm="champion",version="{MODEL}:{v1}"}} 1.0']
    assert not [line for line in expected if line not in text]
    spec = client.get("/openapi.json").json()
    assert {"/predict", "/health", "/metrics"} <= set(spec["paths"])
    assert {"PredictRequest", "PredictRow", "PredictResponse"} <= set(spec["components"]["schemas"])


def test_cli_user_errors_are_one_red_line(project: Project, tmp_path) -> None:
    from quiver.cli import _register_optional_commands, app

    _register_optional_commands()
    config = tmp_path / "quiver.yaml"
    config.write_text(f"project: p\nregistry_url: {project.config.registry_url}\nredis_url: "
                      f"{project.config.redis_url}\n")
    runner = CliRunner()
    result = runner.invoke(app, ["canary", "step", MODEL, "--config", str(config)])
    assert result.exit_code == 2 and "no running rollout" in result.output
    assert "Traceback" not in result.output
    result = runner.invoke(app, ["canary", "start", MODEL, "--version", "1", "--steps", "5,x", "--config",
                                 str(config)])
    assert result.exit_code == 2 and "--steps" in result.output
    result = runner.invoke(app, ["evaluate", "--config", str(config), "--as-of", "yesterday"])
    assert result.exit_code == 2 and "--as-of" in result.output


def test_hot_swap_over_http_loses_no_request(project: Project) -> None:
    import threading

    v1 = register(project.models, project.root, seed=1)
    v2 = register(project.models, project.root, seed=2)
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="first")
    users = [5, 6, 7]
    expected = {f"{MODEL}:{v}": project.scores(v, users) for v in (v1, v2)}
    service = project.service(poll_interval_s=0.05)
    answers: list[httpx.Response] = []
    errors: list[BaseException] = []
    stop = threading.Event()
    with service, Server(create_app(service, api_key=KEY)) as client:
        base = str(client.base_url)

        def hammer(k: int) -> None:
            with httpx.Client(base_url=base, timeout=30) as own:
                i = 0
                while not stop.is_set():
                    try:
                        answers.append(post(own, {"rows": [{"request_id": f"h{k}-{i}-{u}", "entities": {"user_id": u}}
                                                           for u in users]}))
                    except BaseException as exc:
                        errors.append(exc)
                    i += 1

        threads = [threading.Thread(target=hammer, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        try:
            deadline = time.monotonic() + 30
            while len(answers) < 15 and time.monotonic() < deadline:
                time.sleep(0.01)
            project.models.set_alias(MODEL, "champion", v2, expected=v1, reason="swap under load")
            while client.get("/health").json()["champion"] != f"{MODEL}:{v2}" and time.monotonic() < deadline:
                time.sleep(0.01)
            after = len(answers)
            while len(answers) < after + 15 and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            stop.set()
            for t in threads:
                t.join()
    assert not errors and answers
    assert {r.status_code for r in answers} == {200}
    seen = set()
    for r in answers:
        predictions = r.json()["predictions"]
        label = {p["model_version"] for p in predictions}
        assert len(label) == 1
        version = label.pop()
        seen.add(version)
        np.testing.assert_allclose([p["score"] for p in predictions], expected[version], atol=1e-12)
    assert seen == set(expected)


def test_cli_rollout_commands(project: Project, tmp_path) -> None:
    import json

    from quiver.cli import _register_optional_commands, app
    from quiver.registry import rollouts

    _register_optional_commands()
    v1 = register(project.models, project.root, seed=1)
    v2 = register(project.models, project.root, seed=2)
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="first")
    config = tmp_path / "quiver.yaml"
    config.write_text(f"project: p\nregistry_url: {project.config.registry_url}\nredis_url: "
                      f"{project.config.redis_url}\noffline_root: {project.config.offline_root}\n")
    runner = CliRunner()

    def run(*args: str) -> str:
        result = runner.invoke(app, [*args, "--config", str(config)])
        assert result.exit_code == 0, result.output
        return result.output

    assert "shadow of 'fraud'" in run("shadow", "start", MODEL, "--version", str(v2))
    assert project.models.aliases(MODEL)["shadow"] == v2
    # Nothing served yet: a verdict over no labelled pairs is no verdict (exit 2, nothing recorded).
    evaluation = runner.invoke(app, ["shadow", "evaluate", MODEL, "--json", "--config", str(config)])
    assert evaluation.exit_code == 2 and "no rows compared: 0 requests scored by both" in evaluation.output, \
        evaluation.output
    assert rollouts.list_decisions(project.registry, MODEL, kind="shadow_evaluation") == []
    assert "rollout #" in run("canary", "start", MODEL, "--version", str(v2), "--steps", "0.1,0.5,1")
    status = json.loads(run("canary", "status", MODEL, "--json"))
    assert status["rollouts"][0]["fraction"] == 0.1 and status["rollouts"][0]["status"] == "running"
    step = json.loads(run("canary", "step", MODEL, "--json"))
    assert step["decision"]["outcome"] == "hold" and step["actions"] == []
    again = json.loads(run("canary", "step", MODEL, "--json"))
    assert again["decision"]["id"] == step["decision"]["id"] and again["decision"]["created"] is False
    assert "rollout rolled_back" in run("canary", "rollback", MODEL, "--reason", "manual test")
    assert "canary" not in project.models.aliases(MODEL)
    evaluated = runner.invoke(app, ["evaluate", MODEL, "--config", str(config)])
    assert evaluated.exit_code == 2 and "no rows evaluated: no serving-log rows of 'fraud'" in evaluated.output, \
        evaluated.output
