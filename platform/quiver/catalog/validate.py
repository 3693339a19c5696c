"""Validate user definitions and resolve them into the Catalog IR.

Every check reports the definition's kind, name, file and line; all problems are collected before
raising, so one `quiver apply` shows everything that needs fixing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any

from quiver.catalog.aggregations import AGG_FUNCTIONS, accepts
from quiver.catalog.contracts import contract_spec
from quiver.catalog.definitions import (
    EVENT_TIME_FORMATS,
    KAFKA_TIMESTAMP,
    Aggregation,
    Entity,
    FeatureService,
    FeatureView,
    Field,
    Location,
    OnDemandFeatureView,
    RequestSource,
    Source,
    StreamBinding,
)
from quiver.catalog.errors import CatalogError, DefinitionProblem, QuiverError, did_you_mean
from quiver.catalog.ir import (
    AggSpec,
    Catalog,
    EntitySpec,
    FieldSpec,
    ServiceSpec,
    SourceSpec,
    StreamSpec,
    ViewSpec,
)
from quiver.catalog.on_demand import on_demand_spec, request_source_spec
from quiver.catalog.schema import read_source_schema
from quiver.catalog.types import DTYPES, duration_label, is_identifier, parse_duration, to_micros

SchemaReader = Callable[[Source], dict[str, str | None]]
# Columns the stores add beside features (offline/layout.py: tiles and last values); catalog/ may not import it.
RESERVED = frozenset({"n_events", "tile_start", "event_ts", "event_ts_us"})
UNSUPPORTED = "unsupported"  # a Parquet type Quiver has no logical dtype for
TILE_CHOICES = [timedelta(minutes=m) for m in (1, 5, 10, 15, 30, 60, 120, 180, 360, 720, 1440)]


def default_tile(windows: list[timedelta]) -> timedelta:
    """About a twelfth of the smallest window, from a list of round sizes, dividing every window.

    Odd windows fall back to the greatest common divisor of the windows and one day, so the default
    always divides a day too (tiles must align to date partitions).
    """
    smallest = min(windows)
    fitting = [t for t in TILE_CHOICES if t <= smallest / 12 and all(w % t == timedelta(0) for w in windows)]
    if fitting:
        return fitting[-1]
    common = math.gcd(86_400_000_000, *(to_micros(w) for w in windows))
    return timedelta(microseconds=common)


class _Problems:
    def __init__(self) -> None:
        self.items: list[DefinitionProblem] = []

    def add(self, kind: str, name: object, location: Location, message: str) -> None:
        self.items.append(DefinitionProblem(kind, str(name), location, message))


def build_catalog(
    definitions: Iterable[object], root: Path | None = None, schema_reader: SchemaReader | None = None
) -> Catalog:
    """Validate definitions and return the Catalog IR; raise CatalogError listing every problem.

    `schema_reader` returns a source's columns → dtypes (default: the real Parquet footers under `root`).
    """
    root = root or Path.cwd()
    reader = schema_reader or (lambda source: read_source_schema(source.path, root))
    problems = _Problems()
    defs = list(definitions)
    entities = [d for d in defs if isinstance(d, Entity)]
    sources = [d for d in defs if isinstance(d, Source)]
    views = [d for d in defs if isinstance(d, FeatureView)]
    services = [d for d in defs if isinstance(d, FeatureService)]
    requests = [d for d in defs if isinstance(d, RequestSource)]
    on_demand = [d for d in defs if isinstance(d, OnDemandFeatureView)]
    # Definitions referenced but not bound at module level are still part of the catalog (an equal copy
    # counts as the same definition; a different one with the same name is a clash).
    for service in services:
        views.extend(v for v in service.features if isinstance(v, FeatureView) and v not in views)
        on_demand.extend(v for v in service.features if isinstance(v, OnDemandFeatureView) and v not in on_demand)
    for odfv in on_demand:
        requests.extend(r for r in odfv.request_sources if isinstance(r, RequestSource) and r not in requests)
    for view in views:
        entities.extend(e for e in view.entities if isinstance(e, Entity) and e not in entities)
        if isinstance(view.source, Source) and view.source not in sources:
            sources.append(view.source)

    _check_names(problems, [("entity", e) for e in entities] + [("source", s) for s in sources]
                 + [("feature_view", v) for v in views] + [("feature_service", s) for s in services]
                 + [("request_source", r) for r in requests] + [("on_demand_view", v) for v in on_demand])
    entity_specs = {e.name: _entity_spec(problems, e) for e in entities}
    _check_key_types(problems, entities)
    source_specs = {s.name: _source_spec(problems, s, reader) for s in sources}
    view_specs = {v.name: _view_spec(problems, v, source_specs) for v in views}
    request_specs = {r.name: request_source_spec(problems.add, r) for r in requests}
    names = {v.name for v in on_demand}
    on_demand_specs = {v.name: on_demand_spec(problems.add, v, view_specs, request_specs, names) for v in on_demand}
    featured: dict[str, Any] = {**view_specs, **on_demand_specs}
    service_specs = {s.name: _service_spec(problems, s, featured) for s in services}
    if problems.items:
        raise CatalogError(problems.items)
    return Catalog(
        entities={k: v for k, v in entity_specs.items() if v},
        sources={k: v for k, v in source_specs.items() if v},
        views={k: v for k, v in view_specs.items() if v},
        services={k: v for k, v in service_specs.items() if v},
        request_sources={k: v for k, v in request_specs.items() if v},
        on_demand={k: v for k, v in on_demand_specs.items() if v},
    )


def _check_names(problems: _Problems, named: list[tuple[str, Any]]) -> None:
    # Case-insensitive: Spark and DuckDB resolve identifiers case-insensitively, so `User` would meet `user`.
    seen: dict[str, tuple[str, str, Location]] = {}
    for kind, obj in named:
        if not is_identifier(obj.name):
            problems.add(kind, obj.name, obj.location, "name must be a plain identifier (letters, digits, _; "
                         "at most 63 characters)")
            continue
        folded = obj.name.lower()
        if folded in seen:
            other_kind, other_name, other_loc = seen[folded]
            problems.add(kind, obj.name, obj.location,
                         f"name clashes with {other_kind.replace('_', ' ')} {other_name!r} defined at {other_loc}")
        else:
            seen[folded] = (kind, obj.name, obj.location)


def _entity_spec(problems: _Problems, entity: Entity) -> EntitySpec | None:
    try:
        keys = entity.keys
    except TypeError:
        problems.add("entity", entity.name, entity.location,
                     f"join_keys must be a list of names or a mapping name → dtype, got {entity.join_keys!r}")
        return None
    if not keys:
        problems.add("entity", entity.name, entity.location, "needs at least one join key")
    for key, dtype in keys.items():
        if not is_identifier(key):
            problems.add("entity", entity.name, entity.location, f"join key {key!r} is not a plain identifier")
        if not isinstance(dtype, str) or dtype not in DTYPES or dtype in ("float64", "timestamp"):
            problems.add("entity", entity.name, entity.location,
                         f"join key {key!r} has type {dtype!r}; keys must be int64, string or bool")
    return EntitySpec(entity.name, tuple(keys.items()), entity.description, entity.owner,
                      tuple(sorted(entity.tags.items())), entity.location)


def _check_key_types(problems: _Problems, entities: list[Entity]) -> None:
    first: dict[str, tuple[str, Entity]] = {}
    for entity in entities:
        try:
            keys = entity.keys
        except TypeError:  # reported by _entity_spec
            continue
        for key, dtype in keys.items():
            if key in first and first[key][0] != dtype:
                other = first[key][1]
                problems.add("entity", entity.name, entity.location,
                             f"join key {key!r} is {dtype} here but {first[key][0]} in entity "
                             f"{other.name!r} ({other.location})")
            first.setdefault(key, (dtype, entity))


def _duration(problems: _Problems, kind: str, name: str, loc: Location, what: str,
              value: object) -> timedelta | None:
    try:
        delta = parse_duration(value)  # type: ignore[arg-type]
    except ValueError as exc:
        problems.add(kind, name, loc, f"{what}: {exc}")
        return None
    if delta <= timedelta(0):
        problems.add(kind, name, loc, f"{what} must be positive, got {value!r}")
        return None
    return delta


def _source_spec(problems: _Problems, source: Source, reader: SchemaReader) -> SourceSpec | None:
    loc = source.location
    if not is_identifier(source.timestamp_field):
        problems.add("source", source.name, loc, f"timestamp_field {source.timestamp_field!r} is not a plain identifier")
        return None
    if not isinstance(source.path, str) or not source.path.strip():
        problems.add("source", source.name, loc, f"path must name Parquet files, got {source.path!r}")
        return None
    try:
        columns = reader(source)
    except QuiverError as exc:
        problems.add("source", source.name, loc, str(exc))
        return None
    if source.timestamp_field not in columns:
        problems.add("source", source.name, loc,
                     f"timestamp_field {source.timestamp_field!r} is not a column of {source.path!r} "
                     f"(columns: {', '.join(columns)})")
    elif columns[source.timestamp_field] != "timestamp":
        problems.add("source", source.name, loc, f"timestamp_field {source.timestamp_field!r} has type "
                     f"{columns[source.timestamp_field] or UNSUPPORTED}, expected a timestamp")
    for column in columns:
        if not is_identifier(column):
            problems.add("source", source.name, loc, f"column {column!r} is not a plain identifier")
    stream = _stream_spec(problems, source, source.stream, set(columns)) if source.stream else None
    contract = None
    if source.contract is not None:
        where = getattr(source.contract, "location", loc)
        contract = contract_spec(lambda message: problems.add("source", source.name, where, message),
                                 source.contract, {c: t or UNSUPPORTED for c, t in columns.items()})
    return SourceSpec(source.name, source.path, source.timestamp_field,
                      tuple((c, t or UNSUPPORTED) for c, t in columns.items()), stream,
                      source.description, source.owner, tuple(sorted(source.tags.items())), loc, contract)


def _stream_spec(problems: _Problems, source: Source, stream: StreamBinding, columns: set[str]) -> StreamSpec | None:
    loc = source.location
    if not stream.path and not stream.kafka_topic:
        problems.add("source", source.name, loc, "stream binding needs a local path or a kafka_topic")
    if stream.format != "json":  # the feeder and the Kafka parser read JSON objects, one per line or record
        problems.add("source", source.name, loc, f"stream format {stream.format!r}: the stream reads JSON records "
                                                 f"only (format='json')")
    delay = _duration_or_zero(problems, source, "watermark_delay", stream.watermark_delay)
    late = _duration_or_zero(problems, source, "allowed_lateness", stream.allowed_lateness)
    future = _duration_or_zero(problems, source, "max_future", stream.max_future)
    idle = _duration_or_zero(problems, source, "idle_timeout", stream.idle_timeout or "0s")
    align = _duration_or_zero(problems, source, "watermark_alignment", stream.watermark_alignment or "0s")
    _check_event_time(problems, source, stream, columns)
    return StreamSpec(stream.path, stream.format, stream.kafka_topic, stream.kafka_bootstrap_servers,
                      to_micros(delay), to_micros(late), stream.event_time, stream.event_time_format,
                      to_micros(future), to_micros(idle), to_micros(align))


def _check_event_time(problems: _Problems, source: Source, stream: StreamBinding, columns: set[str]) -> None:
    """What the Kafka parser can read as event time: refused here, with the definition's file:line, rather than
    every record quarantined once the job runs."""
    def add(message: str) -> None:
        problems.add("source", source.name, source.location, message)

    if stream.event_time_format not in EVENT_TIME_FORMATS:
        add(f"event_time_format {stream.event_time_format!r} is not one of {', '.join(EVENT_TIME_FORMATS)}")
    if not stream.event_time:
        if stream.event_time_format != "epoch_us":
            add("event_time_format needs event_time (the field it reads); the default fields are ts_us and ts_ms")
        return
    if stream.path:
        add(f"event_time {stream.event_time!r} applies to Kafka records; stream files carry ts_us (or ts_ms) as "
            f"Quiver's producer writes them: drop path or event_time")
    if stream.event_time == KAFKA_TIMESTAMP:
        if stream.event_time_format != "epoch_us":
            add("event_time_format does not apply to KAFKA_TIMESTAMP (the record's timestamp is epoch ms)")
        return
    if not stream.event_time.isidentifier():
        add(f"event_time {stream.event_time!r} must be a top-level JSON field name (letters, digits, _) or "
            f"KAFKA_TIMESTAMP")
    elif stream.event_time in columns and stream.event_time != source.timestamp_field:
        add(f"event_time {stream.event_time!r} is another column of the source; the event time is the source's "
            f"timestamp_field ({source.timestamp_field!r}): name the record field that holds it")


def _duration_or_zero(problems: _Problems, source: Source, what: str, value: object) -> timedelta:
    try:
        delta = parse_duration(value)  # type: ignore[arg-type]
    except ValueError as exc:
        problems.add("source", source.name, source.location, f"{what}: {exc}")
        return timedelta(0)
    if delta < timedelta(0):
        problems.add("source", source.name, source.location, f"{what} must not be negative")
    return delta


def _view_spec(problems: _Problems, view: FeatureView, sources: dict[str, SourceSpec | None]) -> ViewSpec | None:
    loc, name = view.location, view.name

    def add(message: str) -> None:
        problems.add("feature_view", name, loc, message)

    if not isinstance(view.source, Source):
        add(f"source must be a Source, got {type(view.source).__name__}")
        return None
    if not view.entities or not all(isinstance(e, Entity) for e in view.entities):
        add("entities must be a non-empty list of Entity")
        return None
    if not view.schema and not view.aggregations:
        add("defines no features: give schema=[Field(...)] or aggregations=[Aggregation(...)]")
    if view.schema and view.aggregations:
        add("mixes last-value fields and aggregations; split them into two views (they store differently)")
    source = sources.get(view.source.name)
    columns = dict(source.columns) if source else {}
    keys = view.join_keys
    for key, dtype in keys.items():
        if source and key not in columns:
            add(f"join key {key!r} is not a column of source {view.source.name!r}")
        elif source and columns[key] != dtype:
            add(f"join key {key!r} is {dtype} in its entity but {columns[key]} in source {view.source.name!r}")
    fields = tuple(_field_spec(add, f, columns, source is not None) for f in view.schema)
    aggs = tuple(_agg_spec(_adder(problems, name, _where(a, loc)), a, columns, source is not None)
                 for a in view.aggregations)
    feature_names = [f.name for f in fields if f] + [a.name for a in aggs if a]
    folded = [feature.lower() for feature in feature_names]  # engines match column names case-insensitively
    for feature in dict.fromkeys(f for f in feature_names if folded.count(f.lower()) > 1):
        exact = feature_names.count(feature) > 1
        add(f"feature {feature!r} is defined twice" + ("" if exact else " (names are case-insensitive)"))
    taken = {key.lower() for key in keys} | RESERVED
    for feature in feature_names:
        if feature.lower() in taken:
            add(f"feature name {feature!r} clashes with a join key or a reserved column "
                f"({', '.join(sorted(RESERVED))})")
    ttl = _duration(problems, "feature_view", name, loc, "ttl", view.ttl) if view.ttl is not None else None
    tile = _tiles(add, problems, view, ttl)
    if not source or None in fields or None in aggs:
        return None
    return ViewSpec(
        name, tuple(e.name for e in view.entities), tuple(keys.items()), source.name, source.timestamp_field,
        tuple(f for f in fields if f), tuple(a for a in aggs if a),
        to_micros(ttl) if ttl else None, to_micros(tile) if tile else None, view.online,
        view.description, view.owner, tuple(sorted(view.tags.items())), loc, source.contract,
    )


def _adder(problems: _Problems, view: str, where: Location) -> Callable[[str], None]:
    def add(message: str) -> None:
        problems.add("feature_view", view, where, message)

    return add


def _where(definition: object, fallback: Location) -> Location:
    """The definition's own location when it has one (built in a catalog file), else its container's."""
    location = getattr(definition, "location", None)
    return location if isinstance(location, Location) and location.line else fallback


def _closest(name: str, candidates: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the closest candidate, or '' when nothing is close."""
    return did_you_mean(name, candidates)


def _tiles(add: Callable[[str], None], problems: _Problems, view: FeatureView,
           ttl: timedelta | None) -> timedelta | None:
    windows = []
    for agg in view.aggregations:
        window = _duration(problems, "feature_view", view.name, _where(agg, view.location),
                           f"window of {agg.column}/{agg.fn}", agg.window)
        if window:
            windows.append(window)
    if not view.aggregations:
        if view.tile is not None:
            add("tile is only meaningful for aggregations")
        return None
    if not windows:
        return None
    if view.tile is not None:
        tile = _duration(problems, "feature_view", view.name, view.location, "tile", view.tile)
        if tile is None:
            return None
    else:
        tile = default_tile(windows)
    if timedelta(days=1) % tile != timedelta(0):
        add(f"tile {duration_label(tile)} ({view.tile!r}) must divide one day so tiles align to the epoch "
            "and to date partitions")
    for window in windows:
        if window % tile != timedelta(0):
            add(f"window {duration_label(window)} is not a whole multiple of the tile {duration_label(tile)}")
    if ttl is not None and ttl < max(windows):
        add(f"ttl {duration_label(ttl)} is shorter than the longest window {duration_label(max(windows))}: "
            "window values would expire early")
    return tile


def _field_spec(add: Callable[[str], None], f: Field, columns: dict[str, str],
                has_source: bool) -> FieldSpec | None:
    if not isinstance(f, Field):
        add(f"schema entries must be Field(...), got {f!r}")
        return None
    if not is_identifier(f.name) or not is_identifier(f.source_column):
        add(f"field {f.name!r} (column {f.source_column!r}) is not a plain identifier")
        return None
    if not isinstance(f.dtype, str) or f.dtype not in DTYPES:
        add(f"field {f.name!r} has unknown dtype {f.dtype!r}; use one of {', '.join(sorted(DTYPES))}")
        return None
    if has_source and f.source_column not in columns:
        add(f"field {f.name!r} reads column {f.source_column!r}, which the source does not have"
            + _closest(f.source_column, columns))
        return None
    if has_source and columns[f.source_column] == UNSUPPORTED:
        add(f"field {f.name!r} reads column {f.source_column!r}, whose Parquet type Quiver does not support")
        return None
    if has_source and columns[f.source_column] != f.dtype:
        add(f"field {f.name!r} is declared {f.dtype} but column {f.source_column!r} is {columns[f.source_column]}")
        return None
    return FieldSpec(f.name, f.source_column, f.dtype, f.description)


def _agg_spec(add: Callable[[str], None], agg: Aggregation, columns: dict[str, str],
              has_source: bool) -> AggSpec | None:
    if not isinstance(agg, Aggregation):
        add(f"aggregations entries must be Aggregation(...), got {agg!r}")
        return None
    if not is_identifier(agg.column):
        add(f"aggregation column {agg.column!r} is not a plain identifier")
        return None
    if not isinstance(agg.fn, str) or agg.fn not in AGG_FUNCTIONS:
        add(f"aggregation fn {agg.fn!r} is unknown; use one of {', '.join(AGG_FUNCTIONS)}")
        return None
    try:
        window = agg.window_delta
    except ValueError:
        return None  # reported by _tiles with the window's context
    if window <= timedelta(0):
        return None  # likewise; a negative window would also make a nonsense default name
    if not is_identifier(agg.feature_name):
        add(f"feature name {agg.feature_name!r} is not a plain identifier")
        return None
    dtype = columns.get(agg.column)
    if has_source and dtype is None:
        add(f"aggregation {agg.feature_name!r} reads column {agg.column!r}, which the source does not have"
            + _closest(agg.column, columns))
        return None
    if has_source and dtype == UNSUPPORTED:
        add(f"aggregation {agg.feature_name!r} reads column {agg.column!r}, whose Parquet type Quiver "
            "does not support")
        return None
    if has_source and dtype and not accepts(agg.fn, dtype):
        add(f"aggregation {agg.feature_name!r}: {agg.fn} needs a numeric column, {agg.column!r} is {dtype}")
        return None
    return AggSpec(agg.feature_name, agg.column, agg.fn, to_micros(window), dtype or "float64", agg.description)


def _service_spec(problems: _Problems, service: FeatureService, views: dict[str, Any]) -> ServiceSpec | None:
    """`views`: every feature-bearing definition by name (stored and on-demand views)."""
    refs = service.references
    if not refs:
        problems.add("feature_service", service.name, service.location, "lists no features")
    for ref in dict.fromkeys(r for r in refs if isinstance(r, str) and refs.count(r) > 1):
        problems.add("feature_service", service.name, service.location, f"feature {ref!r} is listed twice")
    for ref in refs:
        if not isinstance(ref, str) or ref.count(":") != 1:
            problems.add("feature_service", service.name, service.location,
                         f"feature {ref!r} must be 'view:feature' or a FeatureView")
            continue
        view_name, _, feature = ref.partition(":")
        view = views.get(view_name)
        if view_name not in views:
            problems.add("feature_service", service.name, service.location,
                         f"feature {ref!r} names unknown view {view_name!r}")
        elif view and feature not in view.feature_names:
            problems.add("feature_service", service.name, service.location,
                         f"feature {ref!r}: view {view_name!r} has no feature {feature!r}")
    named: dict[str, str] = {}
    for ref in dict.fromkeys(r for r in refs if isinstance(r, str) and r.count(":") == 1):
        feature = ref.partition(":")[2]
        if feature in named and named[feature] != ref:
            # A training set and an online read name columns by feature: two views giving the same name
            # would only fail at request time, in the middle of a join.
            problems.add("feature_service", service.name, service.location,
                         f"features {named[feature]!r} and {ref!r} both give the output column {feature!r}; "
                         f"rename one (Field/Aggregation name=...) or split the service")
        named.setdefault(feature, ref)
    return ServiceSpec(service.name, tuple(refs), service.description, service.owner,
                       tuple(sorted(service.tags.items())), service.location)
