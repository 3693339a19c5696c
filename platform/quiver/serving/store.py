"""FeatureStore: the SDK entry point. Config + catalog + online store; online reads, offline delegation.

    store = FeatureStore()                      # ./quiver.yaml
    result = store.get_online_features(["user_spend:amount_sum_1h"], [{"user_id": 7}])
    result.to_dict()                            # {"user_id": array([7]), "user_spend:amount_sum_1h": array([…])}

A request is resolved once into a plan (views to read, keys to build, output order) and the plan is
cached, so a repeated request costs one Redis round trip plus the decode.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from quiver.catalog.errors import QuiverError, RequestFieldError
from quiver.catalog.ir import Catalog, ContractSpec, ViewSpec
from quiver.catalog.references import expand_on_demand, input_column, resolve_features
from quiver.config import Config, load_config
from quiver.online.base import (
    MAX_TIME_US,
    MIN_TIME_US,
    TIME_RANGE,
    Batch,
    Column,
    OnlineStore,
    ViewRead,
    now_us,
    timestamp_us,
)
from quiver.serving.result import OnlineResult

if TYPE_CHECKING:  # on_demand imports pandas: the online read without on-demand views does not need it
    from quiver.compile.on_demand import FieldPath

Features = str | Sequence[str]
EntityRows = Sequence[Mapping[str, Any]] | Mapping[str, Any]
_PLAN_CACHE = 256


@dataclass(frozen=True)
class ReadPlan:
    """A resolved request: which views to read, with which keys, in which output order; which on-demand
    views to compute after the read, from which request fields and input columns."""

    reads: tuple[ViewRead, ...]
    outputs: tuple[tuple[str, str, str], ...]  # (output column, view, feature)
    keys: tuple[tuple[str, str], ...]  # join keys (name, dtype) every read needs, in first-seen order
    named_keys: tuple[tuple[str, tuple[str, str]], ...] = ()  # (output column, (view, feature))
    on_demand: tuple[str, ...] = ()
    request_fields: tuple[tuple[str, str], ...] = ()  # (name, dtype) the on-demand views read
    inputs: tuple[tuple[tuple[str, str], str], ...] = ()  # ((view, feature), column read into)
    request_contracts: tuple[tuple[str, ContractSpec], ...] = ()  # (request source, its contract)

    @cached_property
    def output_views(self) -> tuple[str, ...]:
        """The views (stored or on-demand) the outputs come from, each once, in output order."""
        return tuple(dict.fromkeys(view for _, (view, _) in self.named_keys))


class OnlineCall(NamedTuple):
    """A prepared online read: the plan, typed keys, request times and the store's pending read."""

    plan: ReadPlan
    entities: dict[str, np.ndarray]
    times: int | np.ndarray
    pending: Any  # None: no entities, nothing to fetch


def resolve(catalog: Catalog, features: Features, full_feature_names: bool = False) -> ReadPlan:
    """Turn feature references or a FeatureService name into a ReadPlan; QuiverError on unknown names.

    Names and errors are the training set's (`quiver.catalog.references.resolve_features`), so a model sees
    the same columns in training and in serving: the feature name, or `view__feature` with full_feature_names.
    """
    refs = resolve_features(catalog, features, full_feature_names)
    expanded = expand_on_demand(catalog, refs)
    per_view: dict[str, list[str]] = {}
    keys: dict[str, str] = {}
    for ref in expanded.stored:
        view = _view(catalog, ref.view)
        per_view.setdefault(ref.view, []).append(ref.feature)
        for key, dtype in view.keys:
            keys.setdefault(key, dtype)
    reads = tuple(ViewRead(catalog.views[v], tuple(fs)) for v, fs in per_view.items())
    inputs = tuple(((v, f), input_column(expanded, refs, v, f)) for name in expanded.on_demand
                   for v, f in catalog.on_demand[name].inputs)
    sources = dict.fromkeys(s for name in expanded.on_demand for s in catalog.on_demand[name].request_sources)
    contracts = tuple((s, c) for s in sources if (c := catalog.request_sources[s].contract) is not None)
    return ReadPlan(reads, tuple((r.column, r.view, r.feature) for r in refs), tuple(keys.items()),
                    tuple((r.column, (r.view, r.feature)) for r in refs), tuple(expanded.on_demand),
                    tuple(expanded.request_fields.items()), inputs, contracts)


def _view(catalog: Catalog, name: str) -> ViewSpec:
    return catalog.select_views([name], need="online")[0]


def entity_columns(plan: ReadPlan, entity_rows: EntityRows) -> dict[str, np.ndarray]:
    """Join key columns as typed numpy arrays, from rows (list of dicts) or columns (dict of arrays)."""
    columns: dict[str, Any] = {}
    if isinstance(entity_rows, dict | Mapping):  # dict first: an ABC check alone costs a microsecond
        for key, _ in plan.keys:
            if key not in entity_rows:
                raise QuiverError(f"entities lack join key {key!r} (needed by the requested features)")
            value = entity_rows[key]
            columns[key] = [value] if np.isscalar(value) else value
    else:
        rows = list(entity_rows)
        for key, _ in plan.keys:
            try:
                columns[key] = [row[key] for row in rows]
            except KeyError:
                raise QuiverError(f"an entity row lacks join key {key!r}") from None
            except TypeError:
                raise QuiverError("entity_rows must be a list of dicts or a dict of columns") from None
    out: dict[str, np.ndarray] = {}
    n: int | None = None
    for key, dtype in plan.keys:
        out[key] = _typed(key, columns[key], dtype)
        if n is not None and len(out[key]) != n:
            raise QuiverError(f"join key columns differ in length: {key!r} has {len(out[key])}, others {n}")
        n = len(out[key])
    return out


def _typed(key: str, values: Any, dtype: str) -> np.ndarray:
    try:
        if dtype == "int64":
            return _int64_keys(values)
        if dtype == "bool":
            arr = np.asarray(values)
            if arr.dtype != bool:
                raise ValueError("not booleans")
            return arr.reshape(-1)
        arr = np.asarray(values, dtype=object).reshape(-1)
        if not all(isinstance(v, str) for v in arr):
            raise ValueError("not strings")
        return arr
    except (ValueError, TypeError, OverflowError) as exc:
        raise QuiverError(f"join key {key!r} must hold {dtype} values ({exc})") from None


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_ASCII_INTEGER = re.compile(r"-?[0-9]+")


def _int64_keys(values: Any) -> np.ndarray:
    """Integer join keys as int64, exactly: a value outside int64 is an error, never wrapped around."""
    arr = np.asarray(values)
    kind = arr.dtype.kind
    if kind == "i":
        return arr.astype(np.int64, copy=False).reshape(-1)
    if kind == "u":  # numpy picks uint64 for Python ints in [2^63, 2^64): astype(int64) would wrap them
        if arr.size and int(arr.max()) > _INT64_MAX:
            raise ValueError(f"{int(arr.max())} is outside the int64 range")
        return arr.astype(np.int64).reshape(-1)
    if kind == "f" and isinstance(values, np.ndarray):  # a float column of whole numbers
        if not np.all(np.mod(arr, 1) == 0):
            raise ValueError("not integers: float64")
        if not np.all((arr >= -(2.0**63)) & (arr < 2.0**63)):
            raise ValueError("a value is outside the int64 range")
        return arr.astype(np.int64).reshape(-1)
    if kind not in "OUSf":
        raise ValueError(f"not integers: {arr.dtype}")
    # Python values (a list mixing ints beyond int64, floats, digit strings): one by one, exactly.
    out = []
    for value in arr.reshape(-1).tolist():
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError(f"not an integer: {value!r}")
        if isinstance(value, str) and not _ASCII_INTEGER.fullmatch(value):
            # int() also reads "３６９" (any Unicode digits), " 7 " and "1_000": each would score another user
            raise ValueError(f"not an integer: {value!r} (digits as text must be ASCII 0-9, optionally after '-')")
        number = int(value)
        if not _INT64_MIN <= number <= _INT64_MAX:
            raise ValueError(f"{number} is outside the int64 range")
        out.append(number)
    return np.array(out, dtype=np.int64)


def request_times(at: Any, n: int) -> int | np.ndarray:
    """`at` as epoch µs: None → now; a scalar; or one time per entity."""
    if at is None:
        return now_us()
    if isinstance(at, np.ndarray) and at.dtype.kind == "M":
        arr = at.astype("datetime64[us]").astype(np.int64)
        if arr.size and (np.isnat(at).any() or arr.min() < MIN_TIME_US or arr.max() >= MAX_TIME_US):
            raise QuiverError(f"`at`: a time is NaT or outside the supported range {TIME_RANGE}")
    elif isinstance(at, np.ndarray | list | tuple):
        arr = np.array([timestamp_us(v, "`at`") for v in at], dtype=np.int64)
    else:
        return timestamp_us(at, "`at`")
    if len(arr) != n:
        raise QuiverError(f"`at` has {len(arr)} times for {n} entities")
    return arr


class FeatureStore:
    """Config, catalog and online store of one project; the SDK's entry point."""

    def __init__(self, config_path: str | Path | None = None, *, config: Config | None = None,
                 catalog: Catalog | None = None, online_store: OnlineStore | None = None,
                 catalog_version: int | None = None):
        self.config = config or load_config(config_path)
        self.disk_differs = False  # True: the definitions on disk hold changes not applied (so not served)
        if catalog is None:
            from quiver.registry.repository import load_applied_catalog

            applied = load_applied_catalog(self.config)
            catalog, catalog_version, self.disk_differs = applied.catalog, applied.version, applied.disk_differs
        self.catalog = catalog
        self.catalog_version = catalog_version  # the registry version served; None: definitions on disk, unapplied
        self._online = online_store
        self._plans: OrderedDict[Any, ReadPlan] = OrderedDict()

    @property
    def online(self) -> OnlineStore:
        """The online store (connects on first use: the configured Redis, else an embedded one)."""
        if self._online is None:
            from quiver.online.factory import open_online_store

            self._online = open_online_store(self.config)
        return self._online

    def plan(self, features: Features, full_feature_names: bool = False) -> ReadPlan:
        """The cached ReadPlan of a request."""
        cache_key: Any = (features if isinstance(features, str) else tuple(features), full_feature_names)
        plan = self._plans.get(cache_key)
        if plan is None:
            plan = resolve(self.catalog, features, full_feature_names)
            self._plans[cache_key] = plan
            if len(self._plans) > _PLAN_CACHE:
                self._plans.popitem(last=False)
        return plan

    def get_online_features(self, features: Features, entity_rows: EntityRows, at: Any = None, *,
                            full_feature_names: bool = False,
                            request: Mapping[str, Any] | None = None) -> OnlineResult:
        """Feature values for entities as of `at` (default: now), in one online-store round trip.

        `features`: "view:feature" references or a FeatureService name. `entity_rows`: a list of dicts or
        a dict of columns (arrays, lists or scalars) holding every join key the features need. `at`: a
        datetime, ISO string, epoch µs, or one such per entity. `request`: the request fields on-demand
        features read (name → one value per entity). Columns are named as in `get_historical_features`:
        the feature name, or `view__feature` with `full_feature_names`. Every value has a status
        (`result.statuses()`): a missing entity is NOT_FOUND, not a zero.
        """
        call = self.prepare_online(features, entity_rows, at, full_feature_names=full_feature_names)
        fetched = self.online.fetch(call.pending) if call.pending is not None else None
        return self.finish_online(call, fetched, request)

    def prepare_online(self, features: Features, entity_rows: EntityRows, at: Any = None, *,
                       full_feature_names: bool = False) -> OnlineCall:
        """Step 1 of `get_online_features` (no I/O): resolve, type the keys, plan the store read. Then
        `self.online.fetch(call.pending)` (the one blocking step, skipped when `call.pending` is None) and
        `finish_online(call, fetched)`. Servers run only the middle step on a worker thread."""
        plan = self.plan(features, full_feature_names)
        entities = entity_columns(plan, entity_rows)
        n = len(next(iter(entities.values()))) if entities else 0
        times = request_times(at, n)
        pending = self.online.plan_read(plan.reads, entities, times) if n else None
        return OnlineCall(plan, entities, times, pending)

    def finish_online(self, call: OnlineCall, fetched: Any, request: Mapping[str, Any] | None = None, *,
                      path: FieldPath | None = None) -> OnlineResult:
        """Step 3 of `get_online_features` (no I/O): decode into an OnlineResult, then compute the on-demand
        features from `request` and the values read. `path` names a refused request value in errors as the
        caller's client sent it (default `request.<field>[i]`; /predict: `rows[i].fields.<field>`)."""
        plan = call.plan
        if call.pending is not None:
            batch = self.online.finish_read(call.pending, fetched)
        else:
            batch = Batch()
            for read in plan.reads:
                for feature in read.features:
                    batch.add((read.view.name, feature), _empty(read.view.feature_dtype(feature)))
        if plan.on_demand:
            self._on_demand(plan, batch, call, request or {}, path)
        return OnlineResult(call.entities, batch, plan.named_keys, call.times)

    def _on_demand(self, plan: ReadPlan, batch: Batch, call: OnlineCall, request: Mapping[str, Any],
                   path: FieldPath | None) -> None:
        from quiver.compile.on_demand_modes import compute, online_arrays

        n = len(next(iter(call.entities.values()))) if call.entities else 0
        fields = request_columns(plan, request, n)
        if plan.request_contracts:
            check_contracts(fields, plan, path)
        columns: dict[str, Any] = dict(fields)
        for name in plan.on_demand:
            spec = self.catalog.on_demand[name]
            if spec.mode == "python":  # lists in and out: the store's columns, no pandas on the way
                inputs = {feature: batch[(view, feature)] for view, feature in spec.inputs}
                for feature, (values, valid) in online_arrays(spec, {**fields, **inputs}, call.times, n).items():
                    batch.add((name, feature), Column(values, valid, spec.feature_dtype(feature)))
                continue
            for view, feature in spec.inputs:
                columns[feature] = column_series(batch[(view, feature)])
            for feature, series in compute(spec, columns, call.times, n).items():
                batch.add((name, feature), series_column(series, spec.feature_dtype(feature)))

    def get_historical_features(self, labels: Any = None, features: Features | None = None, **kwargs: Any) -> Any:
        """Point-in-time correct training data (a DataFrame): see `quiver.offline.pit.get_historical_features`.
        The engine is quiver.yaml's `engine` unless `engine=` is given; Feast's `entity_df=` works as `labels`."""
        from quiver.offline.pit import get_historical_features

        kwargs.setdefault("engine", self.config.engine)
        return get_historical_features(labels, features, catalog=self.catalog, config=self.config, **kwargs)

    def materialize(self, end: Any = None, views: Sequence[str] | None = None, **kwargs: Any) -> Any:
        """Copy offline values as of `end` into the online store (see quiver.online.materialize)."""
        from quiver.online.materialize import materialize

        return materialize(self.config, self.catalog, end, views, store=self.online, **kwargs)

    def close(self) -> None:
        if self._online is not None:
            self._online.close()

    def __enter__(self) -> FeatureStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _empty(dtype: str) -> Column:
    np_dtype = {"int64": np.int64, "float64": np.float64, "bool": np.bool_, "timestamp": np.int64}.get(dtype, object)
    return Column(np.zeros(0, dtype=np_dtype), np.zeros(0, dtype=bool), dtype)


def check_contracts(fields: Mapping[str, Sequence[Any]], plan: ReadPlan, path: FieldPath | None = None) -> None:
    """Refuse a request whose fields fail their request source's contract (RequestFieldError naming the
    first value as `path` spells it, default `request.<field>[i]`), after counting every refused row on
    `quiver_contract_refused_rows_total{path="request"}`."""
    from quiver.compile.on_demand import check_request_contracts, request_field

    refusal = check_request_contracts(fields, dict(plan.request_fields), plan.request_contracts,
                                      path or request_field)
    if refusal.counts:
        from quiver import metrics

        for (source, reason), n in refusal.counts.items():
            metrics.CONTRACT_REFUSED.labels(source=source, check=reason, path="request").inc(n)
        total = sum(refusal.counts.values())
        raise RequestFieldError(f"{refusal.first}" + (f" ({total} rows refused in all)" if total > 1 else ""))


def request_columns(plan: ReadPlan, request: Mapping[str, Any], n: int) -> dict[str, Any]:
    """The request fields the plan's on-demand views read, one value per entity (a scalar is broadcast);
    a missing one is an error naming it."""
    out: dict[str, Any] = {}
    for name, _ in plan.request_fields:
        if name not in request:
            raise QuiverError(f"request field {name!r} is missing (on-demand features need it)")
        value = request[name]
        values = [value] * n if np.isscalar(value) or value is None else list(value)
        if len(values) != n:
            raise QuiverError(f"request field {name!r} has {len(values)} values for {n} entities")
        out[name] = values
    return out


def column_series(column: Column) -> Any:
    """An online Column as the pandas column a training set holds (float64 NaN, Int64, boolean, object)."""
    import pandas as pd

    from quiver.compile.on_demand import utc_micros

    missing = ~column.valid
    if column.dtype == "float64":
        return pd.Series(np.where(column.valid, column.values, np.nan).astype(np.float64, copy=False))
    if column.dtype == "int64":
        return pd.Series(pd.arrays.IntegerArray(column.values.astype(np.int64), missing))
    if column.dtype == "bool":
        return pd.Series(pd.arrays.BooleanArray(column.values.astype(bool), missing))
    if column.dtype == "timestamp":
        return utc_micros(np.where(column.valid, column.values, 0)).where(column.valid)
    values = column.values.astype(object)
    values[missing] = None
    return pd.Series(values, dtype=object)


def series_column(series: Any, dtype: str) -> Column:
    """A typed on-demand output as an online Column (values + validity)."""
    from quiver.compile.on_demand import series_arrays

    values, valid = series_arrays(series, dtype)
    return Column(values, valid, dtype)
