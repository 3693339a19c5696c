"""What the JVM Flink sink (`'connector' = 'quiver-redis'`, infra/jvm/redis-sink) needs to write a view.

The streaming job can write its tiles and last values straight to Redis instead of change files for the
loader. The Java writer knows nothing of the catalog: `sink_layout` describes, from layout.py's own record
dtypes, how to turn one row of a view's sink table (the columns compile/flink.py declares) into the key and
the bytes the Python codec reads; `sink_options` is the WITH clause of that table. The shared vectors
(tests/vectors/online_records.json) hold both writers to the same bytes.

Usage in compile/flink.py: keep the sink table's columns, replace the filesystem options::

    options = list(sink_options(view, "tiles", redis_url, project=project,
                                markers_key=markers_key(project, view.source) if marks else None).items())
"""

from __future__ import annotations

import json
from typing import Any, Final

from quiver.catalog.aggregations import EVENTS_COLUMN, TILE_START, last_ts_column
from quiver.catalog.ir import ViewSpec
from quiver.compile.flink import BATCH_FIELD, NEWEST
from quiver.offline.layout import EVENT_TS
from quiver.online.layout import (
    KEY_PREFIX,
    key_prefix,
    last_record_dtype,
    meta_key,
    null_bytes,
    tile_partials,
    tile_record_dtype,
    trim_horizon_us,
)

CONNECTOR: Final = "quiver-redis"
LAYOUT_VERSION: Final = 2  # bump with the Java reader (SinkLayout.java) when the JSON or the keys change (2: hash tags)
DEFAULT_BUFFER_ROWS: Final = 20_000
DEFAULT_IN_FLIGHT: Final = 2  # flushes out on the sink's writer thread at once
KEY_DTYPES: Final = ("int64", "string", "bool")  # what the catalog allows for join keys
SINK_KINDS: Final = {"tiles": "agg", "last": "last"}  # sink kind (compile/flink.py) → view kind


def markers_key(project: str, source: str) -> str:
    """The Redis SET that collects the feeder's batch markers of `source` once their rows are written."""
    return f"{KEY_PREFIX}:{project}:_markers:{source}"


def _slot(dtype: Any, name: str) -> tuple[str, int]:
    """(numpy slot code such as '<i8', byte offset) of field `name` of a record dtype."""
    field, offset = dtype.fields[name][:2]
    code = field.str if field.str != "|u1" else "u1"
    return code, int(offset)


def _field(column: str, dtype: str, record: Any, name: str, null_bit: int | None = None) -> dict[str, Any]:
    slot, offset = _slot(record, name)
    return {"column": column, "dtype": dtype, "slot": slot, "offset": offset, "null_bit": null_bit}


def sink_layout(view: ViewSpec, project: str = "default") -> dict[str, Any]:
    """Everything the Java writer needs to encode one sink row of `view` (JSON-ready).

    - `key_prefix` + the `keys` columns (int64 decimal, bool 0/1, strings UTF-8 with `%`→`%25`, `:`→`%3A`)
      joined by `:` is the Redis key (layout.entity_keys);
    - `fields`: every fixed slot of the record in byte order: sink column, logical dtype, numpy slot code
      (`<i8`, `<f8`, `u1`, `<u4` = a string's UTF-8 length), byte offset, and for last-value fields the bit
      of the null bitmap (`null_bit`; tiles store a null as 0); string bytes follow the fixed part in
      field order, and a tile's `var_len_offset` (0: none) holds their total;
    - `script`: the Lua script (online/lua/<script>.lua), `trim_horizon_us` its tile horizon ARGV;
    - `time_column` / `newest_column`: the columns whose greatest value raises `max_event_ts` in `meta_key`;
      `marker_column`: set on the feeder's batch markers (key columns null).
    """
    bad = [f"{name} ({dtype})" for name, dtype in view.keys if dtype not in KEY_DTYPES]
    if bad:
        raise ValueError(f"view {view.name!r}: join keys {', '.join(bad)} cannot be Redis keys")
    layout: dict[str, Any] = {
        "version": LAYOUT_VERSION, "view": view.name, "key_prefix": key_prefix(project, view).decode(),
        "meta_key": meta_key(project, view.name).decode(),
        "keys": [{"column": name, "dtype": dtype} for name, dtype in view.keys],
        "marker_column": BATCH_FIELD,
    }
    if view.kind == "last":
        record = last_record_dtype(view)
        fields = [_field(EVENT_TS, "timestamp", record, "ts")]
        fields += [_field(f.name, f.dtype, record, f"f{i}", i) for i, f in enumerate(view.fields)]
        layout.update(kind="last", script="last", time_column=EVENT_TS, newest_column=None,
                      events_column=None, trim_horizon_us=0, var_len_offset=0,
                      null_bitmap={"offset": _slot(record, "nulls")[1], "bytes": null_bytes(len(view.fields))})
    else:
        record = tile_record_dtype(view)
        fields = [_field(TILE_START, "timestamp", record, "tile_start"),
                  _field(EVENTS_COLUMN, "int64", record, "n_events")]
        for i, partial in enumerate(tile_partials(view)):
            fields.append(_field(partial.name, partial.dtype, record, f"p{i}"))
            if partial.partial.kind == "last":
                fields.append(_field(last_ts_column(partial.column), "timestamp", record, f"t{i}"))
        var_len = _slot(record, "var_len")[1] if "var_len" in (record.fields or {}) else 0
        layout.update(kind="tiles", script="tile", time_column=TILE_START, newest_column=NEWEST,
                      events_column=EVENTS_COLUMN, trim_horizon_us=trim_horizon_us(view),
                      var_len_offset=var_len, null_bitmap=None)
    layout.update(width=int(record.itemsize), fields=fields)
    return layout


def sink_options(view: ViewSpec, kind: str, redis_url: str, *, project: str = "default",
                 markers_key: str | None = None, buffer_rows: int = DEFAULT_BUFFER_ROWS,
                 flush_interval_ms: int = 0, in_flight: int = DEFAULT_IN_FLIGHT) -> dict[str, str]:
    """The WITH options of a `quiver-redis` sink table for `view`'s `kind` ("tiles" or "last") sink.

    `markers_key`: where the view's batch markers go (`markers_key(project, source)`; only the sink that
    carries the `__batch` column needs it). `buffer_rows`: rows buffered before an early flush (the writer
    also flushes on every checkpoint and at end of input). `flush_interval_ms`: also flush this often (0:
    not on a timer), which bounds how long a value waits in the buffer. `in_flight`: flushes written to Redis on
    the sink's own thread at once while the job goes on (each checkpoint waits for them); 0: in the task thread."""
    if SINK_KINDS.get(kind) != view.kind:
        raise ValueError(f"view {view.name!r} ({view.kind}) has no {kind!r} sink: expected "
                         f"{'tiles' if view.kind == 'agg' else 'last'!r}")
    if buffer_rows < 1:
        raise ValueError(f"buffer_rows must be positive, got {buffer_rows}")
    if flush_interval_ms < 0:
        raise ValueError(f"flush_interval_ms must not be negative, got {flush_interval_ms}")
    if in_flight < 0:
        raise ValueError(f"in_flight must not be negative, got {in_flight}")
    options = {
        "connector": CONNECTOR,
        "redis.url": redis_url,
        "view": view.name,
        "kind": kind,
        "layout": json.dumps(sink_layout(view, project), separators=(",", ":")),
        "buffer.rows": str(buffer_rows),
        "write.in-flight": str(in_flight),
    }
    if markers_key:
        options["markers.key"] = markers_key
    if flush_interval_ms:
        options["flush.interval"] = f"{flush_interval_ms} ms"
    return options
