"""The scheduled drift check: compute, store the time series, publish metrics, raise and resolve alerts.

`run_drift_check` is what the drift DAG (and `quiver drift`) calls. Alerts:
* kind "drift", subject "<name>:<feature>", severity warning — per feature whose status is `alert`;
* kind "dataset_drift", subject "<name>", severity warning — when the report's decision says the dataset
  drifted (drift alone warns: the loop's `retrain_needed`, raised by `pipelines/loop_harm.py` on expected
  harm or a lasting drift, is what the retrain DAG and `AirflowAssetSink` act on).
Open alerts of features (or the dataset) that are judged healthy again are resolved ("cleared on <data
time>"); features without enough data leave their alerts as they are. Drift alerts belong to the reference they
were judged against (recorded in their detail): a check against another reference — a new champion's —
first resolves the old one's open alerts ("the model changed: old → new"), then raises its own. A repeated
condition bumps the open alert (no new delivery); every change is in the alert's history (`alert_events`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from quiver import metrics
from quiver.catalog.errors import NoRowsError
from quiver.monitoring import repository
from quiver.monitoring.alerts import AlertManager, RaisedAlert
from quiver.monitoring.drift import DriftConfig, DriftReport, Frame, compute_drift
from quiver.registry import Registry


@dataclass(frozen=True)
class DriftCheck:
    """A finished check: the report, its registry run id (if stored) and the alerts it raised."""

    report: DriftReport
    run_id: int | None
    alerts: list[Any]


def report_name(model: str, version: int, arm: str, start: datetime, end: datetime) -> str:
    """File stem of a serving-drift report (the drift DAG writes it, the console links it): model, version, arm
    and the data window it covers."""
    return f"drift-{model}-v{version}-{arm}-{start:%Y%m%dT%H%M}-{end:%Y%m%dT%H%M}"


def read_table(path: str | Path, columns: Sequence[str] | None = None) -> pa.Table:
    """A Parquet file or folder (hive partitions allowed) as one Arrow table."""
    import pyarrow.dataset as ds

    source = Path(path)
    if source.is_dir():
        return ds.dataset(source, format="parquet", partitioning="hive").to_table(
            columns=list(columns) if columns else None)
    return pq.read_table(source, columns=list(columns) if columns else None)


@dataclass(frozen=True)
class DriftColumns:
    """Which columns a drift check compares by default, and which it left out and why."""

    features: list[str]
    left_out: dict[str, str]  # column → reason (join key, timestamp, not a feature, …)
    origin: str  # what the features came from, e.g. "feature service fraud_model"


def default_drift_columns(catalog: Any, reference_columns: Sequence[str], current_columns: Sequence[str],
                          service: str | None = None) -> DriftColumns:
    """The catalog's features present in both tables (a service's when named), never keys, times or labels.

    Training sets and serving logs name features as the training set does (the feature name). Tables that
    hold raw source events instead (no feature columns) are compared on the source columns the views read.
    """
    both = [c for c in reference_columns if c in set(current_columns)]
    keys = {k for view in catalog.views.values() for k in view.key_names}
    times = {src.timestamp_field for src in catalog.sources.values()} | {"event_ts", "event_timestamp",
                                                                         "created_ts", "date"}
    if service is not None:
        if service not in catalog.services:
            raise ValueError(f"unknown feature service {service!r}; services: "
                             f"{', '.join(sorted(catalog.services)) or 'none'}")
        wanted = [ref.partition(":")[2] for ref in catalog.services[service].features]
        missing = [f for f in wanted if f not in both]
        if missing:
            raise ValueError(f"feature service {service!r}: feature(s) {', '.join(missing)} are not in both "
                             f"tables (columns in both: {', '.join(both)})")
        features, origin = wanted, f"feature service {service}"
    else:
        catalog_features = list(dict.fromkeys(f for v in catalog.views.values() for f in v.feature_names))
        features = [c for c in both if c in set(catalog_features)]
        origin = "the catalog's features"
        if not features:
            read = {c for v in catalog.views.values() for c in [*(a.column for a in v.aggregations),
                                                                 *(f.column for f in v.fields)]}
            features = [c for c in both if c in read and c not in keys and c not in times]
            origin = "the source columns the catalog's views read"
    if not features:
        raise ValueError(f"no catalog feature or source column is in both tables (columns in both: "
                         f"{', '.join(both) or 'none'}); name the columns with -f")
    chosen = set(features)
    left_out = {c: "join key" if c in keys else "timestamp" if c in times else "not a catalog feature"
                for c in both if c not in chosen}
    return DriftColumns(features, left_out, origin)


def time_window(table: pa.Table) -> tuple[Any, Any] | None:
    """(earliest, latest) of the table's event time column (`event_ts`, else the first timestamp column)."""
    import pyarrow.compute as pc

    names = [f.name for f in table.schema if pa.types.is_timestamp(f.type)]
    if not names:
        return None
    name = "event_ts" if "event_ts" in names else names[0]
    bounds = pc.min_max(table.column(name)).as_py()
    return (bounds["min"], bounds["max"]) if bounds["min"] is not None else None


def table_schema(path: str | Path) -> pa.Schema:
    """The schema of a Parquet file or folder, read from footers only."""
    import pyarrow.dataset as ds

    source = Path(path)
    if source.is_dir():
        return ds.dataset(source, format="parquet", partitioning="hive").schema
    return pq.read_schema(source)


def time_columns(schema: pa.Schema) -> list[str]:
    """Timestamp columns of a schema (`event_ts` first when present)."""
    names = [f.name for f in schema if pa.types.is_timestamp(f.type)]
    return sorted(names, key=lambda n: n != "event_ts")


def run_drift_check(reference: Frame, current: Frame, *, name: str, features: Sequence[str] | None = None,
                    config: DriftConfig | None = None, registry: Registry | None = None,
                    alerts: AlertManager | None = None, engine: str = "fast", reference_label: str = "",
                    current_label: str = "", detail: dict[str, Any] | None = None) -> DriftCheck:
    """Compare, record (when a registry is given, with `detail`), publish metrics and raise/resolve alerts.

    The run and the alerts it raises or resolves commit in one transaction (a crash in between can neither
    leave a recorded run without its alerts nor alerts without their run); alerts are delivered after."""
    from quiver.monitoring import faults

    for side, frame, label in (("reference", reference, reference_label), ("current", current, current_label)):
        if _row_count(frame) == 0:  # a check over nothing is not evidence: never recorded, never a pass
            raise NoRowsError(f"no rows compared: the {side} side{' (' + label + ')' if label else ''} has no rows")
    report = compute_drift(reference, current, features, config, engine=engine)
    metrics.observe_drift(name, report)
    store = registry if registry is not None else (alerts.registry if alerts is not None else None)
    if store is None:
        return DriftCheck(report, None, [])
    opened: list[tuple[Any, str]] = []
    with store._write() as connection:
        run_id = repository.record_drift_run_in(connection, store.project, report, name, reference_label,
                                                current_label, detail) if registry is not None else None
        faults.point("drift.recorded")
        if alerts is not None:
            opened = _drift_alerts_in(connection, store.project, alerts, report, name, run_id, reference_label,
                                      current_label, _judged(detail))
    raised: list[Any] = []
    for record, outcome in opened:
        metrics.ALERTS.labels(kind=record.kind, severity=record.severity, outcome=outcome).inc()
        if outcome != "repeated" and alerts is not None:
            alerts.deliver(record.id)
        raised.append(RaisedAlert(repository.get_alert(store, record.id), outcome))
    return DriftCheck(report, run_id, raised)


def _judged(detail: dict[str, Any] | None) -> dict[str, Any]:
    """The data time the run judged (its window's end), for its alerts' detail: alerts keep both clocks too."""
    from quiver.registry.rollouts import judged_time

    moment = judged_time(detail)
    return {"as_of": moment.isoformat()} if moment is not None else {}


def _drift_alerts_in(connection: Any, project: str, alerts: AlertManager, report: DriftReport, name: str,
                     run_id: int | None, reference_label: str, current_label: str,
                     judged: dict[str, Any] | None = None) -> list[tuple[Any, str]]:
    """Per-feature and dataset drift alerts of one report, opened or resolved inside the caller's transaction."""
    sinks, judged = list(alerts.sinks), judged or {}
    moment = datetime.fromisoformat(judged["as_of"]) if judged.get("as_of") else None
    cleared = f"cleared on {moment:%Y-%m-%d %H:%M} UTC" if moment is not None else "cleared"
    if reference_label:  # alerts judged against another reference (the previous champion) are over
        repository.resolve_model_changed_in(
            connection, project, name, repository.reference_version(reference_label), keep_unlabelled=True,
            as_of=moment, noun="model" if reference_label.endswith(" reference") else "reference")
    own = {"reference": reference_label, **judged} if reference_label else dict(judged)
    opened = []
    for f in report.features:
        subject = f"{name}:{f.feature}"
        if f.drifted:
            opened.append(repository.open_alert_in(
                connection, project, "drift", subject, "warning", f"Feature {f.feature} drifted ({name})",
                "; ".join(f.reasons),
                {"run_id": run_id, "scores": f.scores, "n_ref": f.n_ref, "n_cur": f.n_cur, **own}, sinks))
        elif f.status in ("ok", "warn"):
            repository.resolve_alerts_in(connection, project, "drift", subject, reason=cleared, as_of=moment)
    if report.dataset_drift:
        names = ", ".join(f.feature for f in report.drifted)
        opened.append(repository.open_alert_in(
            connection, project, "dataset_drift", name, "warning",  # drift alone warns: retrain_needed is critical
            f"Dataset drift in {name}: {len(report.drifted)}/{len(report.judged)} features",
            f"Drifted: {names}. {report.rule}.",
            {"run_id": run_id, "drifted": [f.feature for f in report.drifted], "drift_share": report.drift_share,
             "current": current_label, **own}, sinks))
    elif report.judged:
        repository.resolve_alerts_in(connection, project, "dataset_drift", name, reason=cleared, as_of=moment)
    return opened


def _row_count(frame: Frame) -> int:
    return int(frame.num_rows) if isinstance(frame, pa.Table) else len(frame)
