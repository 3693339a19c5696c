"""The consistency job: replay a window of serving logs through the point-in-time engine and report, per
feature, how often what serving returned differs from what a training set of the same requests would hold,
and why (`quiver.monitoring.consistency` for the rules, `consistency_evidence` for the recomputations).

    run_consistency(config, model="fraud_model", start=…, end=…) -> ConsistencyCheck

Rows: the answering arms (champion and canary) of the window; shadow and paired rows repeat the same reads.
A feature is compared on the rows of each model version that reads it — the version's inputs in the model
registry, or, for a version the registry does not know, the versions whose rows hold a value for it. Beyond
`sample_rows` rows a fixed-seed sample is compared (same logs, same sample), and the report says so.
Results go to the registry (`consistency_runs`, `consistency_results`, migration 0008), and a feature whose
wrong share (every differing row but late events) is above its threshold raises a `consistency` alert; one
that is back under it resolves its alert.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from quiver.catalog.errors import NoRowsError, QuiverError, did_you_mean
from quiver.catalog.ir import Catalog
from quiver.catalog.references import FeatureRef
from quiver.config import Config
from quiver.monitoring import consistency as cons
from quiver.monitoring import consistency_evidence as ev
from quiver.monitoring.consistency import FeatureConsistency, Values
from quiver.offline.store import store_for
from quiver.serving.logs.read import ANSWERING_ARMS, logged_column, rows_reading, span_hint, version_rows

ALERT_KIND = "consistency"
_EXAMPLES = 3  # example rows kept per cause


@dataclass(frozen=True)
class ConsistencySettings:
    """Knobs of one run; thresholds are shares of compared rows (0.001 = 0.1 %)."""

    threshold: float = cons.DEFAULT_THRESHOLD
    thresholds: Mapping[str, float] = field(default_factory=dict)  # view:feature → its own threshold
    freshness: Mapping[str, float] = field(default_factory=dict)  # view → p99 lag objective, seconds
    rtol: float = cons.RTOL
    max_lag_s: float = 900.0
    ttl_margin_s: float = 60.0
    sample_rows: int = 100_000
    engine: str = "duckdb"
    seed: int = 0

    def threshold_of(self, feature: str) -> float:
        return float(self.thresholds.get(feature, self.threshold))

    @classmethod
    def of_project(cls, config: Config, threshold: float | None = None, **knobs: Any) -> ConsistencySettings:
        """The project's thresholds (monitoring.yaml); an explicit `threshold` holds for every feature."""
        from quiver.monitoring.settings import load_settings

        monitoring = load_settings(config)
        knobs.setdefault("freshness", monitoring.freshness_objectives)
        if threshold is not None:
            return cls(threshold=threshold, **knobs)
        return cls(threshold=monitoring.consistency_threshold, thresholds=monitoring.consistency_thresholds, **knobs)


@dataclass(frozen=True)
class ConsistencyCheck:
    """A finished run: the report, its registry run id (when recorded) and the alerts it raised."""

    report: cons.ConsistencyReport
    run_id: int | None
    alerts: list[Any]


@dataclass(frozen=True)
class _Scope:
    """What is compared: the features and, per feature, its logged column and the rows that read it."""

    subject: str
    refs: list[FeatureRef]
    columns: dict[str, str]  # view:feature → logged column
    reads: dict[str, np.ndarray]  # view:feature → mask over the logged rows: rows whose model read it
    notes: list[str]


def run_consistency(config: Config, *, model: str | None = None, service: str | None = None,
                    start: datetime, end: datetime, settings: ConsistencySettings | None = None,
                    registry: Any = None, alerts: Any = None, record: bool = True,
                    catalog: Catalog | None = None) -> ConsistencyCheck:
    """Compare the served feature values of [start, end) with the point-in-time values (see the module
    docstring). `registry` says which model version read what and when views were materialized; the run is
    recorded there unless `record` is False; alerts are raised and resolved when `alerts` is given."""
    from quiver.registry.repository import load_applied_catalog
    from quiver.serving.logs import log_schema, read_serving_logs

    if model is None and service is None:
        raise QuiverError("give --model NAME or --service NAME: whose served features to check")
    if end <= start:
        raise QuiverError(f"the window is empty: end {end.isoformat()} is not after start {start.isoformat()}")
    settings = settings or ConsistencySettings()
    began = time.perf_counter()
    catalog = catalog or load_applied_catalog(config).catalog
    logged = read_serving_logs(store_for(config), start, end, schema=log_schema(catalog))
    logged = logged.filter(pc.is_in(logged["arm"], pa.array(ANSWERING_ARMS)))
    scope = _scope(catalog, logged, model, service, registry)
    window = (start.astimezone(UTC).isoformat(), end.astimezone(UTC).isoformat())
    in_scope = np.zeros(logged.num_rows, dtype=bool)
    for mask in scope.reads.values():
        in_scope |= mask
    rows_logged = int(in_scope.sum())
    chosen = np.flatnonzero(in_scope)
    if len(chosen) > settings.sample_rows:  # a fixed seed: the same logs give the same sample
        rng = np.random.default_rng(settings.seed)
        chosen = np.sort(rng.choice(chosen, settings.sample_rows, replace=False))
    notes = list(scope.notes)
    if len(chosen) < rows_logged:
        notes.append(f"compared a sample of {len(chosen):,} of the {rows_logged:,} rows (seed {settings.seed})")
    if not len(chosen):  # never a pass, never recorded: a real run on a page stays the latest
        raise NoRowsError(_no_rows(config, scope, logged, window))
    features = _compare(config, catalog, logged.take(pa.array(chosen)), scope, chosen, settings, registry, notes)
    report = cons.ConsistencyReport(scope.subject, window, rows_logged, len(chosen), tuple(features), tuple(notes),
                                    settings.rtol, time.perf_counter() - began,
                                    {"max_lag_s": settings.max_lag_s, "ttl_margin_s": settings.ttl_margin_s})
    run_id = record_run(registry, report) if registry is not None and record else None
    raised = _alert(alerts, report, run_id) if alerts is not None else []
    return ConsistencyCheck(report, run_id, raised)


def _no_rows(config: Config, scope: _Scope, logged: pa.Table, window: tuple[str, str]) -> str:
    """Why a window compared nothing, and where the rows are."""
    asked = f"no rows compared for {scope.subject} in [{window[0]}, {window[1]})"
    if logged.num_rows == 0:
        return f"{asked}: no serving-log rows of the answering arms in the window; {span_hint(store_for(config))}"
    why = "; ".join(scope.notes) or "none of the window's rows read the checked features"
    return f"{asked}: {logged.num_rows:,} serving-log rows in the window, but {why}"


def check_window(project: Any, model: str, start: datetime, end: datetime) -> dict[str, Any]:
    """The consistency DAG task's work: `model`'s served features over [start, end), recorded and alerting;
    a summary for the task log. A project that cannot be checked yet (no offline data, no such model) is
    `unavailable`, with why, rather than a failed run."""
    base = {"model": model, "window_start": start.isoformat(), "window_end": end.isoformat()}
    try:
        check = run_consistency(project.config, model=model, start=start, end=end,
                                settings=ConsistencySettings.of_project(project.config),
                                registry=project.registry, alerts=project.alerts)
    except NoRowsError as exc:
        return {**base, "status": "no_rows", "reason": str(exc)}
    except QuiverError as exc:
        return {**base, "status": "unavailable", "reason": str(exc)}
    report = check.report
    return {**base, "status": "inconsistent" if report.inconsistent else "consistent", "run_id": check.run_id,
            "rows_compared": report.rows_compared, "inconsistent": [f.feature for f in report.inconsistent]}


# ----- scope: which features, which rows -----


def _scope(catalog: Catalog, logged: pa.Table, model: str | None, service: str | None, registry: Any) -> _Scope:
    notes: list[str] = []
    versions = _known_versions(registry)
    labels = logged["model_version"].to_numpy(zero_copy_only=False).astype(object)
    if model is not None:
        wanted = {label for label in set(labels.tolist()) if str(label).rsplit(":", 1)[0] == model}
        if not wanted and registry is not None and model not in {v.name for v in versions.values()}:
            raise QuiverError(f"no model {model!r} in the registry and no serving-log rows of it")
    else:
        wanted = set(labels.tolist())
    if service is not None:
        if service not in catalog.services:
            raise QuiverError(f"unknown feature service {service!r}{did_you_mean(service, list(catalog.services))}"
                              f" (services: {', '.join(sorted(catalog.services)) or 'none'})")
        candidates = list(catalog.services[service].features)
    else:
        service_of = [versions[v].lineage.get("service") for v in wanted if v in versions]
        named = next((s for s in service_of if s in catalog.services), None)
        candidates = list(catalog.services[named].features) if named else \
            [f"{v.name}:{f}" for v in catalog.views.values() for f in v.feature_names]
    refs, unknown = _known_refs(catalog, candidates)
    bare_count: dict[str, int] = {}
    for ref in refs:
        bare_count[ref.feature] = bare_count.get(ref.feature, 0) + 1
    if unknown:
        notes.append(f"not compared: {', '.join(unknown)} (not in the applied catalog)")
    columns: dict[str, str] = {}
    reads: dict[str, np.ndarray] = {}
    kept = []
    in_wanted = np.isin(labels, list(wanted))
    answering = logged.filter(pa.array(in_wanted))  # rows of the model's versions
    groups = version_rows(answering)
    for ref in refs:
        name = f"{ref.view}:{ref.feature}"
        column = logged_column(logged, ref.view, ref.feature)
        if column is None:
            continue
        if bare_count[ref.feature] > 1 and column == f"feature.{ref.feature}":
            # Two views with a feature of this name, logged under the bare name: which one was served is unknown.
            notes.append(f"not compared: {name} (logged as {ref.feature!r}, a name other views use too)")
            continue
        mask = np.zeros(logged.num_rows, dtype=bool)
        mask[in_wanted] = rows_reading(answering, column, ref.view, ref.feature, versions, groups)
        if mask.any():
            columns[name], reads[name] = column, mask
            kept.append(ref)
    subject = " ".join(p for p in (f"model {model}" if model else "", f"service {service}" if service else "") if p)
    if not kept:
        notes.append("no served rows in the window read these features")
    return _Scope(subject, kept, columns, reads, notes)


def _known_versions(registry: Any) -> dict[str, Any]:
    if registry is None:
        return {}
    from quiver.registry.models import ModelRegistry

    return {v.label: v for v in ModelRegistry(registry).versions()}


def _known_refs(catalog: Catalog, names: Sequence[str]) -> tuple[list[FeatureRef], list[str]]:
    """Refs of the stored and on-demand features among `names`, and the names the catalog does not know."""
    refs, unknown = [], []
    for name in dict.fromkeys(names):
        view, _, feature = name.partition(":")
        if view in catalog.views or view in catalog.on_demand:
            refs.append(FeatureRef(view, feature, f"{view}__{feature}"))
        else:
            unknown.append(name)
    return refs, unknown


# ----- comparison -----


def _compare(config: Config, catalog: Catalog, rows_table: pa.Table, scope: _Scope, chosen: np.ndarray,
             settings: ConsistencySettings, registry: Any, notes: list[str]) -> list[FeatureConsistency]:
    t_us = rows_table["ts"].cast(pa.int64()).to_numpy(zero_copy_only=False).astype(np.int64)
    key_types = {k: dtype for v in catalog.views.values() for k, dtype in v.keys}
    keys = {k: ev.key_array(rows_table[f"key.{k}"] if f"key.{k}" in rows_table.column_names
                            else pa.nulls(len(t_us)), dtype) for k, dtype in key_types.items()}
    rows = ev.Rows(t_us, keys)
    stored = [r for r in scope.refs if r.view in catalog.views]
    offline = ev.point_in_time(config, catalog, stored, rows, settings.engine) if stored else {}
    out: list[FeatureConsistency] = []
    codes_of: dict[str, np.ndarray] = {}  # view:feature → cause code per compared row (EQUAL where not read)
    late_noted = False
    for view_name in dict.fromkeys(r.view for r in stored):
        view = catalog.views[view_name]
        refs = [r for r in scope.refs if r.view == view_name]
        names = [f"{r.view}:{r.feature}" for r in refs]
        served = {n: cons.as_values(rows_table[scope.columns[n]]) for n in names}
        here = {n: scope.reads[n][chosen] for n in names}
        off = {n: offline[(r.view, r.feature)] for n, r in zip(names, refs, strict=True)}
        same = {n: cons.equal(served[n], off[n], settings.rtol) | ~here[n] for n in names}
        differs = np.zeros(len(t_us), dtype=bool)
        for n in names:
            differs |= ~same[n]
        evidence: dict[str, dict[str, np.ndarray]] = {n: {} for n in names}
        lags = {n: np.full(len(t_us), np.nan) for n in names}  # seconds behind, on rows explained by lag
        if differs.any():
            late_noted |= _evidence(config, catalog, view, refs, names, rows, served, off, differs, settings,
                                    registry, evidence, lags)
        for n in names:
            index = np.flatnonzero(here[n])
            codes = cons.classify(same[n][index], **{k: v[index] for k, v in evidence[n].items()})
            codes_of[n] = np.full(len(t_us), cons.EQUAL, dtype=np.int8)
            codes_of[n][index] = codes
            s, o = served[n].take(index), off[n].take(index)
            examples = _examples(rows_table, index, s, o, codes, view.key_names)
            out.append(cons.summarize(n, s, o, codes, settings.threshold_of(n), examples,
                                      lag_s=lags[n][index], objective_s=settings.freshness.get(view_name)))
    on_demand = [r for r in scope.refs if r.view in catalog.on_demand]
    if on_demand:
        out += _compare_on_demand(config, catalog, rows_table, rows, scope, on_demand, chosen, codes_of, settings)
    if late_noted:
        notes.append("late events: arrival read as the time the streaming feeder wrote their late-event file; "
                     "batch source files record no arrival time")
    return out


def _compare_on_demand(config: Config, catalog: Catalog, rows_table: pa.Table, rows: ev.Rows, scope: _Scope,
                       refs: list[FeatureRef], chosen: np.ndarray, codes_of: Mapping[str, np.ndarray],
                       settings: ConsistencySettings) -> list[FeatureConsistency]:
    """On-demand features against a training set's (the logged request fields in, point-in-time inputs). A row
    that differs takes the cause of a stored input that differs on it (a stale input makes a stale output);
    with every compared input equal, or none compared, it is unexplained: the function ran differently."""
    fields = {name for r in refs for name, _ in catalog.on_demand[r.view].request_fields}
    request = {name: rows_table[f"request.{name}"].combine_chunks() if f"request.{name}" in rows_table.column_names
               else pa.nulls(rows_table.num_rows) for name in sorted(fields)}
    offline = ev.on_demand_offline(config, catalog, refs, rows, request, settings.engine)
    out = []
    for ref in refs:
        n = f"{ref.view}:{ref.feature}"
        served, off = cons.as_values(rows_table[scope.columns[n]]), offline[(ref.view, ref.feature)]
        index = np.flatnonzero(scope.reads[n][chosen])
        same = cons.equal(served, off)[index]
        inputs = [codes_of[f"{v}:{f}"][index] for v, f in catalog.on_demand[ref.view].inputs if f"{v}:{f}" in codes_of]
        # Evidence per cause: an input differs on the row for that cause (an unexplained input gives none).
        evidence = {cause: np.zeros(len(index), dtype=bool) for cause in ("late", "ttl", "lag", "gap")}
        for codes in inputs:
            for cause, code in (("late", cons.LATE_EVENT), ("ttl", cons.TTL_BOUNDARY), ("lag", cons.STREAM_LAG),
                                ("gap", cons.MATERIALIZATION_GAP)):
                evidence[cause] |= codes == code
        codes = cons.classify(same, **evidence)
        s, o = served.take(index), off.take(index)
        keys = sorted({k for v, _ in catalog.on_demand[ref.view].inputs for k in catalog.views[v].key_names})
        out.append(cons.summarize(n, s, o, codes, settings.threshold_of(n),
                                  _examples(rows_table, index, s, o, codes, keys)))
    return out


def _evidence(config: Config, catalog: Catalog, view: Any, refs: list[FeatureRef], names: list[str],
              rows: ev.Rows, served: dict[str, Values], off: dict[str, Values], differs: np.ndarray,
              settings: ConsistencySettings, registry: Any, evidence: dict[str, dict[str, np.ndarray]],
              lags: dict[str, np.ndarray]) -> bool:
    """Fill `evidence[feature][cause]` (masks over all rows) for the rows of `view` that differ, and `lags`
    (seconds behind the request of the nearest earlier moment whose value was served); True when the
    late-event store was consulted."""
    index = np.flatnonzero(differs)
    sub = rows.take(index)
    n = len(rows.t_us)

    def spread(mask: np.ndarray) -> np.ndarray:
        full = np.zeros(n, dtype=bool)
        full[index] = mask
        return full

    zero = [any(a.name == r.feature and a.fn in ("count", "sum") for a in view.aggregations) for r in refs]
    online_empty = cons.empty_rows([served[m].take(index) for m in names], zero)
    offline_empty = cons.empty_rows([off[m].take(index) for m in names], zero)
    for m in names:
        evidence[m]["gap"] = spread(online_empty & ~offline_empty)
    materialized = [m for m in (ev.last_materialization(registry, view.name, sub.t_us, back)
                                for back in (0, 1)) if m is not None] if registry is not None else None
    moments = ev.earlier_moments(sub.t_us, settings.max_lag_s, materialized)
    if moments:  # every earlier moment in one replay: the rows repeated, one copy per moment
        stacked = sub.repeat(len(moments))
        earlier = ev.read_before(config, catalog, view, refs, stacked, np.concatenate(moments), settings.engine)
        k = len(index)
        for m, r in zip(names, refs, strict=True):
            column = earlier[(r.view, r.feature)]
            candidates = [column.take(np.arange(i * k, (i + 1) * k)) for i in range(len(moments))]
            found = cons.lag_evidence(served[m].take(index), candidates)
            evidence[m]["lag"] = spread(found)
            lags[m][index] = cons.lag_seconds(served[m].take(index), candidates, sub.t_us, moments)
    if view.kind == "last" and view.ttl_us:
        margin = int(settings.ttl_margin_s * ev.US)
        shorter = ev.point_in_time(config, catalog, refs, sub, settings.engine, ttl_shift_us=-margin)
        longer = ev.point_in_time(config, catalog, refs, sub, settings.engine, ttl_shift_us=margin)
        for m, r in zip(names, refs, strict=True):
            key = (r.view, r.feature)
            evidence[m]["ttl"] = spread(cons.ttl_evidence(served[m].take(index), off[m].take(index),
                                                          shorter[key], longer[key]))
    files = ev.late_files(config, view)
    if not files:
        return False
    unseen = ev.unseen_late(files, sub.key_tuples(view.key_names), sub.t_us)
    for excluded in sorted(set(unseen) - {frozenset()}, key=sorted):
        group = np.flatnonzero([u == excluded for u in unseen])
        known = ev.without_late(config, catalog, view, refs, sub.take(group), files, excluded, settings.engine)
        for m, r in zip(names, refs, strict=True):
            mask = np.zeros(len(index), dtype=bool)
            mask[group] = cons.late_evidence(served[m].take(index[group]), known[(r.view, r.feature)],
                                             np.ones(len(group), dtype=bool))
            evidence[m]["late"] = evidence[m].get("late", np.zeros(n, dtype=bool)) | spread(mask)
    return True


def _examples(table: pa.Table, index: np.ndarray, served: Values, offline: Values, codes: np.ndarray,
              key_names: Sequence[str]) -> list[dict[str, Any]]:
    """The first few differing rows of each cause (one cause's many rows must not hide another's); `index`
    maps the compared rows to rows of `table`."""
    picked = sorted(i for code in range(1, len(cons.CAUSES) + 1) for i in np.flatnonzero(codes == code)[:_EXAMPLES])
    wanted = ["request_id", "ts", *(f"key.{k}" for k in key_names if f"key.{k}" in table.column_names)]
    rows = table.select(wanted).take(pa.array(index[picked], pa.int64())).to_pylist() if picked else []
    out = []
    for i, row in zip(picked, rows, strict=True):
        out.append({"request_id": row.get("request_id"), "ts": row["ts"].isoformat() if row.get("ts") else None,
                    "keys": {k: row.get(f"key.{k}") for k in key_names},
                    "served": None if served.missing[i] else _plain(served.values[i]),
                    "offline": None if offline.missing[i] else _plain(offline.values[i]),
                    "cause": cons.CAUSES[int(codes[i]) - 1]})
    return out


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


# ----- registry and alerts -----


def record_run(registry: Any, report: cons.ConsistencyReport) -> int:
    """Store the run and one result row per feature (registry tables of migration 0008). Returns its id."""
    from quiver.monitoring.consistency_records import record_consistency_run

    return int(record_consistency_run(registry, report))


def _alert(alerts: Any, report: cons.ConsistencyReport, run_id: int | None) -> list[Any]:
    raised = []
    for f in report.features:
        if f.status == "alert":
            causes = ", ".join(f"{c} {n}" for c, n in f.causes.items() if n and c != "late_event") or "-"
            detail = {"run_id": run_id, "subject": report.subject, "window": {"start": report.window[0],
                                                                             "end": report.window[1]},
                      **{k: v for k, v in f.to_dict().items() if k != "examples"}}
            raised.append(alerts.raise_alert(
                ALERT_KIND, f.feature, "warning",
                f"{f.feature}: {f.wrong_rate:.2%} of served values differ from offline",
                f"{f.wrong} of {f.compared} rows served for {report.subject} in [{report.window[0]}, "
                f"{report.window[1]}) differ from the point-in-time value (threshold {f.threshold:.2%}); causes: "
                f"{causes}; late events (not counted): {f.late}", detail))
        elif f.status == "ok":
            alerts.resolve(ALERT_KIND, f.feature)
    return raised
