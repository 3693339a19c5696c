"""The feature server's floor: a bare ASGI app (no framework) doing the same Redis round trip as
`quiver serve` and returning the same JSON. Started by `benchmarks/http_server.py` under uvicorn with the
feature server's own settings; configured by environment (FLOOR_REDIS_URL, FLOOR_PREFIX, FLOOR_DTYPE,
FLOOR_FEATURES), so that it imports nothing of Quiver's serving stack.

It does the least a correct answer needs: read and parse the body, build the entity keys, MGET them with
redis-py's asyncio client, decode the fixed-width records, and encode the values with one status per value
(with msgspec, the JSON library `quiver serve` uses).
No validation, no auth check beyond the header's presence, no metrics: what is left is HTTP, JSON and Redis.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import msgspec
import numpy as np
import redis.asyncio as aioredis

PREFIX = os.environ.get("FLOOR_PREFIX", "").encode()
DTYPE = np.dtype([tuple(f) for f in json.loads(os.environ.get("FLOOR_DTYPE", "[]"))])
FEATURES = json.loads(os.environ.get("FLOOR_FEATURES", "[]"))
_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode  # the JSON library the feature server uses: the floor is no slower
_client: Any = None


async def _reply(send: Any, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    global _client
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                _client = aioredis.Redis.from_url(os.environ["FLOOR_REDIS_URL"])
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await _client.aclose()
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["path"] == "/health":
        await _reply(send, 200, b'{"status":"ok"}')
        return
    body, more = b"", True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    request = _decode(body)
    users = request["entities"]["user_id"]
    raw = await _client.mget([PREFIX + b"%d}" % u for u in users])
    records = np.frombuffer(b"".join(raw), dtype=DTYPE)
    present = ["PRESENT"] * len(users)
    payload = {"at": time.time_ns() // 1000, "entities": {"user_id": users},
               "features": {name: records[f"f{i}"].tolist() for i, name in enumerate(FEATURES)},
               "status": {name: present for name in FEATURES}}
    await _reply(send, 200, _encode(payload))
