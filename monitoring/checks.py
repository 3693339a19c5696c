"""The scheduled drift check: compute, store the time series, publish metrics, raise and resolve alerts.

`run_drift_check` is what the drift DAG (and `quiver drift`) calls. Alerts:
* kind "drift", subject "<name>:<feature>", severity warning — per feature whose status is `alert`;
* kind "dataset_drift", subject "<name>", severity critical — when the drifted share reaches the threshold
  (this is the signal the retrain DAG listens to through `AirflowAssetSink`).
Open alerts of features (or the dataset) that are judged healthy again are resolved; features without
enough data leave their alerts as they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from monitoring import metrics, repository
from monitoring.alerts import AlertManager
from monitoring.drift import DriftConfig, DriftReport, Frame, compute_drift
from quiver.registry import Registry


@dataclass(frozen=True)
class DriftCheck:
    """A finished check: the report, its registry run id (if stored) and the alerts it raised."""

    report: DriftReport
    run_id: int | None
    alerts: list[Any]


def read_table(path: str | Path, columns: Sequence[str] | None = None) -> pa.Table:
    """A Parquet file or folder (hive partitions allowed) as one Arrow table."""
    import pyarrow.dataset as ds

    source = Path(path)
    if source.is_dir():
        return ds.dataset(source, format="parquet", partitioning="hive").to_table(
            columns=list(columns) if columns else None)
    return pq.read_table(source, columns=list(columns) if columns else None)


def run_drift_check(reference: Frame, current: Frame, *, name: str, features: Sequence[str] | None = None,
                    config: DriftConfig | None = None, registry: Registry | None = None,
                    alerts: AlertManager | None = None, engine: str = "fast", reference_label: str = "",
                    current_label: str = "") -> DriftCheck:
    """Compare, record (when a registry is given), publish metrics and raise/resolve alerts."""
    report = compute_drift(reference, current, features, config, engine=engine)
    metrics.observe_drift(name, report)
    run_id = None
    if registry is not None:
        run_id = repository.record_drift_run(registry, report, name, reference_label, current_label)
    raised: list[Any] = []
    if alerts is not None:
        for f in report.features:
            subject = f"{name}:{f.feature}"
            if f.drifted:
                raised.append(alerts.raise_alert(
                    "drift", subject, "warning", f"Feature {f.feature} drifted ({name})", "; ".join(f.reasons),
                    {"run_id": run_id, "scores": f.scores, "n_ref": f.n_ref, "n_cur": f.n_cur}))
            elif f.status in ("ok", "warn"):
                alerts.resolve("drift", subject)
        if report.dataset_drift:
            names = ", ".join(f.feature for f in report.drifted)
            raised.append(alerts.raise_alert(
                "dataset_drift", name, "critical",
                f"Dataset drift in {name}: {len(report.drifted)}/{len(report.judged)} features",
                f"Drifted: {names}. Share {report.drift_share:.0%} ≥ {report.drift_share_threshold:.0%}.",
                {"run_id": run_id, "drifted": [f.feature for f in report.drifted],
                 "drift_share": report.drift_share, "reference": reference_label, "current": current_label}))
        elif report.judged:
            alerts.resolve("dataset_drift", name)
    return DriftCheck(report, run_id, raised)
