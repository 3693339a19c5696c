"""Shadow evaluation of the challenger: champion and challenger score the same live requests.

Starts when `quiver_retrain` sets a challenger (Asset `quiver://challenger/<model>`) and looks again daily
while a shadow runs. It points alias `shadow` at the challenger (the prediction service scores each request
with it after answering with the champion; never while a rollout runs or is watched), then waits — a sensor
in reschedule mode, so no worker slot is held — until `loop_min_labelled` requests scored by both have their
delayed label *by the moment it pokes* (a run's conf `as_of` pins that moment: replays and the demo run
days of data in minutes); that moment goes on to the verdict, so a retried verdict records the same
decision. The paired, anytime-valid comparison (log loss with a non-inferiority margin; AUC with a
bootstrap interval as information) is recorded and applied as one decision: `better` or `not worse` emits
`quiver://canary/<model>` and the canary starts; `worse` ends the shadow, drops the challenger and alerts;
`inconclusive` keeps shadowing until `loop_max_shadow_days`, then drops it with an alert. A wait that times
out skips the verdict (next run).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from airflow.sdk import Asset, AssetOrTimeSchedule, CronDataIntervalTimetable, PokeReturnValue, dag, task
from airflow.sdk.exceptions import AirflowSkipException

from quiver.pipelines.loop import settings
from quiver.pipelines.loop_common import canary_asset_uri, challenger_asset_uri

S = settings()
CHALLENGER = Asset(challenger_asset_uri(S.model))
CANARY = Asset(canary_asset_uri(S.model))


@dag(
    dag_id="quiver_shadow_eval",
    schedule=AssetOrTimeSchedule(timetable=CronDataIntervalTimetable("@daily", timezone="UTC"),
                                 assets=[CHALLENGER]),
    start_date=datetime(2026, 11, 1),
    catchup=False,
    max_active_runs=1,
    default_args=S.default_args(retries=2, retry_delay_s=120),
    tags=["quiver", "models", "loop"],
    doc_md=__doc__,
)
def quiver_shadow_eval() -> None:
    @task
    def start_shadow(dag_run: Any = None) -> dict[str, Any]:
        from quiver.pipelines.loop import pinned_clock, shadow_start

        started = shadow_start(S.config_path, S.model, pinned_clock(dag_run.conf if dag_run else None))
        if started["status"] != "shadowing":
            raise AirflowSkipException(f"no challenger to shadow ({started})")
        return started

    @task.sensor(mode="reschedule", poke_interval=timedelta(seconds=S.poke_interval_s),
                 timeout=timedelta(seconds=S.wait_timeout_s), soft_fail=True)
    def wait_for_labels(_: dict[str, Any], dag_run: Any = None) -> PokeReturnValue:
        from quiver.pipelines.loop import pinned_clock, shadow_labels_ready

        ready, moment = shadow_labels_ready(S.config_path, S.model, S.min_labelled,
                                            pinned_clock(dag_run.conf if dag_run else None))
        return PokeReturnValue(is_done=ready, xcom_value=moment)

    @task
    def verdict(moment: str) -> dict[str, Any]:
        from quiver.pipelines.loop import shadow_verdict

        return shadow_verdict(S.config_path, S.model, moment, S.min_labelled)

    @task(outlets=[CANARY])
    def hand_on(result: dict[str, Any], outlet_events: Any = None) -> dict[str, Any]:
        if not result["handed_on"]:
            raise AirflowSkipException(f"verdict {result['verdict']}: not handed to the canary")
        extra = {key: result[key] for key in ("model", "champion", "challenger", "verdict", "decision_id", "as_of")}
        outlet_events[CANARY].extra = {**extra, "window_end": result["as_of"]}
        return extra

    hand_on(verdict(wait_for_labels(start_shadow())))


quiver_shadow_eval()
