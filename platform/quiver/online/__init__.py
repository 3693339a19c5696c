"""Online store: Redis layout (layout.py, the one place it is documented), codec, merge, writer and reader.

- `base.OnlineStore`: the one interface (write last values / tiles, read as of a time, freshness).
- `redis_store.RedisOnlineStore`: the Redis implementation (pipelined MGET reads, Lua newer-wins writes).
- `materialize.materialize`: offline store → online store, incremental and replay-safe.
- `embedded.ensure_redis`: the configured Redis URL, or an embedded redis-server for demos.
- `factory.open_online_store`: the one place a project's store is opened (readers and writers).
"""
