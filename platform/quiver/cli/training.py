"""`quiver training-set`: labels + features → a point-in-time correct training set in Parquet; or, with
`--from-logs`, the served requests of a window as serving saw them, with their labels (log and wait)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from quiver.catalog.errors import QuiverError
from quiver.catalog.ir import Catalog
from quiver.cli.common import (
    CatalogOption,
    ConfigOption,
    console,
    open_project,
    option_time,
    user_errors,
    with_cli_flags,
)
from quiver.config import Config

# The point-in-time join's errors name its Python arguments; on the command line they are these flags.
PYTHON_ARGUMENTS_AS_FLAGS = {"timestamp_column=…": "--timestamp-column NAME", "assume_utc=True": "--assume-utc",
                             "full_feature_names=True": "--full-feature-names", "overwrite=True": "--overwrite"}


def register(app: typer.Typer) -> None:
    """Add the `training-set` command to the `quiver` CLI."""

    @app.command("training-set")
    @user_errors
    def training_set(
        labels: Annotated[str | None, typer.Argument(help="labels Parquet file (a path or s3://…; with engine "
                                                           "spark also a folder or a glob): join keys, a "
                                                           "timestamp, anything else (not with --from-logs)")] = None,
        out: Annotated[str, typer.Option("--out", help="training set to write (Parquet, atomically): a path or "
                                                      "an object-store URI (s3://…); with engine spark a folder, "
                                                      "written by the executors")] = "",
        features: Annotated[str | None, typer.Option(help="comma-separated view:feature list")] = None,
        service: Annotated[str | None, typer.Option(help="a feature service instead of --features")] = None,
        engine: Annotated[str | None, typer.Option(help="duckdb or spark (default: from config)")] = None,
        timestamp_column: Annotated[str | None, typer.Option(help="label timestamp column (default: event_ts, "
                                                                  "else event_timestamp, else the only "
                                                                  "datetime column)")] = None,
        full_feature_names: Annotated[bool, typer.Option(help="name columns view__feature")] = False,
        assume_utc: Annotated[bool, typer.Option(help="read naive label timestamps as UTC")] = False,
        from_logs: Annotated[bool, typer.Option("--from-logs", help="the requests served in --start…--end as "
                                                                    "serving saw them, joined to the label store "
                                                                    "by request id; features the logs lack are "
                                                                    "backfilled")] = False,
        start: Annotated[str | None, typer.Option(help="with --from-logs: serving logs from this ISO time")] = None,
        end: Annotated[str | None, typer.Option(help="with --from-logs: serving logs until this ISO time "
                                                     "(exclusive)")] = None,
        model: Annotated[str | None, typer.Option(help="with --from-logs: only this model's served rows")] = None,
        labels_as_of: Annotated[str | None, typer.Option(help="with --from-logs: labels that had arrived by this "
                                                              "ISO time (default: all)")] = None,
        overwrite: Annotated[bool, typer.Option(help="with engine spark: replace the training set written "
                                                     "before in OUT")] = False,
        config: ConfigOption = None,
        catalog: CatalogOption = None,
    ) -> None:
        """Join every label row with its features as of the row's timestamp; write OUT. With --from-logs, the
        served requests of the window instead, with the values serving gave the model."""
        from quiver.offline.pit import get_historical_features, write_training_set

        if (features is None) == (service is None):
            raise QuiverError("give exactly one of --features view:feature,… or --service NAME")
        if not out:
            raise QuiverError("give --out PATH: where to write the training set")
        if from_logs == (labels is not None):
            raise QuiverError("give a labels file, or --from-logs --start … --end … (the label store), not both"
                              if from_logs else "give a labels file, or --from-logs --start … --end …")
        since, until = option_time(start, "--start"), option_time(end, "--end")
        if from_logs and (since is None or until is None):
            raise QuiverError("--from-logs needs --start and --end: the window of served requests")
        from quiver.offline.store import is_remote, open_store

        cfg, cat = open_project(config, catalog)
        wanted: str | list[str] = service or [f.strip() for f in (features or "").split(",") if f.strip()]
        if labels is not None and (engine or cfg.engine) == "spark":
            _on_the_executors(labels, wanted, out, cfg, cat, overwrite, full_feature_names, timestamp_column,
                              assume_utc)
            return
        if is_remote(out):
            open_store(out, Path.cwd())  # a bad scheme or missing credentials: before the join
        else:
            check_output_path(Path(out))  # before the join: a bad --out must not cost the whole run
        if from_logs and since is not None and until is not None:  # both checked above
            from quiver.monitoring.logged_features import get_logged_features

            built = get_logged_features(wanted, config=cfg, catalog=cat, start=since, end=until, model=model,
                                        labels_as_of=option_time(labels_as_of, "--labels-as-of"),
                                        timestamp_column=timestamp_column or "event_ts",
                                        full_feature_names=full_feature_names, engine=engine)
            frame = built.frame
            rows = built.rows
            console.print(f"{rows['kept']:,} labelled request(s) of {rows['logged']:,} logged rows "
                          f"({rows['unlabelled']:,} without a label yet, {rows['errored']:,} failed calls, "
                          f"{rows['duplicates']:,} repeats); as served: {', '.join(built.logged) or '-'}; "
                          f"backfilled: {', '.join(built.backfilled) or '-'}"
                          + "".join(f"; {k} backfilled on {n:,} rows" for k, n in built.mixed.items()),
                          highlight=False)
        elif labels is not None:
            try:
                frame = get_historical_features(labels if is_remote(labels) else Path(labels), wanted, catalog=cat,
                                                config=cfg, engine=engine or cfg.engine,
                                                full_feature_names=full_feature_names,
                                                timestamp_column=timestamp_column, assume_utc=assume_utc)
            except QuiverError as exc:
                raise with_cli_flags(exc, PYTHON_ARGUMENTS_AS_FLAGS) from None
        written = write_training_set(frame, out)
        console.print(f"wrote {written}: {len(frame):,} rows × {len(frame.columns)} columns")
        console.print(frame.head(5).to_string(max_cols=12), highlight=False, soft_wrap=True)


def _on_the_executors(labels: str, wanted: str | list[str], out: str, config: Config, catalog: Catalog,
                      overwrite: bool, full_feature_names: bool, timestamp_column: str | None,
                      assume_utc: bool) -> None:
    """Engine spark: the executors read LABELS (a file, folder, glob or URI), join, and write OUT as a Parquet
    folder committed by one manifest; the driver holds no row."""
    from quiver.offline.spark_training_sets import write_historical_features

    try:
        written = write_historical_features(labels, wanted, out, catalog=catalog, config=config, overwrite=overwrite,
                                            full_feature_names=full_feature_names,
                                            timestamp_column=timestamp_column, assume_utc=assume_utc)
    except QuiverError as exc:
        raise with_cli_flags(exc, PYTHON_ARGUMENTS_AS_FLAGS) from None
    console.print(f"wrote {written.uri}: {written.rows:,} rows in {written.files} file(s), committed by "
                  f"{written.manifest} (label_row gives the labels' order)", highlight=False)


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
