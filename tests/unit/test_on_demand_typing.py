"""The on-demand view's typing: the fast paths give what pandas' general conversion gives, value for value and
dtype for dtype, and a view function that changes its input never reaches the caller's data."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

from quiver.catalog.errors import QuiverError
from quiver.catalog.ir import FieldSpec, OnDemandSpec
from quiver.compile.on_demand import _timestamps, input_frame, outputs, typed, utc_micros
from quiver.online.base import Column
from quiver.serving.store import column_series, series_column


def general(values: Any, dtype: str) -> pd.Series:
    """The general path alone: the same values as an object column, which no fast path takes."""
    listed = list(values) if not isinstance(values, pd.Series) else values.tolist()
    return typed(pd.Series(listed, dtype=object), dtype, "x")


CASES: list[tuple[Any, str]] = [
    ([1.5, 2, None, float("nan"), -0.0], "float64"),
    ([3, 4, 5], "float64"),
    (np.array([1.25, np.nan]), "float64"),
    (np.array([7, 8], dtype=np.int32), "float64"),
    (np.array([2**40, -3]), "int64"),
    (np.array([1, 2], dtype=np.uint8), "int64"),
    (pd.Series([1.0, 2.0], index=[5, 9]), "float64"),
    (pd.Series([1, None], dtype="Int64"), "int64"),
    (pd.Series([3, 4], dtype=np.int32), "int64"),
    ([True, None, False], "bool"),
    (np.array([True, False]), "bool"),
    (pd.Series([True, None], dtype="boolean"), "bool"),
    (pd.Series([False, True]), "bool"),
]


@pytest.mark.parametrize(("values", "dtype"), CASES)
def test_the_fast_paths_type_as_the_general_path_does(values: Any, dtype: str) -> None:
    fast, slow = typed(values, dtype, "x"), general(values, dtype)
    assert fast.dtype == slow.dtype, (fast.dtype, slow.dtype)
    assert isinstance(fast.index, pd.RangeIndex) and fast.index.start == 0
    pd.testing.assert_series_equal(fast, slow, check_exact=True)


def test_the_fast_paths_leave_what_they_cannot_type_to_the_general_path() -> None:
    assert typed([1, True], "float64", "x").tolist() == [1.0, 1.0]  # a bool among numbers: pandas' rule
    with pytest.raises(QuiverError, match="x must hold float64 values"):
        typed(["1.5", "abc"], "float64", "x")
    with pytest.raises(QuiverError, match="not whole numbers"):
        typed(np.array([1.5]), "int64", "x")
    assert typed(np.array([2**64 - 1], dtype=np.uint64), "float64", "x")[0] == float(2**64 - 1)


def test_typed_columns_never_share_data_with_what_they_were_made_of() -> None:
    for values in (np.array([1.0, 2.0]), pd.Series([1.0, 2.0]), pd.Series([1, 2], dtype="Int64"),
                   pd.Series([True, False], dtype="boolean"), np.array([True])):
        column = typed(values, {"f": "float64", "i": "int64", "b": "bool"}[values.dtype.kind if
                                                                         values.dtype.kind in "fb" else "i"], "x")
        before = values.copy()
        column.iloc[0] = column.iloc[-1] if column.dtype != "float64" else -99.0
        assert (values == before).all() if isinstance(values, np.ndarray) else values.equals(before)


def test_a_function_that_changes_its_input_does_not_change_the_callers_columns() -> None:
    def scribble(frame: pd.DataFrame) -> pd.DataFrame:
        frame["amount"] *= 100  # changes the frame it was given
        frame.loc[0, "amount_mean_7d"] = -1.0
        return pd.DataFrame({"doubled": frame["amount"] * 2})

    spec = OnDemandSpec(name="v", request_sources=("tx",), request_fields=(("amount", "float64"),),
                        inputs=(("user_spend", "amount_mean_7d"),), input_dtypes=("float64",),
                        outputs=(FieldSpec("doubled", "doubled", "float64"),), udf_name="scribble", udf_source="", udf=scribble)
    amount, usual = np.array([1.0, 2.0]), pd.Series([5.0, 6.0])
    result = outputs(spec, input_frame(spec, {"amount": amount, "amount_mean_7d": usual}, 0, 2))
    assert result["doubled"].tolist() == [200.0, 400.0]
    assert amount.tolist() == [1.0, 2.0] and usual.tolist() == [5.0, 6.0]


def test_epoch_microseconds_are_the_timestamps_pandas_parses() -> None:
    micros = np.array([0, 1_700_000_000_123_456, -86_400_000_001])
    expected = pd.Series(pd.to_datetime(micros, unit="us", utc=True))
    pd.testing.assert_series_equal(utc_micros(micros), expected)
    pd.testing.assert_series_equal(_timestamps(1_700_000_000_123_456, 2),
                                   pd.Series(pd.to_datetime([1_700_000_000_123_456] * 2, unit="us", utc=True)))
    with pytest.raises(pd.errors.OutOfBoundsDatetime):
        utc_micros(np.array([np.iinfo(np.int64).max // 10]))


@pytest.mark.parametrize("dtype", ["float64", "int64", "bool", "string", "timestamp"])
def test_online_columns_and_pandas_columns_round_trip(dtype: str) -> None:
    values = {"float64": np.array([1.5, 0.0, 3.0]), "int64": np.array([4, 0, -2]),
              "bool": np.array([True, False, True]), "string": np.array(["a", "", "c"], dtype=object),
              "timestamp": np.array([1_700_000_000_000_000, 0, 5])}[dtype]
    column = Column(values, np.array([True, False, True]), dtype)
    series = column_series(column)
    assert str(series.dtype) == {"float64": "float64", "int64": "Int64", "bool": "boolean", "string": "object",
                                 "timestamp": "datetime64[ns, UTC]"}[dtype]
    assert series.isna().tolist() == [False, True, False]
    back = series_column(series, dtype)
    assert back.valid.tolist() == [True, False, True]
    assert back.values[0] == values[0] and back.values[2] == values[2]
