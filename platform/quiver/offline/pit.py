"""Point-in-time joins: training sets from labelled rows and the offline store.

For each label row (join keys, timestamp t) every requested feature is its value *as of t* (docs/architecture.md, "As of t"):

* last-value features: the newest row of ``<offline>/<view>/last_values`` with ``t - ttl <= event_ts < t``,
  else null;
* windowed aggregates over ``[floor_g(t) - w, t)``: the whole tiles of ``<offline>/<view>/tiles`` with
  ``tile_start`` in ``[floor_g(t) - w, floor_g(t))``, merged with the raw "head" events of the view's source
  with ``event_ts`` in ``[floor_g(t), t)``, merged by ``catalog.aggregations.PARTIALS`` and finalized by
  ``compile.sql.FINALIZE`` (an empty window gives count 0 and sum 0, null otherwise).

The result keeps every label row — duplicates included — with all label columns, **in the input order and
with the input index**, and appends one column per feature. Label rows whose keys are null or unknown get
null features (0 for count and sum). Feature dtypes: float64 (NaN for null), nullable Int64 / boolean,
object for strings, datetime64[us, UTC]; count is plain int64. Times are compared in µs, the catalog's
resolution: finer label and event times are both floored to the microsecond, so no later event leaks in.

Engines: ``duckdb`` (default, embedded: vectorised numpy over pyarrow reads, finalized in DuckDB — see
pit_numpy for why) and ``spark`` (the same results from Spark window functions, for data beyond one machine).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from quiver.catalog.errors import QuiverError
from quiver.catalog.ir import Catalog, ViewSpec
from quiver.catalog.references import (  # FeatureRef, resolve_features: re-exported (older imports)
    FeatureRef,
    expand_on_demand,
    resolve_features,
)
from quiver.config import Config
from quiver.offline.pit_output import nullable_feature, on_demand_columns, to_pandas
from quiver.offline.pit_plan import LabelSet, plan_requests, timestamps_us
from quiver.offline.store import is_remote

LabelsInput: TypeAlias = pd.DataFrame | pa.Table | str | Path | Any  # Any: a Spark DataFrame (engine spark)
ENGINES = ("duckdb", "spark")
__all__ = ["ENGINES", "FeatureRef", "LabelsInput", "get_historical_features", "label_timestamp_column", "nullable_feature",
           "plan_requests", "prepare_labels", "read_labels", "resolve_features", "to_pandas", "write_training_set"]


def get_historical_features(labels: LabelsInput | None = None, features: str | Sequence[str] | None = None, *,
                            catalog: Catalog, config: Config, engine: str = "duckdb",
                            full_feature_names: bool = False, timestamp_column: str | None = None,
                            assume_utc: bool = False, entity_df: LabelsInput | None = None) -> pd.DataFrame:
    """Label rows with their features as of each row's timestamp (see the module docstring).

    `labels` (or Feast's name, `entity_df=`): a DataFrame, an Arrow table or a Parquet path (with engine spark
    also a folder, a glob or a Spark DataFrame, read by the executors; see `quiver.offline.spark_training_sets` for
    results that should not pass through this process either), with the join keys
    of every requested view and a timestamp column (timezone-aware; naive values are read as UTC only with
    `assume_utc=True`). `timestamp_column` names it; when omitted it is found as Feast does, plus Quiver's
    own name: ``event_ts``, else ``event_timestamp``, else the one datetime column (several: an error).
    `features`: ``["view:feature", …]`` or the name of a feature service. Columns are named by the feature,
    or ``view__feature`` with `full_feature_names`. `engine`: ``duckdb`` (embedded) or ``spark``.
    """
    if engine not in ENGINES:
        raise QuiverError(f"unknown engine {engine!r}; use one of {', '.join(ENGINES)}")
    if (labels is None) == (entity_df is None):
        raise QuiverError("give the label rows once: labels=… or (Feast's name) entity_df=…")
    if features is None:
        raise QuiverError("no features requested: pass features=['view:feature', …] or a feature service name")
    given = labels if labels is not None else entity_df
    if engine == "spark" and (isinstance(given, str | Path) or hasattr(given, "sparkSession")):
        from quiver.offline.spark_training_sets import (
            collect_historical_features,  # the executors read the labels
        )

        return collect_historical_features(given, features, catalog=catalog, config=config,
                                           full_feature_names=full_feature_names,
                                           timestamp_column=timestamp_column, assume_utc=assume_utc)
    frame = read_labels(given)  # type: ignore[arg-type]
    timestamp_column = timestamp_column or label_timestamp_column(frame)
    refs = resolve_features(catalog, features, full_feature_names)
    clashes = [r.column for r in refs if r.column in frame.columns]
    if clashes:
        raise QuiverError(f"feature column(s) {', '.join(map(repr, clashes))} clash with label columns; rename "
                          f"the label columns" + ("" if full_feature_names else " or pass full_feature_names=True"))
    expanded = expand_on_demand(catalog, refs)
    missing = [name for name in expanded.request_fields if name not in frame.columns]
    if missing:
        raise QuiverError(f"on-demand features need request field(s) {', '.join(map(repr, missing))}: the label "
                          f"rows must carry them as columns (what the request sent)")
    stored, refs_requested = expanded.stored, refs
    requests = plan_requests(catalog, config, stored)
    label_set = prepare_labels(frame, [r.view for r in requests], timestamp_column, assume_utc)
    if engine == "spark":
        from quiver.offline import pit_spark

        values = pit_spark.compute(label_set, requests, config)
    else:
        from quiver.offline import pit_numpy

        values = pit_numpy.compute(label_set, requests)
    columns: dict[str, Any] = {}
    for ref in stored:
        view = catalog.views[ref.view]
        columns[ref.column] = to_pandas(values[(ref.view, ref.feature)], view.feature_dtype(ref.feature),
                                        nullable=nullable_feature(view, ref.feature))
    if expanded.on_demand:
        columns.update(on_demand_columns(catalog, expanded, refs_requested, frame, columns, timestamp_column))
    return pd.concat([frame, pd.DataFrame({r.column: columns[r.column] for r in refs_requested},
                                          index=frame.index)], axis=1)


def read_labels(labels: LabelsInput) -> pd.DataFrame:
    """Labels as a DataFrame (a Parquet path or an Arrow table is read as is)."""
    if isinstance(labels, pd.DataFrame):
        return labels
    if isinstance(labels, pa.Table):
        return labels.to_pandas()
    if isinstance(labels, str) and is_remote(labels):
        from quiver.offline.store import open_store

        store = open_store(labels, Path.cwd())
        try:
            return pq.read_table(store.base, filesystem=store.fs).to_pandas()
        except (pa.ArrowInvalid, OSError) as exc:
            raise QuiverError(f"cannot read labels {store.uri(store.base)} as Parquet: {exc}") from None
    if isinstance(labels, str | Path):
        path = Path(labels)
        if not path.exists():
            raise QuiverError(f"labels file {path} does not exist")
        try:
            return pq.read_table(path).to_pandas()
        except (pa.ArrowInvalid, OSError) as exc:
            raise QuiverError(f"cannot read labels {path} as Parquet: {exc}") from None
    raise QuiverError(f"labels must be a pandas DataFrame, a pyarrow Table or a Parquet path, "
                      f"got {type(labels).__name__}")


def label_timestamp_column(frame: pd.DataFrame) -> str:
    """The label rows' time column when none is named: `event_ts`, else Feast's `event_timestamp`, else the
    only datetime column."""
    for name in ("event_ts", "event_timestamp"):
        if name in frame.columns:
            return name
    datetimes = [str(c) for c in frame.columns if pd.api.types.is_datetime64_any_dtype(frame[c].dtype)]
    if len(datetimes) == 1:
        return datetimes[0]
    if datetimes:
        raise QuiverError(f"cannot tell which label column is the time: no 'event_ts' or 'event_timestamp', and "
                          f"several datetime columns ({', '.join(datetimes)}); pass timestamp_column=…")
    return "event_ts"  # none at all: the label check names what is missing, with the other problems


def prepare_labels(frame: pd.DataFrame, views: list[ViewSpec], timestamp_column: str,
                   assume_utc: bool) -> LabelSet:
    """Check the label columns the views need and convert them: keys to Arrow, timestamps to epoch µs."""
    needed: dict[str, list[str]] = {}
    types: dict[str, str] = {}
    for view in views:
        for key, dtype in view.keys:
            needed.setdefault(key, []).append(view.name)
            types[key] = dtype
    missing = [k for k in needed if k not in frame.columns]
    problems = [f"join key {k!r} (needed by {', '.join(needed[k])})" for k in missing]
    if timestamp_column not in frame.columns:
        problems.append(f"timestamp column {timestamp_column!r} (choose another with timestamp_column=…)")
    if problems:
        raise QuiverError(f"labels lack {'; '.join(problems)}; label columns: {', '.join(map(str, frame.columns))}")
    keys = {key: _key_array(frame[key], key, types[key], needed[key]) for key in needed}
    return LabelSet(_label_times(frame[timestamp_column], timestamp_column, assume_utc), keys)


def _key_array(series: pd.Series, name: str, dtype: str, views: list[str]) -> pa.Array:
    checks = {"int64": pd.api.types.is_integer_dtype, "string": pd.api.types.is_string_dtype,
              "bool": pd.api.types.is_bool_dtype}
    ok = checks[dtype](series.dtype)
    if ok and dtype == "string" and series.dtype == object:
        ok = pd.api.types.infer_dtype(series, skipna=True) in ("string", "empty")
    if not ok:
        hint = f" (cast it, e.g. labels[{name!r}].astype('Int64'))" if dtype == "int64" else ""
        raise QuiverError(f"label column {name!r} must hold {dtype} join keys for {', '.join(views)}, "
                          f"got {series.dtype}{hint}")
    try:
        return pa.array(series, type={"int64": pa.int64(), "string": pa.string(), "bool": pa.bool_()}[dtype],
                        from_pandas=True)
    except (pa.ArrowInvalid, OverflowError) as exc:
        raise QuiverError(f"label column {name!r}: cannot use as {dtype} join keys: {exc}") from None


def _label_times(series: pd.Series, name: str, assume_utc: bool) -> np.ndarray:
    try:
        array = pa.array(series, from_pandas=True)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        array = None
    if array is None or not pa.types.is_timestamp(array.type):
        raise QuiverError(f"label column {name!r} must hold timestamps (timezone-aware datetime64), "
                          f"got {series.dtype}")
    if array.type.tz is None and not assume_utc:
        raise QuiverError(f"label column {name!r} holds timezone-naive timestamps; make them aware "
                          f"(e.g. labels[{name!r}].dt.tz_localize('UTC')) or pass assume_utc=True to read "
                          f"them as UTC")
    # Floored to the µs like source times (one rule): floor(e) < floor(t) implies e < t, so no event
    # after t can leak in; events in t's own microsecond are left out, as an event at t is.
    values, nulls = timestamps_us(array)
    if nulls is not None:
        rows = np.flatnonzero(nulls)
        raise QuiverError(f"label column {name!r} has {len(rows)} null timestamp(s) (rows "
                          f"{', '.join(map(str, rows[:5]))}{', …' if len(rows) > 5 else ''}); drop or fill them")
    return values


def write_training_set(frame: pd.DataFrame, path: str | Path) -> Path | str:
    """Write `frame` as Parquet atomically: a temp file beside `path`, then one rename; to an object-store URI
    (s3://…) as one upload, which becomes visible whole or not at all."""
    if isinstance(path, str) and is_remote(path):
        from quiver.offline.store import open_store

        store = open_store(path, Path.cwd())
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), store.base, filesystem=store.fs)
        return store.uri(store.base)
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    staged = target.with_name(f".tmp-{target.name}-{uuid.uuid4().hex[:8]}")
    try:
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), staged)
        os.replace(staged, target)
    finally:
        staged.unlink(missing_ok=True)
    return target
