"""Committed Flink change files → the online store, vectorised; markers, late and quarantine logs → counts;
the Kafka job's late records → the offline store's `_late_events/` (`quiver.streaming.late_kafka`).

Flink writes each view's updating result as `debezium-json` change rows (`op` "c" = the new value of a
tile or of an entity's last value, "d" = the value it replaces) and makes a file visible only when the
checkpoint holding it completes, so every visible file is final and exactly-once. A poll reads all new
files of a view with one `pyarrow.json` call, keeps the "c" rows, and hands them to the online store's
ordinary writers: tiles are whole per-tile partials upserted by (entity, tile_start) where the fuller tile
wins, last values are newer-wins by event time. Loading a file twice therefore changes nothing, which is
what makes delete-after-load safe across crashes (at-least-once loading, exactly-once effect).

Freshness is the newest *event time* loaded per view: a tile row carries `__newest_us` (the newest event
of the tile), a last value its `event_ts`. The loader raises the online store's `max_event_ts` to it
(the store's own write records the newest tile start, which is older).
"""

from __future__ import annotations

import io
import json
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from quiver.catalog.ir import ViewSpec
from quiver.compile.flink import BATCH_FIELD, NEWEST
from quiver.offline.layout import EVENT_TS, last_values_schema, tile_schema
from quiver.online.base import OnlineStore
from quiver.online.redis_store import RedisOnlineStore
from quiver.streaming.paths import StreamPaths, visible_files

if TYPE_CHECKING:
    from quiver.streaming.late_kafka import KafkaLateStore

log = logging.getLogger(__name__)
_STORED = "/_stored"  # counts.json: `late/<source>/_stored`, the rows of late files moved to the offline store
_TS = pa.timestamp("us", tz="UTC")


def change_schema(view: ViewSpec) -> pa.Schema:
    """Columns of a view's change rows as the Flink job writes them (timestamps as int64 epoch µs)."""
    if view.kind == "agg":
        return tile_schema(view)
    schema = last_values_schema(view)
    return pa.schema([pa.field(f.name, pa.int64()) if pa.types.is_timestamp(f.type) else f for f in schema])


def read_changes(view: ViewSpec, files: Sequence[Path], marks: bool = False) -> pa.Table:
    """The new values ("c" rows) of `files`, typed like the offline store's tiles or last values (plus
    `__newest_us` for tiles, and `__batch` when the view carries the feeder's batch markers)."""
    return _read_changes(view, files, marks)[0]


def _read_changes(view: ViewSpec, files: Sequence[Path], marks: bool) -> tuple[pa.Table, bool]:
    """`read_changes`, and whether the files had Flink's compact shape (the fast path)."""
    blob = b"".join(_with_newline(p.read_bytes()) for p in files)
    schema = change_schema(view)
    if view.kind == "agg":
        schema = schema.append(pa.field(NEWEST, pa.int64()))
    if marks:
        schema = schema.append(pa.field(BATCH_FIELD, pa.string()))
    if not blob.strip():
        return _typed(view, schema.empty_table()), True
    floats = [f.name for f in schema if pa.types.is_floating(f.type)]
    new_values = _new_values(blob)
    if new_values is not None:  # Flink's own shape: parse only the new values, as flat objects
        if not new_values:
            return _typed(view, schema.empty_table()), True
        return _typed(view, _read_json(non_finite_as_numbers(new_values, floats), schema)), True
    after = pa.struct(list(schema))
    table = _read_json(non_finite_as_numbers(blob, floats), pa.schema([("after", after), ("op", pa.string())]))
    table = table.filter(pc.equal(table.column("op"), "c"))
    rows = table.column("after").combine_chunks()
    if isinstance(rows, pa.ChunkedArray):  # an empty filter result keeps zero chunks
        rows = pa.array([], type=after)
    return _typed(view, pa.Table.from_arrays(rows.flatten(), schema=schema)), False


_NEW_PREFIX = b'{"before":null,"after":'
_NEW_SUFFIX = b',"op":"c"}'
_OLD_SUFFIX = b'"after":null,"op":"d"}'


def _new_values(blob: bytes) -> bytes | None:
    """The `after` objects of the "c" rows, one per line, when every line has the shape Flink's
    debezium-json writer gives it (`{"before":null,"after":{…},"op":"c"}` or `…"after":null,"op":"d"}`);
    None otherwise (the general reader decides). Every tile update brings a "d" row: skipping those
    unparsed and parsing flat objects instead of structs cut the decoding time by about a quarter.

    A string value cannot end a line with the envelope's suffix: its quotes would be escaped."""
    kept = []
    for line in blob.split(b"\n"):
        if line.startswith(_NEW_PREFIX) and line.endswith(_NEW_SUFFIX):
            kept.append(line[len(_NEW_PREFIX):-len(_NEW_SUFFIX)])
        elif line.strip() and not (line.startswith(b'{"before":{') and line.endswith(_OLD_SUFFIX)):
            return None
    return b"\n".join(kept) + b"\n" if kept else b""


def _read_json(blob: bytes, schema: pa.Schema) -> pa.Table:
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    return pj.read_json(io.BytesIO(blob), parse_options=options,
                        read_options=pj.ReadOptions(block_size=max(1 << 20, min(len(blob) + 1, 64 << 20))))


def _with_keys(view: ViewSpec, table: pa.Table) -> pa.Table:
    """Rows whose join keys are all set: the job keeps null-key groups (no filter may reach the file scan,
    see compile/flink.py) and the feeder already counted those rows as `null_key:<view>`."""
    valid = None
    for key in view.key_names:
        ok = pc.is_valid(table.column(key))
        valid = ok if valid is None else pc.and_(valid, ok)
    return table if valid is None else table.filter(valid)


def non_finite_as_numbers(blob: bytes, floats: Sequence[str]) -> bytes:
    """Flink's JSON writer spells NaN and ±Infinity as strings ("NaN"); pyarrow reads the bare tokens.

    Only `"<float field>":"NaN"` is rewritten: a string value cannot hold that text unescaped."""
    if b'"NaN"' not in blob and b'Infinity"' not in blob:
        return blob
    for name in floats:
        key = re.escape(json.dumps(name).encode())
        blob = re.sub(rb"(" + key + rb'\s*:\s*)"(NaN|Infinity|-Infinity)"', rb"\1\2", blob)
    return blob


def _with_newline(data: bytes) -> bytes:
    return data if not data or data.endswith(b"\n") else data + b"\n"


def _typed(view: ViewSpec, table: pa.Table) -> pa.Table:
    if view.kind == "agg":
        return table
    schema = last_values_schema(view)
    for extra in table.schema.names[len(schema):]:
        schema = schema.append(table.schema.field(extra))
    return table.cast(schema)  # epoch µs → timestamp(us, UTC)


@dataclass
class LoadStats:
    """Running totals of one loader."""

    files: int = 0
    rows: int = 0
    entities: int = 0
    polls: int = 0
    last_load_s: float = 0.0
    busy_s: float = 0.0  # time spent decoding and writing, all polls together (the loader's profile)
    general_reads: int = 0  # reads whose files did not have Flink's compact shape (the slower reader)
    first_load_at: float | None = None  # wall clock of the first and the latest load with data
    last_load_at: float | None = None
    newest_event_us: dict[str, int] = field(default_factory=dict)
    late: dict[str, int] = field(default_factory=dict)
    late_files_stored: int = 0  # the Kafka job's late files moved to the offline store by this loader
    quarantined: dict[str, dict[str, int]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"files": self.files, "rows": self.rows, "entities": self.entities, "polls": self.polls,
                "last_load_s": round(self.last_load_s, 4), "busy_s": round(self.busy_s, 3),
                "general_reads": self.general_reads,
                "first_load_at": self.first_load_at,
                "last_load_at": self.last_load_at, "newest_event_us": dict(self.newest_event_us),
                "late": dict(self.late), "late_files_stored": self.late_files_stored,
                "quarantined": {k: dict(v) for k, v in self.quarantined.items()}}


class Loader:
    """Polls the sink folders of `views` and writes what Flink committed into `store`.

    With `direct_markers` (source → the Redis SET the JVM sink fills), the job writes tiles and last values
    to Redis itself: the loader then only follows the markers there, the newest event time per view and
    the late and quarantine logs.

    With `late_store` (the Kafka route), each committed late file goes to the offline store and is then
    deleted; its rows stay counted (`counts.json` keeps a total per source)."""

    def __init__(self, views: Sequence[ViewSpec], sources: Sequence[str], store: OnlineStore, paths: StreamPaths,
                 marking: Sequence[str] = (), direct_markers: Mapping[str, str] | None = None,
                 late_store: KafkaLateStore | None = None):
        self.late_store = late_store
        self.direct = direct_markers is not None
        self.direct_markers = dict(direct_markers or {})
        self.views = list(views)
        self.marking = set(marking)  # views whose change rows carry the batch markers
        self.sources = list(sources)
        self.store = store
        self.paths = paths
        self.stats = LoadStats()
        self.markers: set[str] = self._read_markers()  # inbox batches whose end marker is committed
        self._counted: dict[str, dict[str, Any]] = self._read_counts()
        self._fold_stored()
        self._recount()

    # ----- change files → online store -----

    def poll(self) -> int:
        """Load every committed change file once; returns the files loaded."""
        if self.direct:
            self._follow_direct()
            self.stats.polls += 1
            self.count_logs()
            return 0
        began = time.perf_counter()
        loaded = 0
        for view in self.views:
            kind = "tiles" if view.kind == "agg" else "last"
            files = visible_files(self.paths.sink(kind, view.name), "part-")
            if not files:
                continue
            marks = view.name in self.marking
            table, compact = _read_changes(view, files, marks)
            self.stats.general_reads += not compact
            if marks:
                table = self._take_markers(table)
            table = _with_keys(view, table)
            if table.num_rows:
                if view.kind == "agg":
                    newest = pc.max(table.column(NEWEST)).as_py()
                    self.stats.entities += self.store.write_tiles(view, table.drop_columns([NEWEST]))
                else:
                    self.stats.entities += self.store.write_last_values(view, table)
                    newest = pc.max(table.column(EVENT_TS).cast(pa.int64())).as_py()
                if newest is not None:
                    self.stats.newest_event_us[view.name] = max(newest, self.stats.newest_event_us.get(view.name, newest))
                    self.store.raise_freshness(view.name, self.stats.newest_event_us[view.name])
            for path in files:
                path.unlink(missing_ok=True)  # reloading would change nothing: deleting is safe after the write
            self.stats.rows += table.num_rows
            loaded += len(files)
        self.stats.files += loaded
        self.stats.polls += 1
        if loaded:
            self.stats.last_load_s = time.perf_counter() - began
            self.stats.busy_s += self.stats.last_load_s
            self.stats.last_load_at = time.time()
            if self.stats.first_load_at is None:
                self.stats.first_load_at = self.stats.last_load_at
        self.count_logs()
        return loaded

    # ----- markers, late and quarantine logs → counts -----

    def count_logs(self) -> bool:
        """Count rows of new late / quarantine files (kept as logs; late files go to the offline store with a
        `late_store`); returns whether anything changed."""
        changed = False
        for source in self.sources:
            for kind in ("late", "quarantine"):
                for path in visible_files(self.paths.sink(kind, source)):
                    key = f"{kind}/{source}/{path.name}"
                    if kind == "late" and self.late_store is not None:
                        changed |= self._store_late(source, key, path)
                        continue
                    if key in self._counted:
                        continue
                    self._counted[key] = _count_file(kind, path)
                    changed = True
        if changed:
            self._fold_stored()
            self._recount()
            self._write_counts()
        return changed

    def _store_late(self, source: str, key: str, path: Path) -> bool:
        """One committed late file → the offline store, counted, then deleted. Each step may be repeated after a
        crash: the store's objects are named after the file (rewritten, never doubled), a file is counted once."""
        assert self.late_store is not None
        try:
            rows = self.late_store.store_file(source, path)
        except OSError as exc:  # the store is unreachable: the file stays, the next poll retries it
            log.warning("late records of %s: %s stays for the next poll: %s", source, path.name, exc)
            return False
        if not self._counted.get(key, {}).get("stored"):
            self._counted[key] = {"rows": rows, "stored": True}
            self._write_counts()  # before the file goes: its rows must stay counted
        path.unlink(missing_ok=True)
        self.stats.late_files_stored += 1
        return True

    def _fold_stored(self) -> None:
        """Counts of late files already moved to the offline store → one total per source, so `counts.json`
        stays small over a long run."""
        for key in [k for k, v in self._counted.items() if v.get("stored") and not k.endswith(_STORED)
                    and not (self.paths.sinks / k).exists()]:
            total = self._counted.setdefault(key.rsplit("/", 1)[0] + _STORED, {"rows": 0, "stored": True})
            total["rows"] = int(total["rows"]) + int(self._counted.pop(key)["rows"])

    def _take_markers(self, table: pa.Table) -> pa.Table:
        """Record the marker rows' batches (persisted before the files go) and drop the column."""
        batches = table.column(BATCH_FIELD)
        found = set(pc.drop_null(batches).to_pylist())
        if found - self.markers:
            self.markers |= found
            self._write_markers()
        return table.filter(pc.is_null(batches)).drop_columns([BATCH_FIELD])

    def _follow_direct(self) -> None:
        """The JVM sink wrote the values: pick up its batch markers and the views' newest event times."""
        store = self._redis()
        found: set[str] = set()
        for key in self.direct_markers.values():
            found |= store.set_members(key)
        if found - self.markers:
            self.markers |= found
            self._write_markers()
        fresh = store.freshness([v.name for v in self.views])
        self.stats.newest_event_us.update({v: int(t) for v, t in fresh.items() if t is not None})

    def _redis(self) -> RedisOnlineStore:
        if not isinstance(self.store, RedisOnlineStore):
            raise TypeError("the JVM sink writes to Redis: the loader needs the Redis online store")
        return self.store

    def forget_markers(self, retired: set[str]) -> None:
        """Forget markers of retired batches (retention: the set stays as small as the inbox)."""
        if self.markers & retired:
            self.markers -= retired
            self._write_markers()
            if self.direct:
                for key in self.direct_markers.values():
                    self._redis().remove_members(key, sorted(retired))

    def _read_markers(self) -> set[str]:
        try:
            return set(json.loads((self.paths.root / "markers.json").read_text()))
        except (OSError, ValueError):
            return set()

    def _write_markers(self) -> None:
        path = self.paths.root / "markers.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(".markers.json.tmp")
        tmp.write_text(json.dumps(sorted(self.markers)))
        tmp.replace(path)

    def _recount(self) -> None:
        late: dict[str, int] = {s: 0 for s in self.sources}
        quarantined: dict[str, dict[str, int]] = {s: {} for s in self.sources}
        for key, counts in self._counted.items():
            kind, source, _ = key.split("/", 2)
            if kind == "late":
                late[source] = late.get(source, 0) + int(counts.get("rows", 0))
                continue
            per = quarantined.setdefault(source, {})
            for reason, n in counts.items():
                per[reason] = per.get(reason, 0) + int(n)
        self.stats.late, self.stats.quarantined = late, quarantined

    def _read_counts(self) -> dict[str, dict[str, Any]]:
        path = self.paths.root / "counts.json"
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return {}
        # A log file removed by hand is forgotten; late files moved to the offline store stay counted.
        return {k: v for k, v in data.items() if v.get("stored") or (self.paths.sinks / k).exists()}

    def _write_counts(self) -> None:
        path = self.paths.root / "counts.json"
        tmp = path.with_name(".counts.json.tmp")
        tmp.write_text(json.dumps(self._counted))
        tmp.replace(path)


def _count_file(kind: str, path: Path) -> dict[str, Any]:
    """Rows of a late file ({"rows": n}) or rows per reason of a quarantine file ({"null_key:view": n})."""
    lines = [line for line in path.read_bytes().split(b"\n") if line.strip()]
    if kind == "late":
        return {"rows": len(lines)}
    counts: dict[str, int] = {}
    for line in lines:
        try:
            row = json.loads(line)
            reason = str(row.get("reason") or "unknown")
            view = row.get("view") or ""
        except ValueError:
            reason, view = "unreadable_quarantine_row", ""
        label = f"{reason}:{view}" if view else reason
        counts[label] = counts.get(label, 0) + 1
    return counts
