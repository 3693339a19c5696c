"""The one place a project's online store is opened: the configured Redis (one server, or a cluster with a
`redis+cluster://` URL), else an embedded one."""

from __future__ import annotations

from quiver.config import Config
from quiver.online.base import OnlineStore

WRITER_TIMEOUT_S = 5.0  # writes ship whole tiles and run Lua: never give them less than this


def open_online_store(config: Config, *, writer: bool = False) -> OnlineStore:
    """The project's online store. Readers wait `redis_timeout_s` (serving keeps it short); writers
    (materialization, the stream runner) at least `WRITER_TIMEOUT_S`."""
    from quiver.online.embedded import ensure_redis

    timeout_s = max(config.redis_timeout_s, WRITER_TIMEOUT_S) if writer else config.redis_timeout_s
    return redis_store_for(ensure_redis(config), config.project, timeout_s=timeout_s)


def redis_store_for(url: str, project: str, *, timeout_s: float = 1.0) -> OnlineStore:
    """The store of a Redis URL: `redis+cluster://` (or `rediss+cluster://`) a cluster, else one server."""
    from quiver.online.cluster_wire import is_cluster_url
    from quiver.online.redis_cluster import RedisClusterOnlineStore
    from quiver.online.redis_store import RedisOnlineStore

    if is_cluster_url(url):
        return RedisClusterOnlineStore(url, project, timeout_s=timeout_s)
    return RedisOnlineStore(url, project, timeout_s=timeout_s)
