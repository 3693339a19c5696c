"""Catalog IR → engines: one shared SQL compiler (`sql`) over the catalog's table of aggregation fns
(`quiver.catalog.aggregations`), and one thin module per target holding only its dialect table (`duckdb`,
`spark`) or its streaming job (`flink`).

`dialect_for` lives here, not in `sql`, so the shared compiler never imports its own dialects (the dialect
modules import `sql`; the arrow points one way).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # typing only: importing quiver.compile must not load any compiler module
    from quiver.compile.sql import Dialect

SQL_TARGETS = ("duckdb", "spark")


def dialect_for(target: str) -> Dialect:
    """The SQL dialect of a target name ('duckdb' or 'spark')."""
    if target == "duckdb":
        from quiver.compile.duckdb import DUCKDB

        return DUCKDB
    if target == "spark":
        from quiver.compile.spark import SPARK

        return SPARK
    raise ValueError(f"unknown SQL target {target!r}; use duckdb or spark")
