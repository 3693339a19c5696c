"""DuckDB target: the dialect table. Everything else is the shared compiler in `compile/sql.py`.

DuckDB compares structs field by field, so `max(struct_pack(t := ts, v := x))` is the newest value and,
on equal times, the greatest one. NaN is a value and the greatest one in DuckDB's ordering (min skips it
unless every value is NaN, max and `last` ties pick it): the project's rule. Runners set `TimeZone = 'UTC'`.
"""

from __future__ import annotations

from typing import Final

from quiver.catalog.ir import ViewSpec
from quiver.compile.sql import Dialect, compile_view

DUCKDB: Final = Dialect(
    name="duckdb",
    quote_char='"',
    types={"int64": "BIGINT", "float64": "DOUBLE", "string": "VARCHAR", "bool": "BOOLEAN",
           "timestamp": "TIMESTAMPTZ"},
    param="${name}",
    # Via TIMESTAMP_NS: it reads TIMESTAMPTZ, naive TIMESTAMP, DATE and ns times alike, and epoch_us floors
    # nanoseconds (a cast to TIMESTAMPTZ would round them to the nearest µs; the catalog's rule is floor).
    epoch_us="epoch_us(CAST({ts} AS TIMESTAMP_NS))",
    timestamp_from_us="make_timestamptz({us})",
    date_from_us="CAST(make_timestamp({us}) AS DATE)",
    struct="struct_pack(t := {t}, v := {v})",
    field="struct_extract({s}, '{f}')",
    order_by="ORDER BY {cols}",
)


def compile_duckdb(view: ViewSpec) -> dict[str, str]:
    """Every DuckDB query of `view`, by kind."""
    return compile_view(DUCKDB, view)
