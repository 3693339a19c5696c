"""Registry records of label-free performance estimates (`performance_estimates`, migration 0009): one row per
(model, version, arm, serving window, metric), written through `Registry._write()` like every loop record.

The estimate is stored the day the window is served (`record_estimate`: status "estimated", or "uncalibrated"
with the reason and no values); when the window's labels arrive `record_realized` computes the same metrics
from them (`performance_estimation.realized_metrics`, the decision threshold the estimate used) and stores
them beside it (status "realized"). Both writes are idempotent upserts on the table's unique key, so a rerun of
a day replaces its numbers and never duplicates them; an estimate rerun after labels arrived keeps the
realized values. Two clocks: `as_of` is the data time judged (the window's end), `computed_at` and
`realized_at` wall-clock times. `estimates_of` reads a model's series with each estimate's error.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import and_, insert, select, update
from sqlalchemy.engine import Connection

from quiver.catalog.errors import QuiverError
from quiver.monitoring.performance_estimation import (
    DEFAULT_THRESHOLD,
    METRICS,
    WindowEstimate,
    realized_metrics,
)
from quiver.registry import Registry
from quiver.registry.estimate_tables import performance_estimates as table

ARMS = ("champion", "shadow", "canary")


def record_estimate(registry: Registry, model: str, version: str, arm: str, window_start: datetime,
                    window_end: datetime, estimate: WindowEstimate, *, computed_at: datetime | None = None) -> int:
    """Store a window's estimates, one row per metric (an "uncalibrated" window: one row per metric with no
    values and the reason). `version` is the version's label, e.g. "fraud_model:2". Returns the rows written."""
    start, end = _window(window_start, window_end)
    _check_arm(arm)
    now = _utc(computed_at) if computed_at else datetime.now(UTC)
    detail = {"threshold": estimate.threshold, "coverage": estimate.coverage, "reason": estimate.reason,
              "calibration": estimate.calibration.to_dict() if estimate.calibration else None}
    rows = []
    for metric in METRICS:
        value = estimate.metrics.get(metric)
        rows.append({"status": estimate.status, "rows": estimate.rows, "computed_at": now,
                     "estimate": _number(value.estimate) if value else None,
                     "lower": _number(value.lower) if value else None,
                     "upper": _number(value.upper) if value else None,
                     "reference": _number(value.reference) if value else None,
                     "detail_json": json.dumps(detail, default=str), "metric": metric})
    with registry._write() as connection:
        existing = _existing(connection, registry.project, model, version, arm, start, end)
        for row in rows:
            found = existing.get(row["metric"])
            if found is None:
                connection.execute(insert(table).values(project=registry.project, model=model, version=version,
                                                        arm=arm, window_start=start, window_end=end, as_of=end,
                                                        **row))
            else:
                if found["realized"] is not None and row["status"] == "estimated":
                    row["status"] = "realized"  # labels arrived before this rerun: keep them and say so
                connection.execute(update(table).where(table.c.id == found["id"]).values(**row))
    return len(rows)


def record_realized(registry: Registry, model: str, version: str, arm: str, window_start: datetime,
                    window_end: datetime, scores: npt.ArrayLike, labels: npt.ArrayLike, *,
                    threshold: float | None = None, realized_at: datetime | None = None) -> dict[str, float]:
    """Compute the window's metrics from its arrived labels and store them beside its estimates (rows with no
    estimate are created, status "realized"). The threshold is the one the estimate used unless given.
    Returns the realized metrics (NaN stored as NULL). Raises QuiverError when the labels hold one class."""
    start, end = _window(window_start, window_end)
    _check_arm(arm)
    now = _utc(realized_at) if realized_at else datetime.now(UTC)
    n = len(np.asarray(labels))
    with registry._write() as connection:
        existing = _existing(connection, registry.project, model, version, arm, start, end)
        if threshold is None:
            stored = next((json.loads(r["detail_json"] or "{}").get("threshold") for r in existing.values()), None)
            threshold = float(stored) if stored is not None else DEFAULT_THRESHOLD
        realized: dict[str, float] = realized_metrics(scores, labels, threshold)
        for metric, value in realized.items():
            values = {"realized": _number(value), "realized_rows": n, "realized_at": now}
            found = existing.get(metric)
            if found is None:
                connection.execute(insert(table).values(
                    project=registry.project, model=model, version=version, arm=arm, window_start=start,
                    window_end=end, as_of=end, computed_at=now, metric=metric, status="realized", rows=n,
                    detail_json=json.dumps({"threshold": threshold, "reason": "no estimate was made"}), **values))
            else:
                status = "realized" if found["status"] != "uncalibrated" else "uncalibrated"
                connection.execute(update(table).where(table.c.id == found["id"]).values(status=status, **values))
    return realized


def estimates_of(registry: Registry, model: str, version: str | int | None = None, arm: str | None = None,
                 metric: str | None = None) -> list[dict[str, Any]]:
    """A model's estimates in data-time order (window end, then arm and metric), each with `error` (estimate −
    realized, None until labels arrive or when nothing was estimated) and `within_band` (the realized value
    inside [lower, upper]); `detail_json` decoded into `detail`. An int `version` means "<model>:<version>"."""
    query = select(table).where(table.c.project == registry.project, table.c.model == model)
    if version is not None:
        query = query.where(table.c.version == (f"{model}:{version}" if isinstance(version, int) else version))
    if arm is not None:
        query = query.where(table.c.arm == arm)
    if metric is not None:
        query = query.where(table.c.metric == metric)
    with registry.engine.connect() as connection:
        rows = [dict(r._mapping) for r in connection.execute(
            query.order_by(table.c.window_end, table.c.arm, table.c.version, table.c.id))]
    order = {name: i for i, name in enumerate(METRICS)}
    rows.sort(key=lambda r: (_utc(r["window_end"]), r["arm"], r["version"], order.get(r["metric"], len(order))))
    for row in rows:
        for key in ("window_start", "window_end", "as_of", "computed_at", "realized_at"):
            row[key] = _utc(row[key]) if row[key] is not None else None
        row["detail"] = json.loads(row.pop("detail_json") or "{}")
        known = row["estimate"] is not None and row["realized"] is not None
        row["error"] = row["estimate"] - row["realized"] if known else None
        row["within_band"] = (row["lower"] <= row["realized"] <= row["upper"]
                              if known and row["lower"] is not None and row["upper"] is not None else None)
    return rows


def estimate_errors(rows: list[dict[str, Any]]) -> dict[str, dict[str, float | int]]:
    """Per metric, over rows of `estimates_of` whose labels arrived: how many, the mean and largest absolute
    error, and the share whose realized value fell inside the band."""
    out: dict[str, dict[str, float | int]] = {}
    for name in METRICS:
        judged = [r for r in rows if r["metric"] == name and r["error"] is not None]
        if judged:
            errors = [abs(r["error"]) for r in judged]
            inside = [r["within_band"] for r in judged if r["within_band"] is not None]
            out[name] = {"windows": len(judged), "mean_abs_error": float(np.mean(errors)),
                         "max_abs_error": float(np.max(errors)),
                         "within_band": float(np.mean(inside)) if inside else math.nan}
    return out


def _existing(connection: Connection, project: str, model: str, version: str, arm: str, start: datetime,
              end: datetime) -> Mapping[str, dict[str, Any]]:
    found = connection.execute(select(table.c.id, table.c.metric, table.c.status, table.c.realized,
                                      table.c.detail_json).where(and_(
        table.c.project == project, table.c.model == model, table.c.version == version, table.c.arm == arm,
        table.c.window_start == start, table.c.window_end == end)))
    return {r.metric: dict(r._mapping) for r in found}


def _window(start: datetime, end: datetime) -> tuple[datetime, datetime]:
    start, end = _utc(start), _utc(end)
    if end <= start:
        raise QuiverError(f"performance estimate: the window [{start.isoformat()}, {end.isoformat()}) is empty")
    return start, end


def _check_arm(arm: str) -> None:
    if arm not in ARMS:
        raise QuiverError(f"performance estimate: arm {arm!r} is not one of {', '.join(ARMS)}")


def _utc(moment: datetime) -> datetime:
    # SQLite hands back naive datetimes (stored as UTC); Postgres aware ones
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _number(value: float | None) -> float | None:
    # SQLite turns NaN into NULL while Postgres keeps it: NULL everywhere
    return value if value is not None and math.isfinite(value) else None
