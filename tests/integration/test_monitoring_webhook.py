"""WebhookSink against a real local HTTP receiver whose first requests fail; records in a real registry."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from quiver.monitoring.alerts import AlertManager, WebhookSink
from quiver.monitoring.repository import get_alert
from quiver.registry import Registry

pytestmark = pytest.mark.integration


class Receiver:
    """http.server on 127.0.0.1 that answers `fail_status` to the first `failures` POSTs, then 200."""

    def __init__(self, failures: int, fail_status: int = 503, retry_after: str | None = None):
        self.failures, self.fail_status, self.retry_after = failures, fail_status, retry_after
        self.bodies: list[dict[str, Any]] = []
        self.statuses: list[int] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                receiver.bodies.append(body)
                status = receiver.fail_status if len(receiver.bodies) <= receiver.failures else 200
                receiver.statuses.append(status)
                self.send_response(status)
                if status != 200 and receiver.retry_after:
                    self.send_header("Retry-After", receiver.retry_after)
                self.end_headers()
                self.wfile.write(b"ok" if status == 200 else b"down")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def registry(registry_url: str) -> Iterator[Registry]:
    reg = Registry(registry_url, project="fraud")
    yield reg
    reg.close()


def test_retries_until_the_receiver_recovers(registry: Registry) -> None:
    sleeps: list[float] = []
    with Receiver(failures=2) as receiver:
        sink = WebhookSink(receiver.url, attempts=4, backoff_s=0.01, sleep=sleeps.append)
        raised = AlertManager(registry, [sink]).raise_alert(
            "dataset_drift", "fraud_model", "critical", "Dataset drift in fraud_model", "3/5 features drifted")
    assert receiver.statuses == [503, 503, 200]
    assert sleeps == [0.01, 0.02]  # exponential backoff between attempts
    body = receiver.bodies[-1]
    assert body["text"] == ":rotating_light: [CRITICAL] Dataset drift in fraud_model"
    assert body["blocks"][0] == {"type": "header", "text": {"type": "plain_text",
                                                           "text": "Dataset drift in fraud_model"}}
    assert raised.alert.deliveries == {"webhook": "delivered"}
    with registry.engine.connect() as connection:
        attempts = connection.exec_driver_sql("SELECT attempts FROM alert_deliveries").scalar()
    assert attempts == 3


def test_gives_up_keeps_the_alert_and_redelivers_later(registry: Registry) -> None:
    with Receiver(failures=3, fail_status=500) as receiver:
        sink = WebhookSink(receiver.url, attempts=3, backoff_s=0.0)
        manager = AlertManager(registry, [sink])
        raised = manager.raise_alert("quality", "transactions", "warning", "gate failed")
        assert raised.alert.deliveries == {"webhook": "failed"}
        assert get_alert(registry, raised.alert.id).status == "open"  # the record survives the failure
        assert manager.redeliver() == 1
    assert receiver.statuses == [500, 500, 500, 200]
    assert get_alert(registry, raised.alert.id).deliveries == {"webhook": "delivered"}


def test_client_errors_are_not_retried_but_429_is(registry: Registry) -> None:
    with Receiver(failures=5, fail_status=400) as receiver:
        raised = AlertManager(registry, [WebhookSink(receiver.url, attempts=4, backoff_s=0.0)]).raise_alert(
            "drift", "m:x", "warning", "x drifted")
        assert receiver.statuses == [400]
        assert raised.alert.deliveries == {"webhook": "failed"}
    sleeps: list[float] = []
    with Receiver(failures=1, fail_status=429, retry_after="0.05") as receiver:
        sink = WebhookSink(receiver.url, attempts=2, backoff_s=5.0, sleep=sleeps.append)
        AlertManager(registry, [sink]).raise_alert("drift", "m:y", "warning", "y drifted")
        assert receiver.statuses == [429, 200]
    assert sleeps == [0.05]  # Retry-After wins over the backoff


def test_unreachable_receiver_fails_cleanly(registry: Registry) -> None:
    with Receiver(failures=0) as receiver:
        url = receiver.url
    # the server is closed now: connection refused on every attempt
    raised = AlertManager(registry, [WebhookSink(url, attempts=2, backoff_s=0.0, timeout_s=2)]).raise_alert(
        "drift", "m:z", "warning", "z drifted")
    assert raised.alert.deliveries == {"webhook": "failed"}
    with registry.engine.connect() as connection:
        error = connection.exec_driver_sql("SELECT last_error FROM alert_deliveries").scalar()
    assert "gave up after 2 attempts" in error
