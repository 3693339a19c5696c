"""`quiver labels write | import | list`: delayed labels (what really happened to a served request) without
writing Python. Labels live under the offline root (`quiver.monitoring.labels`); bad rows are quarantined
with a reason and counted, never dropped."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from quiver.catalog.errors import QuiverError
from quiver.cli.common import ConfigOption, console, option_time, user_errors
from quiver.config import load_config
from quiver.offline.store import store_for


def _say(written: Any) -> None:
    console.print(f"wrote {written.written:,} labels" + (f"; quarantined {written.quarantined:,} ("
                  + ", ".join(f"{n} {why}" for why, n in written.reasons.items()) + ") under _quarantine/"
                  if written.quarantined else ""), highlight=False)


def _read(path: Path) -> Any:
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    if not path.exists():
        raise QuiverError(f"{path} does not exist")
    if path.suffix.lower() == ".csv":
        return pcsv.read_csv(path)
    if path.is_dir() or path.suffix.lower() in (".parquet", ".pq"):
        return pq.read_table(path)
    raise QuiverError(f"{path}: labels are read from Parquet (a file or folder) or CSV, not {path.suffix!r}")


def register(app: typer.Typer) -> None:
    """Add the `labels` command group to the `quiver` CLI."""
    labels_app = typer.Typer(help="Delayed labels of served requests (for shadow, canary and evaluation).",
                             no_args_is_help=True)
    app.add_typer(labels_app, name="labels")

    @labels_app.command("write")
    @user_errors
    def write_command(
        request_id: Annotated[list[str], typer.Option("--request-id", help="a served request's id (repeat for "
                                                                            "several)")],
        label: Annotated[list[str], typer.Option("--label", help="0 or 1, one per --request-id (or one for all)")],
        arrived_at: Annotated[str | None, typer.Option(help="when the label became known (ISO; default now)")] = None,
        config: ConfigOption = None,
    ) -> None:
        """Record the label of one or a few requests."""
        from quiver.monitoring.labels import write_labels

        if len(label) not in (1, len(request_id)):
            raise QuiverError(f"give one --label, or one per --request-id ({len(request_id)} ids, {len(label)} "
                              f"labels)")
        values = label * len(request_id) if len(label) == 1 else label
        cfg = load_config(config)
        _say(write_labels(store_for(cfg), request_id, [_label(v) for v in values], option_time(arrived_at, "--arrived-at")))

    @labels_app.command("import")
    @user_errors
    def import_command(
        path: Annotated[Path, typer.Argument(help="Parquet file or folder, or CSV, holding the labels")],
        request_id: Annotated[str, typer.Option("--request-id", help="column with the served request ids")]
        = "request_id",
        label: Annotated[str, typer.Option("--label", help="column with the 0/1 labels")] = "label",
        arrived_at: Annotated[str | None, typer.Option(
            help="column with each label's arrival time, or an ISO time for all (default: now)")] = None,
        config: ConfigOption = None,
    ) -> None:
        """Import labels from a table (e.g. the business's own outcome table)."""
        from quiver.monitoring.labels import write_labels

        table = _read(path)
        missing = [c for c in (request_id, label) if c not in table.column_names]
        if missing:
            raise QuiverError(f"{path} has no column {', '.join(map(repr, missing))} (columns: "
                              f"{', '.join(table.column_names)}); name them with --request-id / --label")
        when: Any = None
        if arrived_at is not None and arrived_at in table.column_names:
            when = [_aware(t) for t in table[arrived_at].to_pylist()]
            if any(t is None for t in when):
                raise QuiverError(f"{path}: column {arrived_at!r} has empty arrival times")
        else:
            when = option_time(arrived_at, "--arrived-at")
        cfg = load_config(config)
        _say(write_labels(store_for(cfg), table[request_id].to_pylist(), table[label].to_pylist(), when))

    @labels_app.command("list")
    @user_errors
    def list_command(
        as_of: Annotated[str | None, typer.Option("--as-of", help="labels known at this ISO time (default: all)")]
        = None,
        request_id: Annotated[list[str] | None, typer.Option("--request-id", help="only these requests")] = None,
        limit: Annotated[int, typer.Option(help="rows shown")] = 20,
        config: ConfigOption = None,
    ) -> None:
        """How many labels are known (one per request: the newest arrival), by arrival day, and some rows."""
        import pyarrow as pa
        import pyarrow.compute as pc

        from quiver.monitoring.labels import label_files, read_labels

        cfg = load_config(config)
        table = read_labels(store_for(cfg), option_time(as_of, "--as-of"))
        if request_id:
            table = table.filter(pc.is_in(table["request_id"], pa.array(request_id)))
        quarantined = len(label_files(store_for(cfg), quarantined=True))
        positives = int(pc.sum(table["label"]).as_py() or 0) if table.num_rows else 0
        console.print(f"{table.num_rows:,} labelled requests ({positives:,} positive)"
                      + (f" known at {as_of}" if as_of else "") + f"; {quarantined} quarantined file(s)",
                      highlight=False)
        if table.num_rows:
            days = pc.strftime(table["arrived_at"], format="%Y-%m-%d")
            counts = pc.value_counts(days).to_pylist()
            by_day = Table("arrival day", "labels")
            for item in sorted(counts, key=lambda c: c["values"]):
                by_day.add_row(item["values"], f"{item['counts']:,}")
            console.print(by_day)
        rows = Table("request_id", "label", "arrived at")
        for r in table.slice(0, limit).to_pylist():
            rows.add_row(r["request_id"], f"{r['label']:g}", f"{r['arrived_at']:%Y-%m-%d %H:%M:%S}")
        if table.num_rows:
            console.print(rows)


def _label(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return float("nan")  # quarantined by write_labels with its reason, not silently dropped


def _aware(value: Any) -> datetime | None:
    if value is None:
        return None
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
