"""Shared fixtures: a real redis-server and a throwaway PostgreSQL cluster, started by the tests themselves."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import (
    PostgresCluster,
    RedisServer,
    S3Server,
    ServiceError,
    find_postgres_bin,
    postgres_run_as,
)

# py4j's finalizers log "Closing down clientserver connection" at interpreter exit, after pytest has closed
# the captured streams; logging would print a full traceback for each. They are harmless: stay quiet.
logging.raiseExceptions = False


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    binary = shutil.which("redis-server")
    if binary is None:
        # Fail, never skip: the online store is the product; `make setup` installs redis-server.
        pytest.fail("redis-server not found on PATH: run `make setup` (or apt-get install redis-server)",
                    pytrace=False)
    server = RedisServer(binary, tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


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
    import os

    server = S3Server(tmp_path_factory.mktemp("s3"))
    try:
        server.start()
    except ServiceError as e:
        pytest.fail(str(e), pytrace=False)
    saved = {k: os.environ.get(k) for k in server.env}
    os.environ.update(server.env)
    yield server
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    server.stop()
