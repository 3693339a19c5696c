"""Flink SQL target: one streaming job that keeps the tiles and last values of every streamed view fresh.

A view is streamed when it is online and its source has a stream binding. Per source the job reads JSON
lines (a local directory tailed with `source.monitor-interval`, or a Kafka topic in production) whose
event time is `ts_ms` (BIGINT epoch milliseconds); every other field is read as its JSON text and cast in
SQL, so a value of the wrong type becomes a counted quarantine row instead of a failed job. Then:

    parsed      typed columns + `__problem`: null_event_ts | bad_type:<col> | event_ts_out_of_range
    on time     no problem and not behind `watermark - allowed_lateness` (CURRENT_WATERMARK, mini-batch off)
    late        the rest of the valid rows  → late-events log (JSON), replayable by a batch backfill
    quarantine  problems, and per view the rows with a null join key → quarantine log with the reason
    tiles       GROUP BY (keys, tile_start) over on-time rows: n_events + the partials of the fn table
    last values top-1 per entity by (event time, field values DESC NULLS LAST), the offline tie rule

Tiles and last values are updating results; they go to the filesystem sink in `debezium-json`, the one
built-in changelog format (the sink's changelog mode is its format's), committed on checkpoints. A loader
takes each file's newest row per key into the online store (tiles replace whole per-tile partials, so a
replay never double counts). Tile columns and units are exactly `offline/layout.py`'s: `tile_start` and
`<col>__last_ts` in epoch µs (`ts_ms * 1000`), so the tiles in Redis equal the batch tiles.

The per-event partials come from `compile/sql.py`'s TILE_OPS. Flink cannot take the max of a ROW, so
`last` is the max of a string key `<ts_us, 19 digits><order key><value>` decoded after the aggregate:
exact for strings and integers; for floats the order key is the value rounded to 17 decimals (|v| < 1e19),
which only matters for two events of one entity at the same millisecond whose values differ below that.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
from quiver.compile.sql import TILE_OPS

TIME_FIELD: Final = "ts_ms"  # the stream's event time: epoch milliseconds (pipelines/demo_data.write_stream_files)
TYPES: Final[Mapping[str, str]] = {"int64": "BIGINT", "float64": "DOUBLE", "string": "STRING",
                                   "bool": "BOOLEAN", "timestamp": "BIGINT"}  # timestamps: epoch ms
SINK_KINDS: Final = ("tiles", "last", "late", "quarantine")
PROBLEM: Final = "__problem"
TS_MS: Final = "__ts_ms"
ROWTIME: Final = "__rowtime"
_TS_US: Final = "__ts_us"
_TS_DIGITS: Final = 19  # epoch µs as fixed-width digits, so string order is time order
_INT_OFFSET: Final = "CAST('9223372036854775808' AS DECIMAL(20, 0))"
_FLOAT_OFFSET: Final = "CAST('10000000000000000000' AS DECIMAL(20, 0))"
_FLOAT_KEY: Final = 39


@dataclass(frozen=True)
class FlinkTarget:
    """Where the compiled job reads and writes.

    `inbox`: source → directory of JSON-lines files the job tails (local mode). `sink_root`: directory
    of the sinks (`<kind>/<view or source>/`). `kafka`: read each source's Kafka topic instead
    (production; rendered, not tested here). The source never ends by itself: a bounded source whose
    subtasks finish at different times stops the file sink's checkpoints (union list state cannot
    finish partially), so bounded runs tail too and stop once every batch is committed (runner.py).
    """

    inbox: Mapping[str, str]
    sink_root: str
    monitor_interval_ms: int = 200
    roll_interval_ms: int = 500
    max_future_ms: int = 60_000
    kafka: bool = False


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
        columns = _columns(source, views_of)
        statements += [_source_ddl(source, columns, target), _parsed_view(source, columns, target),
                       _on_time_view(source)]
        statements += [_late_sink(source, columns, target), _quarantine_sink(source, columns, target)]
        inserts += [_late_insert(source, columns), _quarantine_insert(source, columns, views_of)]
        for view in views_of:
            if view.kind == "agg":
                statements.append(_tiles_sink(view, target))
                inserts.append(_tiles_insert(view))
            else:
                statements.append(_last_sink(view, target))
                inserts.append(_last_insert(view))
    return FlinkJob(_settings(catalog, chosen), tuple(statements), tuple(inserts),
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


def _settings(catalog: Catalog, views: Sequence[ViewSpec]) -> tuple[tuple[str, str], ...]:
    return (
        ("table.local-time-zone", "UTC"),
        # Mini-batch makes CURRENT_WATERMARK return processing time: every event would look late.
        ("table.exec.mini-batch.enabled", "false"),
        ("table.exec.state.ttl", f"{state_ttl_ms(catalog, views)} ms"),
    )


def _check(view: ViewSpec) -> None:
    names = [*view.key_names, *view.feature_names, *(f.column for f in view.fields),
             *(a.column for a in view.aggregations)]
    clashes = sorted({n for n in names if n.startswith("__") or n == TIME_FIELD})
    if clashes:
        raise QuiverError(f"{view.location}: feature view {view.name!r}: {', '.join(clashes)}: names starting "
                          f"with '__' and {TIME_FIELD!r} (the stream's event time) are reserved for streaming")
    if view.tile_us and view.tile_us % 1000:
        raise QuiverError(f"{view.location}: feature view {view.name!r}: the stream's event time has "
                          "millisecond precision, so tiles must be whole milliseconds")


def _columns(source: SourceSpec, views: Sequence[ViewSpec]) -> list[tuple[str, str]]:
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


# ---- per source: read, parse, split ----


def _source_ddl(source: SourceSpec, columns: list[tuple[str, str]], target: FlinkTarget) -> str:
    q = quote
    stream = source.stream
    assert stream is not None
    raw_ts = f"TRY_CAST({q(TIME_FIELD)} AS BIGINT)"
    lines = [f"{q(TIME_FIELD)} STRING"] + [f"{q(c)} STRING" for c, _ in columns]
    lines.append(f"{q(TS_MS)} AS {raw_ts}")
    # Out-of-range times get rowtime 0 so that one bad far-future event cannot push the watermark ahead
    # and make every later event late; the parse step quarantines them.
    lines.append(f"{q(ROWTIME)} AS TO_TIMESTAMP_LTZ(CASE WHEN {_in_range(raw_ts, target)} THEN {raw_ts} "
                 f"ELSE 0 END, 3)")
    lines.append(f"WATERMARK FOR {q(ROWTIME)} AS {q(ROWTIME)} - {_interval(stream.watermark_delay_us)}")
    if target.kafka:
        if not stream.kafka_topic:
            raise QuiverError(f"{source.location}: source {source.name!r}: stream binding has no kafka_topic")
        options = [("connector", "kafka"), ("topic", stream.kafka_topic),
                   ("properties.bootstrap.servers", stream.kafka_bootstrap_servers or "localhost:9092"),
                   ("properties.group.id", f"quiver-{source.name}"),
                   ("scan.startup.mode", "group-offsets"), ("properties.auto.offset.reset", "earliest"),
                   ("format", "json"), ("json.fail-on-missing-field", "false"),
                   # No feeder validates Kafka records: unparseable ones are skipped by the format.
                   ("json.ignore-parse-errors", "true")]
    else:
        if source.name not in target.inbox:
            raise QuiverError(f"no input directory for source {source.name!r}")
        options = [("connector", "filesystem"), ("path", target.inbox[source.name]), ("format", "json"),
                   ("json.fail-on-missing-field", "false"),
                   # The feeder already moved unparseable lines to the quarantine (and counted them);
                   # this is a safety net, never the counting gate.
                   ("json.ignore-parse-errors", "true"),
                   ("source.monitor-interval", f"{target.monitor_interval_ms} ms")]
    return _create_table(f"src__{source.name}", lines, options)


def _in_range(ts: str, target: FlinkTarget) -> str:
    return f"{ts} >= 0 AND {ts} <= UNIX_TIMESTAMP() * 1000 + {target.max_future_ms}"


def _parse(column: str, dtype: str) -> str:
    return quote(column) if dtype == "string" else f"TRY_CAST({quote(column)} AS {TYPES[dtype]})"


def _bad_type(column: str, dtype: str) -> str:
    raw, typed = quote(column), _parse(column, dtype)
    if dtype in ("int64", "timestamp"):
        # TRY_CAST('12.5' AS BIGINT) is 12: insist on the canonical integer text.
        return f"{raw} IS NOT NULL AND ({typed} IS NULL OR CAST({typed} AS STRING) <> {raw})"
    return f"{raw} IS NOT NULL AND {typed} IS NULL"


def _parsed_view(source: SourceSpec, columns: list[tuple[str, str]], target: FlinkTarget) -> str:
    q = quote
    ts = q(TS_MS)
    checks = [(f"{q(TIME_FIELD)} IS NULL", "null_event_ts"),
              (f"{ts} IS NULL OR CAST({ts} AS STRING) <> {q(TIME_FIELD)}", f"bad_type:{TIME_FIELD}"),
              (f"NOT ({_in_range(ts, target)})", "event_ts_out_of_range")]
    checks += [(_bad_type(c, t), f"bad_type:{c}") for c, t in columns if t != "string"]
    problem = "CASE\n" + "\n".join(f"      WHEN {cond} THEN {_literal(reason)}" for cond, reason in checks)
    problem += "\n    END"
    cols = [(q(TS_MS), q(TS_MS)), (q(ROWTIME), q(ROWTIME))]
    cols += [(_parse(c, t), q(c)) for c, t in columns]
    cols += [(q(c), q(f"__raw_{c}")) for c in [TIME_FIELD, *(c for c, _ in columns)]]
    cols.append((problem, q(PROBLEM)))
    return (f"CREATE TEMPORARY VIEW {q(source.name + '__parsed')} AS\n{_select(cols)}\n"
            f"FROM {q('src__' + source.name)}")


def _late(source: SourceSpec) -> str:
    stream = source.stream
    assert stream is not None
    wm = f"CURRENT_WATERMARK({quote(ROWTIME)})"
    return f"{wm} IS NOT NULL AND {quote(ROWTIME)} <= {wm} - {_interval(stream.allowed_lateness_us)}"


def _on_time_view(source: SourceSpec) -> str:
    q = quote
    return (f"CREATE TEMPORARY VIEW {q(source.name + '__on_time')} AS\n"
            f"SELECT *\nFROM {q(source.name + '__parsed')}\n"
            f"WHERE {q(PROBLEM)} IS NULL\n  AND NOT ({_late(source)})")


def _late_sink(source: SourceSpec, columns: list[tuple[str, str]], target: FlinkTarget) -> str:
    lines = [f"{quote(TIME_FIELD)} BIGINT"] + [f"{quote(c)} {TYPES[t]}" for c, t in columns]
    return _create_table(sink_table("late", source.name), lines, _file_sink(target, "late", source.name, "json"))


def _late_insert(source: SourceSpec, columns: list[tuple[str, str]]) -> str:
    q = quote
    cols = [(q(TS_MS), q(TIME_FIELD))] + [(q(c), q(c)) for c, _ in columns]
    return (f"INSERT INTO {q(sink_table('late', source.name))}\n{_select(cols)}\n"
            f"FROM {q(source.name + '__parsed')}\nWHERE {q(PROBLEM)} IS NULL\n  AND {_late(source)}")


def _quarantine_sink(source: SourceSpec, columns: list[tuple[str, str]], target: FlinkTarget) -> str:
    lines = ["`reason` STRING", "`view` STRING", f"{quote(TIME_FIELD)} STRING"]
    lines += [f"{quote(c)} STRING" for c, _ in columns]
    return _create_table(sink_table("quarantine", source.name), lines,
                         _file_sink(target, "quarantine", source.name, "json"))


def _quarantine_insert(source: SourceSpec, columns: list[tuple[str, str]], views: Sequence[ViewSpec]) -> str:
    q = quote
    raw = [(q(f"__raw_{c}"), q(c)) for c in [TIME_FIELD, *(c for c, _ in columns)]]
    parsed = q(source.name + "__parsed")
    problems = _select([(q(PROBLEM), "`reason`"), ("''", "`view`"), *raw])
    parts = [f"{problems}\nFROM {parsed}\nWHERE {q(PROBLEM)} IS NOT NULL"]
    for view in views:
        null_key = " OR ".join(f"{q(k)} IS NULL" for k in view.key_names)
        parts.append(f"{_select([(_literal('null_key'), '`reason`'), (_literal(view.name), '`view`'), *raw])}\n"
                     f"FROM {parsed}\nWHERE {q(PROBLEM)} IS NULL\n  AND ({null_key})")
    return f"INSERT INTO {q(sink_table('quarantine', source.name))}\n" + "\nUNION ALL\n".join(parts)


# ---- per view: tiles and last values ----


def _tiles_sink(view: ViewSpec, target: FlinkTarget) -> str:
    lines = [f"{quote(k)} {TYPES[t]}" for k, t in view.keys]
    lines += [f"{quote(TILE_START)} BIGINT", f"{quote(EVENTS_COLUMN)} BIGINT"]
    for partial in _partials(view):
        lines.append(f"{quote(partial.name)} {TYPES[partial.dtype]}")
        if partial.partial.kind == "last":
            lines.append(f"{quote(last_ts_column(partial.column))} BIGINT")
    return _create_table(sink_table("tiles", view.name), lines,
                         _file_sink(target, "tiles", view.name, "debezium-json"))


def _tiles_insert(view: ViewSpec) -> str:
    q = quote
    assert view.tile_us
    tile_ms = view.tile_us // 1000
    keys = [q(k) for k in view.key_names]
    inputs = list(dict.fromkeys(a.column for a in view.aggregations if a.column not in view.key_names))
    events = [(k, k) for k in keys]
    events += [(f"({q(TS_MS)} - MOD({q(TS_MS)}, {tile_ms})) * 1000", q(TILE_START)),
               (f"{q(TS_MS)} * 1000", q(_TS_US))]
    events += [(q(c), q(c)) for c in inputs]
    not_null = " AND ".join(f"{k} IS NOT NULL" for k in keys)
    aggregates = [("COUNT(*)", q(EVENTS_COLUMN))]
    final = [(k, k) for k in keys] + [(q(TILE_START), q(TILE_START)), (q(EVENTS_COLUMN), q(EVENTS_COLUMN))]
    for partial in _partials(view):
        x = q(partial.column)
        op = partial.partial.tile_op
        if op != "count" and partial.dtype != partial.input_dtype:
            x = f"CAST({x} AS {TYPES[partial.dtype]})"  # bool → DOUBLE for sums, → BIGINT for min/max/last
        if op != "last":
            aggregates.append((TILE_OPS[op].format(x=x, s=""), q(partial.name)))
            final.append((q(partial.name), q(partial.name)))
            continue
        key = q(partial.name + "__key")
        aggregates.append((f"max(CASE WHEN {x} IS NOT NULL THEN {_last_key(x, partial.dtype)} END)", key))
        final += _last_decode(key, partial)
    group = ", ".join([*keys, q(TILE_START)])
    return "\n".join([
        f"INSERT INTO {q(sink_table('tiles', view.name))}",
        _select(final),
        "FROM (",
        _indent(_select([(k, k) for k in keys] + [(q(TILE_START), q(TILE_START))] + aggregates)),
        "  FROM (",
        _indent(_select(events), 2),
        _indent(f"FROM {q(view.source + '__on_time')}\nWHERE {not_null}", 2),
        "  )",
        f"  GROUP BY {group}",
        ")",
    ])


def _last_key(x: str, dtype: str) -> str:
    """A string whose order is (event time, value) order: fixed-width time, an order key, the value."""
    ts = f"LPAD(CAST({quote(_TS_US)} AS STRING), {_TS_DIGITS}, '0')"
    if dtype == "string":
        return f"{ts} || {x}"
    if dtype == "int64":
        return f"{ts} || LPAD(CAST(CAST({x} AS DECIMAL(20, 0)) + {_INT_OFFSET} AS STRING), 20, '0')"
    # float64: order by the value rounded to 17 decimals (offset to be positive), then its exact text.
    shifted = f"LPAD(CAST(CAST({x} AS DECIMAL(38, 18)) + {_FLOAT_OFFSET} AS STRING), {_FLOAT_KEY}, '0')"
    order = (f"CASE WHEN {x} >= 1e19 THEN '{'9' * _FLOAT_KEY}' WHEN {x} <= -1e19 THEN '{'0' * _FLOAT_KEY}' "
             f"ELSE {shifted} END")
    return f"{ts} || {order} || CAST({x} AS STRING)"


def _last_decode(key: str, partial: PartialColumn) -> list[tuple[str, str]]:
    value_at = _TS_DIGITS + 1
    if partial.dtype == "string":
        value = f"SUBSTR({key}, {value_at})"
    elif partial.dtype == "int64":
        value = f"CAST(CAST(SUBSTR({key}, {value_at}) AS DECIMAL(20, 0)) - {_INT_OFFSET} AS BIGINT)"
    else:
        value = f"CAST(SUBSTR({key}, {value_at + _FLOAT_KEY}) AS DOUBLE)"
    ts = f"CAST(SUBSTR({key}, 1, {_TS_DIGITS}) AS BIGINT)"
    return [(value, quote(partial.name)), (ts, quote(last_ts_column(partial.column)))]


def _last_sink(view: ViewSpec, target: FlinkTarget) -> str:
    lines = [f"{quote(k)} {TYPES[t]}" for k, t in view.keys] + ["`event_ts` BIGINT"]
    lines += [f"{quote(f.name)} {TYPES[f.dtype]}" for f in view.fields]
    return _create_table(sink_table("last", view.name), lines,
                         _file_sink(target, "last", view.name, "debezium-json"))


def _last_insert(view: ViewSpec) -> str:
    q = quote
    keys = [q(k) for k in view.key_names]
    fields = []
    for f in view.fields:
        value = q(f.column)
        fields.append((f"{value} * 1000" if f.dtype == "timestamp" else value, q(f.name)))
    order = ", ".join([f"{q(TS_MS)} DESC", *(f"{q(f.column)} DESC NULLS LAST" for f in view.fields)])
    rank = f"ROW_NUMBER() OVER (PARTITION BY {', '.join(keys)} ORDER BY {order})"
    inner = [(k, k) for k in keys] + [(f"{q(TS_MS)} * 1000", "`event_ts`"), *fields, (rank, q("__rank"))]
    outer = [(k, k) for k in keys] + [("`event_ts`", "`event_ts`")] + [(q(f.name), q(f.name)) for f in view.fields]
    not_null = " AND ".join(f"{k} IS NOT NULL" for k in keys)
    return "\n".join([
        f"INSERT INTO {q(sink_table('last', view.name))}",
        _select(outer),
        "FROM (",
        _indent(_select(inner)),
        _indent(f"FROM {q(view.source + '__on_time')}\nWHERE {not_null}"),
        ")",
        f"WHERE {q('__rank')} = 1",
    ])


# ---- helpers ----


def _partials(view: ViewSpec) -> list[PartialColumn]:
    return view_partials([(a.column, a.fn, a.input_dtype) for a in view.aggregations])


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
