"""Source statements of the Flink SQL target (`quiver.compile.flink`): the feeder's checked JSON files, or a
Kafka topic parsed once per record on the JVM (`quiver_parse`), classified and split in SQL into on-time events,
late events and quarantine rows."""

from __future__ import annotations

from collections.abc import Sequence

from quiver.catalog.definitions import KAFKA_TIMESTAMP
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



# ---- Kafka: parsed once on the JVM, classified and split in SQL ----

PARSE_FUNCTION = "quiver_parse"
PARSE_CLASS = "dev.quiver.jvm.parse.ParseRecord"  # infra/jvm/redis-sink (the quiver jar also carries the parser)
REASON = "__reason"
RECORD = "__record"
FUTURE = "__future"
RECORD_TIMESTAMP = "__kafka_ts"  # the Kafka record's timestamp (metadata), when it is the event time


def parse_function() -> str:
    """The Kafka job's parser: one call reads a record's JSON into a ROW of typed fields, its event time and
    its first type problem (see ParseRecord.java for the exact rules, the JSON_VALUE/TRY_CAST ones)."""
    return f"CREATE TEMPORARY SYSTEM FUNCTION IF NOT EXISTS {PARSE_FUNCTION} AS {literal(PARSE_CLASS)} LANGUAGE JAVA"


def _parse_spec(source: SourceSpec, columns: Sequence[tuple[str, str]]) -> str:
    """The parser's spec: the columns as `name:dtype,...`, after `@<field>=<format>;` when the event time is a
    named field, or `@;` when it is the record's timestamp (the parser then reads no time field)."""
    stream = source.stream
    assert stream is not None
    spec = ",".join(f"{c}:{t}" for c, t in columns if c != stream.event_time)
    if stream.event_time == KAFKA_TIMESTAMP:
        return "@;" + spec
    if stream.event_time:
        return f"@{stream.event_time}={stream.event_time_format};{spec}"
    return spec


def _parse_call(source: SourceSpec, columns: Sequence[tuple[str, str]]) -> str:
    return f"{PARSE_FUNCTION}({quote(LINE)}, {literal(_parse_spec(source, columns))})"


def _event_us(source: SourceSpec, columns: Sequence[tuple[str, str]]) -> str:
    """SQL over the source table's columns: the record's event time in epoch µs."""
    stream = source.stream
    assert stream is not None
    if stream.event_time == KAFKA_TIMESTAMP:  # whole seconds since the epoch, then the record's milliseconds
        ts = quote(RECORD_TIMESTAMP)
        # TIMESTAMPDIFF is an INT: widened before the scaling, which would overflow it.
        return (f"(CAST(TIMESTAMPDIFF(SECOND, TO_TIMESTAMP_LTZ(0, 3), {ts}) AS BIGINT) * 1000000"
                f" + EXTRACT(MILLISECOND FROM {ts}) * 1000)")
    return f"({_parse_call(source, columns)}).{quote(TS_US)}"


STARTUP_MODES = ("earliest", "latest", "group-offsets", "timestamp:<epoch ms>")


def startup_options(startup: str) -> list[tuple[str, str]]:
    """The Kafka source's start for a job with no state to restore (a restored job resumes from the offsets in
    its checkpoint whatever this says): `earliest`, `latest`, `group-offsets` (the group's committed offsets,
    the earliest where it has none) or `timestamp:<epoch ms>` (the first record at or after it)."""
    if startup == "earliest":
        return [("scan.startup.mode", "earliest-offset")]
    if startup == "latest":
        return [("scan.startup.mode", "latest-offset")]
    if startup == "group-offsets":
        return [("scan.startup.mode", "group-offsets"), ("properties.auto.offset.reset", "earliest")]
    kind, _, millis = startup.partition(":")
    if kind == "timestamp" and millis.isdigit():
        return [("scan.startup.mode", "timestamp"), ("scan.startup.timestamp-millis", millis)]
    raise QuiverError(f"Kafka startup {startup!r}: expected one of {', '.join(STARTUP_MODES)}")


def kafka_source_ddl(source: SourceSpec, columns: Sequence[tuple[str, str]], target: FlinkTarget) -> str:
    q = quote
    stream = source.stream
    assert stream is not None
    if not stream.kafka_topic:
        raise QuiverError(f"{source.location}: source {source.name!r}: stream binding has no kafka_topic")
    brokers = stream.brokers(target.kafka_bootstrap)
    if not brokers:
        raise QuiverError(f"{source.location}: source {source.name!r} reads Kafka topic {stream.kafka_topic!r}, "
                          f"but no brokers are set: kafka.bootstrap in quiver.yaml (or QUIVER_KAFKA_BOOTSTRAP), "
                          f"or kafka_bootstrap_servers on the binding")
    # The same call as the parsed view's: the parser memoises its last record, so the record is parsed once.
    ts = _event_us(source, columns)
    ms = f"({ts} - MOD(MOD({ts}, 1000) + 1000, 1000)) / 1000"  # floor to the watermark's ms
    # Unusable or future times get rowtime 0: one bad far-future record cannot push the watermark ahead
    # and make every later record late; the parsed view quarantines the unusable and sends the future ones
    # to the batch route.
    lines = [f"{q(LINE)} STRING"]
    if stream.event_time == KAFKA_TIMESTAMP:
        lines.append(f"{q(RECORD_TIMESTAMP)} TIMESTAMP_LTZ(3) METADATA FROM 'timestamp' VIRTUAL")
    lines += [f"{q(ROWTIME)} AS TO_TIMESTAMP_LTZ(CASE WHEN {_not_future(ts, source, target)} THEN {ms} ELSE 0 END, 3)",
              f"WATERMARK FOR {q(ROWTIME)} AS {q(ROWTIME)} - {interval(stream.watermark_delay_us)}"]
    # A fresh job (empty state) starts where `target.kafka_startup` says; a restored one resumes from the offsets
    # in its checkpoint. Offsets are also committed to the group on each completed checkpoint: that is how lag
    # is watched and how a bounded run knows it is done (runner.py).
    options = [("connector", "kafka"), ("topic", stream.kafka_topic),
               ("properties.bootstrap.servers", brokers),
               ("properties.group.id", kafka_group(target, source.name)),
               *startup_options(target.kafka_startup),
               *((f"properties.{k}", v) for k, v in target.kafka_properties),
               # Each record as one string: malformed JSON becomes a quarantine row, never a silent skip.
               ("format", "raw")]
    if stream.idle_timeout_us:
        options.append(("scan.watermark.idle-timeout", f"{stream.idle_timeout_us // 1000} ms"))
    if stream.watermark_alignment_us:  # every aligned source of the job in one group
        options += [("scan.watermark.alignment.group", "quiver"),
                    ("scan.watermark.alignment.max-drift", f"{stream.watermark_alignment_us // 1000} ms")]
    return create_table(f"src__{source.name}", lines, options)


# The job's clock in epoch µs: the end of the current second. UNIX_TIMESTAMP() reads whole seconds, so read as
# the second's start it put every event of the current second "in the future": half the live events of a
# fresh stream went to quarantine as event_ts_in_future. An event is future once it is later than this.
CLOCK_US = "(UNIX_TIMESTAMP() + 1) * 1000000"


def not_future(ts_us: str, max_future_ms: int) -> str:
    """SQL: event time `ts_us` (epoch µs) is at most `max_future_ms` after the job's clock."""
    return f"{ts_us} <= {CLOCK_US} + {max_future_ms * 1000}"


def _not_future(ts_us: str, source: SourceSpec, target: FlinkTarget) -> str:
    """The run's tolerance when it sets one (`--max-future-ms`), else the source's (`StreamBinding.max_future`)."""
    stream = source.stream
    assert stream is not None
    tolerance = target.max_future_ms if target.max_future_ms is not None else stream.max_future_us // 1000
    return not_future(ts_us, tolerance)


class _ParsedValues:
    """Contract rules (`quiver.compile.contracts.Spelling`) over the Kafka job's parsed fields: a column is the
    parser's typed field, the timestamp column its event time in epoch µs. Flink has no isnan: `ABS(x) >= 0` is
    false exactly for NaN, read through an integer CASE so Calcite cannot turn its negation into `x < 0`."""

    epoch_us = "{ts}"
    is_nan = "({x} IS NOT NULL AND CASE WHEN ABS({x}) >= 0 THEN 0 ELSE 1 END = 1)"

    def __init__(self, source: SourceSpec):
        self.timestamp_field = source.timestamp_field

    def quote(self, name: str) -> str:
        return quote(TS_US if name == self.timestamp_field else name)

    def string(self, value: str) -> str:
        return literal(value)


def parsed_view(source: SourceSpec, columns: list[tuple[str, str]], target: FlinkTarget) -> str:
    """The records with their parsed fields, `__problem` (the parser's type problem, else the first failing
    contract check; NULL for a good record) and `__future` (an event time beyond the source's tolerance: such a
    record takes the batch route with the late ones, as on the file route)."""
    q = quote
    stream = source.stream
    assert stream is not None
    checks = [(f"{q(REASON)} IS NOT NULL", q(REASON))]
    if source.contract is not None:  # the same rules and reasons as every other path, on the parsed values
        spelling = _ParsedValues(source)
        checks += [(violation_sql(spelling, c, CLOCK_US), literal(c.reason)) for c in source.contract.checks]
    problem = "CASE\n" + "\n".join(f"      WHEN {cond} THEN {reason}" for cond, reason in checks)
    problem += "\n    END"
    cols = [(q(TS_US), q(TS_US)), (q(ROWTIME), q(ROWTIME))]
    cols += [(q(c), q(c)) for c, _ in columns]
    cols += [(q(LINE), q(LINE)), (problem, q(PROBLEM)),
             (f"{q(TS_US)} IS NOT NULL AND NOT ({_not_future(q(TS_US), source, target)})", q(FUTURE))]
    # The parser's fields by name: one call per record (a derived table, so the checks read columns).
    record = q(RECORD)
    by_record = stream.event_time == KAFKA_TIMESTAMP
    time_us = _event_us(source, columns) if by_record else f"r.{record}.{q(TS_US)}"
    fields = [q(LINE), q(ROWTIME), f"r.{record}.{q(REASON)} AS {q(REASON)}", f"{time_us} AS {q(TS_US)}"]
    fields += [f"{time_us} AS {q(c)}" if c == stream.event_time else f"r.{record}.{q(c)} AS {q(c)}"
               for c, _ in columns]
    passed = f"{q(RECORD_TIMESTAMP)}, " if by_record else ""
    inner = ("SELECT\n" + ",\n".join(f"    {f}" for f in fields)
             + f"\n  FROM (SELECT {q(LINE)}, {q(ROWTIME)}, {passed}{_parse_call(source, columns)} AS {record}"
             + f" FROM {q('src__' + source.name)}) AS r")
    return (f"CREATE TEMPORARY VIEW {q(source.name + '__parsed')} AS\n{select_list(cols)}\n"
            f"FROM (\n  {inner}\n)")


def _late(source: SourceSpec) -> str:
    """SQL: a parsed record takes the batch route: dated beyond the future tolerance, or behind the watermark by
    more than the allowed lateness."""
    stream = source.stream
    assert stream is not None
    wm = f"CURRENT_WATERMARK({quote(ROWTIME)})"
    return (f"{quote(FUTURE)} OR ({wm} IS NOT NULL AND {quote(ROWTIME)} <= {wm} - "
            f"{interval(stream.allowed_lateness_us)})")


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
            f"FROM {q(source.name + '__parsed')}\nWHERE {q(PROBLEM)} IS NULL\n  AND ({_late(source)})")


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
