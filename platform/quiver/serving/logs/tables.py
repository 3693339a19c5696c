"""Serving-log rows in memory (`Batch`, `Record`) and as Arrow tables (`batches_to_table`), the same whether
rows came from `log()` or `log_batch()`.

Columns: `ts` (timestamp µs UTC, when `log` was called), `request_id`, `call_id` (one id per request to the
prediction service: its rows on one arm were scored by one model call), `model_version`, `arm`
(champion / shadow / canary / paired …), `latency_ms`, `prediction` (float64, may be null), `error` (empty, or
why the model failed on the row: then `prediction` is null), `rollout_id`, `rollout_step` (int64) and
`canary_fraction` (float64): the rollout, step and traffic share the row was routed under (null when no rollout
ran), so a judge counts only rows served under the step it judges, `missing_inputs` (int64: how many of the
serving model's inputs were missing, null where not known); then one column per request field the client sent
named `request.<name>` (what on-demand features read, so a model can later be trained on it), one per entity
key named `key.<name>` and one per feature named `feature.<name>` (names as the caller gives them, e.g.
"user_spend:amount_sum_1h"); the prefixes keep a key and a feature of the same name apart; `replica` (the
process that served the row, see `replica_name`). Given `schema=log_schema(catalog)` (the servers do), every file has
every key, request field and feature of the catalog, typed from it, null where the serving model did not read
it: one schema for the dataset, so pandas, `pyarrow.dataset`, DuckDB and Spark read the folder as it is. Other
columns keep the type they were first written with; a catalog change adds columns (read with DuckDB's
`union_by_name`, Spark's `mergeSchema`, or `read_serving_logs`). Values are cast to the dataset's type without
loss (NaN, how numpy hands over a missing integer, boolean or text, becomes a null; 7.0 becomes 7); rows
holding a value the type cannot take (1.5 or "abc" in an int64 column) are quarantined with why, never
written as a file of another schema.
Quarantine files hold the same columns with `ts` as plain epoch µs (`ts_us`), plus `quarantine_reason`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa

from quiver.online.base import ColumnBlock

KEY_PREFIX = "key."
FEATURE_PREFIX = "feature."
REQUEST_PREFIX = "request."
US_PER_HOUR = 3_600_000_000
BASE_SCHEMA = pa.schema([("ts", pa.timestamp("us", tz="UTC")), ("request_id", pa.string()), ("call_id", pa.string()),
                         ("model_version", pa.string()), ("arm", pa.string()), ("latency_ms", pa.float64()),
                         ("prediction", pa.float64()), ("error", pa.string()), ("rollout_id", pa.int64()),
                         ("rollout_step", pa.int64()), ("canary_fraction", pa.float64()),
                         ("missing_inputs", pa.int64()), ("replica", pa.string())])

Record = tuple[int, str, Mapping[str, Any], Mapping[str, Any], str, str, float, float | None, str]
RolloutTag = tuple[int, int, float]  # (rollout id, step, canary fraction) a row was routed under


@dataclass(frozen=True, slots=True)
class Batch:
    """Rows of one `log_batch` call as columns; a str/float field holds one value for every row."""

    n: int
    ts_us: int | np.ndarray
    request_ids: Sequence[str]
    entity_keys: Mapping[str, Any]
    features: Mapping[str, Any]
    model_version: str | np.ndarray
    arm: str | np.ndarray
    latency_ms: float | np.ndarray
    predictions: np.ndarray | None
    error: str | np.ndarray
    rollout: RolloutTag | None = None
    call_id: str | np.ndarray = ""  # the request these rows came in (one per row when they came in several)
    request: Mapping[str, Any] | None = None  # the request's fields (what on-demand features read)
    missing: np.ndarray | None = None  # per row, how many of the serving model's inputs were missing


def micros(ts: datetime) -> int:
    if ts.tzinfo is None:
        raise ValueError("serving-log timestamps must be timezone-aware (UTC)")
    delta = ts - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def records_to_table(records: list[Record]) -> pa.Table:
    """Buffered `log()` records as one Arrow table (columns as in the module docstring)."""
    return batches_to_table([_records_batch(records)])


def batches_to_table(batches: Sequence[Batch]) -> pa.Table:
    """Batches as one Arrow table, rows in order: the same columns and types as `log()` of the same rows."""
    keys: dict[str, None] = {}
    joined = _joined_blocks(batches)
    features: dict[str, None] = {} if joined is None else dict.fromkeys(joined[0].names)
    fields: dict[str, None] = {}
    for batch in batches:
        keys.update(dict.fromkeys(batch.entity_keys))
        if joined is None:
            features.update(dict.fromkeys(batch.features))
        if batch.request:
            fields.update(dict.fromkeys(batch.request))
    # The fixed columns are small next to the features: plain Python lists, exactly as `log()` builds them.
    columns: dict[str, pa.Array] = {
        "ts": pa.array(_flat(batches, "ts_us"), pa.int64()).cast(BASE_SCHEMA.field("ts").type),
        "request_id": pa.array([r for b in batches for r in b.request_ids], pa.string()),
        "call_id": pa.array(_flat(batches, "call_id"), pa.string()),
        "model_version": pa.array(_flat(batches, "model_version"), pa.string()),
        "arm": pa.array(_flat(batches, "arm"), pa.string()),
        "latency_ms": pa.array(_flat(batches, "latency_ms"), pa.float64()),
        "prediction": pa.array([p for b in batches for p in _predictions(b)], pa.float64()),
        "error": pa.array(_flat(batches, "error"), pa.string()),
        **_rollout_columns(batches),
        "missing_inputs": pa.array([m for b in batches for m in (b.missing.tolist() if b.missing is not None
                                                                  else [None] * b.n)], pa.int64()),
    }
    for name in keys:
        columns[KEY_PREFIX + name] = _merge([(b.entity_keys.get(name), b.n) for b in batches])
    for name in features:
        if joined is not None:
            block, absent = joined
            column = block[name]
            columns[FEATURE_PREFIX + name] = _array(column) if absent is None else pa.array(column, mask=absent)
        else:
            columns[FEATURE_PREFIX + name] = _merge([(b.features.get(name), b.n) for b in batches])
    for name in fields:
        columns[REQUEST_PREFIX + name] = _merge([((b.request or {}).get(name), b.n) for b in batches])
    return pa.table(columns)


def _joined_blocks(batches: Sequence[Batch]) -> tuple[ColumnBlock, np.ndarray | None] | None:
    """Every batch's features as one ColumnBlock and the rows that had none (a mask; None when every row had
    them), when each batch holds a block of the same names and kind or no features at all (shadow and paired
    rows): what a prediction server logs. One concatenation instead of one per feature over every batch."""
    first = next((b.features for b in batches if isinstance(b.features, ColumnBlock)), None)
    if not isinstance(first, ColumnBlock):
        return None
    names, dtype = first.names, first.array.dtype
    arrays: list[np.ndarray] = []
    absent: list[bool] = []
    blanks: dict[int, np.ndarray] = {}
    for batch in batches:
        block = batch.features
        if isinstance(block, ColumnBlock) and block.names == names and block.array.dtype == dtype:
            arrays.append(block.array)
            absent.append(False)
        elif not block:
            blank = blanks.get(batch.n)
            if blank is None:
                blank = blanks[batch.n] = np.zeros((batch.n, len(names)), dtype=dtype)
            arrays.append(blank)
            absent.append(True)
        else:
            return None
    mask = np.repeat(absent, [b.n for b in batches]) if any(absent) else None
    return ColumnBlock(names, np.concatenate(arrays)), mask


def _rollout_columns(batches: Sequence[Batch]) -> dict[str, pa.Array]:
    names = ("rollout_id", "rollout_step", "canary_fraction")
    values: list[list[Any]] = [[], [], []]
    for batch in batches:
        tag = batch.rollout or (None, None, None)
        for column, value in zip(values, tag, strict=True):
            column.extend([value] * batch.n)
    return {name: pa.array(column, BASE_SCHEMA.field(name).type) for name, column in zip(names, values, strict=True)}


def _records_batch(records: list[Record]) -> Batch:
    keys: dict[str, None] = {}
    features: dict[str, None] = {}
    for record in records:
        keys.update(dict.fromkeys(record[2]))
        features.update(dict.fromkeys(record[3]))
    return Batch(len(records), np.array([r[0] for r in records], np.int64), [r[1] for r in records],
                 {k: [r[2].get(k) for r in records] for k in keys},
                 {f: [r[3].get(f) for r in records] for f in features},
                 np.array([r[4] for r in records], object), np.array([r[5] for r in records], object),
                 np.array([r[6] for r in records], object), np.array([r[7] for r in records], object),
                 np.array([r[8] for r in records], object))


def as_batches(items: list[Record | Batch]) -> list[Batch]:
    """Buffered items in order as batches: each run of `log()` records becomes one."""
    out: list[Batch] = []
    run: list[Record] = []
    for item in items:
        if isinstance(item, Batch):
            if run:
                out.append(_records_batch(run))
                run = []
            out.append(item)
        else:
            run.append(item)
    if run:
        out.append(_records_batch(run))
    return out


def split_by_hour(batch: Batch) -> list[tuple[int, Batch]]:
    if not isinstance(batch.ts_us, np.ndarray):
        return [(batch.ts_us // US_PER_HOUR, batch)]
    hours = batch.ts_us // US_PER_HOUR
    if (hours == hours[0]).all():
        return [(int(hours[0]), batch)]
    return [(int(hour), take_rows(batch, np.flatnonzero(hours == hour))) for hour in np.unique(hours)]


def take_rows(batch: Batch, index: np.ndarray) -> Batch:
    def take(values: Any) -> Any:
        if isinstance(values, np.ndarray):
            return values[index]
        if isinstance(values, str | int | float) or values is None:
            return values
        return [values[i] for i in index.tolist()]

    return Batch(len(index), take(batch.ts_us), take(batch.request_ids),
                 {k: take(v) for k, v in batch.entity_keys.items()},
                 batch.features.take(index) if isinstance(batch.features, ColumnBlock) else
                 {k: take(v) for k, v in batch.features.items()},
                 take(batch.model_version), take(batch.arm), take(batch.latency_ms), take(batch.predictions),
                 take(batch.error), batch.rollout, take(batch.call_id),
                 None if batch.request is None else {k: take(v) for k, v in batch.request.items()},
                 take(batch.missing))


def _flat(batches: Sequence[Batch], name: str) -> list[Any]:
    """Field `name` with one value per row, whether a batch holds one value for all its rows or an array."""
    out: list[Any] = []
    for batch in batches:
        value = getattr(batch, name)
        out.extend(value.tolist() if isinstance(value, np.ndarray) else [value] * batch.n)
    return out


def _predictions(batch: Batch) -> list[float | None]:
    if batch.predictions is None:
        return [None] * batch.n
    values: list[float | None] = batch.predictions.tolist()
    if batch.predictions.dtype == object:  # from log(): the caller's values, nulls included
        return values
    if isinstance(batch.error, str):
        return [None] * batch.n if batch.error else values
    return [None if e else v for v, e in zip(values, batch.error.tolist(), strict=True)]


_NUMPY_KINDS = frozenset("fibU")  # dtypes Arrow takes straight from numpy with the types `log()` infers


def _array(values: Any) -> pa.Array:
    """One column piece as Arrow, typed as `log()` would type the same Python values."""
    if isinstance(values, np.ndarray):
        kind = values.dtype.kind
        if kind == "f":
            return pa.array(values.astype(np.float64, copy=False))
        if kind == "i" or (kind == "u" and values.dtype.itemsize <= 4):
            return pa.array(values.astype(np.int64, copy=False))
        if kind == "b":
            return pa.array(values, pa.bool_())
        if kind == "U":
            return pa.array(values, pa.string())
    return _values(_python(values))


def _python(values: Any) -> list[Any]:
    return values.tolist() if isinstance(values, np.ndarray) else list(values)


def _merge(pieces: list[tuple[Any, int]]) -> pa.Array:
    """One key/feature column from its piece in each batch (None: the batch lacks it, so nulls)."""
    present = [v for v, _ in pieces if v is not None]
    numpy = [v for v in present if isinstance(v, np.ndarray) and v.dtype.kind in _NUMPY_KINDS]
    if not numpy:  # Python values only: one inference over the whole column, as `log()` does
        return _values([x for v, n in pieces for x in (_python(v) if v is not None else [None] * n)])
    kinds = {v.dtype.kind for v in numpy}
    if len(numpy) == len(pieces) and len(kinds) == 1:
        return _array(np.concatenate(numpy) if len(numpy) > 1 else numpy[0])
    arrays = [None if v is None else _array(v) for v, _ in pieces]
    types = {a.type for a in arrays if a is not None and a.type != pa.null()}
    if len(types) > 1:  # e.g. ints in one batch, floats or text in another: let one inference decide
        return _values([x for v, n in pieces for x in (_python(v) if v is not None else [None] * n)])
    target = types.pop() if types else pa.null()
    return pa.concat_arrays([a if a is not None and a.type == target else pa.nulls(n, target)
                             for a, (_, n) in zip(arrays, pieces, strict=True)])


def _values(values: list[Any]) -> pa.Array:
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        # Mixed types in one flush (e.g. a number and a string): keep every value, as text.
        return pa.array([None if v is None else str(v) for v in values], pa.string())


def log_schema(catalog: Any) -> pa.Schema:
    """The serving-log columns a project's catalog can produce, typed: the fixed columns, every entity key,
    request field and feature (stored and on-demand), so every file has them whichever model logged it.

    A feature is declared as `feature.<view>:<name>` and, when no other view has a feature of that name with
    another type, as `feature.<name>`: the column the prediction service logs (a model's input columns are the
    features' own names), so its type is the catalog's even in a flush where a null turned it into floats."""
    from quiver.offline.layout import arrow_type

    fields = list(BASE_SCHEMA)
    keys = {name: dtype for entity in catalog.entities.values() for name, dtype in entity.keys}
    fields += [pa.field(KEY_PREFIX + name, arrow_type(dtype)) for name, dtype in keys.items()]
    requests = {name: dtype for source in catalog.request_sources.values() for name, dtype in source.columns}
    fields += [pa.field(REQUEST_PREFIX + name, arrow_type(dtype)) for name, dtype in requests.items()]
    bare: dict[str, set[pa.DataType]] = {}
    for views in (catalog.views, catalog.on_demand):
        for view in views.values():
            for name in view.feature_names:
                dtype = arrow_type(view.feature_dtype(name))
                fields.append(pa.field(f"{FEATURE_PREFIX}{view.name}:{name}", dtype))
                bare.setdefault(name, set()).add(dtype)
    fields += [pa.field(FEATURE_PREFIX + name, next(iter(types))) for name, types in bare.items() if len(types) == 1]
    return pa.schema(fields)


def conform(table: pa.Table, types: Mapping[str, pa.DataType], order: Sequence[str] = ()) -> tuple[pa.Table, list[str]]:
    """`table` with each column of a known type cast to it (an all-null column becomes typed nulls) and the
    `order` columns it lacks added as typed nulls, those first and in that order; returns the table and the
    columns that could not be cast (kept as they were: a value the declared type cannot hold is not lost)."""
    columns: dict[str, pa.ChunkedArray | pa.Array] = {}
    failed = []
    for name in [*order, *(n for n in table.column_names if n not in set(order))]:
        want = types.get(name)
        if name not in table.column_names:
            if want is not None:
                columns[name] = pa.nulls(table.num_rows, want)
            continue
        column = table[name]
        if want is not None and column.type != want:
            try:
                if pa.types.is_floating(column.type) and not pa.types.is_floating(want):
                    import pyarrow.compute as pc  # NaN is how numpy says "missing": a null in any other type

                    column = pc.if_else(pc.is_nan(column), pa.scalar(None, column.type), column)
                column = column.cast(want)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
                failed.append(name)
        columns[name] = column
    return pa.table(columns), failed


class SchemaMismatch(ValueError):
    """Rows whose values the dataset's column types cannot hold (they are quarantined, never written)."""


def first_bad(column: pa.ChunkedArray | pa.Array, want: pa.DataType) -> str:
    """The first value of `column` that does not cast to `want` (for an error message)."""
    for value in column.to_pylist():
        if value is None or value != value:  # null or NaN: `conform` makes both nulls
            continue
        try:
            pa.array([value], column.type).cast(want)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            return repr(value)[:40]
    return "?"


_UNIQUE_COLUMNS = ("request_id", "call_id")  # one value per row or per call


def dictionary_columns(schema: pa.Schema) -> list[str]:
    """The columns worth Parquet's dictionary encoding: strings, integers and booleans (versions, arms, errors,
    entity keys repeat within a file), not ids that never repeat nor floats and times, which rarely do. By
    default every column gets a dictionary until it outgrows its page: with 50 float features a 10,000-row
    file took 52 ms to write instead of 18 and came out 23 % larger."""
    return [f.name for f in schema if f.name not in _UNIQUE_COLUMNS and (
        pa.types.is_string(f.type) or pa.types.is_large_string(f.type) or pa.types.is_integer(f.type)
        or pa.types.is_boolean(f.type))]


def column_compression(table: pa.Table, codec: str) -> dict[str, str]:
    """`codec` for every column but those holding only nulls (the feature columns a row's model does not read,
    every feature column of a shadow row): nothing to compress there, and skipping it cut a 10,000-row file
    with 100 of them from 11.7 to 8.4 ms to write, at the same size."""
    return {name: "NONE" if table.column(name).null_count == len(table) else codec for name in table.column_names}


@dataclass(slots=True)
class QuarantinedBatch:
    """Rows that cannot go to their hour, and why (written to the quarantine folder by the writer thread)."""

    batch: Batch
    reason: str


@dataclass(slots=True)
class FailedPart:
    """One hour's rows of a flush whose write failed: kept as the table built, tried again later."""

    hour: int
    table: pa.Table
    rows: int
    attempts: int
    next_try: float  # time.monotonic()
    error: str

    @property
    def nbytes(self) -> int:
        return int(self.table.nbytes)
