"""`quiver training-set`: labels + features → a point-in-time correct training set in Parquet."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from quiver.catalog.errors import QuiverError
from quiver.cli.common import CatalogOption, ConfigOption, console, open_project, user_errors


def register(app: typer.Typer) -> None:
    """Add the `training-set` command to the `quiver` CLI."""

    @app.command("training-set")
    @user_errors
    def training_set(
        labels: Annotated[str, typer.Argument(help="labels Parquet file (a path or s3://…): join keys, a "
                                                    "timestamp, anything else")],
        out: Annotated[str, typer.Option("--out", help="training set to write (Parquet, atomically): a path or "
                                                      "an object-store URI (s3://…)")],
        features: Annotated[str | None, typer.Option(help="comma-separated view:feature list")] = None,
        service: Annotated[str | None, typer.Option(help="a feature service instead of --features")] = None,
        engine: Annotated[str | None, typer.Option(help="duckdb or spark (default: from config)")] = None,
        timestamp_column: Annotated[str | None, typer.Option(help="label timestamp column (default: event_ts, "
                                                                  "else event_timestamp, else the only "
                                                                  "datetime column)")] = None,
        full_feature_names: Annotated[bool, typer.Option(help="name columns view__feature")] = False,
        assume_utc: Annotated[bool, typer.Option(help="read naive label timestamps as UTC")] = False,
        config: ConfigOption = None,
        catalog: CatalogOption = None,
    ) -> None:
        """Join every label row with its features as of the row's timestamp; write OUT."""
        from quiver.offline.pit import get_historical_features, write_training_set

        if (features is None) == (service is None):
            raise QuiverError("give exactly one of --features view:feature,… or --service NAME")
        from quiver.offline.store import is_remote, open_store

        if is_remote(out):
            open_store(out, Path.cwd())  # a bad scheme or missing credentials: before the join
        else:
            check_output_path(Path(out))  # before the join: a bad --out must not cost the whole run
        cfg, cat = open_project(config, catalog)
        wanted: str | list[str] = service or [f.strip() for f in (features or "").split(",") if f.strip()]
        frame = get_historical_features(labels if is_remote(labels) else Path(labels), wanted, catalog=cat, config=cfg, engine=engine or cfg.engine,
                                        full_feature_names=full_feature_names, timestamp_column=timestamp_column,
                                        assume_utc=assume_utc)
        written = write_training_set(frame, out)
        console.print(f"wrote {written}: {len(frame):,} rows × {len(frame.columns)} columns")
        console.print(frame.head(5).to_string(max_cols=12), highlight=False, soft_wrap=True)


def check_output_path(out: Path) -> None:
    """QuiverError unless `out` can be written as a file: not a directory, its folder creatable and writable."""
    if out.is_dir():
        raise QuiverError(f"--out {out} is a directory: give a file path, e.g. {out / 'training.parquet'}")
    parent = out.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise QuiverError(f"--out {out}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise QuiverError(f"--out {out}: cannot write in {parent}")
