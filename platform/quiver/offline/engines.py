"""Batch engines behind one small interface: register sources, run a query, write its rows by date.

`BatchEngine` is all the backfill needs; DuckDB (embedded) and Spark (local or a standalone master) each
implement it with their own Parquet writer. Engine libraries are imported only when an engine is opened.
The one SparkSession of the process is made by `spark_session`, so its settings live in one place.
Both write to a local folder or, for an object-store offline root (quiver.offline.store), to a URI, and read
sources and late events wherever they live once their location is attached (`attach`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from quiver.catalog.errors import QuiverError
from quiver.compile.sql import DATE_COLUMN, Dialect

if TYPE_CHECKING:
    from quiver.catalog.locations import Location
    from quiver.offline.store import OfflineStore


class BatchEngine(Protocol):
    """What a backfill needs from an engine."""

    name: str
    dialect: Dialect

    def attach(self, location: Location) -> None:
        """Let later queries read (and write) files under `location` by its URIs (a folder: nothing to do)."""

    def register_source(self, name: str, files: Sequence[Path | str], union_by_name: bool) -> None:
        """Expose Parquet `files` (folder paths, or URIs of an attached location) as a table called
        `name` to later queries."""

    def write_by_date(self, sql: str, params: Mapping[str, int], out_dir: Path | str) -> None:
        """Run `sql` and write its rows with the engine's own writer as Parquet under
        `out_dir/__date=YYYY-MM-DD/`, one folder per value of the `__date` column (left out of the files).
        `out_dir` (a folder, or a URI on the offline store) must not exist yet."""

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
        self._attached: dict[str, str] = {}  # scheme → endpoint of the filesystem registered for it
        self.connection = duckdb.connect(":memory:")
        self.connection.execute("SET TimeZone = 'UTC'")
        if threads:
            self.connection.execute(f"SET threads = {int(threads)}")
        if memory_limit:
            self.connection.execute(f"SET memory_limit = {_literal(memory_limit)}")

    def attach(self, location: Location) -> None:
        """Let queries read and write `location`'s URIs (through pyarrow's filesystem: no extension download).
        One filesystem answers per scheme, so every location on one scheme must share its endpoint."""
        if location.is_local:
            return
        known = self._attached.get(location.scheme)
        if known is None:
            self.connection.register_filesystem(location.fsspec())
            self._attached[location.scheme] = location.endpoint
        elif known != location.endpoint:
            raise QuiverError(f"DuckDB reads one {location.scheme}:// endpoint per run: "
                              f"{location.uri(location.base)} is on {location.endpoint or 'AWS'}, another root on "
                              f"{known or 'AWS'}; put them on one endpoint or use the spark engine")

    def register_source(self, name: str, files: Sequence[Path | str], union_by_name: bool) -> None:
        listing = ", ".join(_literal(str(f)) for f in files)
        self.connection.execute(
            f"CREATE OR REPLACE VIEW {self.dialect.quote(name)} AS SELECT * FROM read_parquet([{listing}], "
            f"hive_partitioning = false, union_by_name = {str(union_by_name).lower()})")

    def write_by_date(self, sql: str, params: Mapping[str, int], out_dir: Path | str) -> None:
        if isinstance(out_dir, Path):
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

    def __init__(self, master: str = "local[2]", store: OfflineStore | None = None):
        from quiver.compile.spark import SPARK

        self.dialect = SPARK
        self.session = spark_session(master, conf=spark_store_conf(store))

    def attach(self, location: Location) -> None:
        """Hadoop settings for `location` on the running session (its jobs ship them to the executors)."""
        set_hadoop(self.session, spark_store_conf(location))

    def register_source(self, name: str, files: Sequence[Path | str], union_by_name: bool) -> None:
        reader = self.session.read.option("mergeSchema", str(union_by_name).lower())
        reader.parquet(*[_uri(f) for f in files]).createOrReplaceTempView(name)

    def write_by_date(self, sql: str, params: Mapping[str, int], out_dir: Path | str) -> None:
        frame = self.session.sql(sql, args=dict(params))
        target = _uri(out_dir) if isinstance(out_dir, Path) else out_dir
        frame.write.mode("errorifexists").partitionBy(DATE_COLUMN).parquet(target)

    def fetch(self, sql: str, params: Mapping[str, int]) -> pa.Table:
        table: pa.Table = self.session.sql(sql, args=dict(params)).toArrow()
        return table

    def close(self) -> None:
        pass  # the session is shared: starting one costs 10-20 s


def open_engine(name: str, spark_master: str = "local[2]", store: OfflineStore | None = None) -> BatchEngine:
    """A fresh engine by name ('duckdb' or 'spark'), able to write to `store` (default: local folders)."""
    if name == "duckdb":
        engine = DuckDBEngine()
        if store is not None:
            engine.attach(store)
        return engine
    if name == "spark":
        return SparkEngine(spark_master, store)
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


def s3a_jars() -> Path:
    """The folder of Spark's s3a connector and its AWS SDK (`scripts/jars.sh s3a`; see quiver.jars)."""
    from quiver.jars import S3A, jars_dir

    return jars_dir() / S3A


def spark_store_conf(store: Location | None) -> dict[str, str]:
    """Spark settings for reading and writing under `store` (the offline root, or a source's location); a
    clear error when its connector is missing."""
    if store is None or store.is_local:
        return {}
    if store.scheme == "s3" and not list(s3a_jars().glob("hadoop-aws-*.jar")):
        raise QuiverError(f"Spark cannot reach {store.uri(store.base)}: the s3a jars are missing in "
                          f"{s3a_jars()}; run `bash scripts/jars.sh s3a` (part of `make setup`)")
    return store.spark_conf()


def _classpath_conf() -> dict[str, str]:
    # On the classpath of every session when present (a JVM's classpath is fixed at its start, and one JVM
    # serves every offline root of the process). Executors load them from the same path on their host, as
    # a cluster's installed connector jars are: shipping ~700 MB per executor through spark.jars would not do.
    folder = s3a_jars()
    if not list(folder.glob("hadoop-aws-*.jar")):
        return {}
    return {"spark.driver.extraClassPath": f"{folder}/*", "spark.executor.extraClassPath": f"{folder}/*"}


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
            set_hadoop(existing, conf or {})
            _session = existing
            return _session
        existing.stop()
        _session = None
    builder = SparkSession.builder.master(master).appName("quiver")
    for key, value in {**SPARK_CONF, **_classpath_conf(), **(conf or {})}.items():
        builder = builder.config(key, value)
    _session = builder.getOrCreate()
    _session.sparkContext.setLogLevel("ERROR")
    set_hadoop(_session, conf or {})
    return _session


def set_hadoop(session: Any, conf: Mapping[str, str]) -> None:
    """Apply `spark.hadoop.*` settings to a running session too: jobs ship its Hadoop configuration to the
    executors, so a later offline root (another endpoint) is reached without a restart."""
    hadoop = session.sparkContext._jsc.hadoopConfiguration()
    for key, value in conf.items():
        if key.startswith("spark.hadoop."):
            hadoop.set(key[len("spark.hadoop."):], value)


def stop_spark(*, jvm: bool = False) -> None:
    """Stop the process's SparkSession, if any. `jvm`: also end the driver JVM that PySpark keeps between
    sessions, so the next session starts one that reads the environment as it is then (credentials set since:
    Quiver never puts them in Spark's settings, each JVM finds its own)."""
    global _session
    if _session is not None:
        _session.stop()
        _session = None
    if jvm and "pyspark" in sys.modules:
        from pyspark import SparkContext

        gateway = SparkContext._gateway
        if gateway is not None:
            gateway.shutdown()
            process = getattr(gateway, "proc", None)
            if process is not None:  # the JVM ends when its stdin closes
                process.stdin.close()
                process.wait(timeout=30)
            SparkContext._gateway = None
            SparkContext._jvm = None


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _uri(path: Path | str) -> str:
    """A file as Hadoop opens it: an object store's URI (s3:// read as s3a://), else file:// and the path."""
    text = str(path)
    if "://" in text:
        return "s3a://" + text[len("s3://"):] if text.startswith("s3://") else text
    # Not Path.as_uri(): Hadoop does not decode it, and hive-style folders (date=…) would become date%3D….
    return "file://" + str(Path(path).resolve())
