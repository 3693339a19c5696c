"""Spark SQL target: the dialect table. Everything else is the shared compiler in `compile/sql.py`.

Spark orders structs field by field too, so `max(named_struct('t', ts, 'v', x))` picks the same `last` as
DuckDB, and NaN is the greatest double in Spark's ordering as in DuckDB's (the project's rule). Results are clustered by date and sorted within each task instead of globally sorted: a global
ORDER BY would sample the whole input first, and each date's rows still land in one sorted file.
Sessions use `spark.sql.session.timeZone = UTC`.
"""

from __future__ import annotations

from typing import Final

from quiver.catalog.ir import ViewSpec
from quiver.compile.sql import Dialect, compile_view

SPARK: Final = Dialect(
    name="spark",
    quote_char="`",
    types={"int64": "BIGINT", "float64": "DOUBLE", "string": "STRING", "bool": "BOOLEAN",
           "timestamp": "TIMESTAMP"},
    param=":{name}",
    epoch_us="unix_micros(CAST({ts} AS TIMESTAMP))",  # also reads TIMESTAMP_NTZ and DATE
    timestamp_from_us="timestamp_micros({us})",
    date_from_us="to_date(timestamp_micros({us}))",
    struct="named_struct('t', {t}, 'v', {v})",
    field="{s}.{f}",
    order_by="DISTRIBUTE BY {date} SORT BY {cols}",
    backslash_escapes=True,
)


def compile_spark(view: ViewSpec) -> dict[str, str]:
    """Every Spark SQL query of `view`, by kind."""
    return compile_view(SPARK, view)
