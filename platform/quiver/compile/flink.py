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
* **Kafka** (production). Records are read `raw` (one string each), parsed once per record by our JVM
  function `quiver_parse` (infra/jvm/redis-sink, `dev.quiver.jvm.parse`: typed fields, event time and the
  first type problem, with the JSON_VALUE/TRY_CAST meaning), classified in SQL (`unparseable_json`,
  `null_event_ts`, `bad_type:<col>`, contract reasons, `event_ts_in_future`), and split on
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

from collections.abc import Sequence
from dataclasses import dataclass

from quiver.catalog.errors import QuiverError
from quiver.catalog.ir import Catalog, SourceSpec, ViewSpec
from quiver.compile.flink_sources import (
    events_view,
    file_source_ddl,
    kafka_source_ddl,
    late_insert,
    late_sink,
    on_time_view,
    parse_function,
    parsed_view,
    quarantine_insert,
    quarantine_sink,
)
from quiver.compile.flink_sql import (
    BATCH_FIELD,
    LEGACY_TIME_FIELD,
    LINE,
    NEWEST,
    SINK_KINDS,
    TIME_FIELD,
    TYPES,
    FlinkTarget,
    indent,
    kafka_group,
    quote,
    sink_path,
    sink_table,
)
from quiver.compile.flink_views import last_insert, last_sink, tiles_insert, tiles_sink

__all__ = ["BATCH_FIELD", "LEGACY_TIME_FIELD", "NEWEST", "SINK_KINDS", "TIME_FIELD", "TYPES", "FlinkJob",
           "FlinkTarget", "compile_flink", "kafka_group", "quote", "sink_path", "sink_table", "source_columns",
           "state_ttl_ms", "streamed_views"]


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
        inserts = "\n".join(indent(i.rstrip() + ";") for i in self.inserts)
        return "\n".join([
            "-- Quiver streaming job (Flink SQL); generated, do not edit.",
            *sets, "", "\n\n".join(body), "", "EXECUTE STATEMENT SET BEGIN", inserts, "END;",
        ]) + "\n"


def streamed_views(catalog: Catalog, names: Sequence[str] | None = None) -> list[ViewSpec]:
    """Online views whose source has a stream binding (`names` must all qualify), sorted by name."""
    return sorted(catalog.select_views(names, need="streamed"), key=lambda v: v.name)


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
    statements: list[str] = [parse_function()] if target.kafka else []
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
            statements += [kafka_source_ddl(source, columns, target), parsed_view(source, columns, target),
                           on_time_view(source), late_sink(source, columns, target),
                           quarantine_sink(source, columns, target)]
            inserts += [late_insert(source, columns), quarantine_insert(source, columns, views_of)]
        else:
            statements += [file_source_ddl(source, columns, target), events_view(source, columns)]
        for index, view in enumerate(views_of):
            marks = index == 0 and not target.kafka  # this view's sink carries the batch markers
            if view.kind == "agg":
                statements.append(tiles_sink(view, target, marks))
                inserts.append(tiles_insert(view, marks))
            else:
                statements.append(last_sink(view, target, marks))
                inserts.append(last_insert(view, marks))
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
    # Operator ids from the plan, not from the chained graph: chaining changes with the parallelism, and a
    # savepoint restored at another parallelism must find every operator's state (it failed without this).
    settings.append(("table.exec.uid.generation", "ALWAYS"))
    if target.kafka:  # watermarks per partition; an idle one is skipped after this long
        settings.append(("table.exec.source.idle-timeout", f"{target.kafka_idle_ms} ms"))
    return tuple(settings) + tuple(target.extra_settings)


def _check(view: ViewSpec) -> None:
    names = [*view.key_names, *view.feature_names, *(f.column for f in view.fields),
             *(a.column for a in view.aggregations)]
    clashes = sorted({n for n in names if n.startswith("__") or n in (TIME_FIELD, LEGACY_TIME_FIELD, LINE)})
    if clashes:
        raise QuiverError(f"{view.location}: feature view {view.name!r}: {', '.join(clashes)}: names starting "
                          f"with '__', {TIME_FIELD!r}, {LEGACY_TIME_FIELD!r} and {LINE!r} are reserved for "
                          "streaming")
