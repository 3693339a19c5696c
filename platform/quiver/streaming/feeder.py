"""Stream directory → the Flink job's inbox: checked, typed, time-ordered, late events split off.

Flink's filesystem source reads the files it finds in one scan in no fixed order, so a backlog of many
small files would arrive shuffled (docs/architecture.md, "Streaming"). The feeder therefore hands the job *one* batch file per
pass: the pending stream files' lines in name order (producers name files by their first event time).
Because it sees every line in order, the feeder also does what would otherwise cost the job per row:

* **check** each line against the source's types, vectorised: whole chunks go through `pyarrow.json`
  with the explicit schema (strict: `"3"` is not a number, `"yes"` not a boolean, `1.5` not an integer);
  a chunk that fails is bisected until the bad lines are isolated, and each gets its reason
  (`unparseable_json`, `bad_type:<col>`, `null_event_ts`, `reserved_field:__batch`) in the quarantine log;
* **refuse** rows failing the source's contract (`Contract`), with the same rules and reasons
  (`<rule>:<column>`, its first failing check) as the backfill, vectorised over the typed batch (the
  feeder's clock is the one `max_future` reads): they go to the quarantine log, are counted per check
  (`refused:<reason>` in the manifests), and neither reach the job nor move the watermark;
* **split** late events: the watermark is the greatest event time fed so far minus the source's
  watermark delay; an event at or before `watermark - allowed_lateness` is late. The rule is exact and
  deterministic (it is kept in the manifests, so it survives restarts);
* **hold back** future-dated events (event time after the feeder's clock + the source's `max_future`, 5
  minutes by default, or the run's `--max-future-ms`): online state never holds an event dated far after its
  arrival, so it cannot hide older last values; a producer whose clock runs a little fast loses nothing.

Late and future-dated events are written as Parquet (the source's columns and its event-time column) to
`<offline root>/_late_events/<source>/date=…/`, where the next batch backfill reads them with the
source's own files (`late.py`): nothing late is lost, it takes the batch route. Rows with a null join key
stay in the stream (other views may use them) and are counted per view as `null_key:<view>`.

Lines go to the job unchanged (typed JSON the job parses strictly); only lines holding NaN or ±Infinity
are rewritten, as the strings "NaN"/"Infinity", which Flink's JSON format reads as those doubles. Every
batch ends with a marker line `{"__batch": "<batch>"}`; once it is in a committed marker file, every
line before it has been processed and committed (checkpoint barriers follow the records).

Crash safety: a batch `upto-<last stream file>` appears by an atomic rename after its hidden manifest
`.upto-<…>.json` (the stream files it holds, the watermark and its counts) and its quarantine and late
files were written; what was fed is read back from the manifests, so a crash re-feeds nothing twice.
Retention (`retire`): batch files whose marker was committed and loaded are deleted and their manifests
folded into `.history.json`; with `stream_retention_s`, fed stream files older than that are deleted too.
"""

from __future__ import annotations

import io
import json
import math
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
import pyarrow.parquet as pq

from quiver.catalog.ir import Catalog, ContractSpec, ViewSpec
from quiver.compile.contracts import counts as contract_counts
from quiver.compile.contracts import violations
from quiver.compile.flink import BATCH_FIELD, LEGACY_TIME_FIELD, TIME_FIELD, source_columns
from quiver.offline.layout import LATE_DIR
from quiver.offline.store import OfflineStore
from quiver.streaming.paths import StreamPaths, visible_files

BATCH_PREFIX = "upto-"
UNPARSEABLE = "unparseable_json"
FEEDER_QUARANTINE_PREFIX = "feeder-"
HISTORY = ".history.json"
_MAX_BATCH_BYTES = 64 << 20
_CHUNK_LINES = 20_000
_ARROW = {"int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_(), "string": pa.string(),
          "timestamp": pa.int64()}
_TS = pa.timestamp("us", tz="UTC")
_INT64 = (-(1 << 63), (1 << 63) - 1)
_TS_RANGE = (-62_135_596_800_000_000, 253_402_300_799_999_999)  # years 1..9999 (what Parquet days can name)


@dataclass(frozen=True)
class SourceFeed:
    """What the feeder checks for one source: its columns, the views' keys, its watermark rules."""

    name: str
    columns: tuple[tuple[str, str], ...]
    keys: tuple[tuple[str, tuple[str, ...]], ...]  # (view, join keys)
    timestamp_field: str
    watermark_delay_us: int
    allowed_lateness_us: int
    contract: ContractSpec | None = None
    max_future_us: int = 300_000_000  # event times beyond the clock + this take the batch route

    @property
    def schema(self) -> pa.Schema:
        fields = [(TIME_FIELD, pa.int64()), (LEGACY_TIME_FIELD, pa.int64())]
        fields += [(c, _ARROW[t]) for c, t in self.columns] + [(BATCH_FIELD, pa.string())]
        return pa.schema(fields)


def source_feeds(catalog: Catalog, views: Sequence[ViewSpec]) -> dict[str, SourceFeed]:
    """One SourceFeed per source of the streamed `views`."""
    out: dict[str, SourceFeed] = {}
    for name in sorted({v.source for v in views}):
        source = catalog.sources[name]
        stream = source.stream
        assert stream is not None
        of = [v for v in views if v.source == name]
        # Every column of the source, not only the streamed ones: late events go to the batch route,
        # where views that do not stream may read the others.
        columns = dict(source_columns(source, of))
        for column, dtype in source.columns:
            if column != source.timestamp_field and dtype in _ARROW:
                columns.setdefault(column, dtype)
        out[name] = SourceFeed(name, tuple(columns.items()), tuple((v.name, tuple(v.key_names)) for v in of),
                               source.timestamp_field, stream.watermark_delay_us, stream.allowed_lateness_us,
                               source.contract, stream.max_future_us)
    return out


@dataclass
class FeedResult:
    """What one pass did, per source."""

    files: dict[str, int] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)
    unparseable: dict[str, int] = field(default_factory=dict)
    late: dict[str, int] = field(default_factory=dict)
    future: dict[str, int] = field(default_factory=dict)

    @property
    def total_lines(self) -> int:
        return sum(self.lines.values())


class Feeder:
    """Moves new stream files of each source into its inbox as checked, time-ordered batches."""

    def __init__(self, streams: Mapping[str, Path], paths: StreamPaths, feeds: Mapping[str, SourceFeed],
                 late: Path | OfflineStore, max_future_ms: int | None = None, max_batch_bytes: int = _MAX_BATCH_BYTES,
                 clock: Callable[[], float] = time.time, stream_retention_s: float | None = None):
        """`late`: where late and future-dated events go: the offline store (its `_late_events/`, a folder or
        an object store), or a folder of their own. `max_future_ms`: the run's future tolerance for every source;
        None: each source's own (`SourceFeed.max_future_us`)."""
        self.streams = {name: Path(p) for name, p in streams.items()}
        self.paths, self.feeds = paths, dict(feeds)
        self.late = late if isinstance(late, OfflineStore) else Path(late)
        self.max_future_us = None if max_future_ms is None else max_future_ms * 1000
        self.max_batch_bytes = max_batch_bytes
        self.clock = clock
        self.stream_retention_s = stream_retention_s
        self._fed: dict[str, set[str]] = {}
        self._watermark: dict[str, int | None] = {}
        self.totals: dict[str, dict[str, int]] = {}  # source → lines, late, future, unparseable
        for name in self.streams:
            self._load_state(name)

    # ----- state from manifests -----

    def _manifests(self, source: str) -> Iterable[dict[str, Any]]:
        """Manifests of the batches fed and not yet folded into the history (a manifest whose batch file
        is missing belongs to a pass that crashed before its rename: those files were not fed)."""
        inbox = self.paths.inbox(source)
        absorbed = str(self._history(source).get("absorbed_upto", ""))
        for manifest in sorted(inbox.glob(f".{BATCH_PREFIX}*.json")) if inbox.is_dir() else []:
            batch = manifest.name[1:-len(".json")]
            if batch > absorbed and (inbox / batch).exists():
                yield json.loads(manifest.read_text())

    def _history(self, source: str) -> dict[str, Any]:
        try:
            return dict(json.loads((self.paths.inbox(source) / HISTORY).read_text()))
        except (OSError, ValueError):
            return {}

    def _load_state(self, source: str) -> None:
        history = self._history(source)
        fed = set(history.get("files", []))
        totals = dict(history.get("totals", {}))
        watermark = history.get("max_ts_us")
        for meta in self._manifests(source):
            fed.update(meta["files"])
            for k, n in meta.get("counts", {}).items():
                totals[k] = totals.get(k, 0) + int(n)
            if meta.get("max_ts_us") is not None:
                watermark = meta["max_ts_us"] if watermark is None else max(watermark, meta["max_ts_us"])
        self._fed[source], self.totals[source], self._watermark[source] = fed, totals, watermark

    def pending(self, source: str) -> list[Path]:
        """Stream files of `source` not fed yet, in name (time) order."""
        fed = self._fed[source]
        return [p for p in visible_files(self.streams[source]) if p.name not in fed]

    def backlog(self) -> int:
        """Stream files waiting in every source."""
        return sum(len(self.pending(s)) for s in self.streams)

    # ----- one pass -----

    def feed(self) -> FeedResult:
        """One pass: every pending file of every source into one new inbox batch per source."""
        result = FeedResult()
        for source in self.streams:
            files = self.pending(source)
            if files:
                self._feed_batch(source, files, result)
        return result

    def _chunks(self, files: list[Path]) -> Iterator[tuple[int, list[Path]]]:
        """`files` in runs of at most `max_batch_bytes` (at least one file each): what is checked at once."""
        part, size, start = 0, 0, 0
        for end, path in enumerate(files):
            grown = size + path.stat().st_size
            if end > start and grown > self.max_batch_bytes:
                yield part, files[start:end]
                part, size, start = part + 1, 0, end
                grown = path.stat().st_size
            size = grown
        yield part, files[start:]

    def _feed_batch(self, source: str, files: list[Path], result: FeedResult) -> None:
        """All of a pass's files as *one* batch file: Flink reads the files it finds in one scan in no fixed
        order, so a backlog split into several batches would reach the job shuffled (tiles then arrive
        older than the ones stored, and every such write rewrites a whole value in Redis). Memory stays
        bounded: the lines are checked `max_batch_bytes` at a time and appended to the batch as they pass."""
        inbox = self.paths.inbox(source)
        inbox.mkdir(parents=True, exist_ok=True)
        name = BATCH_PREFIX + files[-1].name
        counts: dict[str, int] = {}
        # The source's watermark moves only once the batch is in: a pass that fails half-way (a full disk) is
        # checked again from the same watermark, so its events are not late against their own chunks.
        watermark = self._watermark[source]
        tmp = inbox / f".{name}.{os.getpid()}.tmp"
        try:
            with tmp.open("wb") as out:
                for part, chunk in self._chunks(files):
                    fed, chunk_counts, watermark = self._check_chunk(source, chunk, watermark,
                                                                     name if part == 0 else f"{name}.{part}")
                    if fed:
                        out.write(b"\n".join(fed) + b"\n")
                    for key, n in chunk_counts.items():
                        counts[key] = counts.get(key, 0) + n
                out.write(json.dumps({BATCH_FIELD: name}).encode() + b"\n")
            manifest = {"files": [p.name for p in files], "max_ts_us": watermark, "counts": counts}
            _atomic_write(inbox / f".{name}.json", json.dumps(manifest).encode())
            os.replace(tmp, inbox / name)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        self._watermark[source] = watermark
        self._fed[source].update(p.name for p in files)
        totals = self.totals[source]
        for k, n in counts.items():
            totals[k] = totals.get(k, 0) + n
        result.files[source] = result.files.get(source, 0) + len(files)
        result.lines[source] = result.lines.get(source, 0) + counts["fed"]
        for target_counts, key in ((result.unparseable, "unparseable"), (result.late, "late"),
                                   (result.future, "future")):
            target_counts[source] = target_counts.get(source, 0) + counts[key]

    def _check_chunk(self, source: str, files: list[Path], watermark_max: int | None,
                     part: str) -> tuple[list[bytes], dict[str, int], int | None]:
        """Check one run of files against the watermark so far: the lines the job gets, the counts and the
        watermark after them. Quarantines, and sets late and future rows aside (files named after `part`)."""
        feed = self.feeds[source]
        lines: list[bytes] = []
        origin: list[int] = []
        for index, path in enumerate(files):
            for raw in path.read_bytes().split(b"\n"):
                line = raw.strip()
                if line:
                    lines.append(line)
                    origin.append(index)
        checked = check_lines(feed, lines)
        counts: dict[str, int] = {"lines": len(lines)}
        quarantine = [{"reason": reason, "view": "", "line": lines[i].decode("utf-8", "replace"),
                       "file": files[origin[i]].name} for i, reason in checked.rejected]
        table, rows = checked.table, checked.rows
        ts = table.column(TIME_FIELD).to_numpy(zero_copy_only=False).astype(np.int64) if table.num_rows else \
            np.empty(0, np.int64)
        now_us = int(self.clock() * 1e6)
        refused = self._refuse(feed, table, now_us, lines, rows, origin, files, quarantine, counts)
        tolerance = feed.max_future_us if self.max_future_us is None else self.max_future_us
        future = ~refused & (ts > now_us + tolerance)
        # A refused row neither moves the watermark nor counts as late: it is not an event of the source.
        watermark, late = late_mask(ts, future | refused, watermark_max, feed)
        on_time = ~(late | future | refused)
        for view, keys in feed.keys:
            null = np.zeros(table.num_rows, dtype=bool)
            for key in keys:
                null |= ~table.column(key).is_valid().to_numpy(zero_copy_only=False)
            for i in np.flatnonzero(null & on_time):
                quarantine.append({"reason": "null_key", "view": view, "line": lines[rows[i]].decode("utf-8", "replace"),
                                   "file": files[origin[rows[i]]].name})
        out = [lines[rows[i]] for i in np.flatnonzero(on_time)]
        position = np.cumsum(on_time) - 1
        for i in np.flatnonzero(on_time & checked.non_finite):  # NaN/±Infinity tokens → strings for Flink
            out[int(position[i])] = _finite_json(lines[rows[i]])
        counts.update(late=int(late.sum()), future=int(future.sum()), unparseable=sum(
            1 for _, r in checked.rejected if r == UNPARSEABLE), quarantined=len(quarantine), fed=len(out))
        if quarantine:
            target = self.paths.sink("quarantine", source) / f"{FEEDER_QUARANTINE_PREFIX}{part}"
            _atomic_write(target, b"".join(json.dumps(q).encode() + b"\n" for q in quarantine))
        if (late | future).any():
            self._write_late(feed, part, table.filter(pa.array(late | future)))
        return out, counts, watermark

    @staticmethod
    def _refuse(feed: SourceFeed, table: pa.Table, now_us: int, lines: list[bytes], rows: np.ndarray,
                origin: list[int], files: list[Path], quarantine: list[dict[str, Any]],
                counts: dict[str, int]) -> np.ndarray:
        """Rows failing the source's contract: quarantined with their reason and counted per check."""
        if feed.contract is None or not table.num_rows:
            return np.zeros(table.num_rows, dtype=bool)
        columns = {c: table.column(TIME_FIELD if c == feed.timestamp_field else c) for c in feed.contract.columns}
        first = violations(pa.table(columns), feed.contract, now_us)
        reasons = feed.contract.reasons
        for i in np.flatnonzero(first >= 0):
            quarantine.append({"reason": reasons[first[i]], "view": "", "file": files[origin[rows[i]]].name,
                               "line": lines[rows[i]].decode("utf-8", "replace")})
        for reason, n in contract_counts(first, feed.contract).items():
            counts[f"refused:{reason}"] = n
        return first >= 0

    def _write_late(self, feed: SourceFeed, batch: str, rows: pa.Table) -> None:
        """Late and future-dated rows → Parquet per UTC day, with the source's event-time column."""
        ts = rows.column(TIME_FIELD).cast(_TS)
        columns: dict[str, pa.Array | pa.ChunkedArray] = {}
        for column, dtype in feed.columns:
            values = rows.column(column)
            columns[column] = values.cast(_TS) if dtype == "timestamp" else values
        columns[feed.timestamp_field] = ts
        table = pa.table(columns)
        days = pc.strftime(ts, format="%Y-%m-%d").to_pylist()
        for day in sorted(set(days)):
            part = table.filter(pa.array([d == day for d in days]))
            buf = io.BytesIO()
            pq.write_table(part, buf)
            name = f"date={day}/{batch}.parquet"  # the same name again after a crash: rewritten, never doubled
            if isinstance(self.late, OfflineStore):
                self.late.put(self.late.path(LATE_DIR, feed.name, name), buf.getvalue())
            else:
                _atomic_write(self.late / feed.name / name, buf.getvalue())

    # ----- batches and retention -----

    def batches(self) -> dict[str, list[str]]:
        """Names of the batches in every inbox (each ends with its marker)."""
        return {source: [p.name for p in visible_files(self.paths.inbox(source), BATCH_PREFIX)]
                for source in self.streams}

    def retire(self, done: set[str]) -> int:
        """Delete inbox batches in `done` (committed and loaded); fold their manifests into the history.

        Returns the batch files deleted. With `stream_retention_s`, fed stream files older than that are
        deleted from the stream directory as well (and forgotten)."""
        removed = 0
        for source in self.streams:
            inbox = self.paths.inbox(source)
            names = [n for n in self.batches()[source] if n in done]
            if not names:
                continue
            history = self._history(source)
            files = set(history.get("files", []))
            totals = dict(history.get("totals", {}))
            newest = history.get("max_ts_us")
            upto = str(history.get("absorbed_upto", ""))
            for batch in sorted(names):
                meta = json.loads((inbox / f".{batch}.json").read_text())
                files.update(meta["files"])
                for k, n in meta.get("counts", {}).items():
                    totals[k] = totals.get(k, 0) + int(n)
                if meta.get("max_ts_us") is not None:
                    newest = meta["max_ts_us"] if newest is None else max(newest, meta["max_ts_us"])
                upto = max(upto, batch)
            if self.stream_retention_s is not None:
                files -= self._expire_stream_files(source, files)
            # History first (it names the newest batch it absorbed), then the files it replaces.
            _atomic_write(inbox / HISTORY, json.dumps({"files": sorted(files), "totals": totals, "max_ts_us": newest,
                                                      "absorbed_upto": upto}).encode())
            for batch in names:
                (inbox / batch).unlink(missing_ok=True)
                (inbox / f".{batch}.json").unlink(missing_ok=True)
                removed += 1
        return removed

    def _expire_stream_files(self, source: str, fed: set[str]) -> set[str]:
        assert self.stream_retention_s is not None
        cutoff = self.clock() - self.stream_retention_s
        gone: set[str] = set()
        for path in visible_files(self.streams[source]):
            if path.name in fed and path.stat().st_mtime < cutoff:
                path.unlink(missing_ok=True)
                gone.add(path.name)
        self._fed[source] -= gone
        return gone

    def reset(self) -> None:
        """Forget what was fed: empty every inbox (a fresh job replays the whole stream directory)."""
        for source in self.streams:
            inbox = self.paths.inbox(source)
            if inbox.is_dir():
                for path in inbox.iterdir():
                    if path.is_file():
                        path.unlink()
            self._fed[source], self._watermark[source], self.totals[source] = set(), None, {}


# ---- checking lines (pure functions, unit-tested) ----


@dataclass
class Checked:
    """Lines that passed (`rows`: their indices, `table`: their typed values) and the rejected ones."""

    rows: np.ndarray
    table: pa.Table
    non_finite: np.ndarray  # per passed row: holds a NaN or ±Infinity float
    rejected: list[tuple[int, str]]


def check_lines(feed: SourceFeed, lines: Sequence[bytes]) -> Checked:
    """Type-check JSON lines against `feed`'s schema, vectorised per chunk; bad lines get a reason."""
    schema = feed.schema
    tables: list[pa.Table] = []
    rows: list[np.ndarray] = []
    rejected: list[tuple[int, str]] = []
    for start in range(0, len(lines), _CHUNK_LINES):
        _check_span(schema, lines, start, min(start + _CHUNK_LINES, len(lines)), tables, rows, rejected)
    table = pa.concat_tables(tables) if tables else schema.empty_table()
    index = np.concatenate(rows) if rows else np.empty(0, np.int64)
    ms = table.column(LEGACY_TIME_FIELD)
    ms_ok = pc.fill_null(pc.less_equal(pc.abs(ms), _INT64[1] // 1000), True).to_numpy(zero_copy_only=False)
    ts = pc.coalesce(table.column(TIME_FIELD), pc.multiply(ms, 1000))
    table = table.set_column(0, TIME_FIELD, ts)
    ts_np = pc.fill_null(ts, 0).to_numpy(zero_copy_only=False)
    problems = np.full(table.num_rows, None, dtype=object)
    problems[(ts_np < _TS_RANGE[0]) | (ts_np > _TS_RANGE[1])] = "event_ts_out_of_range"
    problems[~ms_ok] = f"bad_type:{LEGACY_TIME_FIELD}"
    problems[~ts.is_valid().to_numpy(zero_copy_only=False)] = "null_event_ts"
    problems[table.column(BATCH_FIELD).is_valid().to_numpy(zero_copy_only=False)] = f"reserved_field:{BATCH_FIELD}"
    bad = np.array([p is not None for p in problems], dtype=bool)
    rejected += [(int(index[i]), str(problems[i])) for i in np.flatnonzero(bad)]
    non_finite = np.zeros(table.num_rows, dtype=bool)
    for column, dtype in feed.columns:
        if dtype == "float64":
            values = pc.fill_null(table.column(column), 0.0)
            non_finite |= ~pc.is_finite(values).to_numpy(zero_copy_only=False)
    keep = ~bad
    rejected.sort()
    return Checked(index[keep], table.filter(pa.array(keep)), non_finite[keep], rejected)


def _check_span(schema: pa.Schema, lines: Sequence[bytes], start: int, stop: int, tables: list[pa.Table],
                rows: list[np.ndarray], rejected: list[tuple[int, str]]) -> None:
    """Parse lines[start:stop] in one call; on failure bisect, and classify single bad lines."""
    table = _parse(schema, lines[start:stop])
    if table is not None:
        tables.append(table)
        rows.append(np.arange(start, stop, dtype=np.int64))
        return
    if stop - start == 1:
        reason = classify_line(schema, lines[start])
        if reason is None:  # pyarrow refused what Python accepts (e.g. "NaN" as a string): keep it
            tables.append(_python_row(schema, lines[start]))
            rows.append(np.array([start], dtype=np.int64))
        else:
            rejected.append((start, reason))
        return
    middle = (start + stop) // 2
    _check_span(schema, lines, start, middle, tables, rows, rejected)
    _check_span(schema, lines, middle, stop, tables, rows, rejected)


def _parse(schema: pa.Schema, lines: Sequence[bytes]) -> pa.Table | None:
    options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
    blob = b"\n".join(lines) + b"\n"
    try:
        table = pj.read_json(io.BytesIO(blob), parse_options=options,
                             read_options=pj.ReadOptions(block_size=max(1 << 20, len(blob) + 1)))
    except pa.ArrowInvalid:
        return None
    if table.num_rows != len(lines):  # e.g. two objects on one line
        return None
    return table.select(schema.names).cast(schema)


_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def classify_line(schema: pa.Schema, line: bytes) -> str | None:
    """The quarantine reason of one line, or None when it is acceptable."""
    try:
        row = json.loads(line)
    except ValueError:
        return UNPARSEABLE
    if type(row) is not dict:
        return UNPARSEABLE
    for f in schema:
        value = row.get(f.name)
        if value is None:
            continue
        if pa.types.is_integer(f.type):
            ok = type(value) is int and _INT64[0] <= value <= _INT64[1]
        elif pa.types.is_floating(f.type):
            ok = type(value) in (int, float) or (type(value) is str and value in _NON_FINITE)
        elif pa.types.is_boolean(f.type):
            ok = type(value) is bool
        else:
            ok = type(value) is str
        if not ok:
            return f"bad_type:{f.name}"
    return None


def _python_row(schema: pa.Schema, line: bytes) -> pa.Table:
    row = json.loads(line)
    values = {f.name: [_NON_FINITE.get(row[f.name], row[f.name]) if pa.types.is_floating(f.type)
                       and isinstance(row.get(f.name), str) else row.get(f.name)] for f in schema}
    return pa.table({f.name: pa.array(values[f.name], f.type) for f in schema}, schema=schema)


def late_mask(ts: np.ndarray, future: np.ndarray, watermark_max: int | None,
              feed: SourceFeed) -> tuple[int | None, np.ndarray]:
    """(new greatest event time, late flags) for events `ts` in arrival order.

    The watermark before event i is max(event times before i, future ones excluded) - watermark delay;
    event i is late when ts[i] <= watermark - allowed lateness (Flink's rule, made exact)."""
    if len(ts) == 0:
        return watermark_max, np.zeros(0, dtype=bool)
    floor = np.iinfo(np.int64).min
    counted = np.where(future, floor, ts)
    running = np.maximum.accumulate(counted)
    before = np.empty_like(running)
    before[0] = floor if watermark_max is None else watermark_max
    before[1:] = np.maximum(running[:-1], before[0])
    seen = before != floor
    bound = np.where(seen, before, 0) - feed.watermark_delay_us - feed.allowed_lateness_us
    late = seen & ~future & (ts <= bound)
    newest = int(max(running[-1], before[0]))
    return (None if newest == floor else newest), late


def _finite_json(line: bytes) -> bytes:
    row = json.loads(line)  # the stdlib reads NaN / Infinity tokens
    for key, value in row.items():
        if isinstance(value, float) and not math.isfinite(value):
            row[key] = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return json.dumps(row, allow_nan=False).encode()


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
