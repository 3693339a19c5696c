"""The canary: the challenger serves a growing share of live traffic, judged one step per run.

Starts when shadow evaluation hands the challenger on (Asset `quiver://canary/<model>`) and runs hourly while
a rollout is open. Each run judges the current step once (`quiver.monitoring.canary_judge`): concurrent arms, a
sample-ratio check on the split, guardrails on errors, latency, score shift and — once labels arrive — log
loss and Brier, with anytime-valid tests (the judge looks every run). The outcome is applied and recorded:
advance to the next share, hold (not enough data yet), promote (champion ← canary, the old champion becomes
`previous`) or roll back (traffic back to the champion, champion unchanged). Promotion and rollback alert.
A run with conf {"canary_version": N} opens a rollout for version N by hand (no shadow verdict needed).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow.sdk import Asset, AssetOrTimeSchedule, CronDataIntervalTimetable, dag, task
from airflow.sdk.exceptions import AirflowSkipException

from quiver.pipelines.loop import settings
from quiver.pipelines.loop_common import canary_asset_uri

S = settings()
CANARY = Asset(canary_asset_uri(S.model))


@dag(
    dag_id="quiver_canary",
    schedule=AssetOrTimeSchedule(timetable=CronDataIntervalTimetable("@hourly", timezone="UTC"), assets=[CANARY]),
    start_date=datetime(2026, 11, 1),
    catchup=False,
    max_active_runs=1,
    default_args=S.default_args(retries=2, retry_delay_s=60),
    tags=["quiver", "models", "loop"],
    doc_md=__doc__,
)
def quiver_canary() -> None:
    @task
    def start_rollout(dag_run: Any = None, data_interval_start: Any = None,
                      data_interval_end: Any = None) -> dict[str, Any]:
        from quiver.pipelines.loop import as_of, canary_start

        started = canary_start(S.config_path, S.model, getattr(dag_run, "conf", None),
                               as_of(data_interval_start, data_interval_end))
        if started["status"] == "waiting":
            raise AirflowSkipException(started["reason"])
        return started

    @task
    def judge(_: dict[str, Any], data_interval_start: Any = None, data_interval_end: Any = None) -> dict[str, Any]:
        from quiver.pipelines.loop import as_of, canary_judge_step

        return canary_judge_step(S.config_path, S.model, as_of(data_interval_start, data_interval_end))

    judge(start_rollout())


quiver_canary()
