"""LeanPost: well-formed requests of its route are answered by the handler; everything else reaches the
wrapped app with the body it sent (so its error answers are the app's own)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from fastapi import HTTPException
from pydantic import BaseModel, ConfigDict

from quiver.serving.edge import LeanPost


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int


def run(body: bytes, *, path: str = "/hot", method: str = "POST", headers: list[tuple[bytes, bytes]] | None = None,
        handler: Any = None, chunks: int = 1) -> tuple[list[dict[str, Any]], list[bytes]]:
    """(messages sent, bodies the wrapped app received)."""
    reached: list[bytes] = []
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        message = await receive()
        reached.append(message["body"])
        await send({"type": "http.response.start", "status": 299, "headers": []})
        await send({"type": "http.response.body", "body": b"app"})

    async def answer(request: Body, scope: Any) -> bytes:
        return json.dumps({"twice": request.n * 2}).encode()

    size = max(1, -(-len(body) // chunks))
    parts = [body[i:i + size] for i in range(0, len(body), size)] or [b""]
    queue = [{"type": "http.request", "body": p, "more_body": i < len(parts) - 1} for i, p in enumerate(parts)]

    async def receive() -> dict[str, Any]:
        return queue.pop(0) if queue else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    lean = LeanPost(app, "/hot", Body, handler or answer, api_key="k")
    scope = {"type": "http", "path": path, "method": method,
             "headers": headers if headers is not None else [(b"x-api-key", b"k"), (b"content-type", b"application/json")]}
    asyncio.run(lean(scope, receive, send))
    return sent, reached


def test_a_well_formed_request_is_answered_by_the_handler_in_chunks_too() -> None:
    for chunks in (1, 3):
        sent, reached = run(b'{"n": 21}', chunks=chunks)
        assert reached == [] and sent[0]["status"] == 200 and json.loads(sent[1]["body"]) == {"twice": 42}
        assert (b"content-type", b"application/json") in sent[0]["headers"]


@pytest.mark.parametrize(("body", "kwargs"), [
    (b'{"n": 1}', {"headers": [(b"content-type", b"application/json")]}),  # no key
    (b'{"n": 1}', {"headers": [(b"x-api-key", b"wrong"), (b"content-type", b"application/json")]}),
    (b'{"n": 1}', {"headers": [(b"x-api-key", b"k"), (b"content-type", b"text/plain")]}),
    (b'{"n": NaN}', {}),  # not strict JSON
    (b'{"n": "one"}', {}),  # fails the model
    (b'{"n": 1, "m": 2}', {}),
    (b"", {}),
    (b'{"n": 1}', {"path": "/other"}),
    (b'{"n": 1}', {"method": "PUT"}),
])
def test_everything_else_reaches_the_app_with_its_body(body: bytes, kwargs: dict[str, Any]) -> None:
    sent, reached = run(body, **kwargs)
    assert reached == [body] and sent[0]["status"] == 299


def test_an_http_exception_of_the_handler_is_rendered_as_fastapi_renders_it() -> None:
    async def refuse(request: Body, scope: Any) -> bytes:
        raise HTTPException(503, "later", headers={"Retry-After": "1"})

    sent, reached = run(b'{"n": 1}', handler=refuse)
    assert reached == [] and sent[0]["status"] == 503
    assert (b"retry-after", b"1") in sent[0]["headers"] and json.loads(sent[1]["body"]) == {"detail": "later"}
