"""Batch engines behind one small interface: register sources, run a query, write its rows by date.

`BatchEngine` is all the backfill needs; DuckDB (embedded) and Spark (local or a standalone master) each
implement it with their own Parquet writer. Engine libraries are imported only when an engine is opened.
The one SparkSession of the process is made by `spark_session` (`spark_session_for(config)` with a project's
settings), so its settings live in one place: Quiver's defaults, the user's `spark:` settings over them, and the
few settings Quiver's answers depend on, which a user's setting may not contradict. A session Quiver did not
start is adopted as it is: checked, never changed.
Both write to a local folder or, for an object-store offline root (quiver.offline.store), to a URI, and read
sources and late events wherever they live once their location is attached (`attach`).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from quiver.catalog.errors import QuiverError
from quiver.compile.sql import DATE_COLUMN, Dialect
from quiver.config import SparkSettings

if TYPE_CHECKING:
    from quiver.catalog.locations import Location
    from quiver.config import Config
    from quiver.offline.store import OfflineStore

logger = logging.getLogger(__name__)


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
    """Spark SQL on the process's session (`spark_session`); writes with Spark's Parquet writer. `spark`: a master,
    or the user's Spark settings (`Config.spark`: master and conf)."""

    name = "spark"

    def __init__(self, spark: str | SparkSettings = "local[2]", store: OfflineStore | None = None):
        from quiver.compile.spark import SPARK

        settings = spark if isinstance(spark, SparkSettings) else SparkSettings(spark)
        self.dialect = SPARK
        self.session = spark_session(settings.master, conf=spark_store_conf(store), settings=settings)

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


def open_engine(name: str, spark: str | SparkSettings = "local[2]", store: OfflineStore | None = None) -> BatchEngine:
    """A fresh engine by name ('duckdb' or 'spark'), able to write to `store` (default: local folders). `spark`:
    Spark's master, or the user's Spark settings (`Config.spark`)."""
    if name == "duckdb":
        engine = DuckDBEngine()
        if store is not None:
            engine.attach(store)
        return engine
    if name == "spark":
        return SparkEngine(spark, store)
    raise ValueError(f"unknown engine {name!r}; use duckdb or spark")


# What Quiver's answers depend on, whoever runs the session: event times are UTC microseconds end to end, and
# dates are written and read as they are (proleptic Gregorian, as DuckDB and pyarrow read them). A user's setting
# may not contradict these; where the user says nothing, Quiver sets them.
SPARK_CORRECTNESS: Mapping[str, str] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
    "spark.sql.parquet.datetimeRebaseModeInWrite": "CORRECTED",
    "spark.sql.parquet.datetimeRebaseModeInRead": "CORRECTED",
    "spark.sql.parquet.int96RebaseModeInRead": "CORRECTED",
}
_REBASE_WHY = ("Quiver writes and reads dates as they are, in the proleptic Gregorian calendar that DuckDB and "
               "pyarrow use; LEGACY would shift dates before 1582 (EXCEPTION, which refuses them, is fine too)")
_CORRECTNESS_WHY: Mapping[str, str] = {
    "spark.sql.session.timeZone": "Quiver's point-in-time joins and date partitions compare UTC microseconds",
    "spark.sql.parquet.outputTimestampType": "Quiver's readers (DuckDB, pyarrow, the point-in-time joins) take "
                                             "event times from Parquet as INT64 microseconds",
    "spark.sql.parquet.datetimeRebaseModeInWrite": _REBASE_WHY,
    "spark.sql.parquet.datetimeRebaseModeInRead": _REBASE_WHY,
    "spark.sql.parquet.int96RebaseModeInRead": _REBASE_WHY,
}
# Values Spark treats as Quiver's own (upper case): other names of UTC; EXCEPTION never changes a date.
_UTC_NAMES = frozenset({"UTC", "ETC/UTC", "GMT", "ETC/GMT", "Z", "+00:00", "UTC+00:00", "GMT+00:00", "UCT"})
_SAME_AS: Mapping[str, frozenset[str]] = {
    "spark.sql.session.timeZone": _UTC_NAMES,
    **{key: frozenset({"CORRECTED", "EXCEPTION"}) for key in SPARK_CORRECTNESS if "RebaseMode" in key},
}

# Quiver's defaults for a session it starts, for a small local machine (2 cores: few shuffle partitions); any
# user setting replaces them.
SPARK_DEFAULTS: Mapping[str, str] = {
    "spark.sql.shuffle.partitions": "4",
    "spark.sql.adaptive.enabled": "true",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.driver.memory": "2g",
    "spark.executor.memory": "1g",
    "spark.hadoop.mapreduce.fileoutputcommitter.marksuccessfuljobs": "false",
}
SPARK_CONF: Mapping[str, str] = {**SPARK_DEFAULTS, **SPARK_CORRECTNESS}  # a session with no user settings

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


def keeps_correctness(key: str, value: str) -> bool:
    """Whether `value` of a correctness setting (SPARK_CORRECTNESS) gives Quiver's answers (any other key: yes)."""
    if key not in SPARK_CORRECTNESS:
        return True
    allowed = _SAME_AS.get(key, frozenset({SPARK_CORRECTNESS[key].upper()}))
    return value.strip().upper() in allowed


def merged_spark_conf(user: Mapping[str, str], extra: Mapping[str, str] | None = None,
                      classpath: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings of a session Quiver starts: its defaults, the connectors' `classpath` (a user's class path
    goes first, ours is kept after it), the `user`'s settings over them, the caller's `extra` (object-store
    settings) and last Quiver's correctness settings where nothing above set them. A user's setting that
    contradicts one of those is a QuiverError naming it, the value given and why Quiver needs its own."""
    extra = extra or {}
    wrong = [f"{key}={value} in the Spark settings (quiver.yaml spark.conf or QUIVER_SPARK_CONF): "
             f"{_CORRECTNESS_WHY[key]}; remove it or set {SPARK_CORRECTNESS[key]}"
             for key, value in {**user, **extra}.items() if not keeps_correctness(key, value)]
    if wrong:
        raise QuiverError("; ".join(wrong))
    merged = {**SPARK_DEFAULTS, **(classpath or {})}
    for key, value in user.items():
        merged[key] = f"{value}{os.pathsep}{merged[key]}" if key in (classpath or {}) else value
    merged.update(extra)
    for key, value in SPARK_CORRECTNESS.items():
        merged.setdefault(key, value)
    return merged


def adopted_session_problems(current: Mapping[str, str | None]) -> list[str]:
    """Correctness settings of a session Quiver did not start (`current`: key → its value there) that would
    change Quiver's answers, each with its value, why, and the line that fixes it."""
    return [f"{key}={value} ({_CORRECTNESS_WHY[key]}; fix: spark.conf.set(\"{key}\", \"{SPARK_CORRECTNESS[key]}\"))"
            for key, value in current.items() if key in SPARK_CORRECTNESS and not keeps_correctness(key, value or "")]


def spark_session_for(config: Config, conf: Mapping[str, str] | None = None) -> Any:
    """The process's SparkSession for a project: on `config.spark_master`, with the user's `spark:` settings;
    `conf`: what the caller needs besides (an object store's settings, `spark_store_conf`)."""
    return spark_session(config.spark_master, conf, settings=config.spark)


def spark_session(master: str = "local[2]", conf: Mapping[str, str] | None = None,
                  settings: SparkSettings | None = None) -> Any:
    """The process's SparkSession for `master`, created on first use with `merged_spark_conf` of the user's
    `settings` (on that master) and `conf`; a session Quiver started for another master is stopped first (one
    SparkContext per JVM). A session some other code started on `master` is adopted as it is: Quiver checks the
    settings its answers depend on and raises a QuiverError naming those that differ instead of changing them."""
    global _session
    if settings is not None and settings.master != master:
        raise ValueError(f"settings for master {settings.master!r} given for a session on {master!r}")
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # otherwise Spark binds the hostname's address
    # Executors run Quiver's own code (the join's finalize): by default the interpreter that has it installed.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    user = dict(settings.conf) if settings is not None else {}
    if _alive(_session):
        if _session.sparkContext.master == master:
            _update_own_session(_session, user, conf or {})
            return _session
        _session.stop()
    _session = None
    foreign = _foreign_session()
    if foreign is not None:
        _check_adopted(foreign, master, user)
        set_hadoop(foreign, conf or {})  # an object store's endpoints: Quiver's to add, jobs need them
        return foreign
    wanted = merged_spark_conf(user, conf, _classpath_conf())
    builder = SparkSession.builder.master(master).appName("quiver")
    for key, value in wanted.items():
        builder = builder.config(key, value)
    _session = builder.getOrCreate()
    _session.sparkContext.setLogLevel("ERROR")
    set_hadoop(_session, wanted)
    logger.info("Spark session on %s started: %s", master, _describe(wanted, user))
    return _session


def _alive(session: Any) -> bool:
    return session is not None and session.sparkContext._jsc is not None


def _foreign_session() -> Any:
    """A running session that other code started in this process (the active one, else PySpark's default)."""
    from pyspark.sql import SparkSession

    for session in (SparkSession.getActiveSession(), getattr(SparkSession, "_instantiatedSession", None)):
        if _alive(session):
            return session
    return None


def _update_own_session(session: Any, user: Mapping[str, str], conf: Mapping[str, str]) -> None:
    """Quiver's own session, asked for again (maybe with other settings): its SQL settings follow the call;
    a setting fixed at the session's start is reported, since only a new session takes it."""
    wanted = merged_spark_conf(user, conf)
    changed, fixed = [], []
    for key, value in wanted.items():
        if not key.startswith("spark.sql."):
            if key in user and not key.startswith("spark.hadoop.") and \
                    session.sparkContext.getConf().get(key, None) not in (None, value):
                fixed.append(key)
            continue
        if session.conf.get(key, None) != value and session.conf.isModifiable(key):
            session.conf.set(key, value)
            changed.append(key)
    set_hadoop(session, wanted)
    if changed:
        logger.info("Spark session on %s: set %s", session.sparkContext.master,
                    ", ".join(f"{key}={_shown(key, wanted[key])}" for key in changed))
    if fixed:
        logger.warning("Spark session on %s keeps %s as it started (a new session and driver JVM take the new "
                       "values: quiver.offline.engines.stop_spark(jvm=True))", session.sparkContext.master,
                       ", ".join(fixed))


def _check_adopted(session: Any, master: str, user: Mapping[str, str]) -> None:
    """A session Quiver did not start is its owner's: refuse one that would change Quiver's answers, and say
    which of the user's settings it does not have (Quiver changes none)."""
    running = session.sparkContext.master
    if running != master:
        raise QuiverError(f"a Spark session that Quiver did not start runs on {running} in this process, and the "
                          f"project's Spark master is {master}: one JVM holds one SparkContext; stop that session "
                          f"or set spark.master to {running}")
    problems = adopted_session_problems({key: _current(session, key) for key in SPARK_CORRECTNESS})
    if problems:
        raise QuiverError(f"the Spark session on {running} was not started by Quiver, and Quiver does not change "
                          f"it; these of its settings would change Quiver's answers: {'; '.join(problems)}")
    differing = [f"{key}={_shown(key, str(_current(session, key)))} (spark.conf: {_shown(key, value)})"
                 for key, value in user.items() if _current(session, key) not in (None, value)]
    if differing:
        logger.warning("Spark session on %s was not started by Quiver and keeps its own settings: %s",
                       running, ", ".join(differing))


def _current(session: Any, key: str) -> str | None:
    """A running session's value of `key`: its SQL setting (Spark's default included), else its start setting."""
    try:
        value = session.conf.get(key)
    except Exception:  # py4j: a key the SQL configuration does not know and nobody set
        value = None
    if value is None:
        value = session.sparkContext.getConf().get(key, None)
    return None if value is None else str(value)


def _describe(wanted: Mapping[str, str], user: Mapping[str, str]) -> str:
    """What a new session got and from whom, for the log (secrets left out)."""
    parts = []
    for key in sorted(wanted):
        value = _shown(key, wanted[key])
        if key in user:
            default = SPARK_DEFAULTS.get(key)
            origin = f"yours, not Quiver's default {default}" if default not in (None, user[key]) else "yours"
        elif key in SPARK_CORRECTNESS:
            origin = "Quiver's, needed"
        elif key in SPARK_DEFAULTS:
            origin = "Quiver's default"
        else:
            continue  # class path and object-store settings: Quiver's plumbing
        parts.append(f"{key}={value} ({origin})")
    return ", ".join(parts)


def _shown(key: str, value: str) -> str:
    lowered = key.lower()
    return "***" if any(word in lowered for word in ("secret", "password", "token", "credential", "access.key")) \
        else value


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
