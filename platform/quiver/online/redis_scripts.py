"""The Lua scripts of the Redis online store: every write is one atomic, idempotent script call.

The script text lives in `online/lua/*.lua`, the one copy: this module and the JVM Flink sink
(infra/jvm/redis-sink, which bundles the same files into its jar) both send it, so the two writers can
never apply different merge rules. Keys and values follow online/layout.py and online/codec.py; the
store (redis_store.py) packs the calls.

- `last` (LAST_SCRIPT): newer wins by the record's leading event_ts; KEYS entity keys, ARGV one record each.
- `tile` (TILE_SCRIPT): upsert tiles by tile_start, the fuller tile wins, trim past the horizon;
  ARGV width, var_len offset (0: none), horizon µs, then one value per key.
- `meta` (META_SCRIPT): raise `max_event_ts` of a view's meta hash and stamp `updated_at_ms`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

LUA_DIR: Final = Path(__file__).resolve().parent / "lua"


def _script(name: str) -> bytes:
    return (LUA_DIR / f"{name}.lua").read_bytes()


LAST_SCRIPT: Final = _script("last")
TILE_SCRIPT: Final = _script("tile")
META_SCRIPT: Final = _script("meta")

SCRIPTS: Final = {"last": LAST_SCRIPT, "tile": TILE_SCRIPT, "meta": META_SCRIPT}
