"""Jobs the Airflow DAGs call: each takes plain arguments (dates, paths) and returns a JSON-ready summary.

DAG files stay thin (schedule, dependencies, retries); the work, and its tests, live here.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any

from quiver.catalog.loader import load_catalog
from quiver.config import Config, load_config


def _project(config_path: str | None) -> tuple[Config, Any]:
    config = load_config(Path(config_path) if config_path else None)
    return config, load_catalog(config.catalog_dir, root=config.root)


def backfill_day(day: str, config_path: str | None = None, engine: str | None = None) -> dict[str, Any]:
    """Recompute one day's tiles and last values (re-running replaces exactly that day)."""
    from quiver.offline.backfill import backfill

    config, catalog = _project(config_path)
    when = date.fromisoformat(day)
    report = backfill(config, catalog, when, when, engine=engine or config.engine)
    return {"day": day, "rows_written": report.rows_written,
            "views": {name: {"events": v.events_read, "rows": v.rows_written, "quarantined": v.quarantined}
                      for name, v in report.views.items()}}


def materialize_until(day: str, config_path: str | None = None) -> dict[str, Any]:
    """Load the online store with values as of the end of `day` (midnight UTC after it)."""
    from quiver.online.materialize import materialize

    config, catalog = _project(config_path)
    end = datetime.combine(date.fromisoformat(day) + timedelta(days=1), time(), tzinfo=UTC)
    report = materialize(config, catalog, end=end)
    return {"day": day, "entities_written": report.entities_written, "seconds": round(report.seconds, 3)}


def drift_check(reference: str, current: str, name: str = "features", config_path: str | None = None,
                features: list[str] | None = None) -> dict[str, Any]:
    """Compare `current` with `reference` (Parquet files or folders), record the run, raise/resolve alerts.

    Alerts go to the sinks of the project's monitoring.yaml (an `airflow_asset` sink triggers retraining).
    """
    from monitoring.alerts import AlertManager, sinks_from_config
    from monitoring.checks import read_table, run_drift_check
    from monitoring.settings import load_settings
    from quiver.registry import Registry

    config = load_config(Path(config_path) if config_path else None)
    registry = Registry(config.registry, project=config.project)
    alerts = AlertManager(registry, sinks_from_config(load_settings(config).alert_sinks))
    check = run_drift_check(read_table(config.root / reference, features), read_table(config.root / current, features),
                            name=name, features=features, registry=registry, alerts=alerts,
                            reference_label=reference, current_label=current)
    report = check.report
    return {"run_id": check.run_id, "dataset_drift": report.dataset_drift, "drift_share": report.drift_share,
            "drifted": [f.feature for f in report.drifted], "alerts": [a.alert.id for a in check.alerts]}
