"""The Python vocabulary for registering features: plain, declarative, module-level objects.

A definition is a frozen dataclass. Creating one records the file and line that created it, so every
validation error can point at the user's code. Nothing here touches an engine, a store or the network.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from quiver.catalog.types import Int64, duration_label, parse_duration

_PACKAGE_DIR = str(Path(__file__).resolve().parents[1])


@dataclass(frozen=True)
class Location:
    """Where a definition was created: the user's file and line."""

    file: str
    line: int

    def __str__(self) -> str:
        path = Path(self.file)
        # Shorter and clickable in a terminal: relative to where the command runs.
        with contextlib.suppress(ValueError, OSError):
            path = path.relative_to(Path.cwd())
        return f"{path}:{self.line}"


def _caller_location() -> Location:
    # Walk out of quiver's own frames: the first foreign frame is the user's definition.
    # dataclass-generated __init__ methods report the file "<string>" but run in this module's globals,
    # so the module name (not the file) tells ours from the user's (whose code may be "<string>" too).
    frame = sys._getframe(1)
    while frame is not None and (frame.f_code.co_filename.startswith(_PACKAGE_DIR)
                                 or str(frame.f_globals.get("__name__", "")).startswith("quiver.")):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return Location("<unknown>", 0)
    return Location(frame.f_code.co_filename, frame.f_lineno)


def _located(obj: object) -> None:
    object.__setattr__(obj, "location", _caller_location())


@dataclass(frozen=True)
class Entity:
    """A thing features describe, identified by one or more join keys.

    `join_keys` is a list of key columns (all of type `dtype`) or a mapping key → dtype.
    """

    name: str
    join_keys: Sequence[str] | Mapping[str, str]
    dtype: str = Int64
    description: str = ""
    owner: str = ""
    tags: Mapping[str, str] = field(default_factory=dict)
    location: Location = field(default=Location("<unknown>", 0), compare=False, repr=False)

    def __post_init__(self) -> None:
        _located(self)

    @property
    def keys(self) -> dict[str, str]:
        """Join key → logical dtype, in declaration order."""
        if isinstance(self.join_keys, Mapping):
            return dict(self.join_keys)
        if isinstance(self.join_keys, str):  # a lone string is a common slip; treat it as one key
            return {self.join_keys: self.dtype}
        return {key: self.dtype for key in self.join_keys}


@dataclass(frozen=True)
class StreamBinding:
    """Where fresh events of a source arrive: a Kafka topic in production, a local directory of files here.

    A binding may name both. `quiver stream` reads the topic when brokers are known — `kafka_bootstrap` in
    quiver.yaml (or QUIVER_KAFKA_BOOTSTRAP), which wins, or `kafka_bootstrap_servers` here — and otherwise
    the files at `path`. A binding with a topic and no path needs brokers (it is refused without).

    Event time (Kafka records): by default the JSON fields `ts_us` (epoch µs) or `ts_ms` (epoch ms), what
    Quiver's producers write. `event_time` names another field, read as `event_time_format`: `epoch_s`,
    `epoch_ms`, `epoch_us` (numbers; seconds and milliseconds may have a fraction) or `iso8601` (text with a
    zone: `2026-12-07T10:15:00.250+01:00`, `...Z`); or `KAFKA_TIMESTAMP` for the record's own timestamp.
    `max_future`: how far after the job's clock an event time may lie and still be served online (a producer
    whose clock runs fast); later events take the batch route (the offline store's late events).
    `idle_timeout`: how long a partition of the topic may stay silent before the watermark moves on without it
    (default: the job's, a minute). `watermark_alignment`: the most the job lets this source's partitions (and
    every other aligned source) run ahead of the slowest, pausing the fast ones (Flink's watermark alignment);
    None: no alignment.
    """

    path: str = ""
    format: str = "json"
    kafka_topic: str = ""
    kafka_bootstrap_servers: str = ""
    watermark_delay: timedelta | str = "5s"
    allowed_lateness: timedelta | str = "0s"
    event_time: str = ""
    event_time_format: str = "epoch_us"
    max_future: timedelta | str = "5m"
    idle_timeout: timedelta | str | None = None
    watermark_alignment: timedelta | str | None = None


KAFKA_TIMESTAMP = "$kafka.timestamp"  # StreamBinding.event_time: the Kafka record's own timestamp
EVENT_TIME_FORMATS = ("epoch_s", "epoch_ms", "epoch_us", "iso8601")


@dataclass(frozen=True)
class Check:
    """What a valid value of one column is; a row is valid when every column passes its check.

    `not_null`: a value must be there. `finite`: no NaN or ±infinity (float columns). `min` / `max`:
    inclusive bounds (numbers; for timestamps a datetime or ISO-8601 text with an offset); NaN is outside
    every range. `one_of`: the allowed values (text, integers or booleans). `max_future`: a timestamp at most
    this far after the clock of the job that reads the row ("5m"). A null passes every rule but `not_null`.
    """

    not_null: bool = False
    finite: bool = False
    min: float | int | str | datetime | None = None
    max: float | int | str | datetime | None = None
    one_of: Sequence[str | int | bool] | None = None
    max_future: timedelta | str | None = None


@dataclass(frozen=True)
class Contract:
    """What a valid row of a source is: a `Check` per column. Every path that reads the source (backfill,
    stream, request) refuses a row that fails one, quarantines and counts it; the batch quality gate fails a
    batch when more than `max_invalid_share` of its rows are refused."""

    checks: Mapping[str, Check]
    max_invalid_share: float = 0.01
    location: Location = field(default=Location("<unknown>", 0), compare=False, repr=False)

    def __post_init__(self) -> None:
        _located(self)


@dataclass(frozen=True)
class Source:
    """An event table: Parquet files (path or glob, relative to the project root) with an event-time column.

    `contract` says what a valid row is (see `Contract`); without one, only rows without an event time or
    join key are set aside."""

    name: str
    path: str
    timestamp_field: str = "event_ts"
    stream: StreamBinding | None = None
    description: str = ""
    owner: str = ""
    tags: Mapping[str, str] = field(default_factory=dict)
    contract: Contract | None = None
    location: Location = field(default=Location("<unknown>", 0), compare=False, repr=False)

    def __post_init__(self) -> None:
        _located(self)


@dataclass(frozen=True)
class Field:
    """A last-value feature: the column's value in the latest event before the request time.

    `column` defaults to `name`; `dtype` is checked against the source's Parquet schema.
    """

    name: str
    dtype: str
    column: str = ""
    description: str = ""

    @property
    def source_column(self) -> str:
        return self.column or self.name


@dataclass(frozen=True)
class Aggregation:
    """A windowed aggregate `fn(column)` over the events in the window; `name` defaults to column_fn_window."""

    column: str
    fn: str
    window: timedelta | str
    name: str = ""
    description: str = ""
    location: Location = field(default=Location("<unknown>", 0), compare=False, repr=False)

    def __post_init__(self) -> None:
        _located(self)  # errors about one aggregation point at its own line, not its view's

    @property
    def window_delta(self) -> timedelta:
        return parse_duration(self.window)

    @property
    def feature_name(self) -> str:
        if self.name:
            return self.name
        # Keep the user's spelling ("24h" stays 24h); a timedelta gets its shortest exact label.
        label = self.window.replace(" ", "").lower() if isinstance(self.window, str) else ""
        if not label:
            try:
                label = duration_label(self.window_delta)
            except ValueError:  # the validator reports the bad window; a name is still needed to say where
                label = str(self.window)
        return f"{self.column}_{self.fn}_{label}"


@dataclass(frozen=True)
class FeatureView:
    """Features of one or more entities computed from one source.

    Either `schema` (last-value `Field`s, bounded by `ttl`) or `aggregations` (windowed, tiled by `tile`;
    the default tile comes from the smallest window).
    """

    name: str
    entities: Sequence[Entity]
    source: Source
    schema: Sequence[Field] = ()
    aggregations: Sequence[Aggregation] = ()
    ttl: timedelta | str | None = None
    tile: timedelta | str | None = None
    online: bool = True
    description: str = ""
    owner: str = ""
    tags: Mapping[str, str] = field(default_factory=dict)
    location: Location = field(default=Location("<unknown>", 0), compare=False, repr=False)

    def __post_init__(self) -> None:
        _located(self)
        object.__setattr__(self, "entities", tuple(self.entities))
        object.__setattr__(self, "schema", tuple(self.schema))
        object.__setattr__(self, "aggregations", tuple(self.aggregations))

    @property
    def feature_names(self) -> list[str]:
        return [f.name for f in self.schema] + [a.feature_name for a in self.aggregations]

    @property
    def join_keys(self) -> dict[str, str]:
        keys: dict[str, str] = {}
        for entity in self.entities:
            keys.update(entity.keys)
        return keys


@dataclass(frozen=True)
class FeatureService:
    """A named set of features ("view:feature" references or whole views) served together to a model."""

    name: str
    features: Sequence[str | FeatureView | OnDemandFeatureView]
    description: str = ""
    owner: str = ""
    tags: Mapping[str, str] = field(default_factory=dict)
    location: Location = field(default=Location("<unknown>", 0), compare=False, repr=False)

    def __post_init__(self) -> None:
        _located(self)

    @property
    def references(self) -> list[str]:
        refs: list[str] = []
        for item in self.features:
            if isinstance(item, FeatureView | OnDemandFeatureView):
                refs.extend(f"{item.name}:{name}" for name in item.feature_names)
            else:
                refs.append(item)
        return refs


@dataclass(frozen=True)
class RequestSource:
    """Fields that come with the request itself (the transaction being scored), typed by `schema`.

    Online they are the request's `fields`; offline, columns of the label rows of the same names. The
    request's time (`at`, or the label row's timestamp) is always available as `request_ts`."""

    name: str
    schema: Sequence[Field]
    description: str = ""
    owner: str = ""
    tags: Mapping[str, str] = field(default_factory=dict)
    contract: Contract | None = None  # checked on every request's fields, as a source's rows are
    location: Location = field(default=Location("<unknown>", 0), compare=False, repr=False)

    def __post_init__(self) -> None:
        _located(self)
        object.__setattr__(self, "schema", tuple(self.schema))


@dataclass(frozen=True)
class OnDemandFeatureView:
    """Features computed when they are read, by one vectorised function of request fields and other
    features (Feast's on-demand feature views, Tecton's realtime views).

    `mode="pandas"` (the default), `udf(frame) -> DataFrame`: `frame` holds one row per request with the
    request sources' fields, the `inputs` (``"view:feature"``, each as a column named by its feature) and
    `request_ts` (UTC); it returns the `schema` columns. `mode="python"`, `udf(columns) -> dict`: the same
    columns as lists of plain Python values (None where a value is missing, `request_ts` as UTC datetimes),
    and a list per output; no DataFrame is built, so a one-row request costs microseconds, not a
    millisecond. The very same function runs inside `get_historical_features` (request fields from the
    label rows) and inside online reads and `/predict` (from the request's `fields`). Keep it
    self-contained (numpy, pandas and math are in scope): the registry stores its source, so a serving
    process can run the version that was applied."""

    name: str
    schema: Sequence[Field]
    udf: Callable[[Any], Any]
    request_sources: Sequence[RequestSource] = ()
    inputs: Sequence[str] = ()
    description: str = ""
    owner: str = ""
    tags: Mapping[str, str] = field(default_factory=dict)
    mode: str = "pandas"  # or "python": lists in, lists out (see above)
    location: Location = field(default=Location("<unknown>", 0), compare=False, repr=False)

    def __post_init__(self) -> None:
        _located(self)
        for name in ("schema", "request_sources", "inputs"):
            object.__setattr__(self, name, tuple(getattr(self, name)))

    @property
    def feature_names(self) -> list[str]:
        return [f.name for f in self.schema]


Definition = Entity | Source | FeatureView | FeatureService | RequestSource | OnDemandFeatureView
KIND_OF: dict[type[Any], str] = {
    Entity: "entity",
    Source: "source",
    FeatureView: "feature_view",
    FeatureService: "feature_service",
    RequestSource: "request_source",
    OnDemandFeatureView: "on_demand_view",
}
