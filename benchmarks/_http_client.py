"""A minimal HTTP/1.1 keep-alive client for the serving benchmarks: POST prebuilt JSON, read the reply by
Content-Length.

httpx costs ~0.5 ms of Python per request, and the client shares the two cores (and one GIL across its
threads) with the servers, so at ~1k req/s it measured mostly itself. Every side of a benchmark gets this
same client.
"""

from __future__ import annotations

import socket


class KeepAliveClient:
    """One connection; `post(path, payload)` → (status, body)."""

    def __init__(self, base: str, headers: dict[str, str], path: str = "/predict", source: str | None = None):
        host, _, port = base.removeprefix("http://").partition(":")
        # `source`: the local address to send from (e.g. 127.0.0.2: another client to the server's limits).
        self.sock = socket.create_connection((host, int(port)), timeout=30,
                                             source_address=(source, 0) if source else None)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.host = f"{host}:{port}"
        self.extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.path = path
        self.pending = b""

    def post(self, payload: bytes, path: str | None = None) -> tuple[int, bytes]:
        head = (f"POST {path or self.path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
                f"{self.extra}Content-Length: {len(payload)}\r\n\r\n")
        self.sock.sendall(head.encode() + payload)
        while b"\r\n\r\n" not in self.pending:
            self.pending += self._recv()
        head_bytes, _, rest = self.pending.partition(b"\r\n\r\n")
        lines = head_bytes.split(b"\r\n")
        fields = dict(line.split(b":", 1) for line in lines[1:])
        length = int(next(v for k, v in fields.items() if k.strip().lower() == b"content-length"))
        while len(rest) < length:
            rest += self._recv()
        self.pending = rest[length:]
        return int(lines[0].split(b" ", 2)[1]), rest[:length]

    def _recv(self) -> bytes:
        chunk = self.sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError("server closed the connection")
        return chunk

    def close(self) -> None:
        self.sock.close()
