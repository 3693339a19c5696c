"""`quiver ui`: the read-only web console (registered on the main CLI by `register(app)`)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from quiver.cli.common import ConfigOption, console, user_errors


def register(app: typer.Typer) -> None:
    """Add `quiver ui` to the `quiver` CLI."""

    @app.command("ui")
    @user_errors
    def ui(host: Annotated[str, typer.Option(help="interface to bind (anything but loopback needs "
                                                  "QUIVER_API_KEY)")] = "127.0.0.1",
           port: Annotated[int, typer.Option(help="TCP port")] = 8090,
           log_level: Annotated[str, typer.Option(help="uvicorn log level")] = "warning",
           config: ConfigOption = None) -> None:
        """Serve the read-only web console: catalog, models, decisions, rollouts, drift and quality."""
        from quiver.ui.app import serve_console

        serve_console(str(config) if config else None, host, port, log_level=log_level,
                      say=lambda line: console.print(escape(line), highlight=False, soft_wrap=True))
