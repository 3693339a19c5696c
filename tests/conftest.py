"""Shared fixtures: a real redis-server and a throwaway PostgreSQL cluster, started by the tests themselves."""

from __future__ import annotations

import logging
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.durations import (  # the run's time, by resource
    pytest_runtest_logreport,  # noqa: F401
    pytest_terminal_summary,  # noqa: F401
    tag_resource,
)
from tests.harness import (
    PostgresCluster,
    RedisCluster,
    RedisServer,
    S3Server,
    ServiceError,
    find_postgres_bin,
    postgres_run_as,
)

if TYPE_CHECKING:
    from quiver.streaming.kafka_broker import KafkaBroker

# pytest-xdist's workers inherit COLUMNS=80 and LINES=24 from execnet; a serial run has neither. Rich reads
# COLUMNS when a console is made (quiver.cli's, at import), so drop them: a worker then sees what a serial run
# sees, and the CLI's tables keep their full width.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _name in ("COLUMNS", "LINES"):
        os.environ.pop(_name, None)


# Every JVM the tests start (Spark, Flink, the Kafka broker) lives seconds to minutes and shares two cores with
# the others: the C1 compiler alone and the serial collector save it the optimizing compiler's and the
# parallel GC's threads, ~40 % of a JVM-bound module's CPU (test_redis_sink_jvm: 53 → 27 CPU s; Spark and
# Flink modules alike). Only the tests' JVMs: the benchmarks and the product keep the JVM's defaults.
# QUIVER_TEST_JAVA_OPTIONS replaces these flags ("" for none).
TEST_JAVA_OPTIONS = os.environ.get("QUIVER_TEST_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")
if TEST_JAVA_OPTIONS not in os.environ.get("JAVA_TOOL_OPTIONS", ""):  # xdist's workers inherit the controller's
    os.environ["JAVA_TOOL_OPTIONS"] = f"{os.environ.get('JAVA_TOOL_OPTIONS', '')} {TEST_JAVA_OPTIONS}".strip()

# The prediction servers the tests start score their shadows in a process of their own, by default in Linux's
# idle scheduling class: next to three busy test workers on two cores it would wait minutes for CPU (to start,
# to write its log on a stop). The tests check what it does, not its priority: nice 10 here.
os.environ.setdefault("QUIVER_OFF_PATH_PRIORITY", "low")


def _cache_typer_commands() -> None:
    """Typer's test runner rebuilds the app's whole command tree on every `invoke` (~0.3 s of type-hint
    evaluation for 50 commands); build it once, as the executable does per run."""
    import typer.testing

    from tests.cli_runs import command_of

    assert hasattr(typer.testing, "_get_command"), "typer.testing changed: update _cache_typer_commands"
    typer.testing._get_command = command_of  # type: ignore[attr-defined]


_cache_typer_commands()

# py4j's finalizers log "Closing down clientserver connection" at interpreter exit, after pytest has closed
# the captured streams; logging would print a full traceback for each. They are harmless: stay quiet.
logging.raiseExceptions = False


def _redis_binary() -> str:
    binary = shutil.which("redis-server")
    if binary is None:
        # Fail, never skip: the online store is the product; `make setup` installs redis-server.
        pytest.fail("redis-server not found on PATH: run `make setup` (or apt-get install redis-server)",
                    pytrace=False)
    return binary


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(_redis_binary(), tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """Six redis-server processes as one cluster (3 masters, 3 replicas), shared by the tests that need one."""
    cluster = RedisCluster(_redis_binary(), tmp_path_factory.mktemp("redis-cluster"))
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    # A test that stopped the server and failed before restarting it must not break the next one.
    redis_server.start()
    with redis_server.client() as c:
        c.flushall()
    return redis_server.url


def _no_postgres(reason: str) -> None:
    # Fail, never skip, here as in CI: `make setup` installs PostgreSQL (as .ci/run does), so `make test`
    # runs the same suite everywhere and a missing server is never a silent pass.
    pytest.fail(f"{reason}; run `make setup` (as root it installs postgresql)", pytrace=False)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresCluster]:
    bindir = find_postgres_bin()
    if bindir is None:
        _no_postgres("PostgreSQL binaries not found (apt-get install postgresql): no initdb in "
                     "/usr/lib/postgresql/*/bin or on PATH")
        return
    try:
        cluster = PostgresCluster(bindir, run_as=postgres_run_as())
    except ServiceError as e:
        _no_postgres(f"cannot run PostgreSQL here: {e}")
        return
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        cluster.cleanup()


@pytest.fixture
def pg_url(postgres_server: PostgresCluster) -> Iterator[str]:
    name = postgres_server.create_database()
    yield postgres_server.url(name)
    postgres_server.drop_database(name)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/registry.db"


@pytest.fixture(params=["sqlite", "postgres"])
def registry_url(request: pytest.FixtureRequest) -> str:
    # Resolved lazily so the sqlite case never starts PostgreSQL, and the postgres case skips cleanly.
    fixture = "sqlite_url" if request.param == "sqlite" else "pg_url"
    return str(request.getfixturevalue(fixture))


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A private S3-compatible server (moto) with its credentials in this process's environment."""
    server = S3Server(tmp_path_factory.mktemp("s3"))
    try:
        server.start()
    except ServiceError as e:
        pytest.fail(str(e), pytrace=False)
    saved = {k: os.environ.get(k) for k in server.env}
    os.environ.update(server.env)
    # Quiver never puts credentials in Spark's settings: each JVM reads its own environment, so a Spark driver
    # JVM started earlier in this process (by another module) cannot see these. End it; the next job starts one.
    engines = sys.modules.get("quiver.offline.engines")
    if engines is not None:
        engines.stop_spark(jvm=True)
    yield server
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    server.stop()


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaBroker]:
    """A real single-node KRaft Kafka broker (the jars `make setup` fetched), on its own ports and folder."""
    from quiver.catalog.errors import QuiverError
    from quiver.streaming.kafka_broker import KafkaBroker

    broker = KafkaBroker(tmp_path_factory.mktemp("kafka"))
    try:
        broker.start()
    except QuiverError as e:  # jars missing or the broker would not start: fail, never skip
        pytest.fail(str(e), pytrace=False)
    yield broker
    broker.stop()


# Heavy resources, by test module: `make test-fast` leaves these out (`-m "not heavy"`), `make test` runs all.
# A module named here gets the marker on every test; "postgres" is also given to any test using the cluster.
HEAVY_MODULES: dict[str, frozenset[str]] = {
    "spark": frozenset({"test_backfill_spark", "test_backfill_spark_standalone", "test_contract_paths",
                        "test_edges_nan", "test_edges_time", "test_offline_object_store_cluster",
                        "test_pit_backfill", "test_pit_spark", "test_serving_log_readers", "test_spark_sessions",
                        "test_spark_training_sets"}),
    "flink": frozenset({"test_contract_paths", "test_demo_kafka", "test_kafka_event_time", "test_kafka_late_store",
                        "test_kafka_parse_flink", "test_kafka_security", "test_readme", "test_redis_sink_jvm",
                        "test_streaming_cluster", "test_streaming_crash", "test_streaming_e2e", "test_streaming_kafka",
                        "test_streaming_kafka_inflight", "test_streaming_kafka_sql", "test_streaming_unbounded"}),
    "kafka": frozenset({"test_demo_kafka", "test_embedded_kafka", "test_kafka_event_time", "test_kafka_fresh_job",
                        "test_kafka_late_store", "test_kafka_security", "test_streaming_kafka",
                        "test_streaming_kafka_inflight", "test_streaming_kafka_sql"}),
    "airflow": frozenset({"test_dags", "test_loop_airflow", "test_loop_celery", "test_loop_standalone",
                          "test_monitoring_airflow"}),
    "training": frozenset({"test_artifact_store_s3", "test_drift_reference", "test_loop_state", "test_models_training",
                           "test_models_resume", "test_readme"}),
    "browser": frozenset({"test_console_browser", "test_serving_hardening"}),
    # NannyML, the reference CBPE, in a venv of its own that the first run builds from PyPI
    "nannyml": frozenset({"test_cbpe_nannyml"}),
}
RESOURCE_MARKERS = (*HEAVY_MODULES, "postgres")


def pytest_configure(config: pytest.Config) -> None:
    for name in RESOURCE_MARKERS:
        config.addinivalue_line("markers", f"{name}: needs {name} (a heavy real part)")
    config.addinivalue_line("markers", "heavy: any of spark, flink, kafka, airflow, training, browser, nannyml")


# The longest modules (a full run's --durations, grouped), longest first. Under xdist (`make test` runs two
# workers, whole modules each) they are handed out first, so no long module starts last and runs alone.
LONGEST_FIRST = ("test_loop_airflow", "test_readme", "test_streaming_kafka", "test_streaming_kafka_inflight",
                 "test_streaming_cluster",
                 "test_loop_celery", "test_streaming_crash", "test_streaming_e2e", "test_loop_standalone",
                 "test_streaming_unbounded", "test_offline_object_store_cluster", "test_backfill_spark_standalone",
                 "test_loop_faults", "test_cbpe_nannyml", "test_dags", "test_streaming_kafka_sql", "test_redis_sink_jvm")


def _module_name(item: pytest.Item) -> str:
    return item.module.__name__.rsplit(".", 1)[-1] if item.module is not None else ""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):  # workers collect; the controller hands out their modules in order
        rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(_module_name(item), len(rank)))  # stable: the rest keep their order
    for item in items:
        module = _module_name(item)
        heavy = [name for name, modules in HEAVY_MODULES.items() if module in modules]
        for name in heavy:
            item.add_marker(name)
        if heavy:
            item.add_marker("heavy")
        params = getattr(item, "callspec", None)
        uses_postgres = {"pg_url", "postgres_server"} & set(getattr(item, "fixturenames", ()))
        if uses_postgres or (params is not None and params.params.get("registry_url") == "postgres"):
            item.add_marker("postgres")
        tag_resource(item)
