"""The Catalog IR: validated, normalized definitions every compiler and store reads.

The IR is plain frozen data with durations in microseconds and names resolved, so compilers never
re-derive defaults. `Catalog.to_dict()` is canonical (sorted, location-free): its hash is the version key.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from quiver.catalog.definitions import Location


@dataclass(frozen=True)
class EntitySpec:
    name: str
    keys: tuple[tuple[str, str], ...]
    description: str = ""
    owner: str = ""
    tags: tuple[tuple[str, str], ...] = ()
    location: Location = field(default=Location("<unknown>", 0), compare=False)


@dataclass(frozen=True)
class StreamSpec:
    path: str
    format: str
    kafka_topic: str
    kafka_bootstrap_servers: str
    watermark_delay_us: int
    allowed_lateness_us: int
    event_time: str = ""  # "" : ts_us / ts_ms; a JSON field; or definitions.KAFKA_TIMESTAMP
    event_time_format: str = "epoch_us"
    max_future_us: int = 300_000_000
    idle_timeout_us: int = 0  # 0: the job's default
    watermark_alignment_us: int = 0  # 0: no alignment
    # Left out of the canonical dict at their defaults: a catalog that sets none keeps its version hash.
    OMIT_AT_DEFAULT: ClassVar[tuple[str, ...]] = ("event_time", "event_time_format", "max_future_us",
                                                  "idle_timeout_us", "watermark_alignment_us")

    def reads_kafka(self, bootstrap: str = "") -> bool:
        """Whether the stream job reads this binding's Kafka topic rather than the files at its path: it does
        when it names a topic and brokers are known (`bootstrap`, the config's `kafka_bootstrap`, or its own
        `kafka_bootstrap_servers`), or when it has no path at all."""
        return bool(self.kafka_topic) and (not self.path or bool(bootstrap or self.kafka_bootstrap_servers))

    def brokers(self, bootstrap: str = "") -> str:
        """The brokers of the topic: the config's `bootstrap` wins over the binding's. Empty when neither names
        any (the runner refuses such a job: a silent localhost:9092 would read the wrong cluster or none)."""
        return bootstrap or self.kafka_bootstrap_servers


CHECK_RULES = ("not_null", "finite", "min", "max", "one_of", "future")  # the order a row's reason is taken in


@dataclass(frozen=True)
class CheckSpec:
    """One rule on one column. `value`: the bound (timestamps in epoch µs), the allowed values, or the
    tolerance in µs after the reading job's clock (`future`); None for `not_null` and `finite`."""

    column: str
    dtype: str
    rule: str  # one of CHECK_RULES
    value: Any = None

    @property
    def reason(self) -> str:
        """How a row failing this rule is counted and quarantined: `<rule>:<column>`."""
        return f"{self.rule}:{self.column}"


@dataclass(frozen=True)
class ContractSpec:
    """A validated contract: its rules in the order a row's reason is taken (columns as declared, then
    CHECK_RULES), and the share of refused rows above which the batch gate fails."""

    checks: tuple[CheckSpec, ...]
    max_invalid_share: float = 0.01

    @property
    def columns(self) -> list[str]:
        return list(dict.fromkeys(c.column for c in self.checks))

    @property
    def reasons(self) -> list[str]:
        return [c.reason for c in self.checks]

    @property
    def uses_clock(self) -> bool:
        return any(c.rule == "future" for c in self.checks)


@dataclass(frozen=True)
class SourceSpec:
    name: str
    path: str
    timestamp_field: str
    columns: tuple[tuple[str, str], ...]
    stream: StreamSpec | None = None
    description: str = ""
    owner: str = ""
    tags: tuple[tuple[str, str], ...] = ()
    location: Location = field(default=Location("<unknown>", 0), compare=False)
    contract: ContractSpec | None = None


@dataclass(frozen=True)
class FieldSpec:
    name: str
    column: str
    dtype: str
    description: str = ""


@dataclass(frozen=True)
class AggSpec:
    name: str
    column: str
    fn: str
    window_us: int
    input_dtype: str
    description: str = ""


@dataclass(frozen=True)
class ViewSpec:
    """A validated feature view. `kind` is 'last' (last-value fields) or 'agg' (tiled aggregations)."""

    name: str
    entities: tuple[str, ...]
    keys: tuple[tuple[str, str], ...]
    source: str
    timestamp_field: str
    fields: tuple[FieldSpec, ...] = ()
    aggregations: tuple[AggSpec, ...] = ()
    ttl_us: int | None = None
    tile_us: int | None = None
    online: bool = True
    description: str = ""
    owner: str = ""
    tags: tuple[tuple[str, str], ...] = ()
    location: Location = field(default=Location("<unknown>", 0), compare=False)
    contract: ContractSpec | None = None  # the source's, copied: its rules decide which rows the view reads

    @property
    def kind(self) -> str:
        return "agg" if self.aggregations else "last"

    @property
    def key_names(self) -> list[str]:
        return [name for name, _ in self.keys]

    @property
    def feature_names(self) -> list[str]:
        return [f.name for f in self.fields] + [a.name for a in self.aggregations]

    @property
    def source_columns(self) -> list[tuple[str, str]]:
        """(source column, dtype) the view reads: keys, event time, then inputs, each once, in order."""
        cols: dict[str, str] = dict(self.keys)
        cols.setdefault(self.timestamp_field, "timestamp")
        for f in self.fields:
            cols.setdefault(f.column, f.dtype)
        for a in self.aggregations:
            cols.setdefault(a.column, a.input_dtype)
        return list(cols.items())

    @property
    def max_window_us(self) -> int:
        return max((a.window_us for a in self.aggregations), default=0)

    def feature_dtype(self, feature: str) -> str:
        for f in self.fields:
            if f.name == feature:
                return f.dtype
        from quiver.catalog.aggregations import output_dtype  # the fn table owns result types

        for agg in self.aggregations:
            if agg.name == feature:
                return output_dtype(agg.fn, agg.input_dtype)
        raise KeyError(feature)


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    features: tuple[str, ...]
    description: str = ""
    owner: str = ""
    tags: tuple[tuple[str, str], ...] = ()
    location: Location = field(default=Location("<unknown>", 0), compare=False)


@dataclass(frozen=True)
class RequestSourceSpec:
    """Typed fields that arrive with a request (offline: label-row columns of the same names)."""

    name: str
    columns: tuple[tuple[str, str], ...]  # (field, dtype), as a source's columns
    description: str = ""
    owner: str = ""
    tags: tuple[tuple[str, str], ...] = ()
    location: Location = field(default=Location("<unknown>", 0), compare=False)
    contract: ContractSpec | None = None


@dataclass(frozen=True)
class OnDemandSpec:
    """A validated on-demand view: request fields and stored features in, `outputs` out, by `udf`.

    `inputs` are (view, feature) of stored views, passed to the function as columns named by the feature;
    `request_fields` the (name, dtype) of its request sources' fields. `udf_source` is the function's source,
    part of the catalog's content (a changed function is a new catalog version); `udf` is the callable
    itself, never serialized."""

    name: str
    request_sources: tuple[str, ...]
    request_fields: tuple[tuple[str, str], ...]
    inputs: tuple[tuple[str, str], ...]
    input_dtypes: tuple[str, ...]  # the dtype of each input, aligned with `inputs`
    outputs: tuple[FieldSpec, ...]
    udf_name: str
    udf_source: str
    description: str = ""
    owner: str = ""
    tags: tuple[tuple[str, str], ...] = ()
    location: Location = field(default=Location("<unknown>", 0), compare=False)
    udf: Callable[[Any], Any] | None = field(default=None, compare=False)
    mode: str = "pandas"  # "python": the function takes and returns lists (omitted from the dict when pandas)

    @property
    def feature_names(self) -> list[str]:
        return [f.name for f in self.outputs]

    def feature_dtype(self, feature: str) -> str:
        for f in self.outputs:
            if f.name == feature:
                return f.dtype
        raise KeyError(feature)


SPEC_KINDS = ("entity", "source", "feature_view", "feature_service", "request_source", "on_demand_view")
_OPTIONAL_KINDS = ("request_source", "on_demand_view")  # in to_dict only when used: older hashes stay valid


@dataclass(frozen=True)
class Catalog:
    """A complete, validated set of definitions."""

    entities: Mapping[str, EntitySpec]
    sources: Mapping[str, SourceSpec]
    views: Mapping[str, ViewSpec]
    services: Mapping[str, ServiceSpec]
    request_sources: Mapping[str, RequestSourceSpec] = field(default_factory=dict)
    on_demand: Mapping[str, OnDemandSpec] = field(default_factory=dict)

    def view(self, name: str) -> ViewSpec:
        try:
            return self.views[name]
        except KeyError:
            raise KeyError(f"unknown feature view {name!r}; known: {', '.join(sorted(self.views))}") from None

    def select_views(self, names: Sequence[str] | None = None, *, need: str = "") -> list[ViewSpec]:
        """The feature views a command acts on: `names` in the order given, each once, or (None) every view
        that qualifies, sorted by name. `need`: "" (any view), "online", or "streamed" (online, and its source
        has a stream binding). Every unknown name is one error (with the closest match); a named view that
        does not qualify is an error saying why."""
        from quiver.catalog.errors import QuiverError, did_you_mean

        def why_not(view: ViewSpec) -> str:
            if need in ("online", "streamed") and not view.online:
                return f"feature view {view.name!r} is offline-only (online=False)"
            if need == "streamed" and self.sources[view.source].stream is None:
                return (f"{view.location}: feature view {view.name!r}: source {view.source!r} has no stream "
                        "binding (StreamBinding(path=...) or kafka_topic)")
            return ""

        if names is None:
            return [view for _, view in sorted(self.views.items()) if not why_not(view)]
        unknown = [n for n in dict.fromkeys(names) if n not in self.views]
        if unknown:
            hint = did_you_mean(unknown[0], self.views) if len(unknown) == 1 else ""
            raise QuiverError(f"unknown feature view(s) {', '.join(map(repr, unknown))}{hint}; known: "
                              f"{', '.join(sorted(self.views))}")
        chosen = [self.views[n] for n in dict.fromkeys(names)]
        refused = [why_not(v) for v in chosen if why_not(v)]
        if refused:
            raise QuiverError("; ".join(refused))
        return chosen

    def views_with_feature(self, feature: str) -> list[tuple[str, str]]:
        """(kind, view name) of every view that defines a feature named `feature`, feature views ("view") before
        on-demand views ("on_demand"), each sorted by name: what `quiver describe FEATURE` points at."""
        stored = [("view", name) for name, view in sorted(self.views.items()) if feature in view.feature_names]
        computed = [("on_demand", name) for name, view in sorted(self.on_demand.items())
                    if feature in view.feature_names]
        return stored + computed

    def by_kind(self) -> dict[str, Mapping[str, Any]]:
        return {
            "entity": self.entities,
            "source": self.sources,
            "feature_view": self.views,
            "feature_service": self.services,
            "request_source": self.request_sources,
            "on_demand_view": self.on_demand,
        }

    def to_dict(self) -> dict[str, dict[str, dict[str, Any]]]:
        """Canonical, JSON-ready form (no file locations, no callables): equal catalogs give equal dicts."""
        return {
            kind: {name: spec_to_dict(spec) for name, spec in sorted(specs.items())}
            for kind, specs in self.by_kind().items() if specs or kind not in _OPTIONAL_KINDS
        }

    @property
    def content_hash(self) -> str:
        return content_hash(self.to_dict())


def spec_to_dict(spec: Any) -> dict[str, Any]:
    """One definition as plain JSON data, without its location."""
    out: dict[str, Any] = {}
    for name in (f.name for f in fields(spec)):  # fields(): the instance fields, not a ClassVar
        if name in ("location", "udf") or (name == "contract" and spec.contract is None):
            continue  # no contract: the dict (and hash) of a catalog from before contracts existed
        if name == "mode" and spec.mode == "pandas":
            continue  # likewise, a catalog from before on-demand views had modes
        if name in getattr(spec, "OMIT_AT_DEFAULT", ()) and getattr(spec, name) == spec.__dataclass_fields__[name].default:
            continue
        out[name] = _plain(getattr(spec, name))
    return out


def _plain(value: Any) -> Any:
    if hasattr(value, "__dataclass_fields__"):
        return spec_to_dict(value)
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def content_hash(data: Any) -> str:
    """sha256 of canonical JSON."""
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()
