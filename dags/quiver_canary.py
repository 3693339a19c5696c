"""The canary: the challenger serves a growing share of live traffic, judged one step per run.

Starts when shadow evaluation hands the challenger on (Asset `quiver://canary/<model>`) and runs hourly while
a rollout is open. Each run judges the current step once (`quiver.monitoring.canary_judge`), as of its data
interval's end (Asset-triggered runs: the moment the event carries), on the rows served under that step:
concurrent arms, a sample-ratio check on the split, guardrails on errors and latency per model call, score
shift, and — once labels arrive — log loss and Brier paired on the same rows, with anytime-valid tests (the
judge looks every run). The decision is recorded and applied in one transaction: advance to the next share,
hold (not enough data yet), promote (champion ← canary, the old champion becomes `previous` and keeps
scoring as the shadow for the post-promotion watch) or roll back (traffic back to the champion, the
candidacy ended). While a promotion is watched, each run looks again and reverts it if the new champion
proves worse. Promotion and rollback alert. A run with conf {"canary_version": N} opens a rollout for
version N by hand (no shadow verdict needed; add "again": true for a version rolled back before).

Beside them, every run compacts the serving log's closed hours of the two days before its interval's end
(`quiver logs compact`): every replica's small files of an hour merged into one, atomically.

Both the start and each step wait on the consistency gate (`quiver.monitoring.consistency_gate`, on unless
monitoring.yaml sets `consistency_gate: false`): without a recent, non-empty, passing consistency check of the
model covering the window judged (the drift DAG's daily `check_consistency`), the start waits and a running
step holds, recording why.
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
    def start_rollout(dag_run: Any = None, data_interval_start: Any = None, data_interval_end: Any = None,
                      triggering_asset_events: Any = None) -> dict[str, Any]:
        from quiver.pipelines.loop import as_of, canary_start, event_extras

        moment = as_of(data_interval_start, data_interval_end, event_extras(triggering_asset_events))
        started = canary_start(S.config_path, S.model, getattr(dag_run, "conf", None), moment)
        if started["status"] == "waiting":
            raise AirflowSkipException(started["reason"])
        return {**started, "as_of": moment.isoformat()}

    @task
    def judge(started: dict[str, Any]) -> dict[str, Any]:
        from quiver.pipelines.loop import canary_judge_step
        from quiver.pipelines.loop_common import utc

        return canary_judge_step(S.config_path, S.model, utc(started["as_of"]))

    @task
    def compact_serving_logs(data_interval_end: Any = None) -> dict[str, Any]:
        from quiver.pipelines.loop import compact_logs_step

        return compact_logs_step(S.config_path, data_interval_end)

    judge(start_rollout())
    compact_serving_logs()  # beside the canary, not after it: a waiting canary skips its judge, not this


quiver_canary()
