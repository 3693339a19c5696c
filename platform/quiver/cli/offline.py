"""Batch commands: `quiver compile` (print generated SQL) and `quiver backfill` (fill the offline store)."""

from __future__ import annotations

from datetime import date
from typing import Annotated

import typer
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.syntax import Syntax
from rich.table import Table

from quiver.catalog.errors import QuiverError
from quiver.cli.common import (
    CatalogOption,
    ConfigOption,
    ViewsOption,
    console,
    open_project,
    split_names,
    user_errors,
)


def register(app: typer.Typer) -> None:
    """Add `compile` and `backfill` to the `quiver` app."""

    @app.command("compile")
    @user_errors
    def compile_command(
        view: Annotated[str | None, typer.Argument(help="feature view (default: all)")] = None,
        target: Annotated[str, typer.Option(help="spark, duckdb or flink")] = "duckdb",
        kind: Annotated[str, typer.Option(help="main (tiles or last_values), quarantine, stats or all")] = "main",
        config: ConfigOption = None, catalog: CatalogOption = None,
        plain: Annotated[bool, typer.Option(help="no syntax highlighting")] = False,
    ) -> None:
        """Print the SQL of a view (or all) for TARGET; parameters start_us/end_us are epoch µs."""
        from quiver.compile import dialect_for
        from quiver.compile.sql import compile_view, main_kind

        if target == "flink":  # one streaming job for all streamed views (quiver.cli.streaming)
            from quiver.cli.streaming import print_flink_job

            return print_flink_job(config, catalog, view, plain)
        if target not in ("spark", "duckdb"):
            raise QuiverError(f"--target must be spark, duckdb or flink, got {target!r}")
        if kind not in ("main", "quarantine", "stats", "all"):
            raise QuiverError(f"--kind must be main, quarantine, stats or all, got {kind!r}")
        _, cat = open_project(config, catalog)
        names = [v.name for v in cat.select_views([view] if view else None)]
        for name in names:
            queries = compile_view(dialect_for(target), cat.views[name])
            wanted = {"main": [main_kind(cat.views[name])], "all": list(queries)}.get(kind, [kind])
            for query_kind in wanted:
                sql = queries[query_kind]
                if plain:
                    typer.echo(sql)
                else:
                    console.print(Syntax(sql, "sql", theme="ansi_dark", word_wrap=True))

    @app.command("backfill")
    @user_errors
    def backfill_command(
        start: Annotated[str, typer.Option(help="first day, YYYY-MM-DD (UTC)")],
        end: Annotated[str, typer.Option(help="last day, YYYY-MM-DD (inclusive)")],
        engine: Annotated[str | None, typer.Option(help="duckdb or spark (default: from config)")] = None,
        views: ViewsOption = None,
        config: ConfigOption = None, catalog: CatalogOption = None,
    ) -> None:
        """Compute tiles and last values for START..END and replace those dates in the offline store."""
        from quiver.offline.backfill import backfill

        cfg, cat = open_project(config, catalog)
        first, last = _day(start, "--start"), _day(end, "--end")
        selected = split_names(views)
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TimeElapsedColumn(), console=console, transient=True) as bar:
            task = bar.add_task("backfill", total=None)

            def step(done: int, total: int, what: str) -> None:
                bar.update(task, completed=done, total=total, description=what)

            report = backfill(cfg, cat, first, last, engine=engine or cfg.engine, views=selected, progress=step)
        table = Table("view", "kind", "events read", "null keys", "null time", "refused by contract",
                      "rows written", "dates",
                      title=f"backfill {first}..{last} with {report.engine} in {report.seconds:.1f} s")
        for item in report.views.values():
            table.add_row(item.view, item.kind, f"{item.events_read:,}", f"{item.quarantined_null_keys:,}",
                          f"{item.quarantined_null_ts:,}", refused_text(item.quarantined_by_check),
                          f"{item.rows_written:,}", str(len(item.rows_by_date)))
        console.print(table)
        from quiver.offline.store import store_for

        store = store_for(cfg)  # a URI root is shown as a URI, without its query (no secrets ever live there)
        console.print(f"offline store: {cfg.offline_dir if store.is_local else store.uri(store.base)}")


def refused_text(by_check: dict[str, int]) -> str:
    """Rows a contract refused, per check: "finite:amount 17, one_of:category 26" (or "0")."""
    return ", ".join(f"{reason} {n:,}" for reason, n in sorted(by_check.items())) or "0"


def _day(text: str, option: str) -> date:
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise QuiverError(f"{option} must be a date like 2024-01-31, got {text!r}") from None
