"""What a training run trains on: the label rows of its window with their features, built either from a
labels file (features point-in-time, `get_historical_features`) or from what serving saw (the serving logs
joined to the label store by request id, `get_logged_features`). Both give the same columns, so the rest of
`quiver.pipelines.training` does not know which it got.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from quiver.catalog.errors import QuiverError
from quiver.catalog.ir import Catalog
from quiver.config import Config

DEFAULT_LABELS = "data/labels/labels.parquet"


@dataclass(frozen=True)
class TrainingSet:
    """The training frame, the label rows it was built from (snapshotted beside the model: any worker can
    rebuild the split), and what was left out of the window and why."""

    frame: pd.DataFrame
    labels: pa.Table
    window_times: Any  # every label time of the window, arrived or not (the drift reference's days)
    origin: str  # where the labels came from, for lineage
    not_arrived: int = 0
    null_labels: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    features_from: dict[str, Any] = field(default_factory=dict)  # from logs: each feature's origin


ARRIVAL_COLUMNS = ("label_arrived_at", "arrived_at")  # when a label became known, first found wins


def arrival_column(table: pa.Table) -> str | None:
    """The labels' arrival-time column, if they have one."""
    return next((c for c in ARRIVAL_COLUMNS if c in table.column_names), None)


def known_by(table: pa.Table, cutoff: datetime) -> tuple[pa.Table, int]:
    """Label rows whose label had arrived by `cutoff` (knowledge time), and how many had not. Labels without
    an arrival column are all taken as known (there is no way to tell); `run_training` says so."""
    column = arrival_column(table)
    if column is None:
        return table, 0
    arrived = table[column].cast(pa.timestamp("us", "UTC"))
    known = pc.fill_null(pc.less_equal(arrived, pa.scalar(cutoff, pa.timestamp("us", "UTC"))), False)
    kept = table.filter(known)
    return kept, table.num_rows - kept.num_rows


def window_labels(labels: str | Path | pd.DataFrame | pa.Table, window_start: datetime, cutoff: datetime,
                  timestamp_column: str = "event_ts") -> pa.Table:
    """The label rows with `timestamp_column` in [window_start, cutoff), sorted by time."""
    import pyarrow.parquet as pq

    if isinstance(labels, str | Path):
        path = Path(labels)
        if not path.exists():
            raise QuiverError(f"labels file {path} does not exist")
        table = pq.read_table(path)
    else:
        table = labels if isinstance(labels, pa.Table) else pa.Table.from_pandas(labels, preserve_index=False)
    if timestamp_column not in table.column_names:
        raise QuiverError(f"labels lack the timestamp column {timestamp_column!r}; columns: "
                          f"{', '.join(table.column_names)}")
    ts = table[timestamp_column]
    utc = pa.timestamp("us", "UTC")
    keep = pc.and_(pc.greater_equal(ts, pa.scalar(window_start, utc)), pc.less(ts, pa.scalar(cutoff, utc)))
    window = table.filter(keep)
    return window.take(pc.sort_indices(window, sort_keys=[(timestamp_column, "ascending")]))


def refuse_by_request_contracts(catalog: Catalog, service: str, table: pa.Table) -> tuple[pa.Table, dict[str, int]]:
    """Label rows without those whose request fields fail their request source's contract (the rows
    `/predict` refuses), and how many each check refused (`<source>/<rule>:<column>`)."""
    from quiver.compile.contracts import counts, violations
    from quiver.serving.store import resolve

    plan = resolve(catalog, service)
    keep = np.ones(table.num_rows, dtype=bool)
    refused: dict[str, int] = {}
    for source, contract in plan.request_contracts:
        present = [c for c in contract.columns if c in table.column_names]
        if len(present) < len(contract.columns):
            continue  # the training set will say which request column the labels lack
        first = violations(table.select(present), contract, time.time_ns() // 1000)
        refused.update({f"{source}/{reason}": n for reason, n in counts(first[keep], contract).items()})
        keep &= first < 0
    return (table if keep.all() else table.filter(pa.array(keep))), refused


def _origin(labels: str | Path | pd.DataFrame, config: Config) -> str:
    """Where the labels came from, for lineage: a project-relative path, a file name, or "<DataFrame>"."""
    if isinstance(labels, pd.DataFrame):
        return "<DataFrame>"
    path = Path(os.path.abspath(labels))  # not resolve(): a symlinked data folder is still the project's
    try:
        return path.relative_to(config.root).as_posix()
    except ValueError:
        return f"<outside the project>/{path.name}"


def from_label_rows(config: Config, catalog: Catalog, service: str, labels: str | Path | pd.DataFrame | None,
                    start: datetime, end: datetime, label_column: str, timestamp_column: str, engine: str | None,
                    say: Callable[[str], None]) -> TrainingSet:
    """Label rows of [start, end) from a labels file, known by `end`, with point-in-time features."""
    from quiver.offline.pit import get_historical_features

    source = labels if labels is not None else config.root / DEFAULT_LABELS
    table = window_labels(source, start, end, timestamp_column)
    window_times = table[timestamp_column]
    table, unknown_yet = known_by(table, end)
    if arrival_column(table) is None:
        say("note: the labels carry no arrival time (label_arrived_at / arrived_at): every label of the window is "
            "taken as known by the cutoff")
    elif unknown_yet:
        say(f"left out {unknown_yet:,} label(s) of the window that had not arrived by the cutoff (knowledge time)")
    if table.num_rows == 0:
        raise QuiverError(f"no labels with {timestamp_column} in [{start:%Y-%m-%d %H:%M}, {end:%Y-%m-%d %H:%M}) "
                          f"UTC in {source if not isinstance(source, pd.DataFrame) else 'the frame'}")
    if label_column not in table.column_names:
        raise QuiverError(f"labels lack the label column {label_column!r}; columns: {', '.join(table.column_names)}")
    unlabelled = table[label_column].null_count
    if unlabelled:
        say(f"quarantined {unlabelled:,} label row(s) with a null {label_column!r} (not trained on)")
        table = table.filter(pc.is_valid(table[label_column]))
    table, refused = refuse_by_request_contracts(catalog, service, table)
    if refused:
        say(f"quarantined {sum(refused.values()):,} label row(s) whose request fields fail their contract "
            f"({', '.join(f'{r} {n:,}' for r, n in sorted(refused.items()))}): serving would refuse them too")
    frame = get_historical_features(table, service, catalog=catalog, config=config,
                                    engine=engine or config.engine, timestamp_column=timestamp_column)
    return TrainingSet(frame, table, window_times, _origin(source, config), unknown_yet, unlabelled, refused)


def from_serving_logs(config: Config, catalog: Catalog, service: str, start: datetime, end: datetime,
                      logs_of: str | None, label_column: str, timestamp_column: str, engine: str | None,
                      say: Callable[[str], None]) -> TrainingSet:
    """The requests served in [start, end) as serving saw them, with the labels that arrived by `end`, and the
    service's features the logs lack backfilled ("log and wait")."""
    from quiver.monitoring.logged_features import get_logged_features

    built = get_logged_features(service, config=config, catalog=catalog, start=start, end=end, model=logs_of,
                                labels_as_of=end, label_column=label_column, timestamp_column=timestamp_column,
                                engine=engine)
    rows = built.rows
    frame = built.frame.sort_values(timestamp_column, kind="stable").reset_index(drop=True)
    say(f"from the serving logs: {rows['kept']:,} labelled request(s) of {rows['logged']:,} logged rows "
        f"({rows['unlabelled']:,} without a label by the cutoff, {rows['errored']:,} failed calls, "
        f"{rows['duplicates']:,} repeats left out); features as served: {', '.join(built.logged) or '-'}; "
        f"backfilled: {', '.join(built.backfilled) or '-'}"
        + (f"; partly backfilled: {', '.join(f'{k} ({n:,} rows)' for k, n in built.mixed.items())}"
           if built.mixed else ""))
    labels = pa.Table.from_pandas(frame[list(built.label_columns)], preserve_index=False)
    window_times = built.served_at  # every request of the window, its label arrived or not
    return TrainingSet(frame, labels, window_times, f"serving_logs[{built.window[0]},{built.window[1]})",
                       rows["unlabelled"], 0, {}, built.lineage())

