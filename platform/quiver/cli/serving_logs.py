"""`quiver logs compact | hours`: the serving log under the store root, every replica's files. `compact` merges
closed hours into one file each (what the hourly canary DAG's `compact_serving_logs` task runs); `hours` lists
what a reader would read, per hour: files, replicas and whether it is compacted."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated

import typer
from rich.table import Table

from quiver.catalog.errors import QuiverError
from quiver.cli.common import ConfigOption, console, option_time, user_errors
from quiver.config import load_config
from quiver.offline.store import store_for


def _window(start: str | None, end: str | None, hours: float) -> tuple[datetime, datetime]:
    until = option_time(end, "--end") or datetime.now(UTC)
    since = option_time(start, "--start") or until - timedelta(hours=hours)
    if since >= until:
        raise QuiverError(f"--start {since.isoformat()} is not before --end {until.isoformat()}")
    return since, until


def register(app: typer.Typer) -> None:
    """Add the `logs` command group to the `quiver` CLI."""
    logs_app = typer.Typer(help="Serving logs of every replica under the store root.", no_args_is_help=True)
    app.add_typer(logs_app, name="logs")

    @logs_app.command("compact")
    @user_errors
    def compact_command(
        start: Annotated[str | None, typer.Option(help="first hour (ISO; default --hours before --end)")] = None,
        end: Annotated[str | None, typer.Option(help="end of the window (ISO; default now)")] = None,
        hours: Annotated[float, typer.Option(help="window length when --start is not given")] = 48.0,
        settle_minutes: Annotated[float, typer.Option(help="leave hours that ended less than this ago")] = 15.0,
        open_hours: Annotated[bool, typer.Option(help="compact the hours still being written too (their later "
                                                      "files are read beside the compacted one)")] = False,
        config: ConfigOption = None,
    ) -> None:
        """Merge each closed hour's files (every replica's) into one, atomically; idempotent."""
        from quiver.serving.logs.compact import compact

        if settle_minutes < 0:
            raise QuiverError(f"--settle-minutes must be >= 0, got {settle_minutes:g}")
        cfg = load_config(config)
        since, until = _window(start, end, hours)
        done = compact(store_for(cfg), since, until, settle=None if open_hours else timedelta(minutes=settle_minutes))
        for result in done:
            console.print(f"{result.hour}: {result.files_in} files → 1, {result.rows:,} rows "
                          f"({', '.join(f'{k} {v:,}' for k, v in sorted(result.replicas.items()))}) "
                          f"in {result.seconds:.2f} s", highlight=False)
        console.print(f"compacted {len(done)} hour(s) of {since:%Y-%m-%d %H:%M} → {until:%Y-%m-%d %H:%M} UTC",
                      highlight=False)

    @logs_app.command("hours")
    @user_errors
    def hours_command(
        start: Annotated[str | None, typer.Option(help="first hour (ISO; default --hours before --end)")] = None,
        end: Annotated[str | None, typer.Option(help="end of the window (ISO; default now)")] = None,
        hours: Annotated[float, typer.Option(help="window length when --start is not given")] = 24.0,
        config: ConfigOption = None,
    ) -> None:
        """Per hour: the files a reader reads, the replicas that wrote them, and whether it is compacted."""
        from quiver.serving.logs.read import LOG_DIR, MANIFEST, log_files, read_manifest

        cfg = load_config(config)
        store = store_for(cfg)
        since, until = _window(start, end, hours)
        by_hour: dict[str, list[str]] = {}
        for path in log_files(store, since, until):
            folder, _, name = path.rpartition("/")
            by_hour.setdefault(folder, []).append(name)
        table = Table("hour (UTC)", "files", "replicas", "compacted")
        for folder, names in by_hour.items():
            manifest = read_manifest(store, folder) if MANIFEST in store.children(folder) else None
            replicas = set(manifest["replicas"]) if manifest else set()
            replicas |= {n.split("-", 2)[2].rsplit("-", 1)[0] for n in names if n.startswith("part-")
                         and n.count("-") >= 3}
            table.add_row(folder.split(f"{LOG_DIR}/", 1)[-1], str(len(names)),
                          ", ".join(sorted(replicas)) or "?", f"{manifest['rows']:,} rows" if manifest else "no")
        console.print(table)
        if not by_hour:
            raise QuiverError(f"no serving logs between {since:%Y-%m-%d %H:%M} and {until:%Y-%m-%d %H:%M} UTC under "
                              f"{store.root}")
