"""The Redis layout of the online store, in one place. Every reader and writer goes through this module.

Keys (UTF-8, readable in redis-cli)::

    q:<project>:<view>:<tag>:{<entity>}      STRING  one packed value per (view, entity)
    q:<project>:_meta:<view>                 HASH    max_event_ts (µs; feature freshness),
                                                     updated_at_ms, run (last materialization marker)

- ``<tag>``: 8 hex digits of a hash of the view's *storage* schema (kind, key dtypes, field or partial
  columns with dtypes, tile size, longest window). A layout change reads as "no value" until the view is
  re-materialized, instead of being misdecoded; description or owner changes keep the tag.
- ``<entity>``: the join key values in the view's key order, joined by ``:``. int64 as decimal, bool as
  ``0``/``1``, strings as UTF-8 with ``%``, ``:``, ``{`` and ``}`` percent-escaped (so composite keys never
  collide, and the braces are always the key's hash tag).
- ``{…}``: Redis Cluster's hash tag. A cluster places a key by the CRC16 of the text between the braces, so
  every view's value of one entity lands in one slot (a read is one MGET per slot, see redis_cluster.py),
  while the entities spread over all slots. A single server ignores the braces: one layout for both, and
  the meta keys (no braces) spread over slots by their view name. Layout 2 added the braces; a store written
  by layout 1 reads as "no value" (the tag changed) until it is materialized again.

Values are little-endian, packed (no padding), fixed width where the data allows, so a read of B entities
is one ``MGET`` whose replies are joined and decoded with one ``numpy.frombuffer`` (docs/architecture.md, "Online read path": packed
strings + MGET are 9–19× faster than one hash per entity at 100–1000 entities).

Last-value view, one record per entity (the newest event written)::

    event_ts i8 | one slot per field | null bitmap | UTF-8 bytes of the string fields, in field order
    slots: int64 / timestamp (µs) i8, float64 f8, bool u1, string u4 byte length
    null bitmap: ceil(F / 8) bytes, bit i (LSB first) set = field i is null

Aggregation view, the live tiles of one entity, sorted by tile_start, one fixed-width record per tile::

    tile_start i8 | n_events i8 | one slot per partial column [| var_len u4 | UTF-8 bytes]
    slots in ``view_partials`` order (catalog/aggregations.py); ``<col>__last`` is followed by
    ``<col>__last_ts`` i8. cnt i8; sum / sumsq f8; min / max / last in the partial's dtype (int64 and
    timestamp i8, float64 f8, string u4 length with its bytes after the record, var_len = their total).
    A partial whose column had no non-null value in the tile (cnt = 0) is stored as 0 and read as null.

Writes (redis_store.py) go in pipelined batches of a few hundred keys. A batch is first sent as MSETNX,
which sets every key when none exists and nothing otherwise (a bulk load into an empty store runs at raw
MSET speed and can never overwrite anything); a refused batch is re-sent as a Lua script (one MGET, one
MSET inside) that applies the rules below:

- last value: newer wins. The incoming record replaces the stored one only when its event_ts is >= the
  stored event_ts, so replays and late writes never overwrite a newer value (a replay of the same event
  writes the same bytes).
- tiles: upsert by tile_start. An incoming tile replaces the stored tile with the same tile_start unless
  the stored one holds more events (tiles only grow, so a stale replay never shrinks a tile and writing a
  tile twice never double counts). Tiles older than ``newest tile_start - (longest window + one tile)``
  are trimmed on every write.

Reads decide at request time which tiles count: the window ``w`` as of ``t`` merges the tiles with
``floor_g(t) - w <= tile_start <= floor_g(t)``; the last one is the current, partial tile, which holds
exactly the events before ``t`` when the events ingested so far are those before ``t``. That is the
offline rule (whole tiles in ``[floor_g(t) - w, floor_g(t))`` plus raw events in ``[floor_g(t), t)``),
so online equals offline; and windows decay with no events arriving. TTL of last values is applied at
read: a value counts when ``t - ttl <= event_ts < t``.

Limits: the online store answers for "now" and later. Read as of a time before data already written, a
last value newer than ``t`` reads as null (the older one is gone) and the current tile may hold events
at or after ``t``. Keys carry no Redis expiry: stale tiles are trimmed, stale last values are hidden by
the TTL at read, and memory is bounded by the number of entities.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

import numpy as np

from quiver.catalog.aggregations import view_partials
from quiver.catalog.ir import ViewSpec

KEY_PREFIX: Final = "q"
KEY_END: Final = b"}"  # closes the hash tag that key_prefix opens
INT64_MIN: Final = np.iinfo(np.int64).min

# Logical dtype → packed numpy slot. Strings hold their byte length; the bytes follow the fixed part.
SLOT_DTYPES: Final[dict[str, str]] = {
    "int64": "<i8",
    "float64": "<f8",
    "bool": "u1",
    "timestamp": "<i8",
    "string": "<u4",
}


def view_tag(view: ViewSpec) -> str:
    """8 hex digits naming the view's storage schema (see module docstring)."""
    if view.kind == "last":
        body: dict[str, Any] = {"fields": [(f.name, f.dtype) for f in view.fields]}
    else:
        triples = [(a.column, a.fn, a.input_dtype) for a in view.aggregations]
        body = {"partials": [(p.name, p.dtype) for p in view_partials(triples)],
                "tile_us": view.tile_us, "max_window_us": view.max_window_us}
    body.update(kind=view.kind, keys=list(view.keys), layout=2)
    blob = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha1(blob).hexdigest()[:8]


def key_prefix(project: str, view: ViewSpec) -> bytes:
    """Bytes every key of `view` starts with, up to its entity (the hash tag's opening brace included; the
    key ends with the entity and KEY_END)."""
    return f"{KEY_PREFIX}:{project}:{view.name}:{view_tag(view)}:{{".encode()


def meta_key(project: str, view: str) -> bytes:
    """The per-view metadata hash (freshness, materialization marker)."""
    return f"{KEY_PREFIX}:{project}:_meta:{view}".encode()


def _escape(value: str) -> bytes:
    if "%" in value or ":" in value or "{" in value or "}" in value:
        value = value.replace("%", "%25").replace(":", "%3A").replace("{", "%7B").replace("}", "%7D")
    return value.encode()


def _key_parts(values: np.ndarray | Sequence[Any], dtype: str) -> list[bytes]:
    if dtype == "int64":
        return [b"%d" % v for v in np.asarray(values, dtype=np.int64).tolist()]
    if dtype == "bool":
        return [b"1" if v else b"0" for v in np.asarray(values, dtype=bool).tolist()]
    return [_escape(str(v)) for v in (values.tolist() if isinstance(values, np.ndarray) else values)]


def entity_keys(prefix: bytes, view: ViewSpec, columns: Mapping[str, np.ndarray | Sequence[Any]]) -> list[bytes]:
    """Redis keys of the entities given column-wise (one array per join key of `view`)."""
    if len(view.keys) == 1 and view.keys[0][1] == "int64":
        fmt = prefix.replace(b"%", b"%%") + b"%d}"
        return [fmt % v for v in np.asarray(columns[view.keys[0][0]], dtype=np.int64).tolist()]
    return [prefix + tag + KEY_END for tag in entity_tags(view, columns)]


def entity_tags(view: ViewSpec, columns: Mapping[str, np.ndarray | Sequence[Any]]) -> list[bytes]:
    """The `<entity>` part of the entities' keys: what a Redis Cluster hashes to place them."""
    if len(view.keys) == 1:
        name, dtype = view.keys[0]
        return _key_parts(columns[name], dtype)
    parts = [_key_parts(columns[name], dtype) for name, dtype in view.keys]
    return [b":".join(row) for row in zip(*parts, strict=True)]


def last_record_dtype(view: ViewSpec) -> np.dtype[Any]:
    """Fixed part of a last-value record: ts, one slot per field (f0…), null bitmap."""
    fields: list[tuple[Any, ...]] = [("ts", "<i8")]
    fields += [(f"f{i}", SLOT_DTYPES[f.dtype]) for i, f in enumerate(view.fields)]
    fields.append(("nulls", "u1", (null_bytes(len(view.fields)),)))
    return np.dtype(fields)


def null_bytes(n_fields: int) -> int:
    return max(1, (n_fields + 7) // 8)


def tile_record_dtype(view: ViewSpec) -> np.dtype[Any]:
    """Fixed part of a tile record: tile_start, n_events, one slot per partial (p0…; last_ts as t0…)."""
    fields: list[tuple[str, str]] = [("tile_start", "<i8"), ("n_events", "<i8")]
    has_strings = False
    for i, partial in enumerate(tile_partials(view)):
        fields.append((f"p{i}", SLOT_DTYPES[partial.dtype]))
        has_strings |= partial.dtype == "string"
        if partial.partial.kind == "last":
            fields.append((f"t{i}", "<i8"))
    if has_strings:
        fields.append(("var_len", "<u4"))
    return np.dtype(fields)


def tile_partials(view: ViewSpec) -> list[Any]:
    """The view's distinct partial columns, in storage order."""
    return view_partials([(a.column, a.fn, a.input_dtype) for a in view.aggregations])


def trim_horizon_us(view: ViewSpec) -> int:
    """Tiles older than newest tile_start minus this are never read again (longest window + one tile)."""
    return view.max_window_us + int(view.tile_us or 0)
