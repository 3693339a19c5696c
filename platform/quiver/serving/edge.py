"""What both HTTP servers do at their edge, before a request reaches the store or a model.

- Strict JSON (`StrictJSONRoute`): a body must be RFC 8259 JSON in UTF-8. `NaN`, `Infinity`, numbers beyond
  float64 (`1e400`), lone UTF-16 surrogates (`"\\ud800"`) and invalid UTF-8 are a 422 saying what and where,
  never a value a model or the serving log has to cope with (Python's json module accepts all of them).
- Validation errors (`validation_failed`): 422 with, per problem, its location (`loc`, e.g. `["body", "rows",
  0, "at"]`), message and type, never the input itself: echoing it cost a 500 when it could not be encoded,
  and reflects whatever a client sent.
- Times: `quiver.serving.times` (one bounded range, `quiver.online.base.TIME_RANGE`).
- Per-client concurrency (`ClientLimit`): at most N requests of one client in flight on the data routes;
  the next gets 429 + Retry-After at once, so one heavy client cannot hold every worker. Big bodies go
  through the heavy lane (`HeavyLane`): one at a time, taking turns with the other clients' traffic.
- Offline docs (`create_fastapi`): /docs and /redoc load Swagger UI and ReDoc from files served by the server
  itself (the fastapi-offline package ships them), not from a CDN.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import re
import time
from collections.abc import Awaitable, Callable, Coroutine, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import pydantic
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_MAX_ERRORS = 20  # a 10,000-row body with one mistake per row need not answer 10,000 problems


# ----- strict JSON -----

def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON (RFC 8259 has no NaN or Infinity)")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"number {text[:40]} is beyond the float64 range")
    return value


def strict_loads(body: bytes) -> Any:
    """Parse `body` as RFC 8259 JSON in UTF-8; json.JSONDecodeError (with a position) for anything else."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise json.JSONDecodeError(f"body is not valid UTF-8 ({exc.reason})", body.decode("latin-1"),
                                   exc.start) from None
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except ValueError as exc:
        if isinstance(exc, json.JSONDecodeError):
            raise
        raise json.JSONDecodeError(str(exc), text, 0) from None
    escape = _SURROGATE_ESCAPE.search(text)
    if escape is not None:  # rare: check the parsed strings only when the text holds a surrogate escape
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise json.JSONDecodeError("a string holds a lone UTF-16 surrogate (\\ud800-\\udfff without its "
                                       "pair), which is not text", text, escape.start()) from None
    return value


# `json_bytes(payload)`: a JSON response body (UTF-8). msgspec (pinned in requirements/main.txt) encodes a
# response 4-5x faster than ujson and parses a request 4x faster than `strict_loads`, as strictly.
try:
    import msgspec

    _decode: Callable[[bytes], Any] = msgspec.json.Decoder().decode
    _FAST_ERRORS: tuple[type[Exception], ...] = (ValueError, RecursionError, msgspec.DecodeError)
    json_bytes: Callable[[Any], bytes] = msgspec.json.Encoder().encode
except ImportError:  # pragma: no cover - the stdlib is enough, only slower
    _decode = strict_loads
    _FAST_ERRORS = (ValueError, RecursionError)

    def json_bytes(payload: Any) -> bytes:
        return json.dumps(payload, separators=(",", ":")).encode()


def fast_loads(body: bytes) -> Any:
    """`strict_loads` for bodies it accepts, faster; anything either would refuse raises ValueError (the
    caller then lets `strict_loads` say why and where). msgspec refuses everything `strict_loads` refuses
    (NaN, ±Infinity, numbers beyond float64, lone surrogates, invalid UTF-8, trailing data): tests pin
    this."""
    try:
        return _decode(body)
    except _FAST_ERRORS as exc:
        raise ValueError(str(exc)) from None


class StrictJSONRequest(Request):
    """A Request whose `json()` is `strict_loads` (FastAPI turns its errors into 422 `json_invalid`)."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = strict_loads(await self.body())
        return self._json


class StrictJSONRoute(APIRoute):
    """An APIRoute that parses bodies with `strict_loads`."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict


def _safe(value: Any) -> Any:
    """A JSON-encodable, printable stand-in for one piece of an error (no surrogates, no NaN, no objects)."""
    if isinstance(value, bool | int) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    return str(value).encode("utf-8", "backslashreplace").decode("utf-8")[:200]


async def validation_failed(request: Request, exc: Exception) -> Response:
    """422 listing each problem's location, message and type (never the input)."""
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    detail = []
    for error in errors[:_MAX_ERRORS]:
        item: dict[str, Any] = {"loc": [_safe(part) for part in error.get("loc", ())],
                                "msg": _safe(error.get("msg", "")), "type": _safe(error.get("type", ""))}
        context = error.get("ctx")
        if context:
            item["ctx"] = {str(k): _safe(v) for k, v in context.items()}
        detail.append(item)
    if len(errors) > _MAX_ERRORS:
        detail.append({"loc": ["body"], "msg": f"… and {len(errors) - _MAX_ERRORS} more problems",
                       "type": "too_many_errors"})
    return JSONResponse({"detail": detail}, status_code=422)


# ----- per-client concurrency -----

@dataclass
class ClientCounts:
    """What a ClientLimit did: requests refused (429) since start, and requests in flight per client."""

    refused: int = 0
    in_flight: dict[str, int] = field(default_factory=dict)


class ClientLimit:
    """At most `per_client` requests of one client in flight on `paths`; the next gets 429 + Retry-After.

    The client is the peer address, or — behind a proxy that sets it — the value of `client_header` (e.g.
    X-Forwarded-For: use it only when the proxy overwrites what clients send). One event loop runs every
    call, so the counts need no lock."""

    def __init__(self, app: ASGIApp, per_client: int, paths: frozenset[str], client_header: str = "",
                 retry_after_s: int = 1, counts: ClientCounts | None = None, heavy_body_bytes: int = 0):
        if per_client < 1:
            raise ValueError("per_client must be at least 1")
        self.app = app
        self.heavy_body_bytes = heavy_body_bytes
        self.lane = HeavyLane() if heavy_body_bytes > 0 else None
        self.per_client = per_client
        self.paths = paths
        self.header = client_header.lower().encode()
        self.retry_after_s = retry_after_s
        self.counts = counts or ClientCounts()
        self.in_flight = self.counts.in_flight

    def _client(self, scope: Scope) -> str:
        return client_key(scope, self.header)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        client = self._client(scope)
        running = self.in_flight.get(client, 0)
        if running >= self.per_client:
            self.counts.refused += 1
            body = json.dumps({"detail": f"too many concurrent requests from this client (at most "
                                         f"{self.per_client} in flight); retry later"}).encode()
            await send({"type": "http.response.start", "status": 429,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode()),
                                    (b"retry-after", str(self.retry_after_s).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        self.in_flight[client] = running + 1
        try:
            if self.lane is None:
                await self.app(scope, receive, send)
                return
            self.lane.seen(client)
            size = _content_length(scope)
            if size is not None and size <= self.heavy_body_bytes:
                await self.app(scope, receive, send)
                return
            await self.lane.acquire(client, size if size is not None else self.heavy_body_bytes)
            try:
                await self.app(scope, receive, send)
            finally:
                self.lane.release(client)
        finally:
            left = self.in_flight[client] - 1
            if left:
                self.in_flight[client] = left
            else:
                del self.in_flight[client]


def _content_length(scope: Scope) -> int | None:
    """The request's Content-Length, or None (chunked, or not a number: treated as big)."""
    for name, value in scope.get("headers") or ():
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class HeavyLane:
    """Where requests with big bodies go: one at a time (the fairest client's next, as in FairSlots), and while
    other clients are active the lane rests after each request for as long as the request took, once per other
    client, so it holds at most its share of the server's time (1 / active clients).

    Parsing, reading features for and encoding a 1,000-row request all run on the event loop, between the
    small requests of everyone else: eight such requests back to back took the light clients to 0.10× their
    throughput (`benchmarks/fairness.py`). A client is active when a request of its began in the last
    `active_s`. `clock` is for tests."""

    def __init__(self, active_s: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self.slots = FairSlots(1, max_waiting=1 << 30)  # the per-client limit already bounds who waits here
        self.active_s = active_s
        self.clock = clock
        self.last_seen: dict[str, float] = {}
        self.resume_at = 0.0
        self.began = 0.0

    def seen(self, client: str) -> None:
        """A request of `client` began (small or big)."""
        now = self.clock()
        self.last_seen[client] = now
        if len(self.last_seen) > 10_000:  # forget clients long quiet
            self.last_seen = {c: t for c, t in self.last_seen.items() if now - t < self.active_s}

    def others_active(self, client: str) -> int:
        now = self.clock()
        return sum(1 for c, t in self.last_seen.items() if c != client and now - t < self.active_s)

    async def acquire(self, client: str, size: int) -> None:
        """Wait for the lane (and its rest, if any); charged `size` bytes to `client`."""
        await self.slots.acquire(client, size)
        try:
            pause = self.resume_at - self.clock()
            if pause > 0:
                await asyncio.sleep(pause)
        except BaseException:
            self.slots.release()
            raise
        self.began = self.clock()

    def release(self, client: str) -> None:
        ended = self.clock()
        others = self.others_active(client)
        self.resume_at = ended + (ended - self.began) * others if others else ended
        self.slots.release()


# ----- fair scoring slots -----

class Busy(Exception):
    """Too many calls wait for a slot; answer 503 with Retry-After."""


@dataclass
class _Waiter:
    client: str
    weight: int
    seq: int
    future: asyncio.Future[None]


class FairSlots:
    """At most `slots` scoring calls at once; when one ends, the waiting call whose client was served the
    fewest rows lately goes next (rows decay with a half-life of `half_life_s`). A client sending 1,000-row
    requests then waits behind the 1-row requests of others instead of ahead of them: each client gets its
    share of the CPU, measured in rows. At most `max_waiting` calls wait (then `Busy`). `fail_waiting(exc)`
    (thread-safe) ends every wait with `exc`, e.g. when the store is marked down, so a stall fails fast."""

    def __init__(self, slots: int, max_waiting: int = 256, half_life_s: float = 1.0):
        if slots < 1:
            raise ValueError("slots must be at least 1")
        self.slots = self.free = slots
        self.max_waiting = max_waiting
        self.half_life_s = half_life_s
        self.waiting: list[_Waiter] = []
        self.served: dict[str, tuple[float, float]] = {}  # client → (decayed rows, when)
        self._seq = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    def _load(self, client: str, now: float) -> float:
        rows, at = self.served.get(client, (0.0, now))
        return float(rows * 0.5 ** ((now - at) / self.half_life_s))

    def _charge(self, client: str, weight: int) -> None:
        now = time.monotonic()
        self.served[client] = (self._load(client, now) + weight, now)
        if len(self.served) > 10_000:  # forget clients long quiet
            self.served = {c: v for c, v in self.served.items() if self._load(c, now) > 1.0}

    async def acquire(self, client: str, weight: int) -> None:
        """Wait for a slot (charged `weight` rows to `client`)."""
        self._loop = asyncio.get_running_loop()
        if self.free > 0 and not self.waiting:
            self.free -= 1
            self._charge(client, weight)
            return
        if len(self.waiting) >= self.max_waiting:
            raise Busy("server busy: too many requests waiting to be scored")
        self._seq += 1
        waiter = _Waiter(client, weight, self._seq, self._loop.create_future())
        self.waiting.append(waiter)
        try:
            await waiter.future
        except asyncio.CancelledError:
            if waiter in self.waiting:
                self.waiting.remove(waiter)
            elif waiter.future.done() and not waiter.future.cancelled() and waiter.future.exception() is None:
                self.release()  # handed a slot just as it was cancelled: pass it on
            raise

    def release(self) -> None:
        """End a call: hand its slot to the fairest waiter."""
        self.free += 1
        now = time.monotonic()
        while self.free > 0 and self.waiting:
            pick = min(self.waiting, key=lambda w: (self._load(w.client, now), w.seq))
            self.waiting.remove(pick)
            if pick.future.done():
                continue
            self.free -= 1
            self._charge(pick.client, pick.weight)
            pick.future.set_result(None)

    def fail_waiting(self, exc: BaseException) -> None:
        """End every wait with `exc` (callable from any thread)."""
        def fail() -> None:
            waiting, self.waiting = self.waiting, []
            for waiter in waiting:
                if not waiter.future.done():
                    waiter.future.set_exception(exc)

        if self._loop is not None:
            self._loop.call_soon_threadsafe(fail)


def client_key(scope: Scope, header: bytes = b"") -> str:
    """Who sent a request: the value of `header` when given and present (behind a proxy), else the peer."""
    if header:
        for name, value in scope.get("headers") or ():
            if name == header:
                return "h:" + bytes(value).decode("latin-1").split(",")[0].strip()
    peer = scope.get("client")
    return str(peer[0]) if peer else ""


# ----- a lean route for the hot endpoint -----

def _is_json(content_type: bytes) -> bool:
    kind = content_type.split(b";")[0].strip().lower()
    return kind == b"application/json" or (kind.startswith(b"application/") and kind.endswith(b"+json"))


def _replay(body: bytes, receive: Receive) -> Receive:
    """A receive that gives `body` once, then whatever the connection says next (a disconnect)."""
    sent = False

    async def again() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return again


class LeanPost:
    """Serve the well-formed requests of one POST route without FastAPI's routing, dependency and response
    machinery (about 40 % of a small request's CPU on the feature server, by py-spy), and hand every other
    request to the FastAPI app, with its body replayed: other routes and methods, a missing or wrong API key,
    a content type that is not JSON, a body that is not strict JSON or does not validate. So every error
    answer is FastAPI's own, as are the OpenAPI schema and /docs; what the lean path answers itself is the
    handler's result (200) or an HTTPException it raises, rendered as FastAPI renders one.

    `handler(body, scope)` gets the validated `model` and returns the response's JSON bytes. Put this
    middleware innermost (add it first) so the body limit, per-client limit and metrics still apply."""

    def __init__(self, app: ASGIApp, path: str, model: type[pydantic.BaseModel],
                 handler: Callable[[Any, Scope], Awaitable[bytes]], api_key: str = ""):
        self.app = app
        self.path = path
        self.model = model
        self.handler = handler
        self.key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != self.path or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        content_type = given = None
        for name, value in scope.get("headers") or ():
            if name == b"content-type":
                content_type = value
            elif name == b"x-api-key":
                given = value
        chunks, more = [], True
        try:
            while more:
                message = await receive()
                if message["type"] != "http.request":
                    return  # the client went away: nobody to answer
                chunks.append(message.get("body", b""))
                more = message.get("more_body", False)
        except HTTPException as exc:  # the body limit, hit while the body arrived
            await self._error(exc, scope, receive, send)
            return
        body = b"".join(chunks)
        request = self._parsed(body, content_type, given)
        if request is None:
            await self.app(scope, _replay(body, receive), send)
            return
        try:
            payload = await self.handler(request, scope)
        except HTTPException as exc:
            await self._error(exc, scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(payload)).encode()),
                                (b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": payload})

    def _parsed(self, body: bytes, content_type: bytes | None, given: bytes | None) -> Any:
        if self.key and not (given and hmac.compare_digest(given, self.key)):
            return None
        if (content_type is not None and not _is_json(content_type)) or not body:
            return None
        try:
            return self.model.model_validate(fast_loads(body))
        except ValueError:  # bad JSON and pydantic.ValidationError: FastAPI's strict route says what and where
            return None

    @staticmethod
    async def _error(exc: HTTPException, scope: Scope, receive: Receive, send: Send) -> None:
        # As FastAPI's own handler renders an HTTPException.
        await JSONResponse({"detail": exc.detail}, exc.status_code, headers=exc.headers)(scope, receive, send)


# ----- the app -----

def create_fastapi(title: str, description: str) -> FastAPI:
    """A FastAPI app with strict JSON bodies, input-free 422s and docs served offline."""
    from fastapi_offline import FastAPIOffline

    app = FastAPIOffline(title=title, version="1", description=description)
    app.router.route_class = StrictJSONRoute
    app.add_exception_handler(RequestValidationError, validation_failed)
    return app


COMMON_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"description": "missing or wrong X-API-Key"},
    413: {"description": "body too large"},
    422: {"description": "malformed body: `detail` lists each problem's location and message"},
    429: {"description": "too many concurrent requests from this client (see Retry-After)"},
    503: {"description": "online store unavailable or server busy (see Retry-After)"},
}
