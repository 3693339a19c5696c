"""Daily materialization: recompute yesterday's offline partitions, then refresh the online store.

Thin by design: the work lives in `pipelines.scheduled`. Set QUIVER_CONFIG to the project's quiver.yaml.
Emits the `quiver://offline/features` Asset so drift checks run on fresh data.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.sdk import Asset, dag, task

OFFLINE_FEATURES = Asset("quiver://offline/features")
CONFIG = os.environ.get("QUIVER_CONFIG")


@dag(
    dag_id="quiver_materialize",
    schedule="@daily",
    start_date=datetime(2026, 11, 1),
    catchup=False,
    max_active_runs=1,
    default_args={"retries": 2, "retry_delay": timedelta(minutes=5)},
    tags=["quiver", "features"],
    doc_md=__doc__,
)
def quiver_materialize() -> None:
    @task
    def backfill(ds: str | None = None) -> dict[str, object]:
        from pipelines.scheduled import backfill_day

        return backfill_day(str(ds), CONFIG)

    @task(outlets=[OFFLINE_FEATURES])
    def materialize(_: dict[str, object], ds: str | None = None) -> dict[str, object]:
        from pipelines.scheduled import materialize_until

        return materialize_until(str(ds), CONFIG)

    materialize(backfill())


quiver_materialize()
