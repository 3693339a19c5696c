"""Connection limits of the servers (runtime.ServerLimits) on real uvicorn sockets: a huge header is a 431,
idle, half-sent and finished keep-alive connections are closed, and connections beyond the limit get 503."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import pytest

from quiver.serving.runtime import ServerLimits
from quiver.serving.server import create_app
from tests.integration.test_serving_http import KEY, Server, post, store  # noqa: F401  (fixture)

pytestmark = pytest.mark.integration

LIMITS = ServerLimits(max_header_bytes=8 * 1024, request_timeout_s=0.5, keep_alive_s=0.5, max_concurrency=3)


@pytest.fixture
def limited(store) -> Iterator[tuple[httpx.Client, int]]:  # noqa: F811  (the imported fixture)
    server = Server(create_app(store, api_key=KEY), LIMITS)
    with server as client:
        yield client, server.port


def closed_by_server(sock: socket.socket, wait_s: float = 20.0) -> bool:
    """True when the server closes the connection (EOF) before `wait_s` — far beyond the limit under test."""
    sock.settimeout(wait_s)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_huge_header_is_refused(limited):
    client, _ = limited
    r = client.get("/health", headers={"X-Padding": "x" * 64 * 1024})
    assert r.status_code == 431
    assert client.get("/health").status_code in (200, 503)  # the server itself is fine


def test_idle_new_connection_is_closed(limited):
    _, port = limited
    with socket.create_connection(("127.0.0.1", port)) as sock:
        assert closed_by_server(sock)


def test_half_sent_request_is_closed(limited):
    _, port = limited
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"POST /features/online HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 500\r\n\r\n{\"features\": [")
        assert closed_by_server(sock)
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")  # head never finished
        assert closed_by_server(sock)


def test_idle_keep_alive_connection_is_closed(limited):
    _, port = limited
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        sock.settimeout(20)
        assert sock.recv(65536).startswith(b"HTTP/1.1 ")
        assert closed_by_server(sock)


def test_connections_beyond_the_limit_get_503(limited):
    client, port = limited
    body = {"features": ["last:amount"], "entities": {"user_id": [1]}, "at_us": 0}
    assert post(client, body).status_code == 200
    held = [socket.create_connection(("127.0.0.1", port)) for _ in range(LIMITS.max_concurrency)]
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as other:
            r = post(other, body)
        assert r.status_code == 503, r.text
    finally:
        for sock in held:
            sock.close()


def test_quiver_serve_applies_the_limits(tmp_path, redis_url):
    import os
    import subprocess
    import sys
    import time

    from tests.harness import free_port

    (tmp_path / "feature_defs").mkdir()
    (tmp_path / "quiver.yaml").write_text(f"project: lim\nregistry_url: sqlite:///reg.db\nredis_url: {redis_url}\n")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", "from quiver.cli import main; main()", "serve", "--port", str(port),
                             "--config", str(tmp_path / "quiver.yaml")], env={**os.environ, "QUIVER_API_KEY": KEY},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            for _ in range(600):
                try:
                    if client.get("/health").status_code:
                        break
                except httpx.TransportError:
                    assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
                    time.sleep(0.1)
            assert client.get("/health", headers={"X-Padding": "x" * 32 * 1024}).status_code == 431
            assert client.get("/health").json()["catalog_version"] is None  # nothing applied: from disk
    finally:
        proc.terminate()
        proc.wait(15)
