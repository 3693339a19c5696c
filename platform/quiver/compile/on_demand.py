"""Running on-demand views: the one implementation behind training sets, online reads and `/predict`.

Both sides build the function's input frame with `input_frame` — request fields and input features typed by
their declared dtypes, nulls as pandas nulls, `request_ts` as UTC timestamps — call the user's function, and
type its outputs with `outputs`. So online and offline values can differ only if the inputs do:

| dtype | column type | null |
|---|---|---|
| float64 | float64 | NaN |
| int64 | Int64 (nullable) | <NA> |
| bool | boolean (nullable) | <NA> |
| string | object | None |
| timestamp | datetime64[ns, UTC] | NaT |
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from quiver.catalog.errors import QuiverError, RequestFieldError
from quiver.catalog.ir import ContractSpec, OnDemandSpec
from quiver.catalog.on_demand import REQUEST_TS
from quiver.compile.contracts import counts as contract_counts
from quiver.compile.contracts import violations

_PANDAS = {"float64": "float64", "int64": "Int64", "bool": "boolean", "string": "object",
           "timestamp": "datetime64[ns, UTC]"}


def typed(values: Any, dtype: str, what: str) -> pd.Series:
    """`values` (list, numpy, pandas) as the pandas column of `dtype` (see the module docstring)."""
    series = values.reset_index(drop=True) if isinstance(values, pd.Series) else pd.Series(list(values)
                                                                                           if not isinstance(values, np.ndarray) else values)
    try:
        if dtype == "timestamp":
            return pd.to_datetime(series, utc=True)
        if dtype == "string":
            return series.astype(object).where(series.notna(), None)
        if dtype == "float64":
            return pd.to_numeric(series, errors="raise").astype("float64")
        if dtype == "int64":
            numbers = pd.to_numeric(series, errors="raise")
            if numbers.dtype.kind == "f" and not (numbers.dropna() % 1 == 0).all():
                raise ValueError("not whole numbers")
            return numbers.astype("Int64")
        return series.astype("boolean")
    except (ValueError, TypeError) as exc:
        raise QuiverError(f"{what} must hold {dtype} values ({exc})") from None


def input_frame(spec: OnDemandSpec, columns: Mapping[str, Any], request_ts: Any, n: int) -> pd.DataFrame:
    """The function's input: request fields and input features (by feature name) from `columns`, typed by
    their declared dtypes, plus `request_ts` (epoch µs or datetimes, one per row or one for all)."""
    frame: dict[str, pd.Series] = {}
    for name, dtype in spec.request_fields:
        if name not in columns:
            raise RequestFieldError(f"on-demand view {spec.name!r} needs request field {name!r}")
        try:
            frame[name] = typed(columns[name], dtype, f"request field {name!r}")
        except QuiverError as exc:
            raise RequestFieldError(str(exc)) from None
    for (_, feature), dtype in zip(spec.inputs, spec.input_dtypes, strict=True):
        frame[feature] = typed(columns[feature], dtype, f"input {feature!r}")
    frame[REQUEST_TS] = _timestamps(request_ts, n)
    return pd.DataFrame(frame, index=pd.RangeIndex(n))


def _timestamps(values: Any, n: int) -> pd.Series:
    if isinstance(values, int | np.integer):
        return pd.Series(pd.to_datetime(np.full(n, int(values), dtype=np.int64), unit="us", utc=True))
    if isinstance(values, np.ndarray) and values.dtype.kind in "iu":
        return pd.Series(pd.to_datetime(values.astype(np.int64), unit="us", utc=True))
    return pd.to_datetime(pd.Series(values).reset_index(drop=True), utc=True)


def outputs(spec: OnDemandSpec, frame: pd.DataFrame) -> dict[str, pd.Series]:
    """Run the view's function on `frame` and type what it returns; QuiverError naming the view otherwise."""
    if spec.udf is None:
        raise QuiverError(f"on-demand view {spec.name!r} has no function loaded")
    try:
        result = spec.udf(frame.copy())
    except Exception as exc:
        raise QuiverError(f"on-demand view {spec.name!r}: its function raised {type(exc).__name__}: {exc}") from exc
    if not isinstance(result, pd.DataFrame):
        raise QuiverError(f"on-demand view {spec.name!r}: its function returned {type(result).__name__}, not a "
                          f"DataFrame")
    if len(result) != len(frame):
        raise QuiverError(f"on-demand view {spec.name!r}: its function returned {len(result)} rows for "
                          f"{len(frame)}")
    missing = [f.name for f in spec.outputs if f.name not in result.columns]
    if missing:
        raise QuiverError(f"on-demand view {spec.name!r}: its function did not return {', '.join(missing)}")
    out: dict[str, pd.Series] = {}
    for f in spec.outputs:
        column = typed(result[f.name].reset_index(drop=True), f.dtype, f"{spec.name}:{f.name}")
        if f.dtype == "float64":
            column = column.where(np.isfinite(column.to_numpy(np.float64)), np.nan)  # ±inf are no values
        out[f.name] = column
    return out


_JSON_TYPES: dict[str, tuple[type, ...]] = {"float64": (int, float), "int64": (int,), "bool": (bool,),
                                            "string": (str,), "timestamp": (str,)}


FieldPath = Callable[[int, str], str]
"""Where the value of request field `name` for row `i` sat in what the client sent, for error messages."""


def row_field(row: int, name: str) -> str:
    """`rows[i].fields.name`: a /predict row's field."""
    return f"rows[{row}].fields.{name}"


def request_field(row: int, name: str) -> str:
    """`request.name[i]`: a value of a request column (the feature server's `request`, the SDK's `request=`)."""
    return f"request.{name}[{row}]"


def check_request_rows(rows: Sequence[Mapping[str, Any]], request_fields: Mapping[str, str],
                       path: FieldPath = row_field) -> None:
    """Request `fields` as a client sent them (JSON values, one mapping per row) against the declared fields:
    every declared field present (null is a value: unknown), none unknown, each of its type (no strings for
    numbers, no booleans for numbers). RequestFieldError names the first problem where the client sent it."""
    for index, row in enumerate(rows):
        unknown = [k for k in row if k not in request_fields]
        if unknown:
            known = ", ".join(request_fields) or "none"
            raise RequestFieldError(f"{path(index, unknown[0])}: unknown field (the features read: {known})")
        for name, dtype in request_fields.items():
            if name not in row:
                raise RequestFieldError(f"{path(index, name)}: missing (a {dtype} the features need; "
                                        f"send null if it is unknown)")
            value = row[name]
            wanted = _JSON_TYPES[dtype]
            wrong_bool = isinstance(value, bool) and bool not in wanted
            if value is not None and (wrong_bool or not isinstance(value, wanted)):
                raise RequestFieldError(f"{path(index, name)}: expected {dtype}, got "
                                        f"{type(value).__name__} {value!r}"[:300])


def pandas_dtype(dtype: str) -> str:
    """The pandas dtype a column of `dtype` has in training sets and input frames."""
    return _PANDAS[dtype]


@dataclass(frozen=True)
class Refusal:
    """Request rows failing their request sources' contracts: how many per (source, reason), and the first."""

    counts: dict[tuple[str, str], int]
    first: str  # "<where the value was sent>: …", e.g. "rows[i].fields.<column>: …" (empty: nothing refused)


def check_request_contracts(fields: Mapping[str, Sequence[Any]], dtypes: Mapping[str, str],
                            contracts: Sequence[tuple[str, ContractSpec]], path: FieldPath = row_field) -> Refusal:
    """Request fields (one value per row) against their request sources' contracts, by the rules every other
    path applies (`quiver.compile.contracts`; the clock is now). The caller counts the refusals and
    refuses the request, naming the first as `path` spells it."""
    counts: dict[tuple[str, str], int] = {}
    first = ""
    now_us = time.time_ns() // 1000
    for source, contract in contracts:
        try:
            table = pa.table({c: _arrow_column(fields[c], dtypes[c]) for c in contract.columns})
        except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError, TypeError) as exc:
            raise RequestFieldError(f"request fields of {source!r} do not have their declared types: {exc}"[:300]) \
                from None
        failed = violations(table, contract, now_us)
        for reason, n in contract_counts(failed, contract).items():
            counts[(source, reason)] = n
        bad = np.flatnonzero(failed >= 0)
        if len(bad) and not first:
            row = int(bad[0])
            check = contract.checks[int(failed[row])]
            first = (f"{path(row, check.column)}: refused by the contract of {source!r} "
                     f"({check.reason}; value {fields[check.column][row]!r})")[:300]
    return Refusal(counts, first)


def _arrow_column(values: Sequence[Any], dtype: str) -> pa.Array:
    if dtype == "timestamp":
        return pa.array(pd.to_datetime(pd.Series(list(values), dtype=object), utc=True, format="ISO8601"))
    return pa.array(list(values), _ARROW_TYPES[dtype])


_ARROW_TYPES = {"float64": pa.float64(), "int64": pa.int64(), "bool": pa.bool_(), "string": pa.string()}
