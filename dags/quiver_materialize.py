"""Daily materialization: gate the day's input batches, recompute that day's offline partitions, refresh Redis.

The run's data interval is the day it processes (yesterday for the scheduled run). First the data-quality
gate checks each source's `date=<day>` batch: a failing batch is quarantined with its report and alerted, so
the backfill never reads it (rows flagged within the tolerance pass; the backfill quarantines them one by
one). Then the day is backfilled and the online store loaded as of the end of the day. Emits the
`quiver://offline/features` Asset so drift checks run on fresh data. Thin by design: the work lives in
`quiver.pipelines.scheduled`; the project is the one QUIVER_CONFIG (or ./quiver.yaml) names.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import Asset, CronDataIntervalTimetable, dag, task

from quiver.pipelines.loop import settings

S = settings()
OFFLINE_FEATURES = Asset("quiver://offline/features")


def _day(data_interval_start: Any) -> str:
    return f"{data_interval_start:%Y-%m-%d}"


@dag(
    dag_id="quiver_materialize",
    schedule=CronDataIntervalTimetable("@daily", timezone="UTC"),
    start_date=datetime(2026, 11, 1),
    catchup=False,
    max_active_runs=1,
    default_args=S.default_args(retries=2, retry_delay_s=300),
    tags=["quiver", "features"],
    doc_md=__doc__,
)
def quiver_materialize() -> None:
    @task
    def quality_gate(data_interval_start: Any = None) -> dict[str, object]:
        from quiver.pipelines.scheduled import quality_gate_day

        return quality_gate_day(_day(data_interval_start), S.config_path)

    @task
    def backfill(gate: dict[str, object], data_interval_start: Any = None) -> dict[str, object]:
        from quiver.pipelines.scheduled import backfill_day

        return {**backfill_day(_day(data_interval_start), S.config_path), "quarantined": gate["quarantined"]}

    @task(outlets=[OFFLINE_FEATURES])
    def materialize(_: dict[str, object], data_interval_start: Any = None,
                    outlet_events: Any = None) -> dict[str, object]:
        from quiver.pipelines.scheduled import materialize_until

        day = _day(data_interval_start)
        # The drift check triggered by this event judges the same day.
        end = (data_interval_start + timedelta(days=1)).isoformat()
        outlet_events[OFFLINE_FEATURES].extra = {"day": day, "window_end": end}
        return materialize_until(day, S.config_path)

    materialize(backfill(quality_gate()))


quiver_materialize()
