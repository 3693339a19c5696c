"""Drift check after each materialization: recent features vs the training reference (PSI / KS).

Runs when `quiver_materialize` updates the offline store. Drift alerts go to the sinks in monitoring.yaml;
an `airflow_asset` sink there emits the drift Asset that triggers retraining. Thin: the work lives in
`pipelines.scheduled.drift_check`. Paths are relative to the project root (QUIVER_CONFIG's folder).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import Asset, dag, task

OFFLINE_FEATURES = Asset("quiver://offline/features")
CONFIG = os.environ.get("QUIVER_CONFIG")
REFERENCE = os.environ.get("QUIVER_DRIFT_REFERENCE", "data/training/reference.parquet")
CURRENT = os.environ.get("QUIVER_DRIFT_CURRENT", "data/training/fraud_model.parquet")


@dag(
    dag_id="quiver_drift",
    schedule=[OFFLINE_FEATURES],
    start_date=datetime(2026, 11, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 1, "retry_delay": timedelta(minutes=2)},
    tags=["quiver", "monitoring"],
    doc_md=__doc__,
)
def quiver_drift() -> None:
    @task
    def check_drift() -> dict[str, object]:
        from pipelines.scheduled import drift_check

        return drift_check(REFERENCE, CURRENT, name="scheduled", config_path=CONFIG)

    check_drift()


quiver_drift()
