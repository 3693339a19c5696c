"""The one table of aggregation functions: which partials each needs, how partials merge, how values finish.

Every engine (spark, duckdb, flink, and the Redis reader) reads this table; none re-derives the rules.
Partials are mergeable: tiles hold partials, windows merge tiles, values are finalized last.

Semantics (docs/architecture.md, "As of t"): nulls are skipped and counted (`n_events - <col>__cnt`); an empty window gives
count 0, sum 0 and null for everything else. `stddev` is the sample standard deviation (null below 2 values),
computed from sum and sum of squares so it merges like the others. `last` is the non-null value with the
greatest event time; ties at the same time take the greatest value, so every engine agrees.

NaN is a value, not a null (one rule in every engine): it is counted, it propagates through sum, mean and
stddev, and it is the greatest value in the ordering of min, max and `last` ties — SQL's ordering in DuckDB
and Spark. So `max` of a window holding a NaN is NaN, and `min` is NaN only when every value is NaN.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from quiver.catalog.types import NUMERIC_DTYPES, Float64, Int64


@dataclass(frozen=True)
class Partial:
    """A per-tile partial of one column: how it is computed from events and how two of them merge."""

    kind: str
    tile_op: str  # count | sum | sumsq | min | max | last — each engine maps these to its SQL
    merge_op: str  # sum | min | max | last
    dtype: str  # 'input' means the input column's dtype


PARTIALS: Final[dict[str, Partial]] = {
    "cnt": Partial("cnt", tile_op="count", merge_op="sum", dtype=Int64),
    "sum": Partial("sum", tile_op="sum", merge_op="sum", dtype=Float64),
    "sumsq": Partial("sumsq", tile_op="sumsq", merge_op="sum", dtype=Float64),
    "min": Partial("min", tile_op="min", merge_op="min", dtype="input"),
    "max": Partial("max", tile_op="max", merge_op="max", dtype="input"),
    # `last` carries its event time in a sibling column `<col>__last_ts` (epoch µs) so it can merge.
    "last": Partial("last", tile_op="last", merge_op="last", dtype="input"),
}


@dataclass(frozen=True)
class AggFunction:
    """One aggregation fn: the partials it reads, its finalize rule, its result dtype and input dtypes."""

    name: str
    partials: tuple[str, ...]
    finalize: str  # count | sum | mean | min | max | last | stddev
    output: str  # a dtype, or 'input'
    numeric_only: bool


AGG_FUNCTIONS: Final[dict[str, AggFunction]] = {
    fn.name: fn
    for fn in (
        AggFunction("count", ("cnt",), "count", Int64, numeric_only=False),
        AggFunction("sum", ("cnt", "sum"), "sum", Float64, numeric_only=True),
        AggFunction("mean", ("cnt", "sum"), "mean", Float64, numeric_only=True),
        AggFunction("min", ("cnt", "min"), "min", "input", numeric_only=True),
        AggFunction("max", ("cnt", "max"), "max", "input", numeric_only=True),
        AggFunction("last", ("cnt", "last"), "last", "input", numeric_only=False),
        AggFunction("stddev", ("cnt", "sum", "sumsq"), "stddev", Float64, numeric_only=True),
    )
}

EVENTS_COLUMN: Final = "n_events"
TILE_START: Final = "tile_start"  # epoch microseconds, aligned to the view's tile size


def output_dtype(fn: str, input_dtype: str) -> str:
    """The logical dtype of `fn(column)` for a column of `input_dtype`."""
    out = AGG_FUNCTIONS[fn].output
    if out != "input":
        return out
    return Int64 if input_dtype == "bool" and fn in ("min", "max") else input_dtype


def accepts(fn: str, input_dtype: str) -> bool:
    """Whether `fn` may aggregate a column of `input_dtype`."""
    return not AGG_FUNCTIONS[fn].numeric_only or input_dtype in NUMERIC_DTYPES


def partial_column(column: str, kind: str) -> str:
    """Name of a partial column in tiles and online tile records, e.g. amount__sum."""
    return f"{column}__{kind}"


def last_ts_column(column: str) -> str:
    return f"{column}__last_ts"


@dataclass(frozen=True)
class PartialColumn:
    """One concrete partial column of a view's tiles."""

    name: str
    column: str
    partial: Partial
    input_dtype: str

    @property
    def dtype(self) -> str:
        if self.partial.dtype != "input":
            return self.partial.dtype
        return Int64 if self.input_dtype == "bool" else self.input_dtype


def view_partials(aggregations: list[tuple[str, str, str]]) -> list[PartialColumn]:
    """Distinct partial columns for (column, fn, input_dtype) triples, in a stable order.

    Partials are shared: `sum` and `mean` of one column read the same `__sum` partial.
    """
    seen: dict[str, PartialColumn] = {}
    for column, fn, input_dtype in aggregations:
        for kind in AGG_FUNCTIONS[fn].partials:
            name = partial_column(column, kind)
            if name not in seen:
                seen[name] = PartialColumn(name, column, PARTIALS[kind], input_dtype)
    return list(seen.values())
