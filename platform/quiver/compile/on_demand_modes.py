"""Running an on-demand view in its mode (`compute`, every path's entry). In python mode the function takes
the columns as lists of plain Python values and returns a list per output, so a one-row request builds no
DataFrame; pandas mode is `quiver.compile.on_demand.input_frame` and `outputs`.

Inputs are what `input_frame` would hold, as Python values: float, int, bool, str and UTC `datetime`, None
where a value is missing (a NaN float is missing too). Outputs are typed as pandas-mode outputs are
(`quiver.compile.on_demand.typed`, ±inf is no value). Offline, `python_outputs` gives pandas columns; online,
`online_arrays` gives what the store holds, (values, valid), without pandas where the values are plain —
the same values either way (`tests/unit/test_on_demand_typing.py` compares the two paths).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd

from quiver.catalog.errors import QuiverError, RequestFieldError
from quiver.catalog.ir import OnDemandSpec
from quiver.catalog.on_demand import REQUEST_TS
from quiver.compile.on_demand import (
    NS_SAFE_US,
    call_udf,
    finite,
    input_frame,
    is_plain,
    outputs,
    plain_list,
    series_arrays,
    timestamps,
    typed,
)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def compute(spec: OnDemandSpec, columns: Mapping[str, Any], request_ts: Any, n: int) -> dict[str, pd.Series]:
    """The view's outputs for `n` rows from `columns` (request fields and input features by name) and the
    request times: its function called in the view's mode, inputs and outputs typed alike on every path."""
    if spec.mode == "python":
        return python_outputs(spec, input_lists(spec, columns, request_ts, n), n)
    return outputs(spec, input_frame(spec, columns, request_ts, n))


def input_lists(spec: OnDemandSpec, columns: Mapping[str, Any], request_ts: Any, n: int) -> dict[str, list[Any]]:
    """The function's input: request fields and input features by name, and `request_ts`, as plain lists.
    A column may be anything `typed` takes, or an online column (`.values`, `.valid`)."""
    named = [*(("request field", name, dtype) for name, dtype in spec.request_fields),
             *(("input", feature, dtype) for (_, feature), dtype in zip(spec.inputs, spec.input_dtypes, strict=True))]
    out: dict[str, list[Any]] = {}
    for what, name, dtype in named:
        if what == "request field" and name not in columns:
            raise RequestFieldError(f"on-demand view {spec.name!r} needs request field {name!r}")
        fast = _plain_input(columns[name], dtype)
        if fast is not None:
            out[name] = fast
            continue
        try:  # typed as pandas mode types it (its errors included), then as plain values
            out[name] = plain_values(typed(columns[name], dtype, f"{what} {name!r}"), dtype)
        except QuiverError as exc:
            if what == "request field":
                raise RequestFieldError(str(exc)) from None
            raise
    out[REQUEST_TS] = _plain_times(request_ts, n)
    return out


def _plain_input(values: Any, dtype: str) -> list[Any] | None:
    """The plain list of an online column or of a list of plain values; None when `typed` must decide."""
    if hasattr(values, "valid") and hasattr(values, "values"):
        listed = values.values.tolist()
        missing = (~values.valid).tolist()
        if dtype == "timestamp":
            return [None if gone else _EPOCH + timedelta(microseconds=int(us))
                    for us, gone in zip(listed, missing, strict=True)]
        if dtype == "float64":
            return [None if gone or v != v else float(v) for v, gone in zip(listed, missing, strict=True)]
        if dtype == "bool":
            return [None if gone else bool(v) for v, gone in zip(listed, missing, strict=True)]
        return [None if gone else v for v, gone in zip(listed, missing, strict=True)]
    if isinstance(values, list) and dtype in ("float64", "int64", "bool") and is_plain(values, dtype):
        if dtype == "float64":
            return [None if v is None or v != v else float(v) for v in values]
        return list(values)
    return None


def _plain_times(request_ts: Any, n: int) -> list[Any]:
    if isinstance(request_ts, int | np.integer):  # one time for every row (the usual online call)
        if -NS_SAFE_US <= request_ts <= NS_SAFE_US:
            return [_EPOCH + timedelta(microseconds=int(request_ts))] * n  # datetimes are immutable: one is enough
        request_ts = np.full(n, int(request_ts), dtype=np.int64)
    if isinstance(request_ts, np.ndarray) and request_ts.dtype.kind in "iu" and (
            request_ts.size == 0 or (request_ts.max() <= NS_SAFE_US and request_ts.min() >= -NS_SAFE_US)):
        return [_EPOCH + timedelta(microseconds=us) for us in request_ts.tolist()]
    return plain_values(timestamps(request_ts, n), "timestamp")


def plain_values(series: pd.Series, dtype: str) -> list[Any]:
    """A typed column as plain Python values, None where missing."""
    missing = series.isna().to_numpy()
    values: list[Any]
    if dtype == "float64":
        values = series.to_numpy(np.float64).tolist()
    elif dtype == "int64":
        values = series.to_numpy(np.int64, na_value=0).tolist()
    elif dtype == "bool":
        values = series.to_numpy(bool, na_value=False).tolist()
    elif dtype == "timestamp":
        values = [None if gone else t.to_pydatetime() for t, gone in zip(series, missing, strict=True)]
    else:
        values = series.tolist()
    if missing.any():
        return [None if gone else v for v, gone in zip(values, missing.tolist(), strict=True)]
    return values


def _call(spec: OnDemandSpec, columns: dict[str, list[Any]], n: int) -> dict[str, list[Any]]:
    """Run the function on `columns` (handed over); its lists, checked for shape (QuiverError naming the view)."""
    result = call_udf(spec, columns)
    if not isinstance(result, Mapping):
        raise QuiverError(f"on-demand view {spec.name!r}: its function returned {type(result).__name__}, not a "
                          f"dict of lists (mode='python')")
    missing = [f.name for f in spec.outputs if f.name not in result]
    if missing:
        raise QuiverError(f"on-demand view {spec.name!r}: its function did not return {', '.join(missing)}")
    out: dict[str, list[Any]] = {}
    for f in spec.outputs:
        values = result[f.name]
        if isinstance(values, str | bytes) or not hasattr(values, "__len__") or len(values) != n:
            size = len(values) if hasattr(values, "__len__") and not isinstance(values, str | bytes) else "no list"
            raise QuiverError(f"on-demand view {spec.name!r}: its function returned {size} values of "
                              f"{f.name!r} for {n} rows")
        out[f.name] = values if isinstance(values, list) else list(values)
    return out


def python_outputs(spec: OnDemandSpec, columns: dict[str, list[Any]], n: int) -> dict[str, pd.Series]:
    """The function's outputs as pandas columns, typed as `quiver.compile.on_demand.outputs` types them."""
    return {name: finite(typed(values, spec.feature_dtype(name), f"{spec.name}:{name}"), spec.feature_dtype(name))
            for name, values in _call(spec, columns, n).items()}


def online_arrays(spec: OnDemandSpec, columns: Mapping[str, Any], request_ts: Any,
                  n: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The view's outputs as the online store holds them, (values, valid): `python_outputs` then
    `series_arrays`, without pandas for lists of plain numbers and booleans."""
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name, values in _call(spec, input_lists(spec, columns, request_ts, n), n).items():
        dtype = spec.feature_dtype(name)
        array = plain_list(values, dtype) if dtype in ("float64", "int64", "bool") else None
        if array is None:
            out[name] = series_arrays(finite(typed(values, dtype, f"{spec.name}:{name}"), dtype), dtype)
        elif dtype == "float64":
            valid = np.isfinite(array)  # NaN (None) and ±inf are no values
            if not valid.all():
                array[~valid] = np.nan
            out[name] = array, valid
        else:
            out[name] = array, np.fromiter((v is not None for v in values), bool, len(values))
    return out
