"""Source statements of the Flink SQL target (`quiver.compile.flink`): the feeder's checked JSON files, or a
Kafka topic parsed, classified and split in SQL into on-time events, late events and quarantine rows."""

from __future__ import annotations

from collections.abc import Sequence

from quiver.catalog.errors import QuiverError
from quiver.catalog.ir import SourceSpec, ViewSpec
from quiver.compile.contracts import violation_sql
from quiver.compile.flink_sql import (
    BATCH_FIELD,
    LEGACY_TIME_FIELD,
    LINE,
    PROBLEM,
    ROWTIME,
    TIME_FIELD,
    TS_US,
    TYPES,
    FlinkTarget,
    create_table,
    file_sink,
    interval,
    kafka_group,
    literal,
    quote,
    select_list,
    sink_table,
)

# ---- local files: the feeder validated every line ----


def file_source_ddl(source: SourceSpec, columns: list[tuple[str, str]], target: FlinkTarget) -> str:
    if source.name not in target.inbox:
        raise QuiverError(f"no input directory for source {source.name!r}")
    lines = [f"{quote(TIME_FIELD)} BIGINT", f"{quote(LEGACY_TIME_FIELD)} BIGINT"]
    lines += [f"{quote(c)} {TYPES[t]}" for c, t in columns] + [f"{quote(BATCH_FIELD)} STRING"]
    options = [("connector", "filesystem"), ("path", target.inbox[source.name]), ("format", "json"),
               ("json.fail-on-missing-field", "false"),
               # Every line was checked by the feeder: a parse error here is a bug, so fail loudly.
               ("json.ignore-parse-errors", "false"),
               ("source.monitor-interval", f"{target.monitor_interval_ms} ms")]
    return create_table(f"src__{source.name}", lines, options)


def events_view(source: SourceSpec, columns: list[tuple[str, str]]) -> str:
    q = quote
    cols = [(f"COALESCE({q(TIME_FIELD)}, {q(LEGACY_TIME_FIELD)} * 1000)", q(TS_US))]
    cols += [(q(c), q(c)) for c, _ in columns] + [(q(BATCH_FIELD), q(BATCH_FIELD))]
    return f"CREATE TEMPORARY VIEW {q(source.name + '__events')} AS\n{select_list(cols)}\nFROM {q('src__' + source.name)}"



# ---- Kafka: parse and classify in SQL ----


def _json(field: str) -> str:
    return f"JSON_VALUE({quote(LINE)}, {literal('$.' + field)})"


def _raw_ts_us() -> str:
    return (f"COALESCE(TRY_CAST({_json(TIME_FIELD)} AS BIGINT), "
            f"TRY_CAST({_json(LEGACY_TIME_FIELD)} AS BIGINT) * 1000)")


def kafka_source_ddl(source: SourceSpec, target: FlinkTarget) -> str:
    q = quote
    stream = source.stream
    assert stream is not None
    if not stream.kafka_topic:
        raise QuiverError(f"{source.location}: source {source.name!r}: stream binding has no kafka_topic")
    ts = _raw_ts_us()
    ms = f"({ts} - MOD(MOD({ts}, 1000) + 1000, 1000)) / 1000"  # floor to the watermark's ms
    # Unusable or future times get rowtime 0: one bad far-future record cannot push the watermark ahead
    # and make every later record late; the parse step quarantines them.
    lines = [f"{q(LINE)} STRING",
             f"{q(ROWTIME)} AS TO_TIMESTAMP_LTZ(CASE WHEN {_not_future(ts, target)} THEN {ms} ELSE 0 END, 3)",
             f"WATERMARK FOR {q(ROWTIME)} AS {q(ROWTIME)} - {interval(stream.watermark_delay_us)}"]
    # A fresh job (empty state) replays the topic from its start; a restored one resumes from the offsets
    # in its checkpoint, whatever the startup mode says. Offsets are also committed to the group on each
    # completed checkpoint: that is how lag is watched and how a bounded run knows it is done (runner.py).
    options = [("connector", "kafka"), ("topic", stream.kafka_topic),
               ("properties.bootstrap.servers", stream.brokers(target.kafka_bootstrap)),
               ("properties.group.id", kafka_group(source.name)),
               ("scan.startup.mode", "earliest-offset"),
               # Each record as one string: malformed JSON becomes a quarantine row, never a silent skip.
               ("format", "raw")]
    return create_table(f"src__{source.name}", lines, options)


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
        return literal(value)


def parsed_view(source: SourceSpec, columns: list[tuple[str, str]], target: FlinkTarget) -> str:
    q = quote
    ts = _raw_ts_us()
    checks = [(f"NOT ({q(LINE)} IS JSON OBJECT)", "unparseable_json"),
              (f"{_json(TIME_FIELD)} IS NULL AND {_json(LEGACY_TIME_FIELD)} IS NULL", "null_event_ts"),
              (_bad_type(TIME_FIELD, "int64"), f"bad_type:{TIME_FIELD}"),
              (_bad_type(LEGACY_TIME_FIELD, "int64"), f"bad_type:{LEGACY_TIME_FIELD}")]
    checks += [(_bad_type(c, t), f"bad_type:{c}") for c, t in columns if t != "string"]
    if source.contract is not None:  # the same rules and reasons as every other path, on the parsed values
        spelling = _ParsedValues(source, columns)
        clock = "UNIX_TIMESTAMP() * 1000000"
        checks += [(violation_sql(spelling, c, clock), c.reason) for c in source.contract.checks]
    checks.append((f"NOT ({_not_future(ts, target)})", "event_ts_in_future"))
    problem = "CASE\n" + "\n".join(f"      WHEN {cond} THEN {literal(reason)}" for cond, reason in checks)
    problem += "\n    END"
    cols = [(ts, q(TS_US)), (q(ROWTIME), q(ROWTIME))]
    cols += [(_parse(c, t), q(c)) for c, t in columns]
    cols += [(q(LINE), q(LINE)), (problem, q(PROBLEM))]
    return (f"CREATE TEMPORARY VIEW {q(source.name + '__parsed')} AS\n{select_list(cols)}\n"
            f"FROM {q('src__' + source.name)}")


def _late(source: SourceSpec) -> str:
    stream = source.stream
    assert stream is not None
    wm = f"CURRENT_WATERMARK({quote(ROWTIME)})"
    return f"{wm} IS NOT NULL AND {quote(ROWTIME)} <= {wm} - {interval(stream.allowed_lateness_us)}"


def on_time_view(source: SourceSpec) -> str:
    q = quote
    return (f"CREATE TEMPORARY VIEW {q(source.name + '__events')} AS\n"
            f"SELECT *\nFROM {q(source.name + '__parsed')}\n"
            f"WHERE {q(PROBLEM)} IS NULL\n  AND NOT ({_late(source)})")


def late_sink(source: SourceSpec, columns: list[tuple[str, str]], target: FlinkTarget) -> str:
    lines = [f"{quote(TIME_FIELD)} BIGINT"] + [f"{quote(c)} {TYPES[t]}" for c, t in columns]
    return create_table(sink_table("late", source.name), lines, file_sink(target, "late", source.name, "json"))


def late_insert(source: SourceSpec, columns: list[tuple[str, str]]) -> str:
    q = quote
    cols = [(q(TS_US), q(TIME_FIELD))] + [(q(c), q(c)) for c, _ in columns]
    return (f"INSERT INTO {q(sink_table('late', source.name))}\n{select_list(cols)}\n"
            f"FROM {q(source.name + '__parsed')}\nWHERE {q(PROBLEM)} IS NULL\n  AND {_late(source)}")


def quarantine_sink(source: SourceSpec, columns: list[tuple[str, str]], target: FlinkTarget) -> str:
    lines = ["`reason` STRING", "`view` STRING", "`line` STRING"]
    return create_table(sink_table("quarantine", source.name), lines,
                         file_sink(target, "quarantine", source.name, "json"))


def quarantine_insert(source: SourceSpec, columns: list[tuple[str, str]], views: Sequence[ViewSpec]) -> str:
    q = quote
    parsed = q(source.name + "__parsed")
    line = (q(LINE), q(LINE))
    problems = select_list([(q(PROBLEM), "`reason`"), ("''", "`view`"), line])
    parts = [f"{problems}\nFROM {parsed}\nWHERE {q(PROBLEM)} IS NOT NULL"]
    for view in views:
        null_key = " OR ".join(f"{q(k)} IS NULL" for k in view.key_names)
        parts.append(f"{select_list([(literal('null_key'), '`reason`'), (literal(view.name), '`view`'), line])}\n"
                     f"FROM {parsed}\nWHERE {q(PROBLEM)} IS NULL\n  AND ({null_key})")
    return f"INSERT INTO {q(sink_table('quarantine', source.name))}\n" + "\nUNION ALL\n".join(parts)
