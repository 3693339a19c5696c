"""`quiver` command line: catalog commands here; batch and serving commands register from their modules.

User errors (QuiverError) print as one red line per problem and exit with code 2, never a traceback.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from quiver.catalog.errors import CatalogError, QuiverError
from quiver.catalog.ir import Catalog
from quiver.catalog.loader import load_catalog
from quiver.catalog.types import duration_label, is_identifier
from quiver.config import CONFIG_FILE, DEFAULT_CONFIG_TEXT, Config, load_config

app = typer.Typer(help="Quiver: define features once; backfill, stream and serve them.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False)
# Piped output (scripts, CI logs) gets Rich's 80 columns, which truncates names in tables: use a wide line
# there unless COLUMNS says otherwise.
_WIDTH = None if sys.stdout.isatty() or "COLUMNS" in os.environ else 200
console = Console(width=_WIDTH)
err_console = Console(stderr=True, width=_WIDTH)

ConfigOption = Annotated[Path | None, typer.Option("--config", help="quiver.yaml (default: ./quiver.yaml)")]
CatalogOption = Annotated[Path | None, typer.Option("--catalog", help="catalog directory (default: from config)")]
F = TypeVar("F", bound=Callable[..., Any])


def user_errors(func: F) -> F:
    """Turn QuiverError into red lines on stderr and exit code 2."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except CatalogError as exc:
            for problem in exc.problems:
                _error(str(problem))
            raise typer.Exit(2) from None
        except QuiverError as exc:
            _error(str(exc))
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


def _error(message: str) -> None:
    # User text ("[/x]" in a name) must not be read as Rich markup; one problem is one line.
    err_console.print(f"[red]error:[/red] {escape(' '.join(message.splitlines()))}", highlight=False,
                      soft_wrap=True)


def open_project(config_path: Path | None, catalog_dir: Path | None = None) -> tuple[Config, Catalog]:
    """Config and validated catalog for a command."""
    config = load_config(config_path)
    directory = catalog_dir or config.catalog_dir
    return config, load_catalog(directory, root=config.root)


def open_registry(config: Config) -> Any:
    from quiver.registry import Registry

    return Registry(config.registry, project=config.project)


@app.command()
@user_errors
def init(directory: Annotated[Path, typer.Argument(help="project directory")] = Path("."),
         project: Annotated[str, typer.Option(help="project name")] = "default") -> None:
    """Create quiver.yaml and an empty feature_defs/ in DIRECTORY."""
    if not is_identifier(project):
        raise QuiverError(f"project name {project!r} must be a plain identifier (letters, digits, _)")
    directory.mkdir(parents=True, exist_ok=True)
    config_file = directory / CONFIG_FILE
    if config_file.exists():
        raise QuiverError(f"{config_file} already exists")
    config_file.write_text(DEFAULT_CONFIG_TEXT.format(project=project))
    (directory / "feature_defs").mkdir(exist_ok=True)
    console.print(f"created {config_file} and {directory / 'feature_defs'}/ — add definitions, then `quiver apply`")


@app.command()
@user_errors
def plan(config: ConfigOption = None, catalog: CatalogOption = None) -> None:
    """Validate the catalog and show what `apply` would change, without writing."""
    cfg, cat = open_project(config, catalog)
    registry = open_registry(cfg)
    diff = registry.plan(cat)
    _print_diff(diff)
    if not diff.is_empty:
        current = registry.latest()
        console.print(f"`quiver apply` would store catalog version {(current[0] if current else 0) + 1} "
                      f"of project {cfg.project!r}", highlight=False)


@app.command()
@user_errors
def apply(config: ConfigOption = None, catalog: CatalogOption = None,
          author: Annotated[str | None, typer.Option(help="recorded with the version")] = None) -> None:
    """Validate the catalog and store it as a new registry version when it changed."""
    cfg, cat = open_project(config, catalog)
    result = open_registry(cfg).apply(cat, author=author)
    if result.created:
        _print_diff(result.diff)
        console.print(f"[green]applied[/green] catalog version {result.version} of project {cfg.project!r}")
    else:
        console.print(f"no changes; catalog version {result.version} is current")


@app.command("list")
@user_errors
def list_views(config: ConfigOption = None, catalog: CatalogOption = None) -> None:
    """List feature views and services of the catalog."""
    _, cat = open_project(config, catalog)
    table = Table("view", "entities", "source", "kind", "features", "ttl / tile", "owner")
    for view in sorted(cat.views.values(), key=lambda v: v.name):
        timing = _micros_label(view.ttl_us) if view.kind == "last" else f"tile {_micros_label(view.tile_us)}"
        table.add_row(view.name, ", ".join(view.entities), view.source, view.kind,
                      str(len(view.feature_names)), timing, view.owner)
    console.print(table)
    for service in cat.services.values():
        console.print(f"service [bold]{service.name}[/bold]: {len(service.features)} features")


@app.command()
@user_errors
def describe(view: Annotated[str, typer.Argument(help="feature view name")],
             config: ConfigOption = None, catalog: CatalogOption = None,
             as_json: Annotated[bool, typer.Option("--json", help="print the IR as JSON")] = False) -> None:
    """Show one feature view: keys, source, features with types and windows, where it is defined."""
    from quiver.catalog.ir import spec_to_dict

    _, cat = open_project(config, catalog)
    try:
        spec = cat.view(view)
    except KeyError as exc:
        raise QuiverError(str(exc.args[0])) from None
    if as_json:
        console.print_json(json.dumps(spec_to_dict(spec)))
        return
    console.print(f"[bold]{spec.name}[/bold]  ({spec.location})\n{spec.description}")
    console.print(f"entities: {', '.join(spec.entities)}   keys: "
                  + ", ".join(f"{k} {t}" for k, t in spec.keys) + f"   source: {spec.source}")
    table = Table("feature", "dtype", "definition")
    for f in spec.fields:
        table.add_row(f.name, f.dtype, f"last {f.column}, ttl {_micros_label(spec.ttl_us)}")
    for a in spec.aggregations:
        table.add_row(a.name, spec.feature_dtype(a.name),
                      f"{a.fn}({a.column}) over {_micros_label(a.window_us)}, tile {_micros_label(spec.tile_us)}")
    console.print(table)


@app.command()
@user_errors
def versions(config: ConfigOption = None) -> None:
    """List the catalog versions stored in the registry."""
    cfg = load_config(config)
    table = Table("version", "created", "author", "hash", "changes")
    for info in open_registry(cfg).versions():
        changes = ", ".join(f"{c['action'][0]}:{c['name']}" for c in info.diff) or "-"
        table.add_row(str(info.version), info.created_at.strftime("%Y-%m-%d %H:%M:%S"), info.author,
                      info.content_hash[:12], changes)
    console.print(table)


@app.command("demo-data")
@user_errors
def demo_data(out: Annotated[Path, typer.Option(help="output directory")] = Path("data"),
              days: int = 7, seed: int = 7, users: int = 2_000, transactions_per_day: int = 20_000,
              drift_from_day: Annotated[int | None, typer.Option(help="shift distributions from this day")] = None,
              late_fraction: float = 0.0, malformed_fraction: float = 0.0) -> None:
    """Write synthetic fraud-domain events and labels (Parquet) for N days."""
    from pipelines.demo_data import generate

    summary = generate(out, days=days, seed=seed, users=users, transactions_per_day=transactions_per_day,
                       drift_from_day=drift_from_day, late_fraction=late_fraction,
                       malformed_fraction=malformed_fraction)
    console.print(summary)


def _print_diff(diff: Any) -> None:
    if diff.is_empty:
        console.print("no changes")
        return
    colors = {"added": "green", "removed": "red", "changed": "yellow"}
    for change in diff.changes:
        console.print(f"[{colors[change.action]}]{escape(str(change))}[/]", highlight=False, soft_wrap=True)


def _micros_label(value: int | None) -> str:
    from datetime import timedelta

    return duration_label(timedelta(microseconds=value)) if value else "-"


def _register_optional_commands() -> None:
    # Batch, online and streaming commands live beside their code; absent modules simply add nothing.
    import importlib

    for module in ("quiver.offline.cli", "quiver.online.cli", "quiver.monitoring_cli", "quiver.offline.training_cli",
                   "quiver.streaming_cli"):
        try:
            importlib.import_module(module).register(app)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise


def main() -> None:
    """Console-script entry point."""
    _register_optional_commands()
    app(prog_name="quiver")


if __name__ == "__main__":
    main()
