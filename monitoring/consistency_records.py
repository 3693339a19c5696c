"""Registry records of the consistency job: a run with its window and one result per feature (the feature's
time series), written in one transaction through `Registry._write()`. What the canary makes of them is
`quiver.monitoring.consistency_gate`: runs chosen by subject and data window, never the newest row alone."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import insert, select

from quiver.monitoring.consistency import ConsistencyReport
from quiver.registry import Registry
from quiver.registry.consistency_tables import consistency_results, consistency_runs


def record_consistency_run(registry: Registry, report: ConsistencyReport) -> int:
    """Store `report`: the run row (window, counts, notes) and a result row per feature. Returns the run id."""
    if not report.rows_compared:
        raise ValueError(f"a consistency run over no rows is not evidence: not recorded ({report.subject})")
    finished = datetime.now(UTC)
    start, end = (datetime.fromisoformat(w) for w in report.window)
    status = "alert" if report.inconsistent else "ok"
    detail = {k: v for k, v in report.to_dict().items() if k not in ("features", "window")}
    with registry._write() as connection:
        result = connection.execute(insert(consistency_runs).values(
            project=registry.project, subject=report.subject[:255], window_start=start, window_end=end, as_of=end,
            started_at=finished - timedelta(seconds=report.elapsed_s), finished_at=finished,
            rows_logged=report.rows_logged, rows_compared=report.rows_compared, n_features=len(report.features),
            n_inconsistent=len(report.inconsistent), status=status, detail_json=json.dumps(detail, default=str)))
        key = result.inserted_primary_key
        assert key is not None
        run_id = int(key[0])
        rows = [{"run_id": run_id, "project": registry.project, "feature": f.feature, "status": f.status,
                 "compared": f.compared, "equal": f.equal, "mismatched": f.mismatched,
                 "missing_online": f.missing_online, "missing_offline": f.missing_offline, "late": f.late,
                 "wrong": f.wrong, "wrong_rate": f.wrong_rate, "threshold": f.threshold,
                 # SQLite turns NaN into NULL while Postgres keeps it: NULL everywhere
                 "smape": f.smape if f.smape is not None and math.isfinite(f.smape) else None,
                 "computed_at": finished,
                 "detail_json": json.dumps({"causes": dict(f.causes), "examples": list(f.examples),
                                           "freshness": f.to_dict()["freshness"]}, default=str)}
                for f in report.features]
        if rows:
            connection.execute(insert(consistency_results), rows)
    return run_id


def consistency_runs_of(registry: Registry, subject: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
    """Recent runs that compared rows, newest first (optionally of one subject, e.g. "model fraud_model").
    Runs over no rows, which earlier releases recorded as `no_rows`, are left out: they are not evidence."""
    query = select(consistency_runs).where(consistency_runs.c.project == registry.project,
                                           consistency_runs.c.rows_compared > 0)
    if subject is not None:
        query = query.where(consistency_runs.c.subject == subject)
    with registry.engine.connect() as connection:
        return [dict(r._mapping) for r in connection.execute(query.order_by(consistency_runs.c.id.desc())
                                                             .limit(limit))]


def consistency_results_of(registry: Registry, run_id: int) -> list[dict[str, Any]]:
    """A run's per-feature results, with their causes and examples decoded."""
    with registry.engine.connect() as connection:
        rows = [dict(r._mapping) for r in connection.execute(
            select(consistency_results).where(consistency_results.c.run_id == run_id)
            .order_by(consistency_results.c.id))]
    for row in rows:
        row.update(json.loads(row.pop("detail_json") or "{}"))
    return rows

