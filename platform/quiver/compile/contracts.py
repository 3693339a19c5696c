"""Contract rules in the two forms the paths run: SQL (backfill on DuckDB and Spark, the Spark point-in-time
join, the Kafka job) and Arrow compute (the stream feeder, request fields, the numpy point-in-time join, the
quality gate). One table per form, and one meaning, which `tests/unit/test_contracts.py` checks row by row
on every engine:

    not_null   the value is null                       (the only rule a null can fail)
    finite     NaN, +inf or -inf                       (float columns)
    min / max  below / above the bound, or NaN          (NaN lies outside every range)
    one_of     not one of the allowed values
    future     a timestamp after the clock + tolerance   (the clock of the job reading the row, epoch µs)

A row's reason is its first failing rule in the contract's order (`ContractSpec.checks`), `<rule>:<column>`;
a row with no reason is valid. Timestamps compare as epoch microseconds (floored, as everywhere).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from quiver.catalog.ir import CheckSpec, ContractSpec

NOW_PARAM: Final = "now_us"  # the reading job's clock in the compiled queries

# {x}: the column (a timestamp as epoch µs), {v}: the rule's value as SQL, {isnan}: the dialect's NaN test of x,
# {nan}: " OR {isnan}" for float columns (empty otherwise), {inf}: +infinity, {clock}: the clock in epoch µs.
SQL_RULES: Final[Mapping[str, str]] = {
    "not_null": "{x} IS NULL",
    "finite": "{isnan} OR abs({x}) = {inf}",
    "min": "{x} < {v}{nan}",
    "max": "{x} > {v}{nan}",
    "one_of": "{x} NOT IN ({v})",
    "future": "{x} > {clock} + {v}",
}


class Spelling(Protocol):
    """What the rules need of a SQL dialect (`compile.sql.Dialect` is one)."""

    @property
    def epoch_us(self) -> str: ...  # {ts} timestamp → BIGINT epoch µs

    @property
    def is_nan(self) -> str: ...  # {x} → true exactly when x is NaN (false for NULL)

    def quote(self, name: str) -> str: ...

    def string(self, value: str) -> str: ...


def literal(s: Spelling, value: Any, dtype: str) -> str:
    """A rule's value as SQL of the column's type (floats through text: exact, and any magnitude)."""
    if dtype == "string":
        return s.string(str(value))
    if dtype == "bool":
        return "TRUE" if value else "FALSE"
    if dtype == "float64":
        return f"CAST('{float(value)!r}' AS DOUBLE)"
    return f"CAST({int(value)} AS BIGINT)"


def violation_sql(s: Spelling, check: CheckSpec, clock: str) -> str:
    """SQL true exactly when a row fails `check` (NULL counts as passing)."""
    column = s.quote(check.column)
    x = s.epoch_us.format(ts=column) if check.dtype == "timestamp" and check.rule != "not_null" else column
    value = ""
    if check.rule == "one_of":
        value = ", ".join(literal(s, v, check.dtype) for v in check.value)
    elif check.rule in ("min", "max"):
        value = literal(s, check.value, "int64" if check.dtype == "timestamp" else check.dtype)
    elif check.rule == "future":
        value = literal(s, check.value, "int64")
    isnan = s.is_nan.format(x=x)
    nan = f" OR {isnan}" if check.dtype == "float64" else ""
    return SQL_RULES[check.rule].format(x=x, v=value, isnan=isnan, nan=nan, inf="CAST('Infinity' AS DOUBLE)",
                                        clock=clock)


def reason_sql(s: Spelling, contract: ContractSpec, clock: str,
               checks: Sequence[CheckSpec] | None = None) -> str:
    """SQL of a row's reason (`<rule>:<column>` of its first failing check), NULL for a valid row."""
    chosen = contract.checks if checks is None else checks
    whens = " ".join(f"WHEN {violation_sql(s, c, clock)} THEN {s.string(c.reason)}" for c in chosen)
    return f"CASE {whens} END"


# ---- Arrow ----


def violations(table: pa.Table, contract: ContractSpec, now_us: int) -> np.ndarray:
    """Per row of `table`, the index in `contract.checks` of its first failing check, -1 when valid.

    The table holds (at least) the contract's columns; other columns are ignored."""
    first = np.full(table.num_rows, -1, dtype=np.int32)
    for index, check in enumerate(contract.checks):
        failed = _fails(table[check.column], check, now_us) & (first < 0)
        first[failed] = index
    return first


def reason_strings(first: np.ndarray, contract: ContractSpec) -> list[str | None]:
    """The reasons of `violations`' answer, None for valid rows."""
    names = contract.reasons
    return [names[i] if i >= 0 else None for i in first.tolist()]


def counts(first: np.ndarray, contract: ContractSpec) -> dict[str, int]:
    """Refused rows per reason (only reasons that occurred)."""
    found = np.bincount(first[first >= 0], minlength=len(contract.checks))
    return {reason: int(n) for reason, n in zip(contract.reasons, found, strict=True) if n}


def _fails(column: pa.ChunkedArray | pa.Array, check: CheckSpec, now_us: int) -> np.ndarray:
    valid = _numpy_bool(pc.is_valid(column))
    if check.rule == "not_null":
        return ~valid
    if check.rule == "one_of":
        allowed = pa.array(list(check.value), column.type)
        member = _numpy_bool(pc.fill_null(pc.is_in(column, value_set=allowed), True))
        return np.asarray(valid & ~member, dtype=bool)
    values = _numbers(column, check.dtype)
    with np.errstate(invalid="ignore"):
        if check.rule == "finite":
            bad = ~np.isfinite(values)
        elif check.rule == "min":
            bad = values < check.value
        elif check.rule == "max":
            bad = values > check.value
        else:  # future
            bad = values > now_us + int(check.value)
        if check.dtype == "float64" and check.rule in ("min", "max"):
            bad |= np.isnan(values)
    return np.asarray(valid & bad, dtype=bool)


def _numbers(column: pa.ChunkedArray | pa.Array, dtype: str) -> np.ndarray:
    if dtype == "timestamp":
        raw = np.asarray(pc.fill_null(pc.cast(column, pa.int64()), 0))
        unit = getattr(column.type, "unit", "us")
        return raw // 1000 if unit == "ns" else raw * {"s": 1_000_000, "ms": 1000}.get(unit, 1)  # floor to µs
    if dtype == "float64":
        return np.asarray(pc.fill_null(pc.cast(column, pa.float64()), math.nan))
    return np.asarray(pc.fill_null(pc.cast(column, pa.int64()), 0))


def _numpy_bool(values: pa.ChunkedArray | pa.Array) -> np.ndarray:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    return np.asarray(values.to_numpy(zero_copy_only=False), dtype=bool)
