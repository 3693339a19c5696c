"""Late records of the Kafka route → the offline store's `_late_events/`, exactly like the feeder's.

The Kafka job writes every record behind its watermark by more than the allowed lateness as one JSON line
(`{"ts_us": <event time, epoch µs>, <column>: <value>, …}`) through Flink's filesystem sink into
`<state>/sinks/late/<source>/`; a file becomes visible when the checkpoint holding it completes (in-progress
files are hidden). `KafkaLateStore.store` turns one committed file into Parquet, one file per UTC day:

    <offline root>/_late_events/<source>/date=<day>/kafka-<JSON file name>.parquet

with the feeder's columns and types (`late_table`): every column of the source the feeder keeps, then its
event-time column as timestamp(us, UTC). The backfill and the consistency job read both routes alike. The
Parquet name comes from the JSON file's name, so a crash between the write and the JSON file's deletion
writes the same object again on the next poll: rewritten, never doubled. The loader deletes the JSON file
once every day of it is written.
"""

from __future__ import annotations

import io
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
import pyarrow.parquet as pq

from quiver.catalog.ir import Catalog, ViewSpec
from quiver.compile.flink import TIME_FIELD
from quiver.offline.layout import LATE_DIR
from quiver.offline.store import OfflineStore
from quiver.streaming.feeder import source_feeds
from quiver.streaming.loader import non_finite_as_numbers
from quiver.streaming.paths import StreamPaths, visible_files

log = logging.getLogger(__name__)

__all__ = ["KafkaLateStore", "LateColumns", "forget_on_fresh", "late_layouts", "late_parquet_name", "late_table",
           "move_committed", "read_late_json"]

_TS = pa.timestamp("us", tz="UTC")
# The Flink job writes timestamps as BIGINT epoch µs (compile/flink_sql.py TYPES).
_JSON_TYPES = {"int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_(), "string": pa.string(),
               "timestamp": pa.int64()}
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True)
class LateColumns:
    """What a source's late files hold: its columns (name, logical dtype) in the feeder's order, and its
    event-time column (`quiver.streaming.feeder.SourceFeed` has both)."""

    source: str
    columns: tuple[tuple[str, str], ...]
    timestamp_field: str


def late_parquet_name(json_name: str, day: str) -> str:
    """The store's name (below the source's late folder) of one day of the committed JSON file `json_name`:
    the same name every time, so writing it again replaces it."""
    return f"date={day}/kafka-{_UNSAFE.sub('_', json_name)}.parquet"


def read_late_json(path: Path, layout: LateColumns) -> pa.Table:
    """The rows of one late file as the job wrote them: `ts_us` and the columns, JSON-typed (timestamps as
    epoch µs). A column the job did not write reads as nulls."""
    fields = [pa.field(TIME_FIELD, pa.int64())]
    fields += [pa.field(c, _JSON_TYPES[t]) for c, t in layout.columns if c != TIME_FIELD]
    schema = pa.schema(fields)
    blob = path.read_bytes()
    if not blob.strip():
        return schema.empty_table()
    floats = [c for c, t in layout.columns if t == "float64"]
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    return pj.read_json(io.BytesIO(non_finite_as_numbers(blob, floats)), parse_options=options,
                        read_options=pj.ReadOptions(block_size=max(1 << 20, min(len(blob) + 1, 64 << 20))))


def late_table(rows: pa.Table, layout: LateColumns) -> pa.Table:
    """`rows` (`ts_us` + columns, as `read_late_json` gives them) with the feeder's late-file columns and types:
    the source's columns in order (timestamp columns as timestamp(us, UTC)), the event time in the source's
    timestamp column (appended unless it is one of the columns)."""
    columns: dict[str, pa.Array | pa.ChunkedArray] = {}
    for column, dtype in layout.columns:
        values = rows.column(column)
        columns[column] = values.cast(_TS) if dtype == "timestamp" else values
    columns[layout.timestamp_field] = rows.column(TIME_FIELD).cast(_TS)
    return pa.table(columns)


class KafkaLateStore:
    """Writes the Kafka job's committed late files into the offline store (a folder or an object store)."""

    def __init__(self, store: OfflineStore, layouts: Mapping[str, LateColumns]):
        self.store = store
        self.layouts = dict(layouts)

    def store_file(self, source: str, path: Path) -> int:
        """Write the committed late file `path` of `source` as Parquet per UTC day (see module docstring);
        returns its rows. Writing the same file again rewrites the same objects."""
        layout = self.layouts[source]
        table = late_table(read_late_json(path, layout), layout)
        if not table.num_rows:
            return 0
        days = pc.strftime(table.column(layout.timestamp_field), format="%Y-%m-%d")
        for day in sorted(set(days.to_pylist())):
            part = table.filter(pc.equal(days, day))
            buf = io.BytesIO()
            pq.write_table(part, buf)
            self.store.put(self.store.path(LATE_DIR, source, late_parquet_name(path.name, day)), buf.getvalue())
        return int(table.num_rows)


def late_layouts(catalog: Catalog, views: Sequence[ViewSpec]) -> dict[str, LateColumns]:
    """source → its late files' columns, the feeder's (every column of the source it keeps, in its order)."""
    return {name: LateColumns(name, feed.columns, feed.timestamp_field)
            for name, feed in source_feeds(catalog, views).items()}


def move_committed(late_store: KafkaLateStore, paths: StreamPaths, sources: Sequence[str]) -> int:
    """Every committed late file of `sources` → the offline store, then deleted (a fresh start that does not
    replay the topics keeps them this way); returns the files moved."""
    moved = 0
    for source in sources:
        for path in visible_files(paths.sink("late", source)):
            late_store.store_file(source, path)
            path.unlink(missing_ok=True)
            moved += 1
    return moved


REPLACED_DIR = "_late_events_replaced"  # beside _late_events: what a replay set aside (the backfill skips it)


def forget_on_fresh(store: OfflineStore, sources: Sequence[str], replayed: bool, startup: str) -> int:
    """`--fresh`: when the new job replays their events from the start (it writes them again; kept, they would
    count twice), set the late-event files of `sources` aside under `_late_events_replaced/<UTC time>/<source>/`
    (never deleted: a record that aged out of the topic or the stream folder is not replayed, and its late file is
    its only copy); keep them in place otherwise. Logs what it did; returns the files set aside."""
    files = {s: store.late_event_files(s) for s in sources}
    total = sum(len(f) for f in files.values())
    if not total:
        return 0
    where = store.uri(store.path(LATE_DIR))
    named = ", ".join(s for s, f in files.items() if f)
    if not replayed:
        log.info("fresh start: kept %d late-event file(s) of %s in %s: the job starts at %s and will not read "
                 "their records again", total, named, where, startup)
        return 0
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    for source, paths in files.items():
        folder, aside = store.path(LATE_DIR, source), store.path(REPLACED_DIR, stamp, source)
        for path in paths:
            target = aside + path[len(folder):]
            store.fs.create_dir(target.rsplit("/", 1)[0], recursive=True)
            store.fs.move(path, target)  # an object store copies on the server side
        store.delete_tree(folder)
    log.info("fresh start: set %d late-event file(s) of %s aside in %s: the job replays the stream from its start "
             "and writes again those whose records it still has; restore a file from there if its records are gone "
             "from the stream", total, named, store.uri(store.path(REPLACED_DIR, stamp)))
    return total
