"""The one place a project's online store is opened: the configured Redis, else an embedded one."""

from __future__ import annotations

from quiver.config import Config
from quiver.online.base import OnlineStore

WRITER_TIMEOUT_S = 5.0  # writes ship whole tiles and run Lua: never give them less than this


def open_online_store(config: Config, *, writer: bool = False) -> OnlineStore:
    """The project's online store. Readers wait `redis_timeout_s` (serving keeps it short); writers
    (materialization, the stream runner) at least `WRITER_TIMEOUT_S`."""
    from quiver.online.embedded import ensure_redis
    from quiver.online.redis_store import RedisOnlineStore

    timeout_s = max(config.redis_timeout_s, WRITER_TIMEOUT_S) if writer else config.redis_timeout_s
    return RedisOnlineStore(ensure_redis(config), config.project, timeout_s=timeout_s)
