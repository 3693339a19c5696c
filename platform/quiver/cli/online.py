"""`quiver materialize` and `quiver serve`, registered on the main CLI by `register(app)`."""

from __future__ import annotations

from typing import Annotated

import typer

from quiver.cli.common import (
    CatalogOption,
    ConfigOption,
    ViewsOption,
    catalog_label,
    console,
    open_applied,
    split_names,
    user_errors,
)


def register(app: typer.Typer) -> None:
    """Add the online commands to `app`."""

    @app.command()
    @user_errors
    def materialize(
        end: Annotated[str | None, typer.Option(help="as-of time, ISO-8601 or epoch µs (default: now)")] = None,
        view: ViewsOption = None,
        full: Annotated[bool, typer.Option(help="ignore the previous run's watermark")] = False,
        config: ConfigOption = None, catalog: CatalogOption = None,
    ) -> None:
        """Copy feature values as of END from the offline store into the online store (incremental)."""
        from quiver.online.materialize import materialize as run

        cfg, applied = open_applied(config, catalog)
        console.print(catalog_label(applied, catalog), highlight=False)
        as_of = int(end) if end is not None and end.lstrip("-").isdigit() else end
        report = run(cfg, applied.catalog, end=as_of, views=split_names(view), full=full, progress=True)
        console.print(str(report), highlight=False)

    @app.command()
    @user_errors
    def serve(
        host: Annotated[str, typer.Option(help="interface to bind")] = "127.0.0.1",
        port: Annotated[int, typer.Option(help="TCP port")] = 8000,
        config: ConfigOption = None,
    ) -> None:
        """Run the HTTP feature server (API key from QUIVER_API_KEY; OpenAPI docs at /docs)."""
        from quiver.serving.server import serve as run

        console.print(f"serving features on http://{host}:{port} (docs at /docs)")
        run(str(config) if config else None, host=host, port=port)
