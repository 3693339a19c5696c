"""Registry records of the monitoring loop: drift runs and their per-feature time series, alerts, deliveries,
and each alert's history (`alert_events`: opened, updated, escalated, resolved, with why and both clocks).

Writes go through `Registry._write()` (SQLite BEGIN IMMEDIATE / a Postgres advisory lock), so the
check-then-insert of alert deduplication is serialized across processes; a partial unique index on open
alerts backs it up.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import insert, select, update

from quiver.monitoring.drift import DriftReport
from quiver.registry import Registry
from quiver.registry.monitoring_tables import (
    alert_deliveries,
    alert_events,
    alerts,
    drift_results,
    drift_runs,
)

SEVERITIES = ("info", "warning", "critical")
_SCORE_COLUMNS = ("psi", "ks_statistic", "ks_pvalue", "wasserstein", "jensenshannon")


def _now() -> datetime:
    return datetime.now(UTC)


def _finite(value: float | None) -> float | None:
    # SQLite silently turns NaN into NULL while Postgres keeps it; store NULL everywhere.
    return None if value is None or not math.isfinite(value) else float(value)


def _inserted_id(result: Any) -> int:
    key = result.inserted_primary_key
    assert key is not None
    return int(key[0])


def _json(data: Any) -> str:
    return json.dumps(data, default=str, sort_keys=True)


def _data_time(detail: dict[str, Any] | None, wall: datetime) -> datetime:
    # The data time a record is about (its detail's `as_of` or window end), else the wall time: the second of
    # the two moments every loop record keeps (registry migration 0007).
    from quiver.registry.rollouts import judged_time

    return judged_time(detail) or wall


# ----- drift -----


def record_drift_run(registry: Registry, report: DriftReport, name: str, reference: str = "",
                     current: str = "", detail: dict[str, Any] | None = None) -> int:
    """Store a drift report: one run row and one result row per feature. Returns the run id."""
    with registry._write() as connection:
        return record_drift_run_in(connection, registry.project, report, name, reference, current, detail)


def record_drift_run_in(connection: Any, project: str, report: DriftReport, name: str, reference: str = "",
                        current: str = "", detail: dict[str, Any] | None = None) -> int:
    """`record_drift_run` inside the caller's write transaction (with the alerts it raises, say)."""
    finished = _now()
    started = datetime.fromtimestamp(finished.timestamp() - report.elapsed_s, UTC)
    run_id = _inserted_id(connection.execute(insert(drift_runs).values(
        project=project, name=name, reference=reference[:1024], current=current[:1024],
        engine=report.engine, started_at=started, finished_at=finished, n_features=len(report.features),
        n_judged=len(report.judged), n_drifted=len(report.drifted), drift_share=report.drift_share,
        dataset_drift=report.dataset_drift, status="succeeded", as_of=_data_time(detail, finished),
        detail_json=_json({"drift_share_threshold": report.drift_share_threshold, "decision": report.decision,
                           "false_alarms_per_90_days": report.false_alarms_per_90_days, "rule": report.rule,
                           **(detail or {})}),
    )))
    rows = []
    for f in report.features:
        extra = {k: v for k, v in f.scores.items() if k not in _SCORE_COLUMNS}
        rows.append({
            "run_id": run_id, "project": project, "feature": f.feature, "kind": f.kind,
            "status": f.status, "drifted": f.drifted, "n_ref": f.n_ref, "n_cur": f.n_cur,
            "nulls_ref": f.nulls_ref, "nulls_cur": f.nulls_cur, "computed_at": finished,
            "detail_json": _json({"scores": extra, "reasons": list(f.reasons), **f.details}),
            **{c: _finite(f.scores.get(c)) for c in _SCORE_COLUMNS},
        })
    if rows:
        connection.execute(insert(drift_results), rows)
    return run_id


def drift_history(registry: Registry, feature: str, name: str | None = None,
                  limit: int = 500) -> list[dict[str, Any]]:
    """A feature's drift results over time, oldest first (optionally only runs called `name`), each with its
    run's name, reference and current side (`run_reference`, `run_current`: what was compared)."""
    query = (select(drift_results, drift_runs.c.name.label("run_name"), drift_runs.c.reference.label("run_reference"),
                    drift_runs.c.current.label("run_current"))
             .join(drift_runs, drift_runs.c.id == drift_results.c.run_id)
             .where(drift_results.c.project == registry.project, drift_results.c.feature == feature))
    if name is not None:
        query = query.where(drift_runs.c.name == name)
    query = query.order_by(drift_results.c.computed_at.desc(), drift_results.c.id.desc()).limit(limit)
    with registry.engine.connect() as connection:
        rows = [dict(r._mapping) for r in connection.execute(query)]
    return rows[::-1]


def list_drift_runs(registry: Registry, name: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
    """Recent drift runs, newest first."""
    query = select(drift_runs).where(drift_runs.c.project == registry.project)
    if name is not None:
        query = query.where(drift_runs.c.name == name)
    with registry.engine.connect() as connection:
        return [dict(r._mapping) for r in connection.execute(
            query.order_by(drift_runs.c.id.desc()).limit(limit))]


def drift_results_of(registry: Registry, run_id: int) -> list[dict[str, Any]]:
    with registry.engine.connect() as connection:
        return [dict(r._mapping) for r in connection.execute(
            select(drift_results).where(drift_results.c.run_id == run_id).order_by(drift_results.c.id))]


# ----- alerts -----


@dataclass(frozen=True)
class AlertRecord:
    """An alert as stored in the registry."""

    id: int
    project: str
    kind: str
    subject: str
    severity: str
    status: str
    title: str
    message: str
    detail: dict[str, Any]
    occurrences: int
    created_at: datetime
    last_seen_at: datetime
    resolved_at: datetime | None = None
    deliveries: dict[str, str] = field(default_factory=dict)  # sink → pending | delivered | failed
    as_of: datetime | None = None  # the data time it is about (created_at, last_seen_at: wall clock)

    @property
    def data_time(self) -> datetime:
        return self.as_of or self.created_at

    @property
    def delivery_status(self) -> str:
        """failed if any sink failed, pending if any is pending, delivered when all are (or there are none)."""
        states = set(self.deliveries.values())
        for state in ("failed", "pending", "sending"):
            if state in states:
                return "pending" if state == "sending" else state
        return "delivered"


def dedup_key(kind: str, subject: str) -> str:
    return f"{kind}:{subject}"[:320]


def open_alert(registry: Registry, kind: str, subject: str, severity: str, title: str, message: str,
               detail: dict[str, Any] | None, sinks: list[str]) -> tuple[AlertRecord, str]:
    """Open an alert, or touch the open one with the same kind and subject.

    Returns the record and what happened: "created", "escalated" (severity rose: deliver again) or
    "repeated". Deliveries for `sinks` are (re)set to pending when the alert is created or escalated.
    """
    with registry._write() as connection:
        return open_alert_in(connection, registry.project, kind, subject, severity, title, message, detail, sinks)


def open_alert_in(connection: Any, project: str, kind: str, subject: str, severity: str, title: str,
                  message: str, detail: dict[str, Any] | None, sinks: list[str]) -> tuple[AlertRecord, str]:
    """`open_alert` inside the caller's write transaction: the alert (pending for every sink) commits or
    vanishes with whatever else the transaction does — e.g. the decision it announces."""
    if severity not in SEVERITIES:
        raise ValueError(f"severity must be one of {', '.join(SEVERITIES)}, got {severity!r}")
    key, now = dedup_key(kind, subject), _now()
    row = connection.execute(select(alerts).where(
        alerts.c.project == project, alerts.c.dedup_key == key, alerts.c.status == "open")).first()
    if row is None:
        alert_id = _inserted_id(connection.execute(insert(alerts).values(
            project=project, kind=kind, subject=subject, dedup_key=key, severity=severity,
            status="open", title=title[:255], message=message, detail_json=_json(detail or {}),
            occurrences=1, created_at=now, last_seen_at=now, as_of=_data_time(detail, now))))
        outcome = "created"
        _event_in(connection, project, alert_id, "opened", severity, message, now, _data_time(detail, now),
                  _event_detail(detail, 1))
    else:
        alert_id = int(row.id)
        escalated = SEVERITIES.index(severity) > SEVERITIES.index(row.severity)
        values: dict[str, Any] = {"occurrences": row.occurrences + 1, "last_seen_at": now}
        if escalated:
            values |= {"severity": severity, "title": title[:255], "message": message,
                       "detail_json": _json(detail or {})}
        connection.execute(update(alerts).where(alerts.c.id == alert_id).values(**values))
        outcome = "escalated" if escalated else "repeated"
        _repeat_event_in(connection, project, alert_id, escalated, severity if escalated else row.severity,
                         message, now, _data_time(detail, now), _event_detail(detail, row.occurrences + 1))
    if outcome != "repeated":
        _reset_deliveries(connection, alert_id, sinks, now)
    return _load_alert(connection, alert_id), outcome


def claim_delivery(registry: Registry, alert_id: int, sink: str, lease_s: float = 300.0) -> bool:
    """Take the delivery of `alert_id` to `sink` (pending, failed, or a `sending` claim older than `lease_s`
    whose sender died): True for exactly one caller, so two workers never send one alert twice."""
    from datetime import timedelta

    now = _now()
    with registry._write() as connection:
        result = connection.execute(update(alert_deliveries).where(
            alert_deliveries.c.alert_id == alert_id, alert_deliveries.c.sink == sink,
            (alert_deliveries.c.status.in_(("pending", "failed")))
            | ((alert_deliveries.c.status == "sending")
               & (alert_deliveries.c.updated_at < now - timedelta(seconds=lease_s)))).values(
            status="sending", updated_at=now))
        return bool(result.rowcount)


def _reset_deliveries(connection: Any, alert_id: int, sinks: list[str], now: datetime) -> None:
    existing = {r.sink for r in connection.execute(
        select(alert_deliveries.c.sink).where(alert_deliveries.c.alert_id == alert_id))}
    for sink in sinks:
        if sink in existing:
            connection.execute(update(alert_deliveries).where(
                alert_deliveries.c.alert_id == alert_id, alert_deliveries.c.sink == sink).values(
                status="pending", updated_at=now))
        else:
            connection.execute(insert(alert_deliveries).values(
                alert_id=alert_id, sink=sink, status="pending", attempts=0, last_error="", updated_at=now))


def record_delivery(registry: Registry, alert_id: int, sink: str, ok: bool, attempts: int,
                    error: str = "") -> None:
    """Store the outcome of one delivery try (attempts add up across tries)."""
    now = _now()
    with registry._write() as connection:
        row = connection.execute(select(alert_deliveries).where(
            alert_deliveries.c.alert_id == alert_id, alert_deliveries.c.sink == sink)).first()
        values = {"status": "delivered" if ok else "failed", "last_error": error[:4000], "updated_at": now,
                  "delivered_at": now if ok else None}
        if row is None:
            connection.execute(insert(alert_deliveries).values(alert_id=alert_id, sink=sink, attempts=attempts,
                                                                **values))
        else:
            connection.execute(update(alert_deliveries).where(alert_deliveries.c.id == row.id).values(
                attempts=row.attempts + attempts, **values))


def resolve_alerts(registry: Registry, kind: str, subject: str | None = None,
                   alert_id: int | None = None, reason: str = "resolved") -> int:
    """Resolve open alerts of `kind` (one subject, one id, or all), saying why in their history. Returns how
    many were resolved."""
    with registry._write() as connection:
        return resolve_alerts_in(connection, registry.project, kind, subject, alert_id, reason)


def resolve_alerts_in(connection: Any, project: str, kind: str, subject: str | None = None,
                      alert_id: int | None = None, reason: str = "resolved", as_of: datetime | None = None,
                      only: Callable[[Any], bool] | None = None) -> int:
    """`resolve_alerts` inside the caller's write transaction. `as_of`: the data time that cleared it (else
    the alert's own); `only`: a further test on each open alert row (e.g. judged against another model)."""
    query = select(alerts).where(alerts.c.project == project, alerts.c.status == "open")
    if kind:
        query = query.where(alerts.c.kind == kind)
    if subject is not None:
        query = query.where(alerts.c.subject == subject)
    if alert_id is not None:
        query = query.where(alerts.c.id == alert_id)
    rows = [r for r in connection.execute(query) if only is None or only(r)]
    now = _now()
    for row in rows:
        connection.execute(update(alerts).where(alerts.c.id == row.id).values(status="resolved", resolved_at=now))
        _event_in(connection, project, int(row.id), "resolved", row.severity, reason, now,
                  as_of or _last_data_time(connection, row) or now, {"occurrences": int(row.occurrences)})
    return len(rows)


# ----- alert history -----

UPDATE_KEYS = ("drifted",)  # a change in these is news the same data day; the rest waits for the next day


@dataclass(frozen=True)
class AlertEvent:
    """One state change of an alert: opened | updated | escalated | resolved, why, and both clocks."""

    id: int
    alert_id: int
    event: str
    severity: str
    reason: str
    at: datetime  # wall clock
    as_of: datetime | None  # the data time it was about
    detail: dict[str, Any]


def _last_data_time(connection: Any, row: Any) -> datetime | None:
    """The newest data time an alert was seen at (its last event's), else the one it opened on."""
    last = connection.execute(select(alert_events.c.as_of).where(alert_events.c.alert_id == row.id)
                              .order_by(alert_events.c.id.desc()).limit(1)).scalar()
    moment = last if last is not None else row.as_of
    return _utc(moment) if moment is not None else None


def _event_detail(detail: dict[str, Any] | None, occurrences: int) -> dict[str, Any]:
    """What a reader of the history needs from an occurrence (not the whole score dump)."""
    kept = {k: v for k, v in (detail or {}).items()
            if k in ("run_id", "drift_share", "drifted", "reference", "current", "decision_id", "version")}
    return {"occurrences": occurrences, **kept}


def _event_in(connection: Any, project: str, alert_id: int, event: str, severity: str, reason: str,
              at: datetime, as_of: datetime | None, detail: dict[str, Any]) -> None:
    connection.execute(insert(alert_events).values(
        alert_id=alert_id, project=project, event=event, severity=severity, reason=reason[:4000], at=at,
        as_of=as_of, detail_json=_json(detail)))


def _repeat_event_in(connection: Any, project: str, alert_id: int, escalated: bool, severity: str,
                     message: str, at: datetime, as_of: datetime, detail: dict[str, Any]) -> None:
    """An escalation always; a repeat only when it brings news (other drifted features) or is the first of
    its data day, so an hourly or daily check that sees the same condition writes at most a line a day."""
    if escalated:
        _event_in(connection, project, alert_id, "escalated", severity, message, at, as_of, detail)
        return
    last = connection.execute(select(alert_events).where(alert_events.c.alert_id == alert_id)
                              .order_by(alert_events.c.id.desc()).limit(1)).first()
    before = json.loads(last.detail_json) if last is not None else {}
    changed = [k for k in UPDATE_KEYS if k in detail and detail.get(k) != before.get(k)]
    new_day = last is None or last.as_of is None or _utc(last.as_of).date() < as_of.date()
    if changed or new_day:
        what = _changes(before, detail) if changed and last is not None else ""
        _event_in(connection, project, alert_id, "updated", severity,
                  f"still holds (seen {detail['occurrences']}×){what}: {message}", at, as_of, detail)


def _changes(before: dict[str, Any], after: dict[str, Any]) -> str:
    old, new = set(before.get("drifted") or []), set(after.get("drifted") or [])
    parts = [f"+{f}" for f in sorted(new - old)] + [f"−{f}" for f in sorted(old - new)]
    return f"; drifted features changed: {' '.join(parts)}" if parts else ""


def alert_history(registry: Registry, alert_id: int) -> list[AlertEvent]:
    """An alert's events, oldest first."""
    with registry.engine.connect() as connection:
        rows = connection.execute(select(alert_events).where(alert_events.c.alert_id == alert_id)
                                  .order_by(alert_events.c.id)).all()
    return [AlertEvent(int(r.id), int(r.alert_id), r.event, r.severity, r.reason, _utc(r.at),
                       _utc(r.as_of) if r.as_of is not None else None, json.loads(r.detail_json or "{}"))
            for r in rows]


# ----- alerts of a model's reference -----


def reference_version(reference: str) -> str:
    """The model version a drift reference label names ("fraud_model:2 reference" → "fraud_model:2")."""
    return reference.removesuffix(" reference").strip()


def _drift_alerts_of(model: str) -> Any:
    return (alerts.c.kind.in_(("drift", "dataset_drift", "retrain_needed"))
            & ((alerts.c.subject == model) | alerts.c.subject.startswith(f"{model}:", autoescape=True)))


def resolve_model_changed_in(connection: Any, project: str, model: str, new_version: str, *,
                             keep_unlabelled: bool, as_of: datetime | None = None, noun: str = "model") -> int:
    """Resolve the open drift alerts of `model` judged against another version than `new_version` ("the
    model changed: old → new"): a promoted model gets its own reference and its own alerts. Alerts that
    recorded no reference (raised before references were kept) stay when `keep_unlabelled`. `noun`: what
    changed, in the reason ("reference" for a check against a file rather than a model version)."""
    rows = connection.execute(select(alerts).where(alerts.c.project == project, alerts.c.status == "open",
                                                   _drift_alerts_of(model))).all()
    resolved = 0
    for row in rows:
        old = reference_version(str(json.loads(row.detail_json or "{}").get("reference") or ""))
        if old == new_version or (not old and keep_unlabelled):
            continue
        resolved += resolve_alerts_in(connection, project, row.kind, alert_id=int(row.id), as_of=as_of,
                                      reason=f"the {noun} changed: {old or 'an earlier version'} → {new_version}")
    return resolved


def get_alert(registry: Registry, alert_id: int) -> AlertRecord:
    with registry.engine.connect() as connection:
        return _load_alert(connection, alert_id)


def list_alerts(registry: Registry, status: str | None = "open", kind: str | None = None,
                limit: int = 200) -> list[AlertRecord]:
    """Alerts newest first, optionally filtered by status and kind."""
    query = select(alerts.c.id).where(alerts.c.project == registry.project)
    if status:
        query = query.where(alerts.c.status == status)
    if kind:
        query = query.where(alerts.c.kind == kind)
    with registry.engine.connect() as connection:
        ids = [r.id for r in connection.execute(query.order_by(alerts.c.id.desc()).limit(limit))]
        return [_load_alert(connection, i) for i in ids]


def undelivered(registry: Registry) -> list[tuple[int, str]]:
    """(alert id, sink) pairs still pending, failed or being sent, for a later retry (`claim_delivery`
    decides whether a `sending` one is abandoned)."""
    query = (select(alert_deliveries.c.alert_id, alert_deliveries.c.sink)
             .join(alerts, alerts.c.id == alert_deliveries.c.alert_id)
             .where(alerts.c.project == registry.project,
                    alert_deliveries.c.status.in_(("pending", "failed", "sending")))
             .order_by(alert_deliveries.c.id))
    with registry.engine.connect() as connection:
        return [(int(r.alert_id), str(r.sink)) for r in connection.execute(query)]


def _load_alert(connection: Any, alert_id: int) -> AlertRecord:
    row = connection.execute(select(alerts).where(alerts.c.id == alert_id)).first()
    if row is None:
        raise KeyError(f"no alert {alert_id}")
    deliveries = {r.sink: r.status for r in connection.execute(
        select(alert_deliveries).where(alert_deliveries.c.alert_id == alert_id))}
    return AlertRecord(int(row.id), row.project, row.kind, row.subject, row.severity, row.status, row.title,
                       row.message, json.loads(row.detail_json), int(row.occurrences),
                       _utc(row.created_at), _utc(row.last_seen_at),
                       _utc(row.resolved_at) if row.resolved_at else None, deliveries,
                       _utc(row.as_of) if row.as_of is not None else None)


def _utc(value: datetime) -> datetime:
    # SQLite hands back naive datetimes; they were written as UTC.
    return value if value.tzinfo else value.replace(tzinfo=UTC)
