"""Batch engines behind one small interface: register sources, run a query, write its rows by date.

`BatchEngine` is all the backfill needs; DuckDB (embedded) and Spark (local or a standalone master) each
implement it with their own Parquet writer. Engine libraries are imported only when an engine is opened.
The one SparkSession of the process is made by `spark_session`, so its settings live in one place.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa

from quiver.compile.sql import DATE_COLUMN, Dialect


class BatchEngine(Protocol):
    """What a backfill needs from an engine."""

    name: str
    dialect: Dialect

    def register_source(self, name: str, files: Sequence[Path], union_by_name: bool) -> None:
        """Expose Parquet `files` as a table called `name` to later queries."""

    def write_by_date(self, sql: str, params: Mapping[str, int], out_dir: Path) -> None:
        """Run `sql` and write its rows with the engine's own writer as Parquet under
        `out_dir/__date=YYYY-MM-DD/`, one folder per value of the `__date` column (left out of the files).
        `out_dir` must not exist yet."""

    def fetch(self, sql: str, params: Mapping[str, int]) -> pa.Table:
        """Run a query with a small result and return it as Arrow."""

    def close(self) -> None:
        """Release what the engine holds (a DuckDB connection; the Spark session stays for reuse)."""


class DuckDBEngine:
    """Embedded DuckDB: one in-memory connection per backfill, UTC session time zone."""

    name = "duckdb"

    def __init__(self, threads: int | None = None, memory_limit: str | None = None):
        import duckdb

        from quiver.compile.duckdb import DUCKDB

        self.dialect = DUCKDB
        self.connection = duckdb.connect(":memory:")
        self.connection.execute("SET TimeZone = 'UTC'")
        if threads:
            self.connection.execute(f"SET threads = {int(threads)}")
        if memory_limit:
            self.connection.execute(f"SET memory_limit = {_literal(memory_limit)}")

    def register_source(self, name: str, files: Sequence[Path], union_by_name: bool) -> None:
        listing = ", ".join(_literal(str(f)) for f in files)
        self.connection.execute(
            f"CREATE OR REPLACE VIEW {self.dialect.quote(name)} AS SELECT * FROM read_parquet([{listing}], "
            f"hive_partitioning = false, union_by_name = {str(union_by_name).lower()})")

    def write_by_date(self, sql: str, params: Mapping[str, int], out_dir: Path) -> None:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        self.connection.execute(
            f"COPY (\n{sql}) TO {_literal(str(out_dir))} "
            f"(FORMAT parquet, PARTITION_BY ({self.dialect.quote(DATE_COLUMN)}))", dict(params))

    def fetch(self, sql: str, params: Mapping[str, int]) -> pa.Table:
        table: pa.Table = self.connection.sql(sql, params=dict(params)).to_arrow_table()
        return table

    def close(self) -> None:
        self.connection.close()


class SparkEngine:
    """Spark SQL on the process's session (`spark_session(master)`); writes with Spark's Parquet writer."""

    name = "spark"

    def __init__(self, master: str = "local[2]"):
        from quiver.compile.spark import SPARK

        self.dialect = SPARK
        self.session = spark_session(master)

    def register_source(self, name: str, files: Sequence[Path], union_by_name: bool) -> None:
        reader = self.session.read.option("mergeSchema", str(union_by_name).lower())
        reader.parquet(*[_uri(f) for f in files]).createOrReplaceTempView(name)

    def write_by_date(self, sql: str, params: Mapping[str, int], out_dir: Path) -> None:
        frame = self.session.sql(sql, args=dict(params))
        frame.write.mode("errorifexists").partitionBy(DATE_COLUMN).parquet(_uri(out_dir))

    def fetch(self, sql: str, params: Mapping[str, int]) -> pa.Table:
        table: pa.Table = self.session.sql(sql, args=dict(params)).toArrow()
        return table

    def close(self) -> None:
        pass  # the session is shared: starting one costs 10-20 s


def open_engine(name: str, spark_master: str = "local[2]") -> BatchEngine:
    """A fresh engine by name ('duckdb' or 'spark')."""
    if name == "duckdb":
        return DuckDBEngine()
    if name == "spark":
        return SparkEngine(spark_master)
    raise ValueError(f"unknown engine {name!r}; use duckdb or spark")


# Local settings: few shuffle partitions (2 cores), no UI, µs timestamps in Parquet, UTC everywhere.
SPARK_CONF: Mapping[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.adaptive.enabled": "true",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "2g",
    "spark.executor.memory": "1g",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
    "spark.sql.parquet.datetimeRebaseModeInRead": "CORRECTED",
    "spark.sql.parquet.int96RebaseModeInRead": "CORRECTED",
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
}

_session: Any = None


def spark_session(master: str = "local[2]", conf: Mapping[str, str] | None = None) -> Any:
    """The process's SparkSession for `master`, created on first use; a session for another master is
    stopped first (one SparkContext per JVM)."""
    global _session
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # otherwise Spark binds the hostname's address
    from pyspark.sql import SparkSession

    existing = _session or SparkSession.getActiveSession()
    if existing is not None and existing.sparkContext._jsc is not None:
        if existing.sparkContext.master == master:
            # Adopted from other code maybe: make sure the SQL settings our queries rely on hold.
            for key, value in {**SPARK_CONF, **(conf or {})}.items():
                if key.startswith("spark.sql.") and existing.conf.get(key, None) != value:
                    existing.conf.set(key, value)
            _session = existing
            return _session
        existing.stop()
        _session = None
    builder = SparkSession.builder.master(master).appName("quiver")
    for key, value in {**SPARK_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    _session = builder.getOrCreate()
    _session.sparkContext.setLogLevel("ERROR")
    return _session


def stop_spark() -> None:
    """Stop the process's SparkSession, if any."""
    global _session
    if _session is not None:
        _session.stop()
        _session = None


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _uri(path: Path) -> str:
    # Not Path.as_uri(): Hadoop does not decode it, and hive-style folders (date=…) would become date%3D….
    return "file://" + str(Path(path).resolve())
