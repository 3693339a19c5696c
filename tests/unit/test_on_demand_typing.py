"""The on-demand view's typing: the fast paths give what pandas' general conversion gives, value for value and
dtype for dtype, and a view function that changes its input never reaches the caller's data."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd
import pytest

from quiver.catalog.errors import QuiverError
from quiver.catalog.ir import FieldSpec, OnDemandSpec
from quiver.compile.on_demand import input_frame, outputs, timestamps, typed, utc_micros
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
                   pd.Series([True, False], dtype="boolean"), np.array([True, False])):
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
    pd.testing.assert_series_equal(timestamps(1_700_000_000_123_456, 2),
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


# ----- python mode -----


def spec_of(udf: Any, mode: str = "python", outputs: tuple[tuple[str, str], ...] = (("y", "float64"),)) -> OnDemandSpec:
    return OnDemandSpec(name="v", request_sources=("tx",), request_fields=(("amount", "float64"), ("n", "int64")),
                        inputs=(("user_spend", "usual"),), input_dtypes=("float64",),
                        outputs=tuple(FieldSpec(name, name, dtype) for name, dtype in outputs), udf_name=udf.__name__,
                        udf_source="", udf=udf, mode=mode)


def test_a_python_mode_function_gets_plain_values_and_its_lists_are_typed_as_pandas_outputs_are() -> None:
    from datetime import UTC, datetime

    from quiver.compile.on_demand_modes import compute

    seen: dict[str, list[Any]] = {}

    def lists(columns: dict[str, list[Any]]) -> dict[str, list[Any]]:
        seen.update(columns)
        return {"y": [None if a is None or u is None else a / u for a, u in zip(columns["amount"], columns["usual"], strict=True)],
                "k": [None if n is None else n + 1 for n in columns["n"]], "inf": [float("inf"), 1, None]}

    def frame(f: pd.DataFrame) -> pd.DataFrame:
        return pd.DataFrame({"y": f["amount"] / f["usual"], "k": f["n"] + 1, "inf": [np.inf, 1.0, np.nan]})

    outputs_ = (("y", "float64"), ("k", "int64"), ("inf", "float64"))
    columns = {"amount": [2.0, None, 3.0], "n": [1, 2, None], "usual": pd.Series([4.0, 1.0, np.nan])}
    python = compute(spec_of(lists, outputs=outputs_), columns, 1_700_000_000_000_000, 3)
    assert seen["amount"] == [2.0, None, 3.0] and seen["n"] == [1, 2, None] and seen["usual"] == [4.0, 1.0, None]
    assert all(type(v) is int for v in seen["n"][:2])
    assert seen["request_ts"] == [datetime.fromtimestamp(1_700_000_000, UTC)] * 3
    twin = compute(spec_of(frame, "pandas", outputs_), columns, 1_700_000_000_000_000, 3)
    for name in ("y", "k", "inf"):
        pd.testing.assert_series_equal(python[name], twin[name], check_names=False)
    assert python["inf"].isna().tolist() == [True, False, True]  # ±inf is no value, in both modes


@pytest.mark.parametrize(("returned", "says"), [
    ([1.0], "returned list, not a dict of lists (mode='python')"),
    ({"z": [1.0]}, "did not return y"),
    ({"y": [1.0, 2.0]}, "returned 2 values of 'y' for 1 rows"),
    ({"y": 1.0}, "returned no list values of 'y' for 1 rows"),
    ({"y": ["a"]}, "v:y must hold float64 values"),
])
def test_a_python_mode_function_returning_the_wrong_shape_is_an_error_naming_the_view(returned: Any,
                                                                                      says: str) -> None:
    from quiver.compile.on_demand_modes import compute

    def bad(columns: dict[str, list[Any]]) -> Any:
        return returned

    with pytest.raises(QuiverError, match=re.escape(says)):
        compute(spec_of(bad), {"amount": [1.0], "n": [1], "usual": [2.0]}, 0, 1)


def test_the_mode_is_validated_stored_with_the_catalog_and_leaves_pandas_catalogs_hashes_alone() -> None:
    from quiver import Field, OnDemandFeatureView, RequestSource
    from quiver.catalog.errors import CatalogError
    from quiver.catalog.ir import spec_to_dict
    from quiver.catalog.loader import catalog_from_dict
    from quiver.catalog.validate import build_catalog

    tx = RequestSource("tx", schema=[Field("amount", "float64")])

    def double(columns: dict[str, list[Any]]) -> dict[str, list[Any]]:
        return {"twice": [None if a is None else 2 * a for a in columns["amount"]]}

    def view(mode: str) -> OnDemandFeatureView:
        return OnDemandFeatureView("ctx", schema=[Field("twice", "float64")], udf=double, request_sources=[tx],
                                   mode=mode)

    with pytest.raises(CatalogError, match="mode 'pyhton' is not one of 'pandas', 'python'"):
        build_catalog([tx, view("pyhton")])
    python, pandas_ = build_catalog([tx, view("python")]), build_catalog([tx, view("pandas")])
    assert "mode" not in spec_to_dict(pandas_.on_demand["ctx"])  # hashed as before modes existed
    assert python.content_hash != pandas_.content_hash
    stored = catalog_from_dict(python.to_dict())  # as a server rebuilds the applied version
    assert stored.on_demand["ctx"].mode == "python"
    assert stored.on_demand["ctx"].udf is not None and stored.on_demand["ctx"].udf({"amount": [1.5]}) == {"twice": [3.0]}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_online_python_path_gives_what_the_general_path_gives(seed: int) -> None:
    # Online, a python-mode view reads store columns and returns arrays without pandas where it can; the
    # general path (pandas columns in, typed pandas outputs) must give the same values and validity.
    from quiver.compile.on_demand import series_arrays
    from quiver.compile.on_demand_modes import input_lists, online_arrays, python_outputs

    rng = np.random.default_rng(seed)
    n = 40
    out_types = (("f", "float64"), ("i", "int64"), ("b", "bool"), ("s", "string"), ("t", "timestamp"))

    def everything(c: dict[str, list[Any]]) -> dict[str, list[Any]]:
        return {"f": [None if a is None or u is None else (a / u if u else float("inf") * (1 if a >= 0 else -1))
                      for a, u in zip(c["amount"], c["usual"], strict=True)],
                "i": [None if k is None else k * 2 for k in c["n"]],
                "b": [None if a is None else a > 1 for a in c["amount"]],
                "s": [None if s is None else s.upper() for s in c["channel"]],
                "t": [None if w is None else w for w in c["seen"]]}

    spec = OnDemandSpec(name="v", request_sources=("tx",), request_fields=(("amount", "float64"), ("n", "int64")),
                        inputs=(("a", "usual"), ("a", "channel"), ("a", "seen")),
                        input_dtypes=("float64", "string", "timestamp"),
                        outputs=tuple(FieldSpec(name, name, dtype) for name, dtype in out_types),
                        udf_name="everything", udf_source="", udf=everything, mode="python")
    valid = rng.random((3, n)) < 0.8
    store = {"usual": Column(rng.choice([0.0, -1.5, 2.0, np.nan], n), valid[0], "float64"),
             "channel": Column(np.array(rng.choice(["web", "", "shop"], n), dtype=object), valid[1], "string"),
             "seen": Column(rng.integers(0, 2_000_000_000_000_000, n), valid[2], "timestamp")}
    fields = {"amount": [None if rng.random() < 0.2 else float(rng.choice([0.0, 3.0, -2.0, 1e300])) for _ in range(n)],
              "n": [None if rng.random() < 0.2 else int(rng.integers(-5, 5)) for _ in range(n)]}
    at = rng.integers(1_600_000_000_000_000, 1_800_000_000_000_000, n)
    online = online_arrays(spec, {**fields, **store}, at, n)
    pandas_columns = {**fields, **{name: column_series(column) for name, column in store.items()}}
    general = python_outputs(spec, input_lists(spec, pandas_columns, pd.Series(utc_micros(at)), n), n)
    for name, dtype in out_types:
        values, valid_ = online[name]
        expected_values, expected_valid = series_arrays(general[name], dtype)
        assert valid_.tolist() == expected_valid.tolist(), name
        assert [v for v, ok in zip(values.tolist(), valid_, strict=True) if ok] == \
            [v for v, ok in zip(expected_values.tolist(), expected_valid, strict=True) if ok], name
    assert 0 < online["f"][1].sum() < n and 0 < online["t"][1].sum() < n  # values and gaps both exercised
