"""DuckDB target: the dialect table. Everything else is the shared compiler in `compile/sql.py`.

DuckDB compares structs field by field, so `max(struct_pack(t := ts, v := x))` is the newest value and,
on equal times, the greatest one. Runners set `TimeZone = 'UTC'`.
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
    epoch_us="epoch_us(CAST({ts} AS TIMESTAMPTZ))",  # also reads TIMESTAMP_NS, naive TIMESTAMP, DATE
    timestamp_from_us="make_timestamptz({us})",
    date_from_us="CAST(make_timestamp({us}) AS DATE)",
    struct="struct_pack(t := {t}, v := {v})",
    field="struct_extract({s}, '{f}')",
    order_by="ORDER BY {cols}",
)


def compile_duckdb(view: ViewSpec) -> dict[str, str]:
    """Every DuckDB query of `view`, by kind."""
    return compile_view(DUCKDB, view)
