"""Flink SQL target: one streaming job that keeps the tiles and last values of every streamed view fresh.

A view is streamed when it is online and its source has a stream binding. Event times are epoch
**microseconds** end to end (the catalog's time resolution): stream lines carry `ts_us` (or the older
`ts_ms`, read as `ts_ms * 1000`), tiles start at `floor(ts_us / g) * g` (floor, also before 1970) and
`<col>__last_ts` / last-value `event_ts` are the event's µs. Two ways to read a source:

* **local files** (default). The feeder (`streaming/feeder.py`) has already checked every line against
  the source's types (vectorised), quarantined bad lines with their reason, split off late events (it
  orders the files, so it knows the watermark) and future-dated ones, and hands the job typed JSON lines.
  The job only aggregates: no watermark, no per-row checks, so mini-batch aggregation may be on. Each
  batch ends with a marker row `{"__batch": "<name>"}`; the source's first view groups by `__batch` too,
  so the marker comes out as a row of that view's sink: once it is in a committed file, every row before
  it is committed too (checkpoint barriers follow the records). No query filters the source: a filter is
  pushed into the file scan, and scans with different filters are not shared, so each INSERT would read
  and parse every file again. Rows with a null join key (and the markers) form null-key groups that the
  loader drops; the feeder counted them.
* **Kafka** (production). Records are read `raw` (one string each), parsed with JSON_VALUE, classified in
  SQL (`unparseable_json`, `null_event_ts`, `bad_type:<col>`, `event_ts_in_future`), and split on
  `CURRENT_WATERMARK` (which needs mini-batch off) into on-time, late and quarantine sinks. Nothing is
  dropped by the format: a malformed record is a counted quarantine row.

Per view: tiles = GROUP BY (keys, tile_start) with `n_events`, the newest event time (`__newest_us`, for
freshness) and the partials of the fn table; last values = top-1 per entity by (event time, field values
DESC NULLS LAST), the offline tie rule. Both are updating results written as `debezium-json` (the one
built-in changelog format of the filesystem sink), committed on checkpoints; the loader keeps the new rows.

NaN is a value, greater than every number (as in DuckDB and Spark): `min` skips it unless the tile holds
nothing else, `max` and `last` take it. Flink's own MIN/MAX over NaN depend on arrival order, so float
min/max are computed over the non-NaN values plus a NaN count; `ABS(x) >= 0` is false exactly for NaN
(never negated: Calcite rewrites `NOT (a >= b)` as `a < b`, which is false for NaN too).
`last` is the max of a string key `<ts_us, 19 digits><class><order key><value>` decoded after the
aggregate (Flink cannot take the max of a ROW): exact for strings and integers; for floats the class
orders NaN > values ≥ 1e19 > the rest > values ≤ -1e19 and the order key is the value rounded to 18
decimals, which only matters for two events of one entity at the same µs whose values differ below that.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from quiver.catalog.errors import QuiverError
from quiver.catalog.ir import Catalog, SourceSpec, ViewSpec
from quiver.compile.aggregations import (
    EVENTS_COLUMN,
    TILE_START,
    PartialColumn,
    last_ts_column,
    view_partials,
)
from quiver.compile.contracts import violation_sql
from quiver.compile.sql import TILE_OPS

TIME_FIELD: Final = "ts_us"  # the stream's event time: epoch microseconds
LEGACY_TIME_FIELD: Final = "ts_ms"  # older producers: epoch milliseconds
BATCH_FIELD: Final = "__batch"  # the feeder's end-of-batch marker rows
NEWEST: Final = "__newest_us"  # newest event time of a tile (freshness)
TYPES: Final[Mapping[str, str]] = {"int64": "BIGINT", "float64": "DOUBLE", "string": "STRING",
                                   "bool": "BOOLEAN", "timestamp": "BIGINT"}  # timestamps: epoch µs
SINK_KINDS: Final = ("tiles", "last", "late", "quarantine")
PROBLEM: Final = "__problem"
ROWTIME: Final = "__rowtime"
TS_US: Final = "__ts_us"
_LINE: Final = "line"
_TS_DIGITS: Final = 19  # epoch µs as fixed-width digits, so string order is time order
_INT_OFFSET: Final = "CAST('9223372036854775808' AS DECIMAL(20, 0))"
_FLOAT_OFFSET: Final = "CAST('10000000000000000000' AS DECIMAL(20, 0))"
_FLOAT_KEY: Final = 39
_NAN: Final = "CAST('NaN' AS DOUBLE)"


@dataclass(frozen=True)
class FlinkTarget:
    """Where the compiled job reads and writes, and how it aggregates.

    `inbox`: source → directory of the feeder's JSON-lines batches (local mode). `sink_root`: directory
    of the sinks (`<kind>/<view or source>/`). `kafka`: read each source's Kafka topic instead
    (production; rendered and golden-tested, not run here). `mini_batch_ms`: mini-batch aggregation
    latency (0 = off; local mode only, Kafka mode needs it off for CURRENT_WATERMARK). `kafka_bootstrap`:
    the brokers (they belong to the deployment, so the config's wins over the catalog's binding);
    `kafka_idle_ms`: how long a partition may stay silent before the watermark moves on without it
    (otherwise one idle partition stalls the late split for good). `view_sinks`: view → the WITH options
    of its tiles or last-value sink, replacing the change files (the JVM Redis sink: online/jvm_sink.py). Idleness is wall-clock time: a
    partition whose records are merely not fetched yet (the job starting, a broker restarting) counts
    as silent too, and once it is skipped the others move the watermark past its records, which then
    arrive late. 10 s made half of a replayed backlog late on a loaded 2-core machine; a minute covers
    a start and a broker restart (docs/streaming.md, Kafka). `extra_settings`:
    further Flink table settings (benchmarks measure candidates with them). The file source never ends
    by itself: a bounded source whose subtasks finish at different times stops the file sink's
    checkpoints, so bounded runs tail too and stop once every batch is committed (runner.py).
    """

    inbox: Mapping[str, str]
    sink_root: str
    monitor_interval_ms: int = 200
    roll_interval_ms: int = 500
    max_future_ms: int = 0
    kafka: bool = False
    kafka_bootstrap: str = ""  # overrides every binding's kafka_bootstrap_servers (config `kafka_bootstrap`)
    kafka_idle_ms: int = 60_000  # a partition silent this long stops holding the watermark back
    mini_batch_ms: int = 0
    mini_batch_size: int = 20_000
    extra_settings: tuple[tuple[str, str], ...] = ()
    view_sinks: Mapping[str, Mapping[str, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class FlinkJob:
    """The compiled job: table settings, DDL and views (in order), and the INSERTs of one statement set."""

    settings: tuple[tuple[str, str], ...]
    statements: tuple[str, ...]
    inserts: tuple[str, ...]
    views: tuple[str, ...]
    sources: tuple[str, ...]

    def script(self) -> str:
        """The whole job as one Flink SQL script (SET, DDL, EXECUTE STATEMENT SET)."""
        sets = [f"SET '{k}' = '{v}';" for k, v in self.settings]
        body = [s.rstrip() + ";" for s in self.statements]
        inserts = "\n".join(_indent(i.rstrip() + ";") for i in self.inserts)
        return "\n".join([
            "-- Quiver streaming job (Flink SQL); generated, do not edit.",
            *sets, "", "\n\n".join(body), "", "EXECUTE STATEMENT SET BEGIN", inserts, "END;",
        ]) + "\n"


def quote(name: str) -> str:
    """`name` as a Flink identifier (the validator refuses unsafe names; quote anyway)."""
    return "`" + name.replace("`", "``") + "`"


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def sink_path(root: str, kind: str, name: str) -> str:
    """Directory of one sink: `<root>/<kind>/<view or source>`."""
    if kind not in SINK_KINDS:
        raise ValueError(f"unknown sink kind {kind!r}")
    return f"{root.rstrip('/')}/{kind}/{name}"


def sink_table(kind: str, name: str) -> str:
    return f"{kind}__{name}"


def streamed_views(catalog: Catalog, names: Sequence[str] | None = None) -> list[ViewSpec]:
    """Online views whose source has a stream binding (`names` must all qualify), sorted by name."""
    if names is None:
        return [v for _, v in sorted(catalog.views.items())
                if v.online and catalog.sources[v.source].stream is not None]
    out = []
    for name in names:
        try:
            view = catalog.view(name)
        except KeyError as exc:
            raise QuiverError(str(exc.args[0])) from None
        if catalog.sources[view.source].stream is None:
            raise QuiverError(f"{view.location}: feature view {name!r}: source {view.source!r} has no stream "
                              "binding (StreamBinding(path=...) or kafka_topic)")
        out.append(view)
    return sorted(out, key=lambda v: v.name)


def source_columns(source: SourceSpec, views: Sequence[ViewSpec]) -> list[tuple[str, str]]:
    """(column, dtype) the views read from the source: keys, then inputs, each once, in first-use order."""
    dtypes = dict(source.columns)
    wanted: dict[str, str] = {}
    for view in views:
        for key, dtype in view.keys:
            wanted.setdefault(key, dtype)
    for view in views:
        for f in view.fields:
            wanted.setdefault(f.column, dtypes.get(f.column, f.dtype))
        for a in view.aggregations:
            wanted.setdefault(a.column, a.input_dtype)
    return list(wanted.items())


def compile_flink(catalog: Catalog, target: FlinkTarget, views: Sequence[str] | None = None) -> FlinkJob:
    """The Flink SQL job of the streamed views (default: all of them)."""
    chosen = streamed_views(catalog, views)
    if not chosen:
        raise QuiverError("no feature view to stream: none is online with a source that has a stream binding")
    by_source: dict[str, list[ViewSpec]] = {}
    for view in chosen:
        _check(view)
        by_source.setdefault(view.source, []).append(view)
    statements: list[str] = []
    inserts: list[str] = []
    for name, views_of in sorted(by_source.items()):
        source = catalog.sources[name]
        columns = source_columns(source, views_of)
        if target.kafka and source.contract is not None:  # parse what the contract checks, too
            dtypes = dict(source.columns)
            read = dict(columns)
            columns += [(c, dtypes[c]) for c in source.contract.columns
                        if c not in read and c != source.timestamp_field]
        if target.kafka:
            statements += [_kafka_source_ddl(source, target), _parsed_view(source, columns, target),
                           _on_time_view(source), _late_sink(source, columns, target),
                           _quarantine_sink(source, columns, target)]
            inserts += [_late_insert(source, columns), _quarantine_insert(source, columns, views_of)]
        else:
            statements += [_file_source_ddl(source, columns, target), _events_view(source, columns)]
        for index, view in enumerate(views_of):
            marks = index == 0 and not target.kafka  # this view's sink carries the batch markers
            if view.kind == "agg":
                statements.append(_tiles_sink(view, target, marks))
                inserts.append(_tiles_insert(view, marks))
            else:
                statements.append(_last_sink(view, target, marks))
                inserts.append(_last_insert(view, marks))
    return FlinkJob(_settings(catalog, chosen, target), tuple(statements), tuple(inserts),
                    tuple(v.name for v in chosen), tuple(sorted(by_source)))


def state_ttl_ms(catalog: Catalog, views: Sequence[ViewSpec]) -> int:
    """How long idle state must live: the longest window (or last-value TTL) plus the lateness allowed.

    State TTL runs on processing time; a tile whose state expired and then gets an event would restart
    from one event, so the late split (not the TTL) is what keeps expired tiles from being touched.
    """
    longest = 0
    for view in views:
        stream = catalog.sources[view.source].stream
        slack = (stream.allowed_lateness_us + stream.watermark_delay_us) if stream else 0
        span = view.max_window_us + int(view.tile_us or 0) if view.kind == "agg" else int(view.ttl_us or 0)
        longest = max(longest, span + slack)
    return max(longest // 1000, 1000)


def _settings(catalog: Catalog, views: Sequence[ViewSpec], target: FlinkTarget) -> tuple[tuple[str, str], ...]:
    mini_batch = target.mini_batch_ms > 0 and not target.kafka
    settings = [("table.local-time-zone", "UTC"),
                # Kafka mode splits late events on CURRENT_WATERMARK, which mini-batch turns into wall-clock time.
                ("table.exec.mini-batch.enabled", "true" if mini_batch else "false")]
    if mini_batch:
        settings += [("table.exec.mini-batch.allow-latency", f"{target.mini_batch_ms} ms"),
                     ("table.exec.mini-batch.size", str(target.mini_batch_size))]
    settings.append(("table.exec.state.ttl", f"{state_ttl_ms(catalog, views)} ms"))
    if target.kafka:  # watermarks per partition; an idle one is skipped after this long
        settings.append(("table.exec.source.idle-timeout", f"{target.kafka_idle_ms} ms"))
    return tuple(settings) + tuple(target.extra_settings)


def _check(view: ViewSpec) -> None:
    names = [*view.key_names, *view.feature_names, *(f.column for f in view.fields),
             *(a.column for a in view.aggregations)]
    clashes = sorted({n for n in names if n.startswith("__") or n in (TIME_FIELD, LEGACY_TIME_FIELD, _LINE)})
    if clashes:
        raise QuiverError(f"{view.location}: feature view {view.name!r}: {', '.join(clashes)}: names starting "
                          f"with '__', {TIME_FIELD!r}, {LEGACY_TIME_FIELD!r} and {_LINE!r} are reserved for "
                          "streaming")


# ---- local files: the feeder validated every line ----


def _file_source_ddl(source: SourceSpec, columns: list[tuple[str, str]], target: FlinkTarget) -> str:
    if source.name not in target.inbox:
        raise QuiverError(f"no input directory for source {source.name!r}")
    lines = [f"{quote(TIME_FIELD)} BIGINT", f"{quote(LEGACY_TIME_FIELD)} BIGINT"]
    lines += [f"{quote(c)} {TYPES[t]}" for c, t in columns] + [f"{quote(BATCH_FIELD)} STRING"]
    options = [("connector", "filesystem"), ("path", target.inbox[source.name]), ("format", "json"),
               ("json.fail-on-missing-field", "false"),
               # Every line was checked by the feeder: a parse error here is a bug, so fail loudly.
               ("json.ignore-parse-errors", "false"),
               ("source.monitor-interval", f"{target.monitor_interval_ms} ms")]
    return _create_table(f"src__{source.name}", lines, options)


def _events_view(source: SourceSpec, columns: list[tuple[str, str]]) -> str:
    q = quote
    cols = [(f"COALESCE({q(TIME_FIELD)}, {q(LEGACY_TIME_FIELD)} * 1000)", q(TS_US))]
    cols += [(q(c), q(c)) for c, _ in columns] + [(q(BATCH_FIELD), q(BATCH_FIELD))]
    return f"CREATE TEMPORARY VIEW {q(source.name + '__events')} AS\n{_select(cols)}\nFROM {q('src__' + source.name)}"


# ---- Kafka: parse and classify in SQL ----


def _json(field: str) -> str:
    return f"JSON_VALUE({quote(_LINE)}, {_literal('$.' + field)})"


def _raw_ts_us() -> str:
    return (f"COALESCE(TRY_CAST({_json(TIME_FIELD)} AS BIGINT), "
            f"TRY_CAST({_json(LEGACY_TIME_FIELD)} AS BIGINT) * 1000)")


def _kafka_source_ddl(source: SourceSpec, target: FlinkTarget) -> str:
    q = quote
    stream = source.stream
    assert stream is not None
    if not stream.kafka_topic:
        raise QuiverError(f"{source.location}: source {source.name!r}: stream binding has no kafka_topic")
    ts = _raw_ts_us()
    ms = f"({ts} - MOD(MOD({ts}, 1000) + 1000, 1000)) / 1000"  # floor to the watermark's ms
    # Unusable or future times get rowtime 0: one bad far-future record cannot push the watermark ahead
    # and make every later record late; the parse step quarantines them.
    lines = [f"{q(_LINE)} STRING",
             f"{q(ROWTIME)} AS TO_TIMESTAMP_LTZ(CASE WHEN {_not_future(ts, target)} THEN {ms} ELSE 0 END, 3)",
             f"WATERMARK FOR {q(ROWTIME)} AS {q(ROWTIME)} - {_interval(stream.watermark_delay_us)}"]
    servers = target.kafka_bootstrap or stream.kafka_bootstrap_servers or "localhost:9092"
    # A fresh job (empty state) replays the topic from its start; a restored one resumes from the offsets
    # in its checkpoint, whatever the startup mode says. Offsets are also committed to the group on each
    # completed checkpoint: that is how lag is watched and how a bounded run knows it is done (runner.py).
    options = [("connector", "kafka"), ("topic", stream.kafka_topic),
               ("properties.bootstrap.servers", servers),
               ("properties.group.id", kafka_group(source.name)),
               ("scan.startup.mode", "earliest-offset"),
               # Each record as one string: malformed JSON becomes a quarantine row, never a silent skip.
               ("format", "raw")]
    return _create_table(f"src__{source.name}", lines, options)


def kafka_group(source: str) -> str:
    """The consumer group whose committed offsets record how far the job has read `source`'s topic."""
    return f"quiver-{source}"


def _not_future(ts_us: str, target: FlinkTarget) -> str:
    return f"{ts_us} <= (UNIX_TIMESTAMP() * 1000 + {target.max_future_ms}) * 1000"


def _parse(column: str, dtype: str) -> str:
    raw = _json(column)
    if dtype == "bool":  # only JSON true/false (Flink's cast would also take 'yes', 't', '1')
        return f"CASE {raw} WHEN 'true' THEN TRUE WHEN 'false' THEN FALSE END"
    return raw if dtype == "string" else f"TRY_CAST({raw} AS {TYPES[dtype]})"


def _bad_type(column: str, dtype: str) -> str:
    raw, typed = _json(column), _parse(column, dtype)
    if dtype in ("int64", "timestamp"):
        # TRY_CAST('12.5' AS BIGINT) is 12: insist on the canonical integer text.
        return f"{raw} IS NOT NULL AND ({typed} IS NULL OR CAST({typed} AS STRING) <> {raw})"
    return f"{raw} IS NOT NULL AND {typed} IS NULL"


class _ParsedValues:
    """Contract rules (`quiver.compile.contracts.Spelling`) over the Kafka job's parsed JSON values: a column
    is its parse expression, timestamps are epoch µs already. Flink has no isnan: `ABS(x) >= 0` is false
    exactly for NaN, read through an integer CASE so Calcite cannot turn its negation into `x < 0`."""

    epoch_us = "{ts}"
    is_nan = "({x} IS NOT NULL AND CASE WHEN ABS({x}) >= 0 THEN 0 ELSE 1 END = 1)"

    def __init__(self, source: SourceSpec, columns: Sequence[tuple[str, str]]):
        self.parsed = {c: _parse(c, t) for c, t in columns}
        self.parsed[source.timestamp_field] = _raw_ts_us()

    def quote(self, name: str) -> str:
        return f"({self.parsed[name]})"

    def string(self, value: str) -> str:
        return _literal(value)


def _parsed_view(source: SourceSpec, columns: list[tuple[str, str]], target: FlinkTarget) -> str:
    q = quote
    ts = _raw_ts_us()
    checks = [(f"NOT ({q(_LINE)} IS JSON OBJECT)", "unparseable_json"),
              (f"{_json(TIME_FIELD)} IS NULL AND {_json(LEGACY_TIME_FIELD)} IS NULL", "null_event_ts"),
              (_bad_type(TIME_FIELD, "int64"), f"bad_type:{TIME_FIELD}"),
              (_bad_type(LEGACY_TIME_FIELD, "int64"), f"bad_type:{LEGACY_TIME_FIELD}")]
    checks += [(_bad_type(c, t), f"bad_type:{c}") for c, t in columns if t != "string"]
    if source.contract is not None:  # the same rules and reasons as every other path, on the parsed values
        spelling = _ParsedValues(source, columns)
        clock = "UNIX_TIMESTAMP() * 1000000"
        checks += [(violation_sql(spelling, c, clock), c.reason) for c in source.contract.checks]
    checks.append((f"NOT ({_not_future(ts, target)})", "event_ts_in_future"))
    problem = "CASE\n" + "\n".join(f"      WHEN {cond} THEN {_literal(reason)}" for cond, reason in checks)
    problem += "\n    END"
    cols = [(ts, q(TS_US)), (q(ROWTIME), q(ROWTIME))]
    cols += [(_parse(c, t), q(c)) for c, t in columns]
    cols += [(q(_LINE), q(_LINE)), (problem, q(PROBLEM))]
    return (f"CREATE TEMPORARY VIEW {q(source.name + '__parsed')} AS\n{_select(cols)}\n"
            f"FROM {q('src__' + source.name)}")


def _late(source: SourceSpec) -> str:
    stream = source.stream
    assert stream is not None
    wm = f"CURRENT_WATERMARK({quote(ROWTIME)})"
    return f"{wm} IS NOT NULL AND {quote(ROWTIME)} <= {wm} - {_interval(stream.allowed_lateness_us)}"


def _on_time_view(source: SourceSpec) -> str:
    q = quote
    return (f"CREATE TEMPORARY VIEW {q(source.name + '__events')} AS\n"
            f"SELECT *\nFROM {q(source.name + '__parsed')}\n"
            f"WHERE {q(PROBLEM)} IS NULL\n  AND NOT ({_late(source)})")


def _late_sink(source: SourceSpec, columns: list[tuple[str, str]], target: FlinkTarget) -> str:
    lines = [f"{quote(TIME_FIELD)} BIGINT"] + [f"{quote(c)} {TYPES[t]}" for c, t in columns]
    return _create_table(sink_table("late", source.name), lines, _file_sink(target, "late", source.name, "json"))


def _late_insert(source: SourceSpec, columns: list[tuple[str, str]]) -> str:
    q = quote
    cols = [(q(TS_US), q(TIME_FIELD))] + [(q(c), q(c)) for c, _ in columns]
    return (f"INSERT INTO {q(sink_table('late', source.name))}\n{_select(cols)}\n"
            f"FROM {q(source.name + '__parsed')}\nWHERE {q(PROBLEM)} IS NULL\n  AND {_late(source)}")


def _quarantine_sink(source: SourceSpec, columns: list[tuple[str, str]], target: FlinkTarget) -> str:
    lines = ["`reason` STRING", "`view` STRING", "`line` STRING"]
    return _create_table(sink_table("quarantine", source.name), lines,
                         _file_sink(target, "quarantine", source.name, "json"))


def _quarantine_insert(source: SourceSpec, columns: list[tuple[str, str]], views: Sequence[ViewSpec]) -> str:
    q = quote
    parsed = q(source.name + "__parsed")
    line = (q(_LINE), q(_LINE))
    problems = _select([(q(PROBLEM), "`reason`"), ("''", "`view`"), line])
    parts = [f"{problems}\nFROM {parsed}\nWHERE {q(PROBLEM)} IS NOT NULL"]
    for view in views:
        null_key = " OR ".join(f"{q(k)} IS NULL" for k in view.key_names)
        parts.append(f"{_select([(_literal('null_key'), '`reason`'), (_literal(view.name), '`view`'), line])}\n"
                     f"FROM {parsed}\nWHERE {q(PROBLEM)} IS NULL\n  AND ({null_key})")
    return f"INSERT INTO {q(sink_table('quarantine', source.name))}\n" + "\nUNION ALL\n".join(parts)


# ---- per view: tiles and last values ----


def _tiles_sink(view: ViewSpec, target: FlinkTarget, marks: bool) -> str:
    lines = [f"{quote(k)} {TYPES[t]}" for k, t in view.keys] + ([f"{quote(BATCH_FIELD)} STRING"] if marks else [])
    lines += [f"{quote(TILE_START)} BIGINT", f"{quote(EVENTS_COLUMN)} BIGINT", f"{quote(NEWEST)} BIGINT"]
    for partial in _partials(view):
        lines.append(f"{quote(partial.name)} {TYPES[partial.dtype]}")
        if partial.partial.kind == "last":
            lines.append(f"{quote(last_ts_column(partial.column))} BIGINT")
    return _create_table(sink_table("tiles", view.name), lines, _view_sink(target, "tiles", view.name))


def _is_number(x: str) -> str:
    # False for NaN (and only NaN), null for null; Calcite does not fold it. Only ever used as a CASE
    # condition with the NaN case in ELSE: `NOT (...)` would be rewritten as `ABS(x) < 0`.
    return f"ABS({x}) >= 0"


def _tiles_insert(view: ViewSpec, marks: bool) -> str:
    q = quote
    assert view.tile_us
    tile = view.tile_us
    keys = [q(k) for k in view.key_names] + ([q(BATCH_FIELD)] if marks else [])
    ts = q(TS_US)
    inputs = list(dict.fromkeys(a.column for a in view.aggregations if a.column not in view.key_names))
    events = [(k, k) for k in keys]
    events += [(f"{ts} - MOD(MOD({ts}, {tile}) + {tile}, {tile})", q(TILE_START)), (ts, ts)]  # floor
    events += [(q(c), q(c)) for c in inputs]
    aggregates = [("COUNT(*)", q(EVENTS_COLUMN)), (f"MAX({ts})", q(NEWEST))]
    final = [(k, k) for k in keys] + [(q(c), q(c)) for c in (TILE_START, EVENTS_COLUMN, NEWEST)]
    nan_counted: set[str] = set()
    for partial in _partials(view):
        x = q(partial.column)
        op = partial.partial.tile_op
        name = q(partial.name)
        if op != "count" and partial.dtype != partial.input_dtype:
            x = f"CAST({x} AS {TYPES[partial.dtype]})"  # bool → DOUBLE for sums, → BIGINT for min/max/last
        if op in ("min", "max") and partial.dtype == "float64":
            nans = q(f"{partial.column}__nan")
            if partial.column not in nan_counted:
                nan_counted.add(partial.column)
                aggregates.append((f"COUNT(CASE WHEN {_is_number(x)} THEN CAST(NULL AS DOUBLE) ELSE {x} END)", nans))
            aggregates.append((f"{op.upper()}(CASE WHEN {_is_number(x)} THEN {x} END)", name))
            if op == "max":  # NaN is the greatest value
                final.append((f"CASE WHEN {nans} > 0 THEN {_NAN} ELSE {name} END", name))
            else:  # ... and the least only when there is nothing else
                final.append((f"CASE WHEN {name} IS NULL AND {nans} > 0 THEN {_NAN} ELSE {name} END", name))
        elif op == "last":
            key = q(partial.name + "__key")
            aggregates.append((f"MAX(CASE WHEN {x} IS NOT NULL THEN {_last_key(x, partial.dtype)} END)", key))
            final += _last_decode(key, partial)
        else:
            aggregates.append((TILE_OPS[op].format(x=x, s=""), name))
            final.append((name, name))
    group = ", ".join([*keys, q(TILE_START)])
    return "\n".join([
        f"INSERT INTO {q(sink_table('tiles', view.name))}",
        _select(final),
        "FROM (",
        _indent(_select([(k, k) for k in keys] + [(q(TILE_START), q(TILE_START))] + aggregates)),
        "  FROM (",
        _indent(_select(events), 2),
        _indent(f"FROM {q(view.source + '__events')}", 2),
        "  )",
        f"  GROUP BY {group}",
        ")",
    ])


def _last_key(x: str, dtype: str) -> str:
    """A string whose order is (event time, value) order: fixed-width time, an order key, the value."""
    ts = f"LPAD(CAST({quote(TS_US)} AS STRING), {_TS_DIGITS}, '0')"
    if dtype == "string":
        return f"{ts} || {x}"
    if dtype == "int64":
        return f"{ts} || LPAD(CAST(CAST({x} AS DECIMAL(20, 0)) + {_INT_OFFSET} AS STRING), 20, '0')"
    # float64: a class digit (NaN 3, ≥ 1e19 2, finite 1, ≤ -1e19 0), the value rounded to 18 decimals
    # (offset to be positive) for the finite class, then its exact text.
    # The CASE inside the CAST keeps NaN and huge values away from the DECIMAL cast (it throws on them,
    # even as TRY_CAST, and Flink may evaluate it before the outer CASE picks a branch).
    finite = f"CASE WHEN {x} > -1e19 AND {x} < 1e19 THEN {x} ELSE 0 END"
    shifted = f"LPAD(CAST(CAST({finite} AS DECIMAL(38, 18)) + {_FLOAT_OFFSET} AS STRING), {_FLOAT_KEY}, '0')"
    zeros = "0" * _FLOAT_KEY
    order = (f"CASE WHEN {_is_number(x)} THEN (CASE WHEN {x} >= 1e19 THEN '2{zeros}' "
             f"WHEN {x} <= -1e19 THEN '0{zeros}' ELSE '1' || {shifted} END) ELSE '3{zeros}' END")
    return f"{ts} || {order} || CAST({x} AS STRING)"


def _last_decode(key: str, partial: PartialColumn) -> list[tuple[str, str]]:
    value_at = _TS_DIGITS + 1
    if partial.dtype == "string":
        value = f"SUBSTR({key}, {value_at})"
    elif partial.dtype == "int64":
        value = f"CAST(CAST(SUBSTR({key}, {value_at}) AS DECIMAL(20, 0)) - {_INT_OFFSET} AS BIGINT)"
    else:
        value = f"CAST(SUBSTR({key}, {value_at + 1 + _FLOAT_KEY}) AS DOUBLE)"  # 'NaN' casts to NaN
    ts = f"CAST(SUBSTR({key}, 1, {_TS_DIGITS}) AS BIGINT)"
    return [(value, quote(partial.name)), (ts, quote(last_ts_column(partial.column)))]


def _last_sink(view: ViewSpec, target: FlinkTarget, marks: bool) -> str:
    lines = [f"{quote(k)} {TYPES[t]}" for k, t in view.keys] + ([f"{quote(BATCH_FIELD)} STRING"] if marks else [])
    lines.append("`event_ts` BIGINT")
    lines += [f"{quote(f.name)} {TYPES[f.dtype]}" for f in view.fields]
    return _create_table(sink_table("last", view.name), lines,
                         _view_sink(target, "last", view.name))


def _last_insert(view: ViewSpec, marks: bool) -> str:
    q = quote
    keys = [q(k) for k in view.key_names] + ([q(BATCH_FIELD)] if marks else [])
    fields = [(q(f.column), q(f.name)) for f in view.fields]
    order = ", ".join([f"{q(TS_US)} DESC", *(f"{q(f.column)} DESC NULLS LAST" for f in view.fields)])
    rank = f"ROW_NUMBER() OVER (PARTITION BY {', '.join(keys)} ORDER BY {order})"
    inner = [(k, k) for k in keys] + [(q(TS_US), "`event_ts`"), *fields, (rank, q("__rank"))]
    outer = [(k, k) for k in keys] + [("`event_ts`", "`event_ts`")] + [(q(f.name), q(f.name)) for f in view.fields]
    return "\n".join([
        f"INSERT INTO {q(sink_table('last', view.name))}",
        _select(outer),
        "FROM (",
        _indent(_select(inner)),
        _indent(f"FROM {q(view.source + '__events')}"),
        ")",
        f"WHERE {q('__rank')} = 1",
    ])


# ---- helpers ----


def _partials(view: ViewSpec) -> list[PartialColumn]:
    return view_partials([(a.column, a.fn, a.input_dtype) for a in view.aggregations])


def _view_sink(target: FlinkTarget, kind: str, view: str) -> list[tuple[str, str]]:
    """A view's tiles or last values: straight to Redis when the target says how, else change files."""
    if view in target.view_sinks:
        return list(target.view_sinks[view].items())
    return _file_sink(target, kind, view, "debezium-json")


def _file_sink(target: FlinkTarget, kind: str, name: str, fmt: str) -> list[tuple[str, str]]:
    roll = f"{target.roll_interval_ms} ms"
    # Row formats roll on time, not on checkpoints: a short roll interval + check interval keeps the
    # path to Redis at about one checkpoint interval. Part files become visible (renamed) on checkpoint.
    return [("connector", "filesystem"), ("path", sink_path(target.sink_root, kind, name)), ("format", fmt),
            ("sink.rolling-policy.rollover-interval", roll), ("sink.rolling-policy.inactivity-interval", roll),
            ("sink.rolling-policy.check-interval", f"{max(target.roll_interval_ms // 4, 10)} ms")]


def _create_table(name: str, lines: list[str], options: list[tuple[str, str]]) -> str:
    body = ",\n".join(f"  {line}" for line in lines)
    opts = ",\n".join(f"  {_literal(k)} = {_literal(v)}" for k, v in options)
    return f"CREATE TABLE {quote(name)} (\n{body}\n) WITH (\n{opts}\n)"


def _interval(us: int) -> str:
    """A day-to-second interval literal of `us` microseconds (millisecond precision)."""
    ms = us // 1000
    days, rest = divmod(ms, 86_400_000)
    if days > 99:
        raise QuiverError(f"interval of {days} days is too long for a Flink interval literal (≤ 99 days)")
    hours, rest = divmod(rest, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds, millis = divmod(rest, 1000)
    return f"INTERVAL '{days} {hours:02d}:{minutes:02d}:{seconds:02d}.{millis:03d}' DAY TO SECOND(3)"


def _select(cols: list[tuple[str, str]]) -> str:
    lines = [expr if expr == alias else f"{expr} AS {alias}" for expr, alias in cols]
    return "SELECT\n" + ",\n".join(f"  {line}" for line in lines)


def _indent(text: str, levels: int = 1) -> str:
    pad = "  " * levels
    return "\n".join(f"{pad}{line}" if line else line for line in text.splitlines())
