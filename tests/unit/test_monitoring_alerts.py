"""Alert records: dedup, escalation, resolution, delivery bookkeeping; sinks' payloads and config."""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from quiver.monitoring.alerts import (
    AirflowAssetSink,
    AlertManager,
    DeliveryError,
    LogSink,
    WebhookSink,
    sinks_from_config,
    slack_payload,
)
from quiver.monitoring.repository import get_alert, list_alerts, undelivered
from quiver.registry import Registry


class Recorder:
    """A sink that remembers what it got; it fails while `failures` > 0 (a fake: unit tests only)."""

    def __init__(self, name: str = "recorder", failures: int = 0, crash: bool = False):
        self.name, self.failures, self.crash = name, failures, crash
        self.sent: list[int] = []

    def send(self, alert) -> int:  # type: ignore[no-untyped-def]
        if self.crash:
            raise RuntimeError("sink bug")
        if self.failures > 0:
            self.failures -= 1
            raise DeliveryError("receiver down", attempts=3)
        self.sent.append(alert.id)
        return 1


@pytest.fixture
def registry(sqlite_url: str) -> Registry:
    return Registry(sqlite_url, project="fraud")


def test_one_open_alert_per_kind_and_subject(registry: Registry) -> None:
    sink = Recorder()
    manager = AlertManager(registry, [sink])
    first = manager.raise_alert("drift", "fraud_model:amount", "warning", "amount drifted", "PSI 0.31")
    again = manager.raise_alert("drift", "fraud_model:amount", "warning", "amount drifted", "PSI 0.35")
    other = manager.raise_alert("drift", "fraud_model:country", "warning", "country drifted")
    assert first.outcome == "created" and again.outcome == "repeated" and other.outcome == "created"
    assert again.alert.id == first.alert.id
    assert again.alert.occurrences == 2
    assert sink.sent == [first.alert.id, other.alert.id]  # the repeat was not re-sent
    assert len(manager.open_alerts("drift")) == 2


def test_escalation_redelivers_and_resolution_reopens(registry: Registry) -> None:
    sink = Recorder()
    manager = AlertManager(registry, [sink])
    a = manager.raise_alert("quality", "transactions", "warning", "gate failed")
    b = manager.raise_alert("quality", "transactions", "critical", "gate failed hard")
    assert b.outcome == "escalated" and b.alert.severity == "critical" and b.alert.title == "gate failed hard"
    assert sink.sent == [a.alert.id, a.alert.id]
    assert manager.resolve("quality", "transactions") == 1
    assert get_alert(registry, a.alert.id).status == "resolved"
    c = manager.raise_alert("quality", "transactions", "warning", "gate failed again")
    assert c.outcome == "created" and c.alert.id != a.alert.id
    assert [x.status for x in list_alerts(registry, None, "quality")] == ["open", "resolved"]


def test_failed_delivery_keeps_the_alert_and_retries_later(registry: Registry) -> None:
    flaky, crashing, fine = Recorder("flaky", failures=1), Recorder("crashing", crash=True), Recorder("fine")
    manager = AlertManager(registry, [flaky, crashing, fine])
    raised = manager.raise_alert("dataset_drift", "fraud_model", "critical", "dataset drift")
    alert = raised.alert
    assert alert.deliveries == {"flaky": "failed", "crashing": "failed", "fine": "delivered"}
    assert alert.delivery_status == "failed"
    assert fine.sent == [alert.id]  # one broken sink does not stop the others
    assert set(undelivered(registry)) == {(alert.id, "flaky"), (alert.id, "crashing")}
    crashing.crash = False
    assert manager.redeliver() == 2
    after = get_alert(registry, alert.id)
    assert after.delivery_status == "delivered"
    assert undelivered(registry) == []
    with registry.engine.connect() as connection:
        attempts = dict(connection.exec_driver_sql(
            "SELECT sink, attempts FROM alert_deliveries WHERE alert_id = ?", (alert.id,)).fetchall())
    assert attempts == {"flaky": 4, "crashing": 2, "fine": 1}  # 3 tries inside the sink, then 1 more


def test_bad_severity_and_duplicate_sink_names(registry: Registry) -> None:
    with pytest.raises(ValueError, match="severity"):
        AlertManager(registry).raise_alert("drift", "x", "urgent", "t")
    with pytest.raises(ValueError, match="unique"):
        AlertManager(registry, [Recorder("a"), Recorder("a")])


def test_log_sink(registry: Registry, caplog: pytest.LogCaptureFixture) -> None:
    manager = AlertManager(registry, [LogSink()])
    with caplog.at_level(logging.WARNING, logger="quiver.alerts"):
        manager.raise_alert("drift", "m:amount", "warning", "amount drifted", "PSI 0.4")
    assert "amount drifted" in caplog.text and "PSI 0.4" in caplog.text


def test_slack_payload_shape(registry: Registry) -> None:
    alert = AlertManager(registry).raise_alert("drift", "m:amount", "critical", "amount drifted", "PSI 0.4").alert
    payload = slack_payload(alert)
    assert payload["text"].startswith(":rotating_light: [CRITICAL] amount drifted")
    assert [b["type"] for b in payload["blocks"]] == ["header", "section", "section", "context"]
    assert payload["blocks"][1]["text"]["text"] == "PSI 0.4"
    json.dumps(payload)  # serializable as is


def test_sinks_from_config(tmp_path: Path) -> None:
    sinks = sinks_from_config([{"type": "log"}, {"type": "webhook", "url": "http://127.0.0.1:9/x", "attempts": 2},
                               {"type": "airflow_asset", "trigger_dir": str(tmp_path)}])
    assert [type(s) for s in sinks] == [LogSink, WebhookSink, AirflowAssetSink]
    with pytest.raises(ValueError, match="unknown alert sink"):
        sinks_from_config([{"type": "pager"}])


def test_airflow_asset_sink_writes_trigger_files(registry: Registry, tmp_path: Path) -> None:
    sink = AirflowAssetSink("quiver://monitoring/drift", trigger_dir=tmp_path)
    manager = AlertManager(registry, [sink])
    manager.raise_alert("drift", "m:amount", "warning", "feature drift")  # not a retraining signal
    manager.raise_alert("dataset_drift", "fraud_model", "warning", "dataset drift")  # drift alone only warns
    assert not sink.trigger_file or not sink.trigger_file.exists()
    raised = manager.raise_alert("retrain_needed", "fraud_model", "critical", "retrain: expected harm",
                                 detail={"share": 0.6})
    assert sink.trigger_file is not None
    event = json.loads(sink.trigger_file.read_text())
    assert event["asset_uri"] == "quiver://monitoring/drift"
    assert event["extra"]["alert_id"] == raised.alert.id and event["extra"]["detail"] == {"share": 0.6}
    history = list((tmp_path / f"{sink.asset_name}.events").glob("*.json"))
    assert len(history) == 1
    assert raised.alert.deliveries == {"airflow_asset": "delivered"}
    with pytest.raises(ValueError, match="api_url"):
        AirflowAssetSink()


def test_airflow_asset_sink_rest_mode_against_a_fake_api(registry: Registry) -> None:
    # A stand-in for Airflow's REST API (a fake: the real API server is not run in tests).
    calls: list[tuple[str, str, Any]] = []

    class Api(BaseHTTPRequestHandler):
        def _reply(self, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            calls.append(("GET", self.path, self.headers["Authorization"]))
            self._reply({"assets": [{"id": 7, "uri": "quiver://monitoring/drift"}], "total_entries": 1})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            calls.append(("POST", self.path, body))
            self._reply({"access_token": "tok"} if self.path == "/auth/token" else {"id": 1})

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        sink = AirflowAssetSink(api_url=f"http://127.0.0.1:{server.server_address[1]}", username="u", password="p")
        raised = AlertManager(registry, [sink]).raise_alert("retrain_needed", "fraud_model", "critical", "retrain")
    finally:
        server.shutdown()
        server.server_close()
    assert raised.alert.deliveries == {"airflow_asset": "delivered"}
    assert calls[0] == ("POST", "/auth/token", {"username": "u", "password": "p"})
    assert calls[1][0] == "GET" and calls[1][1].startswith("/api/v2/assets?uri_pattern=") and calls[1][2] == "Bearer tok"
    method, path, body = calls[2]
    assert (method, path, body["asset_id"]) == ("POST", "/api/v2/assets/events", 7)
    assert body["extra"]["alert_id"] == raised.alert.id
