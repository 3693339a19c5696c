"""The console's FastAPI app: GET pages only (read-only), the servers' API-key convention, reports served
from the project's reports folder.

Auth: with a key configured (QUIVER_API_KEY, or `api_key` in quiver.yaml) every page needs it — as the
servers' `X-API-Key` header, or as a cookie a browser gets from the /login form (HttpOnly, SameSite=Strict);
a missing or wrong key is a 401 with the login form. /health stays open. Without a key the console binds
only to loopback (`serve_console` refuses anything else).

Status: a page that names something the project lacks (an unknown model, decision, rollout) is a 404
(`NotFound`), and so is a path the console has no page for — an HTML page naming the console's pages, never
the framework's JSON; any other failure is a 500 with the traceback logged, never passed off as a missing page.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Form, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from quiver.catalog.errors import QuiverError
from quiver.config import Config
from quiver.ui import alert_pages, catalog_pages, consistency_pages, model_pages
from quiver.ui.data import Console, NotFound
from quiver.ui.html import NAV, esc, link, page

log = logging.getLogger(__name__)
COOKIE = "quiver_console_key"
_LOOPBACK = ("127.0.0.1", "localhost", "::1")
# A console page is self-contained: no script, and nothing may load from anywhere else.
_HEADERS = {"Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
                                       "form-action 'self'; frame-ancestors 'none'",
            "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"}
# Evidently's report runs its own inline script; it may still load nothing from elsewhere.
_REPORT_POLICY = ("default-src 'self' 'unsafe-inline' data: blob:; connect-src 'none'; form-action 'none'; "
                  "frame-ancestors 'none'")


def create_app(config: Config, api_key: str | None = None) -> FastAPI:
    """The console over `config`'s project. `api_key` defaults to QUIVER_API_KEY or the config's api_key."""
    key = api_key if api_key is not None else (os.environ.get("QUIVER_API_KEY") or config.api_key or "")
    console = Console(config)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        console.close()

    app = FastAPI(title="Quiver console", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.api_key_required = bool(key)
    app.state.console = console

    def allowed(request: Request) -> bool:
        if not key:
            return True
        given = request.headers.get("x-api-key") or request.cookies.get(COOKIE) or ""
        return bool(given) and hmac.compare_digest(given.encode(), key.encode())

    async def render(request: Request, build: Callable[[], str]) -> Response:
        if not allowed(request):
            return _login(401, "this console needs the API key")
        try:
            body = await run_in_threadpool(build)  # registry reads block: off the event loop
        except NotFound as exc:  # only a page's explicit "no such thing" is a 404
            return _html(page("Not found", f"<p>{esc(exc)}</p>", config.project), 404)
        except Exception:
            # Anything else is the console's own failure: a 500, and the traceback in the log (a KeyError
            # deep in page code must not pass for a missing page).
            log.exception("console page %s failed", request.url.path)
            return _html(page("Server error", "<p>this page failed to render; the console's log has the "
                                              "error</p>", config.project), 500)
        return _html(body)

    @app.get("/", response_class=HTMLResponse)
    async def home(request: Request) -> Response:
        return await render(request, lambda: model_pages.home(console))

    @app.get("/catalog", response_class=HTMLResponse)
    async def catalog(request: Request) -> Response:
        return await render(request, lambda: catalog_pages.catalog_page(console))

    @app.get("/models", response_class=HTMLResponse)
    async def models(request: Request) -> Response:
        return await render(request, lambda: model_pages.models_index(console))

    @app.get("/models/{name}", response_class=HTMLResponse)
    async def model(request: Request, name: str) -> Response:
        return await render(request, lambda: model_pages.model_page(console, name))

    @app.get("/decisions/{decision_id}", response_class=HTMLResponse)
    async def decision(request: Request, decision_id: int) -> Response:
        return await render(request, lambda: model_pages.decision_page(console, decision_id))

    @app.get("/rollouts", response_class=HTMLResponse)
    async def rollouts(request: Request) -> Response:
        return await render(request, lambda: model_pages.rollouts_index(console))

    @app.get("/rollouts/{rollout_id}", response_class=HTMLResponse)
    async def rollout(request: Request, rollout_id: int) -> Response:
        return await render(request, lambda: model_pages.rollout_page(console, rollout_id))

    @app.get("/drift", response_class=HTMLResponse)
    async def drift(request: Request) -> Response:
        return await render(request, lambda: catalog_pages.drift_page(console))

    @app.get("/alerts", response_class=HTMLResponse)
    async def alerts(request: Request) -> Response:
        return await render(request, lambda: alert_pages.alerts_page(console))

    @app.get("/alerts/{alert_id}", response_class=HTMLResponse)
    async def alert(request: Request, alert_id: int) -> Response:
        return await render(request, lambda: alert_pages.alert_page(console, alert_id))

    @app.get("/consistency", response_class=HTMLResponse)
    async def consistency(request: Request) -> Response:
        return await render(request, lambda: consistency_pages.consistency_page(console))

    @app.exception_handler(StarletteHTTPException)
    async def no_such_page(request: Request, exc: StarletteHTTPException) -> Response:
        # The framework's own answers (a path with no page, a wrong method) as a console page, not JSON.
        if not allowed(request):
            return _login(401, "this console needs the API key")
        if exc.status_code == 404:
            return _not_found(request.url.path)
        return _html(page(f"Error {exc.status_code}", f"<p>{esc(exc.detail)}</p>", config.project), exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def not_a_number(request: Request, _: RequestValidationError) -> Response:
        # /decisions/abc names no decision: a missing page, not a form error in JSON.
        if not allowed(request):
            return _login(401, "this console needs the API key")
        return _not_found(request.url.path)

    def _not_found(path: str) -> Response:
        pages = " · ".join(link(href, text) for href, text in NAV)
        return _html(page("Not found", f"<p>the console has no page {esc(path)}</p><p>its pages: {pages}</p>",
                          config.project), 404)

    @app.get("/reports/{name}")
    async def report(request: Request, name: str) -> Response:
        if not allowed(request):
            return _login(401, "this console needs the API key")
        path = _report_path(console.reports_dir, name)
        if path is None:
            return _html(page("Not found", f"<p>no report {esc(name)}</p>", config.project), 404)
        # Reports are the project's own pages (drift, evaluation); they embed their charts as data: URIs.
        return FileResponse(path, headers={**_HEADERS, "Content-Security-Policy": _REPORT_POLICY})

    @app.get("/login", response_class=HTMLResponse)
    async def login_form() -> Response:
        return _login(200, "")

    @app.post("/login")
    async def login(api_key: str = Form("")) -> Response:
        if key and not hmac.compare_digest(api_key.encode(), key.encode()):
            return _login(401, "wrong key")
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(COOKIE, api_key, httponly=True, samesite="strict")
        return response

    @app.get("/favicon.ico")
    async def favicon() -> Response:
        # Browsers ask for it on every site; "none" is an answer, not a 404 in their console.
        return Response(status_code=204)

    @app.get("/health")
    async def health() -> Response:
        return JSONResponse({"status": "ok", "project": config.project})

    return app


def _html(body: str, status: int = 200) -> Response:
    return HTMLResponse(body, status_code=status, headers=dict(_HEADERS))


def _login(status: int, problem: str) -> Response:
    form = ("<form method='post' action='/login'><label>API key <input type='password' name='api_key' "
            "autocomplete='current-password'></label> <button type='submit'>Open the console</button></form>"
            + (f"<p class='fail'>{esc(problem)}</p>" if problem else ""))
    return _html(page("Sign in", form), status)


def _report_path(directory: Path, name: str) -> Path | None:
    """A file directly in the reports folder (no path components, HTML or PNG only), or None."""
    if "/" in name or "\\" in name or name.startswith(".") or Path(name).suffix not in (".html", ".png"):
        return None
    path = directory / name
    return path if path.is_file() else None


def serve_console(config_path: str | None, host: str = "127.0.0.1", port: int = 8090, *,
                  api_key: str | None = None, log_level: str = "warning", say: Any = None) -> None:
    """Run the console with uvicorn until interrupted (the servers' connection limits)."""
    from quiver.config import load_config
    from quiver.serving.runtime import run_uvicorn

    config = load_config(Path(config_path) if config_path else None)
    app = create_app(config, api_key)
    if not app.state.api_key_required and host not in _LOOPBACK:
        raise QuiverError(f"refusing to serve the console on {host} without an API key: set QUIVER_API_KEY")
    if say is not None:
        say(f"Quiver console of project {config.project!r}: http://{host}:{port}/ (read-only"
            + ("; API key required" if app.state.api_key_required else "; loopback only, no API key") + ")")
    run_uvicorn(app, host, port, log_level)
