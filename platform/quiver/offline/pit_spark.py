"""The Spark point-in-time engine: the semantics of pit_numpy as Spark window functions, for scale.

Label rows are unioned with the rows they look up and ordered per entity by time, so every as-of lookup is
a window over sorted rows rather than a range join:

* last values: the last `struct(event_ts, fields…)` up to the label row; at equal times labels sort before
  events (an event at t is not seen) and events by their field values (ties take the greatest); the TTL is
  checked on the found event_ts.
* whole tiles: per entity ordered by tile_start, label rows carry floor_g(t) and a RANGE frame [-w, -1]
  merges the tiles with tile_start in [floor_g(t) - w, floor_g(t)) with compile.sql's MERGE_OPS.
* head events: per (entity, tile) ordered by time, a running frame computes the partials of the raw events
  in [floor_g(t), t) with compile.sql's per-event TILE_OPS (the backfill's own tile SQL).

Last values are final in the plan. Merged window partials go through pit_merge.combine / finalize — the same
code the embedded engine ends in, so the engines differ at most in float rounding of sums — on the executors
(`mapInArrow`), batch by batch: the driver holds neither the label rows nor the partials. `feature_frame` is
that plan as a Spark DataFrame (label columns plus one column per feature); `compute` collects it for labels
that came from the driver (pandas, Arrow).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from quiver.catalog.aggregations import TILE_START, PartialColumn, last_ts_column, view_partials
from quiver.compile import dialect_for
from quiver.compile.contracts import reason_sql
from quiver.compile.sql import MERGE_OPS, tile_exprs
from quiver.config import Config
from quiver.offline.layout import EVENT_TS, LAST_VALUES, TILES, arrow_type
from quiver.offline.pit_merge import Merged, combine, finalize, partial_kinds
from quiver.offline.pit_plan import LabelSet, ViewRequest

_ROW, _T, _KIND, _ORDER, _TILE = "_q_row", "_q_t", "_q_kind", "_q_order", "_q_tile"


def session(config: Config, requests: Sequence[ViewRequest] = ()) -> Any:
    """The process's SparkSession with the project's Spark settings (shared with the backfill: one per JVM),
    set up for the object store the requests read, if any."""
    from quiver.offline.engines import spark_session_for, spark_store_conf

    store = next((r.remote for r in requests if r.remote), None)
    return spark_session_for(config, conf=spark_store_conf(store))


@dataclass(frozen=True)
class Bounds:
    """The label rows' earliest and latest time (epoch µs): which date partitions a join must read."""

    lo: int
    hi: int


@dataclass(frozen=True)
class FeatureColumn:
    """One requested feature in `feature_frame`'s result: its view, its name and the column holding it."""

    view: str
    feature: str
    column: str
    type: pa.DataType


def compute(labels: LabelSet, requests: Sequence[ViewRequest], config: Config,
            spark: Any = None) -> dict[tuple[str, str], pa.Array]:
    """Feature values per (view, feature), one entry per label row in label order (labels from the driver)."""
    spark = spark or session(config, requests)
    columns: dict[str, pa.Array] = {_ROW: pa.array(np.arange(labels.n, dtype=np.int64)), _T: pa.array(labels.t_us)}
    columns.update(labels.keys)
    label_frame = spark.createDataFrame(pa.table(columns))
    bounds = Bounds(int(labels.t_us.min()), int(labels.t_us.max())) if labels.n else Bounds(0, 1)
    frame, wanted = feature_frame(spark, label_frame, bounds, requests, keep=[_ROW])
    table = _by_row(frame, labels.n)
    return {(f.view, f.feature): table[f.column].combine_chunks() for f in wanted}


def feature_frame(spark: Any, label_frame: Any, bounds: Bounds, requests: Sequence[ViewRequest],
                  keep: Sequence[str] | None = None) -> tuple[Any, list[FeatureColumn]]:
    """`label_frame` (a row id `_q_row`, the time `_q_t` in epoch µs, the join keys in the catalog's types) with
    one column per requested feature (`_q_f<i>`), as a lazy Spark DataFrame: nothing is collected.

    `keep`: the label columns to carry into the result (default: all of them). One plan for all views: each
    adds its columns joined on the label row. Last values are final there; window partials are merged and
    finalized by the executors' Python, batch by batch (only when a window is asked for).
    """
    from pyspark.sql import functions as F

    kept = list(keep if keep is not None else label_frame.columns)
    wanted: list[FeatureColumn] = []
    for req in requests:
        for name in req.features:
            kind = arrow_type(req.view.feature_dtype(name))
            wanted.append(FeatureColumn(req.view.name, name, f"_q_f{len(wanted)}", kind))
    column_of = {(f.view, f.feature): f for f in wanted}
    result, finals, in_python = label_frame.select(*kept), [], []
    for i, req in enumerate(requests):
        prefix = f"v{i}_"
        if req.view.kind == "last":
            frame = _last_values(spark, req, label_frame, bounds, prefix)
            if frame is not None:
                result = result.join(frame, on=_ROW, how="left")
            for name in req.features:
                out = column_of[(req.view.name, name)]
                value = F.col(prefix + name) if frame is not None else F.lit(None)
                finals.append(value.cast(_spark_type(out.type)).alias(out.column))
            continue
        frame, decode = _windows(spark, req, label_frame, bounds, prefix)
        if frame is not None:
            result = result.join(frame, on=_ROW, how="left")
        in_python.append((req.view.name, decode))
    partials = [c for c in result.columns if c not in kept]
    result = result.select(*kept, *finals, *partials)
    if in_python:
        carried = [*kept, *(f.column for f in wanted if f.view not in {v for v, _ in in_python})]
        windowed = [f for f in wanted if f.view in {v for v, _ in in_python}]
        schema = _output_schema(result.select(*carried).schema, windowed)
        result = result.mapInArrow(_Finalizer(carried, in_python, windowed), schema)
    return result.select(*kept, *(f.column for f in wanted)), wanted


class _Finalizer:
    """Runs on the executors: Arrow batches of label rows with their window partials in, label rows with their
    window features out (pit_merge's combine and finalize, the embedded engine's code)."""

    def __init__(self, carried: list[str], decoders: list[tuple[str, Decoder]], wanted: list[FeatureColumn]):
        self.carried, self.decoders, self.wanted = carried, decoders, wanted

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            table = pa.Table.from_batches([batch])
            values: dict[tuple[str, str], pa.Array] = {}
            for view, decode in self.decoders:
                values.update({(view, name): array for name, array in decode(table).items()})
            arrays = [batch.column(name) for name in self.carried]
            arrays += [pc.cast(values[(f.view, f.feature)], f.type) for f in self.wanted]
            yield pa.RecordBatch.from_arrays(arrays, names=[*self.carried, *(f.column for f in self.wanted)])


def _output_schema(carried: Any, wanted: list[FeatureColumn]) -> Any:
    from pyspark.sql.types import StructField, StructType

    return StructType([*carried.fields, *[StructField(f.column, spark_data_type(f.type), True) for f in wanted]])


def spark_data_type(kind: pa.DataType) -> Any:
    """The Spark SQL type of a feature's Arrow type (the five the catalog has)."""
    from pyspark.sql import types as T

    return {"long": T.LongType(), "double": T.DoubleType(), "string": T.StringType(), "boolean": T.BooleanType(),
            "timestamp": T.TimestampType()}[_spark_type(kind)]


def _read(spark: Any, files: list[Any], req: ViewRequest | None = None) -> Any:
    """Parquet `files` as a frame: local paths, or (with `req` on an object store) paths inside its store."""
    if not files:
        return None
    store = req.remote if req is not None else None
    return spark.read.parquet(*[store.uri(str(f), spark=True) if store else str(f) for f in files])


def _micros(column: Any) -> Any:
    from pyspark.sql import functions as F

    return F.unix_micros(column.cast("timestamp"))


def _by_row(frame: Any, n: int) -> pa.Table:
    """Collect a frame with one row per label (`_q_row`) into label order."""
    table = frame.toArrow()
    order = np.asarray(table[_ROW].to_numpy())
    result = table.take(pa.array(np.argsort(order, kind="stable")))
    if result.num_rows != n:
        raise AssertionError(f"spark PIT returned {result.num_rows} rows for {n} labels")
    return result


Decoder = Callable[[pa.Table], dict[str, pa.Array]]


def _last_values(spark: Any, req: ViewRequest, label_frame: Any, bounds: Bounds, prefix: str) -> Any:
    """Per label, the view's fields of the last event before it within the TTL (None: no data at all)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    view, names, keys = req.view, [f.name for f in req.fields], req.view.key_names
    types = {f.name: arrow_type(f.dtype) for f in req.fields}
    lo = bounds.lo - view.ttl_us if view.ttl_us is not None else None
    data = _read(spark, req.partition_files(LAST_VALUES, lo, bounds.hi), req)
    if data is None:
        return None
    data = (data.select(*keys, _micros(F.col(EVENT_TS)).alias(_T), *names)
            .where(F.col(_T).isNotNull() & _all_present(keys)))
    union = (label_frame.select(_ROW, *keys, _T, F.lit(0).alias(_KIND),
                                *[F.lit(None).cast(_spark_type(types[c])).alias(c) for c in names])
             .unionByName(data.select(F.lit(None).cast("long").alias(_ROW), *keys, _T, F.lit(1).alias(_KIND),
                                      *names)))
    frame = (Window.partitionBy(*keys).orderBy(F.col(_T), F.col(_KIND), *[F.col(c).asc_nulls_first() for c in names])
             .rowsBetween(Window.unboundedPreceding, Window.currentRow))
    found = F.last(F.when(F.col(_KIND) == 1, F.struct(F.col(_T).alias("ts"), *names)), ignorenulls=True).over(frame)
    result = union.withColumn("_q_found", found).where(F.col(_KIND) == 0)
    ok = F.col("_q_found").isNotNull()
    if view.ttl_us is not None:
        ok = ok & (F.col("_q_found.ts") >= F.col(_T) - F.lit(view.ttl_us))
    return result.select(_ROW, *[F.when(ok, F.col(f"_q_found.{c}")).alias(prefix + c) for c in names])


def _all_present(keys: list[str]) -> Any:
    from pyspark.sql import functions as F

    condition = F.lit(True)
    for key in keys:
        condition = condition & F.col(key).isNotNull()
    return condition


def _spark_type(kind: pa.DataType) -> str:
    return {pa.int64(): "long", pa.float64(): "double", pa.string(): "string", pa.bool_(): "boolean",
            pa.timestamp("us", tz="UTC"): "timestamp"}[kind]


def _windows(spark: Any, req: ViewRequest, label_frame: Any, bounds: Bounds,
             prefix: str) -> tuple[Any, Decoder]:
    from pyspark.sql import functions as F

    view, aggs = req.view, req.aggregations
    tile = int(view.tile_us or 1)
    columns = list(dict.fromkeys(a.column for a in aggs))
    kinds = {c: partial_kinds([a.fn for a in aggs if a.column == c]) for c in columns}
    dtypes = {a.column: a.input_dtype for a in aggs}
    windows = sorted({a.window_us for a in aggs})
    first, last = bounds.lo - bounds.lo % tile, bounds.hi - bounds.hi % tile  # the labels' tiles, floor_g(t)
    lo, hi = first - windows[-1], last
    labelled = label_frame.withColumn(_TILE, F.col(_T) - F.pmod(F.col(_T), F.lit(tile)))

    tiles = _read(spark, req.partition_files(TILES, lo, hi), req)
    frames = [_tile_windows(tiles, labelled, req, windows, lo, hi, prefix) if tiles is not None else None,
              _head(spark, req, labelled, tile, first, bounds.hi, prefix)]
    present = [f for f in frames if f is not None]
    result = None
    if present:
        result = present[0]
        for frame in present[1:]:
            result = result.join(frame, on=_ROW, how="left")  # both hold every label row

    def decode(table: pa.Table) -> dict[str, pa.Array]:
        names, n = set(table.column_names), table.num_rows
        out: dict[str, pa.Array] = {}
        for window in windows:
            for column in columns:
                wanted = [a for a in aggs if a.column == column and a.window_us == window]
                if not wanted:
                    continue
                kind, dtype = kinds[column], dtypes[column]
                whole = _merged(table, names, f"{prefix}t{window}_{column}", kind, dtype, n)
                head = _merged(table, names, f"{prefix}h_{column}", kind, dtype, n)
                out.update(finalize(wanted, combine(whole, head)))
        return out

    return result, decode


def _tile_windows(tiles: Any, labelled: Any, req: ViewRequest, windows: list[int], lo: int, hi: int,
                  prefix: str) -> Any:
    """Per label and window, the whole tiles' partials merged by compile.sql's MERGE_OPS."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    d, keys = dialect_for("spark"), req.view.key_names
    wanted = []
    for partial in _partials(req):
        wanted.append(partial.name)
        if partial.partial.kind == "last":
            wanted.append(last_ts_column(partial.column))
    tiles = (tiles.select(*keys, F.col(TILE_START).alias(_ORDER), *wanted)
             .where(_all_present(keys) & (F.col(_ORDER) >= lo) & (F.col(_ORDER) < hi)))
    schema = {f.name: f.dataType for f in tiles.schema.fields}
    union = (labelled.select(_ROW, *keys, F.col(_TILE).alias(_ORDER), F.lit(0).alias(_KIND),
                             *[F.lit(None).cast(schema[c]).alias(c) for c in wanted])
             .unionByName(tiles.select(F.lit(None).cast("long").alias(_ROW), *keys, _ORDER, F.lit(1).alias(_KIND),
                                       *wanted)))
    merges = []
    for window in windows:
        frame = Window.partitionBy(*keys).orderBy(_ORDER).rangeBetween(-window, -1)
        for partial in _partials(req, window):
            alias = f"{prefix}t{window}_{partial.column}__{partial.partial.kind}"
            # The bare aggregates of MERGE_OPS (merge_exprs wraps some in casts or field accesses, which a
            # window cannot take); `last` stays the winning struct (last_ts, last), decoded on the driver.
            ts = d.quote(last_ts_column(partial.column))
            sql = MERGE_OPS[partial.partial.merge_op].format(
                p=d.quote(partial.name), t=ts, s=d.struct.format(t=ts, v=d.quote(partial.name)), w="")
            merges.append(F.expr(sql).over(frame).alias(alias))
    return union.select(_ROW, _KIND, *merges).where(F.col(_KIND) == 0).drop(_KIND)


def _partials(req: ViewRequest, window: int | None = None) -> list[PartialColumn]:
    aggs = [a for a in req.aggregations if window is None or a.window_us == window]
    return view_partials([(a.column, a.fn, a.input_dtype) for a in aggs])


def _head(spark: Any, req: ViewRequest, labelled: Any, tile: int, lo: int, hi: int, prefix: str) -> Any:
    """Per label, the partials of the raw events in [floor_g(t), t), by compile.sql's per-event TILE_OPS."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from quiver.offline.engines import set_hadoop, spark_store_conf

    files = req.source_files()
    if not files.location.is_local:  # the source on an object store: its endpoint, shipped to the executors
        set_hadoop(spark, spark_store_conf(files.location))
    events = _read(spark, files.uris(spark=True))
    if events is None:
        return None
    d, keys = dialect_for("spark"), req.view.key_names
    if req.view.contract is not None:  # the rows the backfill refused never count in a head either
        clock = str(time.time_ns() // 1000)
        events = events.where(F.expr(f"({reason_sql(d, req.view.contract, clock)}) IS NULL"))
    columns = list(dict.fromkeys(a.column for a in req.aggregations))
    ts = _micros(F.col(req.view.timestamp_field))
    events = (events.select(*keys, ts.alias(_T), *columns)
              .where(_all_present(keys) & F.col(_T).isNotNull() & (F.col(_T) >= lo) & (F.col(_T) < hi))
              .withColumn(_TILE, F.col(_T) - F.pmod(F.col(_T), F.lit(tile))))
    schema = {f.name: f.dataType for f in events.schema.fields}
    union = (labelled.select(_ROW, *keys, _T, _TILE, F.lit(0).alias(_KIND),
                             *[F.lit(None).cast(schema[c]).alias(c) for c in columns])
             .unionByName(events.select(F.lit(None).cast("long").alias(_ROW), *keys, _T, _TILE,
                                        F.lit(1).alias(_KIND), *columns)))
    # Labels sort before events at the same time: an event at t is not in t's head.
    frame = (Window.partitionBy(*keys, _TILE).orderBy(_T, _KIND)
             .rowsBetween(Window.unboundedPreceding, Window.currentRow))
    wanted = {p.name: p for p in _partials(req)}
    merges = [F.expr(sql).over(frame).alias(f"{prefix}h_{wanted[name].column}__{wanted[name].partial.kind}")
              for name, sql in tile_exprs(d, req.view, d.quote(_T)) if name in wanted]
    return union.select(_ROW, _KIND, *merges).where(F.col(_KIND) == 0).drop(_KIND)


def _merged(table: pa.Table, names: set[str], prefix: str, kinds: list[str], dtype: str, n: int) -> Merged:
    """Partials collected from Spark as a `Merged` (absent columns — no data at all — are empty windows)."""
    def column(kind: str) -> pa.Array | None:
        name = f"{prefix}__{kind}"
        return table[name].combine_chunks() if name in names else None

    cnt = column("cnt")
    merged = Merged(np.zeros(n, dtype=np.int64) if cnt is None else
                    np.asarray(pc.fill_null(pc.cast(cnt, pa.int64()), 0).to_numpy()))
    for kind in kinds:
        data = column(kind)
        if kind == "last":
            values = pa.nulls(n, arrow_type(dtype)) if data is None else data.field("v")
            merged.values[kind] = pc.cast(values, arrow_type(dtype))
            continue
        floating = kind in ("sum", "sumsq") or dtype == "float64"
        target = pa.float64() if floating else pa.int64()
        filled = pa.nulls(n, target) if data is None else pc.cast(data, target)
        merged.values[kind] = np.asarray(pc.fill_null(filled, 0).to_numpy(zero_copy_only=False))
    return merged
