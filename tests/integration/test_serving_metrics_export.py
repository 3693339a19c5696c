"""Monitoring metrics reach Prometheus: through the feature server's /metrics, and from short-lived batch
processes as a node_exporter textfile or a Pushgateway push (a real HTTP server receives it)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from quiver.serving.runtime import export_metrics
from quiver.serving.server import create_app
from tests.integration.test_serving_http import KEY, Server, store  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration


def test_feature_server_exposes_the_monitoring_metrics(store):  # noqa: F811
    from quiver import metrics

    metrics.LATE_EVENTS.labels(source="metrics_export_test").inc(3)
    with Server(create_app(store, api_key=KEY)) as client:
        text = client.get("/metrics").text
    assert 'quiver_late_events_total{source="metrics_export_test"} 3.0' in text
    assert "quiver_requests_total" in text  # the server's own metrics beside them
    assert text.count("# TYPE quiver_feature_freshness_seconds ") <= 1  # no family twice


def test_textfile_for_node_exporter(tmp_path):
    from quiver import metrics

    metrics.ALERTS.labels(kind="drift", severity="warning", outcome="created").inc()
    path = tmp_path / "quiver.prom"
    export_metrics(str(path))
    assert 'quiver_alerts_total{kind="drift",outcome="created",severity="warning"}' in path.read_text()
    with pytest.raises(ValueError, match="textfile"):
        export_metrics(str(tmp_path / "quiver.txt"))


def test_pushgateway_push():
    received: list[tuple[str, str, bytes]] = []

    class Gateway(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.command, self.path, body))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    from quiver import metrics

    metrics.LATE_EVENTS.labels(source="pushed").inc()
    server = HTTPServer(("127.0.0.1", 0), Gateway)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        export_metrics(f"http://127.0.0.1:{server.server_port}", job="quiver_backfill")
    finally:
        server.shutdown()
    (method, path, body), = received
    assert method == "PUT" and path == "/metrics/job/quiver_backfill"
    assert b'quiver_late_events_total{source="pushed"}' in body


def test_cli_commands_export_on_exit(tmp_path):
    (tmp_path / "feature_defs").mkdir()
    (tmp_path / "quiver.yaml").write_text("project: m\nregistry_url: sqlite:///reg.db\n")
    path = tmp_path / "out.prom"
    env = {**os.environ, "QUIVER_METRICS_EXPORT": str(path)}
    done = subprocess.run([sys.executable, "-c", "from quiver.cli import main; main()", "list", "--config",
                           str(tmp_path / "quiver.yaml")], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "python_info" in path.read_text()
