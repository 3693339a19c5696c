"""The shared fixtures start real services: prove it, so other tests can rely on them."""

from __future__ import annotations

import pytest
import redis
import sqlalchemy as sa

from tests.harness import RedisServer

pytestmark = pytest.mark.integration


def test_redis_round_trip(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    r.set("quiver:k", b"v")
    assert r.get("quiver:k") == b"v"


def test_redis_url_starts_empty(redis_url: str) -> None:
    assert redis.Redis.from_url(redis_url).dbsize() == 0


def test_redis_restart_same_port(redis_server: RedisServer, redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    r.set("before", 1)
    port = redis_server.port
    redis_server.stop()
    with pytest.raises(redis.exceptions.ConnectionError):
        redis.Redis.from_url(redis_url, socket_connect_timeout=1).ping()
    redis_server.start()
    assert redis_server.port == port
    r2 = redis.Redis.from_url(redis_server.url)
    assert r2.ping()
    assert r2.get("before") is None  # no persistence: a restart loses everything


def test_postgres_select_1(pg_url: str) -> None:
    engine = sa.create_engine(pg_url)
    with engine.connect() as c:
        assert c.execute(sa.text("SELECT 1")).scalar() == 1
        assert c.execute(sa.text("SELECT current_database()")).scalar() == pg_url.rsplit("/", 1)[1]
    engine.dispose()


def test_registry_url_is_usable(registry_url: str) -> None:
    engine = sa.create_engine(registry_url)
    with engine.begin() as c:
        c.execute(sa.text("CREATE TABLE t (x INTEGER)"))
        c.execute(sa.text("INSERT INTO t VALUES (42)"))
        assert c.execute(sa.text("SELECT x FROM t")).scalar() == 42
    engine.dispose()
