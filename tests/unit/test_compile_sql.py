"""The SQL compiler: its tables cover the fn table, dialects quote, and merge/finalize mean what the
docstring of catalog/aggregations.py says (run on DuckDB, the embedded engine)."""

from __future__ import annotations

import math
from typing import Any

import duckdb
import pytest

from quiver.catalog.aggregations import AGG_FUNCTIONS, PARTIALS, PartialColumn, view_partials
from quiver.catalog.definitions import Location
from quiver.catalog.errors import QuiverError
from quiver.catalog.ir import AggSpec, FieldSpec, ViewSpec
from quiver.compile import dialect_for
from quiver.compile.duckdb import DUCKDB, compile_duckdb
from quiver.compile.spark import SPARK, compile_spark
from quiver.compile.sql import (
    DATE_COLUMN,
    EVENT_TS,
    FINALIZE,
    MERGE_OPS,
    TILE_OPS,
    compile_last_values,
    compile_tiles,
    finalize_expr,
    merge_exprs,
    tile_exprs,
)
from quiver.offline import layout


def _agg(column: str, fn: str, dtype: str = "float64", window_us: int = 3_600_000_000) -> AggSpec:
    return AggSpec(f"{column}_{fn}", column, fn, window_us, dtype)


def _view(aggs: tuple[AggSpec, ...] = (), fields: tuple[FieldSpec, ...] = (),
          keys: tuple[tuple[str, str], ...] = (("user_id", "int64"),)) -> ViewSpec:
    return ViewSpec("v", ("user",), keys, "events", "ts", fields, aggs, None,
                    300_000_000 if aggs else None, location=Location("defs.py", 3))


def test_sql_tables_cover_every_op_of_the_fn_table() -> None:
    assert set(TILE_OPS) == {p.tile_op for p in PARTIALS.values()}
    assert set(MERGE_OPS) == {p.merge_op for p in PARTIALS.values()}
    assert set(FINALIZE) == {fn.finalize for fn in AGG_FUNCTIONS.values()}


def test_dialects_quote_identifiers_and_are_found_by_name() -> None:
    assert DUCKDB.quote('a"b') == '"a""b"'
    assert SPARK.quote("a`b") == "`a``b`"
    assert dialect_for("duckdb") is DUCKDB and dialect_for("spark") is SPARK
    with pytest.raises(ValueError, match="flink"):
        dialect_for("flink")


def test_compiler_names_match_the_offline_layout() -> None:
    assert EVENT_TS == layout.EVENT_TS
    assert DATE_COLUMN.startswith("__")  # never a user column (the validator's identifiers may not clash)


def test_bool_inputs_are_cast_for_numeric_partials() -> None:
    exprs = dict(tile_exprs(DUCKDB, _view((_agg("flag", "mean", "bool"), _agg("flag", "max", "bool"))), "t"))
    assert exprs["flag__sum"] == 'sum(CAST("flag" AS DOUBLE))'
    assert exprs["flag__max"] == 'max(CAST("flag" AS BIGINT))'
    assert exprs["flag__cnt"] == 'count("flag")'


def test_reserved_double_underscore_names_are_refused() -> None:
    view = _view((_agg("__ts_us", "count", "int64"),))
    with pytest.raises(QuiverError, match=r"defs\.py:3.*__ts_us"):
        compile_tiles(DUCKDB, view)


_COMPILE_IN_A_FRESH_PROCESS = """
import json, sys
sys.path.insert(0, sys.argv[1])
from tests.unit.test_compile_sql import _agg, _view
from quiver.compile.duckdb import compile_duckdb
from quiver.compile.spark import compile_spark
view = _view((_agg("amount", "sum"), _agg("amount", "last"), _agg("qty", "stddev", "int64"), _agg("amount", "max")))
print(json.dumps({"duckdb": compile_duckdb(view), "spark": compile_spark(view)}))
"""


def test_compile_is_deterministic_across_processes() -> None:
    """The same view compiles to the same SQL in processes with other string-hash seeds (no set or hash
    order leaks into the SQL), so goldens and `quiver compile` output are stable."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = str(Path(__file__).resolve().parents[2])
    outputs = []
    for seed in ("1", "2", "3"):
        out = subprocess.run([sys.executable, "-c", _COMPILE_IN_A_FRESH_PROCESS, repo], capture_output=True,
                             text=True, env={**os.environ, "PYTHONHASHSEED": seed}, timeout=120, check=True)
        outputs.append(json.loads(out.stdout))
    view = _view((_agg("amount", "sum"), _agg("amount", "last"), _agg("qty", "stddev", "int64"), _agg("amount", "max")))
    here = {"duckdb": compile_duckdb(view), "spark": compile_spark(view)}
    assert all(o == here for o in outputs)
    assert '"qty__sumsq"' in here["duckdb"]["tiles"] and "`amount__last_ts`" in here["spark"]["tiles"]


def test_compile_is_kind_specific() -> None:
    agg_view = _view((_agg("amount", "sum"), _agg("amount", "last")))
    last_view = _view(fields=(FieldSpec("amount", "amount", "float64"),))
    assert set(compile_duckdb(agg_view)) == {"tiles", "quarantine", "stats"}
    assert set(compile_spark(last_view)) == {"last_values", "quarantine", "stats"}
    with pytest.raises(ValueError):
        compile_last_values(DUCKDB, agg_view)
    with pytest.raises(ValueError):
        compile_tiles(DUCKDB, last_view)


# ---- merge and finalize, executed ----


def _partial(column: str, kind: str, dtype: str = "float64") -> PartialColumn:
    return next(p for p in view_partials([(column, "stddev", dtype), (column, "last", dtype),
                                          (column, "min", dtype), (column, "max", dtype)])
                if p.partial.kind == kind)


def _merge(rows: list[tuple[Any, ...]], columns: str, exprs: list[tuple[str, str]]) -> dict[str, Any]:
    con = duckdb.connect()
    values = ", ".join("(" + ", ".join("NULL" if v is None else repr(v) for v in row) + ")" for row in rows)
    select = ", ".join(f"{sql} AS {DUCKDB.quote(name)}" for name, sql in exprs)
    cursor = con.execute(f"SELECT {select} FROM (VALUES {values}) AS t({columns})")
    names = [d[0] for d in cursor.description or ()]
    return dict(zip(names, cursor.fetchone() or (), strict=True))


def test_merge_last_takes_newest_then_greatest_and_honours_the_window_condition() -> None:
    rows = [(10, 5.0, 0), (10, 7.0, 0), (None, None, 0), (30, 1.0, 99)]  # (last_ts, last, tile)
    exprs = merge_exprs(DUCKDB, _partial("x", "last"), when='"tile" < 50')
    got = _merge(rows, '"x__last_ts", "x__last", "tile"', exprs)
    assert got == {"x__last": 7.0, "x__last_ts": 10}
    assert _merge(rows, '"x__last_ts", "x__last", "tile"', merge_exprs(DUCKDB, _partial("x", "last"))) == {
        "x__last": 1.0, "x__last_ts": 30}


def test_merge_sum_of_counts_keeps_bigint() -> None:
    exprs = merge_exprs(DUCKDB, _partial("x", "cnt"))
    con = duckdb.connect()
    sql = f"SELECT {exprs[0][1]} AS c FROM (VALUES (2::BIGINT), (3::BIGINT)) AS t(x__cnt)"
    assert con.execute(f"SELECT typeof(c), c FROM ({sql})").fetchone() == ("BIGINT", 5)


def _finalize(fn: str, partials: dict[str, Any], dtype: str = "float64") -> Any:
    con = duckdb.connect()
    sql = finalize_expr(DUCKDB, _agg("x", fn, dtype))
    cols = ", ".join(f"{'NULL' if v is None else repr(v)}::{t} AS {DUCKDB.quote('x__' + k)}"
                     for k, (v, t) in partials.items())
    row = con.execute(f"SELECT {sql} FROM (SELECT {cols})").fetchone()
    assert row is not None
    return row[0]


EMPTY = {"cnt": (None, "BIGINT"), "sum": (None, "DOUBLE"), "sumsq": (None, "DOUBLE"), "min": (None, "DOUBLE"),
         "max": (None, "DOUBLE"), "last": (None, "DOUBLE")}


@pytest.mark.parametrize(("fn", "expected"), [("count", 0), ("sum", 0), ("mean", None), ("min", None),
                                              ("max", None), ("last", None), ("stddev", None)])
def test_finalize_of_an_empty_window_gives_the_identity(fn: str, expected: Any) -> None:
    assert _finalize(fn, EMPTY) == expected


def test_finalize_values() -> None:
    three = {"cnt": (3, "BIGINT"), "sum": (6.0, "DOUBLE"), "sumsq": (14.0, "DOUBLE"),
             "min": (1.0, "DOUBLE"), "max": (3.0, "DOUBLE"), "last": (2.0, "DOUBLE")}
    assert _finalize("mean", three) == 2.0
    assert _finalize("stddev", three) == 1.0
    assert (_finalize("min", three), _finalize("max", three), _finalize("last", three)) == (1.0, 3.0, 2.0)
    one = {**three, "cnt": (1, "BIGINT"), "sum": (2.0, "DOUBLE"), "sumsq": (4.0, "DOUBLE")}
    assert _finalize("stddev", one) is None  # sample stddev needs two values


def test_finalize_stddev_clamps_rounding_below_zero() -> None:
    values = [0.1] * 3
    partials = {"cnt": (3, "BIGINT"), "sum": (sum(values), "DOUBLE"), "sumsq": (sum(v * v for v in values), "DOUBLE")}
    variance = (partials["sumsq"][0] - partials["sum"][0] ** 2 / 3) / 2
    assert variance < 0  # the case the clamp exists for
    got = _finalize("stddev", partials)
    assert got == 0.0 and not math.isnan(got)


def test_finalize_of_bool_last_is_bool_and_bool_max_is_int() -> None:
    partials = {"cnt": (2, "BIGINT"), "last": (1, "BIGINT"), "max": (1, "BIGINT")}
    assert _finalize("last", partials, "bool") is True
    assert _finalize("max", partials, "bool") == 1
