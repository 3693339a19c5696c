"""Training sets beyond the driver: labels read where they live, the join and its finalize on the executors,
the result kept in Spark or written by the executors to a folder or an object store.

`spark_historical_features` is `get_historical_features` on Spark without a collect: the label rows come from
Parquet files (a file, a folder, a glob, ``s3://…``) or a Spark DataFrame, and the answer is a lazy Spark
DataFrame — the label columns, a `label_row` id, one column per feature. `write_historical_features` writes
that frame from the executors and commits it with one manifest (`_manifest.json`, one PUT): a reader that
goes through the manifest (`read_training_set`) sees the whole set or none of it.

Order: a Spark result has no physical order. `label_row` increases with the labels' order as read (files in
name order, rows in file order) and is unique, but not contiguous; sort by it to get the labels' order back.
Duplicate label rows keep one result row each, as in the embedded engine.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from quiver.catalog.errors import QuiverError
from quiver.catalog.ir import Catalog, ViewSpec
from quiver.catalog.locations import is_remote
from quiver.catalog.references import expand_on_demand, resolve_features
from quiver.config import Config
from quiver.offline.store import MANIFEST, OfflineStore, open_store

ROW_ID = "label_row"
_ROW, _T = "_q_row", "_q_t"
_KEY_TYPES = {"int64": ("ByteType", "ShortType", "IntegerType", "LongType"), "string": ("StringType",),
              "bool": ("BooleanType",)}
_SPARK_KEY = {"int64": "long", "string": "string", "bool": "boolean"}


@dataclass(frozen=True)
class WrittenTrainingSet:
    """A committed training set: where it is, its rows and files, and its manifest's path."""

    uri: str
    rows: int
    files: int
    manifest: str


def spark_historical_features(labels: Any, features: str | Sequence[str], *, catalog: Catalog, config: Config,
                              full_feature_names: bool = False, timestamp_column: str | None = None,
                              assume_utc: bool = False, row_id: str = ROW_ID, spark: Any = None) -> Any:
    """Label rows with their features as of each row's timestamp, as a lazy Spark DataFrame (nothing collected).

    `labels`: Parquet on disk or an object store (a file, a folder, a glob such as ``s3://b/labels/*.parquet``),
    a Spark DataFrame, or a pandas / Arrow table (sent from the driver). The rules are
    `get_historical_features`'s (the as-of join, timestamp column, `assume_utc`, `full_feature_names`);
    `row_id` names the label-order column (see the module docstring).
    """
    from quiver.offline import pit_spark
    from quiver.offline.pit_plan import plan_requests

    refs = resolve_features(catalog, features, full_feature_names)
    expanded = expand_on_demand(catalog, refs)
    requests = plan_requests(catalog, config, expanded.stored)
    spark = spark or pit_spark.session(config, requests)
    frame = _label_frame(spark, labels, config)
    timestamp_column = timestamp_column or _timestamp_column(frame)
    views = [r.view for r in requests]
    _check_columns(frame, views, timestamp_column, [r.column for r in refs], row_id, list(expanded.request_fields))
    label_frame = _with_row_and_time(frame, views, timestamp_column, assume_utc)
    bounds = _bounds(label_frame, timestamp_column)
    result, wanted = pit_spark.feature_frame(spark, label_frame, bounds, requests)
    column_of = {(f.view, f.feature): f.column for f in wanted}
    from pyspark.sql import functions as F

    result = result.select(*[F.col(c) for c in frame.columns], *([F.col(_ROW).alias(row_id)] if row_id else []),
                           *[F.col(column_of[(r.view, r.feature)]).alias(r.column) for r in expanded.stored])
    if expanded.on_demand:  # computed on the executors by the embedded path's own code, batch by batch
        outputs = [r for r in refs if r.view in expanded.on_demand]
        schema = _with_fields(result.schema, [(r.column, catalog.on_demand[r.view].feature_dtype(r.feature))
                                              for r in outputs])
        result = result.mapInArrow(_OnDemand(catalog, expanded, refs, timestamp_column), schema)
    return result.select(*frame.columns, *([row_id] if row_id else []), *[r.column for r in refs])


class _OnDemand:
    """Runs on the executors: label rows with their stored features in, the on-demand features appended
    (`pit_output.on_demand_columns`: the same function, input and output typing as every other path)."""

    def __init__(self, catalog: Catalog, expanded: Any, refs: list[Any], timestamp_column: str):
        self.catalog, self.expanded, self.refs, self.timestamp_column = catalog, expanded, refs, timestamp_column

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from quiver.offline.layout import arrow_type
        from quiver.offline.pit_output import nullable_feature, on_demand_columns, to_pandas

        for batch in batches:
            frame = batch.to_pandas()
            columns = {}
            for ref in self.expanded.stored:
                view = self.catalog.views[ref.view]
                columns[ref.column] = to_pandas(batch.column(ref.column), view.feature_dtype(ref.feature),
                                                nullable=nullable_feature(view, ref.feature))
            computed = on_demand_columns(self.catalog, self.expanded, self.refs, frame, columns, self.timestamp_column)
            arrays, names = list(batch.columns), list(batch.schema.names)
            for ref in self.refs:
                if ref.view in self.expanded.on_demand:
                    kind = arrow_type(self.catalog.on_demand[ref.view].feature_dtype(ref.feature))
                    arrays.append(pa.array(computed[ref.column], type=kind, from_pandas=True))
                    names.append(ref.column)
            yield pa.RecordBatch.from_arrays(arrays, names=names)


def _with_fields(schema: Any, added: list[tuple[str, str]]) -> Any:
    from pyspark.sql.types import StructField, StructType

    from quiver.offline.layout import arrow_type
    from quiver.offline.pit_spark import spark_data_type

    return StructType([*schema.fields, *[StructField(name, spark_data_type(arrow_type(dtype)), True)
                                         for name, dtype in added]])


def collect_historical_features(labels: Any, features: str | Sequence[str], *, catalog: Catalog, config: Config,
                                full_feature_names: bool = False, timestamp_column: str | None = None,
                                assume_utc: bool = False) -> pd.DataFrame:
    """`spark_historical_features` collected as `get_historical_features` returns it: pandas, in the labels'
    order with a fresh index, features in the documented dtypes (labels read by the executors)."""
    from quiver.offline.pit_output import nullable_feature, to_pandas

    refs = resolve_features(catalog, features, full_feature_names)
    frame = spark_historical_features(labels, features, catalog=catalog, config=config,
                                      full_feature_names=full_feature_names, timestamp_column=timestamp_column,
                                      assume_utc=assume_utc, row_id=_ROW)
    table = frame.toArrow()
    table = table.take(pc.sort_indices(table[_ROW])).drop_columns([_ROW])
    named = {r.column for r in refs}
    out = table.select([c for c in table.column_names if c not in named]).to_pandas()
    for ref in refs:
        column = table[ref.column].combine_chunks()
        if ref.view in catalog.views:
            view = catalog.views[ref.view]
            out[ref.column] = to_pandas(column, view.feature_dtype(ref.feature), nullable_feature(view, ref.feature))
        else:  # on-demand outputs keep nullable dtypes, as get_historical_features gives them
            out[ref.column] = to_pandas(column, catalog.on_demand[ref.view].feature_dtype(ref.feature))
    return out


def write_historical_features(labels: Any, features: str | Sequence[str], out: str | Path, *, catalog: Catalog,
                              config: Config, overwrite: bool = False, full_feature_names: bool = False,
                              timestamp_column: str | None = None, assume_utc: bool = False,
                              row_id: str = ROW_ID, spark: Any = None) -> WrittenTrainingSet:
    """Join on Spark and write the training set from the executors to the folder or URI `out` (Parquet, one
    file per Spark partition of the result), committed by one manifest; the driver never holds a row.

    `out` must be new or empty, or (with `overwrite`) a training set written before, which is replaced whole.
    """
    store = _output(out, config, overwrite)
    frame = spark_historical_features(labels, features, catalog=catalog, config=config,
                                      full_feature_names=full_feature_names, timestamp_column=timestamp_column,
                                      assume_utc=assume_utc, row_id=row_id, spark=spark)
    if not store.is_local:
        from quiver.offline.engines import set_hadoop, spark_store_conf

        set_hadoop(frame.sparkSession, spark_store_conf(store))
    run = uuid.uuid4().hex[:12]
    stage = store.path(f".staging-{run}")
    frame.write.mode("errorifexists").parquet(store.uri(stage, spark=True) if not store.is_local
                                              else "file://" + stage)
    staged = [p for p in store.files_under(stage) if p.endswith(".parquet")
              and not p.rsplit("/", 1)[-1].startswith((".", "_"))]
    rows = sum(_rows(store, p) for p in staged)
    store.commit(store.base, staged, rows)  # files moved under run-unique names, then the manifest: one PUT
    store.delete_tree(stage)
    return WrittenTrainingSet(store.root, rows, len(staged), store.uri(store.path(MANIFEST)))


def read_training_set(where: str | Path, columns: Sequence[str] | None = None) -> pa.Table:
    """A committed training set (`write_historical_features`) as Arrow, through its manifest: a set being
    written or replaced is read whole, old or new."""
    store = open_store(str(where), Path.cwd())
    manifest = store.read_manifest(store.base)
    if manifest is None:
        raise QuiverError(f"{store.uri(store.base)} holds no committed training set (no {MANIFEST})")
    paths = [store.path(name) for name in manifest["files"]]
    tables = [pq.read_table(p, filesystem=store.fs, columns=list(columns) if columns else None) for p in paths]
    return pa.concat_tables(tables) if tables else pa.table({})


def training_set_files(where: str | Path) -> list[str]:
    """The data files of a committed training set as an engine opens them (for `spark.read.parquet(*files)`)."""
    store = open_store(str(where), Path.cwd())
    manifest = store.read_manifest(store.base)
    if manifest is None:
        raise QuiverError(f"{store.uri(store.base)} holds no committed training set (no {MANIFEST})")
    return [store.uri(store.path(name), spark=True) if not store.is_local else "file://" + store.path(name)
            for name in manifest["files"]]


# ---- labels ------------------------------------------------------------------------------------------------


def _label_frame(spark: Any, labels: Any, config: Config) -> Any:
    """The label rows as a Spark DataFrame: read by the executors from files, or taken as given."""
    if hasattr(labels, "sparkSession") and hasattr(labels, "schema"):  # a pyspark DataFrame (classic or Connect)
        return labels
    if isinstance(labels, pa.Table):
        return spark.createDataFrame(labels)
    if isinstance(labels, str | Path):
        text = str(labels)
        if is_remote(text):
            from quiver.catalog.locations import open_location
            from quiver.offline.engines import set_hadoop, spark_store_conf

            where = open_location(text, config.root, "labels")
            set_hadoop(spark, spark_store_conf(where))
            uri = where.uri(where.base, spark=True)
        else:
            path = Path(text) if Path(text).is_absolute() else Path.cwd() / text
            if not any(c in text for c in "*?[") and not path.exists():
                raise QuiverError(f"labels {path} do not exist")
            uri = "file://" + str(path)
        try:
            return spark.read.parquet(uri)
        except Exception as exc:  # Spark's AnalysisException: no files, not Parquet
            raise QuiverError(f"cannot read labels {uri} as Parquet: {str(exc).splitlines()[0]}") from None
    import pandas as pd

    if isinstance(labels, pd.DataFrame):
        return spark.createDataFrame(labels)
    raise QuiverError(f"labels must be Parquet (a path, a folder, a glob or a URI), a Spark DataFrame, or a "
                      f"pandas / Arrow table, got {type(labels).__name__}")


def _timestamp_column(frame: Any) -> str:
    """As `pit.label_timestamp_column`: `event_ts`, else `event_timestamp`, else the one timestamp column."""
    for name in ("event_ts", "event_timestamp"):
        if name in frame.columns:
            return name
    times = [f.name for f in frame.schema.fields if type(f.dataType).__name__ in ("TimestampType", "TimestampNTZType")]
    if len(times) > 1:
        raise QuiverError(f"cannot tell which label column is the time: no 'event_ts' or 'event_timestamp', and "
                          f"several timestamp columns ({', '.join(times)}); pass timestamp_column=…")
    return times[0] if times else "event_ts"


def _check_columns(frame: Any, views: list[ViewSpec], timestamp_column: str, feature_columns: list[str],
                   row_id: str, request_fields: list[str]) -> None:
    """Every problem with the label columns, named in one error: missing keys or time, wrong types, clashes."""
    types = {f.name: type(f.dataType).__name__ for f in frame.schema.fields}
    problems, needed = [], _needed_keys(views)
    for key, (dtype, users) in needed.items():
        if key not in types:
            problems.append(f"lacks join key {key!r} (needed by {', '.join(users)})")
        elif types[key] not in _KEY_TYPES[dtype]:
            problems.append(f"column {key!r} must hold {dtype} join keys for {', '.join(users)}, got "
                            f"{types[key].removesuffix('Type').lower()}")
    if timestamp_column not in types:
        problems.append(f"lacks timestamp column {timestamp_column!r} (choose another with timestamp_column=…)")
    elif types[timestamp_column] not in ("TimestampType", "TimestampNTZType"):
        problems.append(f"column {timestamp_column!r} must hold timestamps, got "
                        f"{types[timestamp_column].removesuffix('Type').lower()}")
    missing = [f for f in request_fields if f not in types]
    if missing:
        problems.append(f"lacks request field(s) {', '.join(map(repr, missing))} that on-demand features need "
                        f"(what the request sent)")
    clashes = [c for c in [*feature_columns, row_id] if c and c in types]
    if clashes:
        problems.append(f"column(s) {', '.join(map(repr, clashes))} clash with the result's columns (rename them, "
                        f"or pass full_feature_names=True / another row_id=…)")
    reserved = [c for c in types if c.startswith("_q_")]
    if reserved:
        problems.append(f"column(s) {', '.join(reserved)} use the _q_ prefix Quiver keeps for its own columns")
    if problems:
        raise QuiverError(f"labels: {'; '.join(problems)}; label columns: {', '.join(frame.columns)}")


def _needed_keys(views: list[ViewSpec]) -> dict[str, tuple[str, list[str]]]:
    needed: dict[str, tuple[str, list[str]]] = {}
    for view in views:
        for key, dtype in view.keys:
            needed.setdefault(key, (dtype, []))[1].append(view.name)
    return needed


def _with_row_and_time(frame: Any, views: list[ViewSpec], timestamp_column: str, assume_utc: bool) -> Any:
    """The label rows with their row id and time in epoch µs, join keys in the catalog's types."""
    from pyspark.sql import functions as F

    kind = type(frame.schema[timestamp_column].dataType).__name__
    if kind == "TimestampNTZType" and not assume_utc:
        raise QuiverError(f"label column {timestamp_column!r} holds timezone-naive timestamps; store them as "
                          f"instants (TIMESTAMP, isAdjustedToUTC) or pass assume_utc=True to read them as UTC")
    # The session's time zone is UTC (quiver.offline.engines), so a naive time cast to an instant reads as UTC.
    labelled = frame.withColumn(_ROW, _row_ids(frame)).withColumn(
        _T, F.unix_micros(F.col(timestamp_column).cast("timestamp")))
    for key, (dtype, _) in _needed_keys(views).items():
        labelled = labelled.withColumn(key, F.col(key).cast(_SPARK_KEY[dtype]))
    return labelled


def _row_ids(frame: Any) -> Any:
    """Label row ids in the labels' order: for files, (the file's rank by name) · 2^40 + the row's index in its
    file — Spark packs files into tasks by size, so a scan's own order is not the files' — the same on every
    recomputation; for a frame built otherwise, Spark's increasing id (its partitions' order)."""
    from pyspark.sql import functions as F

    try:
        files = sorted(frame.inputFiles())
        frame.select("_metadata.file_path", "_metadata.row_index").schema  # noqa: B018 (Parquet scans only)
    except Exception:  # not a file scan, or a source without row indices
        return F.monotonically_increasing_id()
    if not files:
        return F.monotonically_increasing_id()
    # inputFiles says file:///x where the scan's metadata says file:/x: both compared in the short form.
    rank = F.create_map(*[F.lit(x) for i, path in enumerate(files) for x in (re.sub("^file:/+", "file:/", path), i)])
    path = F.regexp_replace(F.col("_metadata.file_path"), "^file:/+", "file:/")
    ids = rank[path].cast("long") * F.lit(1 << 40) + F.col("_metadata.row_index")
    return F.when(ids.isNull(), F.raise_error(F.concat(F.lit("label file not in the scan's listing: "), path))) \
        .otherwise(ids)


def _bounds(label_frame: Any, timestamp_column: str) -> Any:
    """The labels' first and last time (one small job); an error naming null timestamps."""
    from pyspark.sql import functions as F

    from quiver.offline.pit_spark import Bounds

    row = label_frame.agg(F.min(_T).alias("lo"), F.max(_T).alias("hi"),
                          F.sum(F.col(_T).isNull().cast("long")).alias("nulls")).collect()[0]
    if row["nulls"]:
        raise QuiverError(f"label column {timestamp_column!r} has {row['nulls']:,} null timestamp(s); drop or "
                          f"fill them")
    return Bounds(int(row["lo"]), int(row["hi"])) if row["lo"] is not None else Bounds(0, 1)


# ---- output ------------------------------------------------------------------------------------------------


def _output(out: str | Path, config: Config, overwrite: bool) -> OfflineStore:
    """The output folder, checked before any work: new, empty, or a training set we may replace."""
    text = str(out)
    store = open_store(text if is_remote(text) else str(Path(text).absolute()), config.root)
    existing = store.files_under(store.base)
    if not existing:
        return store
    if store.read_manifest(store.base) is None:
        raise QuiverError(f"{store.uri(store.base)} already holds files that are not a training set; "
                          f"choose a new folder")
    if not overwrite:
        raise QuiverError(f"{store.uri(store.base)} already holds a training set; pass overwrite=True to "
                          f"replace it")
    return store


def _rows(store: OfflineStore, path: str) -> int:
    with store.fs.open_input_file(path) as handle:
        return int(pq.ParquetFile(handle).metadata.num_rows)

