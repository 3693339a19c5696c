"""Retraining on drift: sliding-window training set → train on the GPU queue → challenger gate.

Scheduled on the Asset `quiver://drift/<model>` that `quiver_drift` emits on dataset drift, with a weekly
calendar fallback (`loop_retrain_calendar` in quiver.yaml; empty turns it off). The training window is the last `loop_window_days` days ending where the drift was seen
(the drift event's window end; the data interval's end for calendar runs). The train task runs on the
`gpu_queue` / `gpu_pool` named in quiver.yaml (device `auto`: CUDA when the worker has one, else CPU).
The new version becomes `challenger` only when it is not worse than its logistic baseline nor than the
champion on the same validation rows; then the Asset `quiver://challenger/<model>` starts shadow evaluation.
One candidate at a time: while a challenger is shadowed or canaried, drift and calendar runs skip (a run with
conf {"cutoff": …} trains anyway). A drift-triggered run waits (skips) until `loop_min_labelled` labels of the
traffic since the drift began had arrived by its cutoff: before that the window holds only the old world.
A retry finds the version it registered for the window: no second training.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow.sdk import Asset, AssetOrTimeSchedule, CronDataIntervalTimetable, dag, task
from airflow.sdk.exceptions import AirflowSkipException

from quiver.pipelines.loop import settings
from quiver.pipelines.loop_common import challenger_asset_uri, drift_asset_uri

S = settings()
DRIFT = Asset(drift_asset_uri(S.model))
CHALLENGER = Asset(challenger_asset_uri(S.model))


# The calendar fallback is `loop_retrain_calendar` (default @weekly); empty: drift events alone start runs.
SCHEDULE = (AssetOrTimeSchedule(timetable=CronDataIntervalTimetable(S.retrain_calendar, timezone="UTC"),
                                assets=[DRIFT]) if S.retrain_calendar else DRIFT)


@dag(
    dag_id="quiver_retrain",
    schedule=SCHEDULE,
    start_date=datetime(2026, 11, 1),
    catchup=False,
    max_active_runs=1,
    default_args=S.default_args(retries=2, retry_delay_s=300),
    tags=["quiver", "models", "loop"],
    doc_md=__doc__,
)
def quiver_retrain() -> None:
    @task
    def plan(data_interval_end: Any = None, triggering_asset_events: Any = None,
             dag_run: Any = None) -> dict[str, Any]:
        from quiver.pipelines.loop import event_extras, retrain_busy, retrain_plan, retrain_waiting

        conf = dict(getattr(dag_run, "conf", None) or {})
        events = event_extras(triggering_asset_events)
        window = {**retrain_plan(S.model, S.window_days, data_interval_end, events, conf),
                  "triggering_events": len(events)}
        busy = retrain_busy(S.config_path, S.model) if window["trigger"] != "manual" else None
        if busy:
            raise AirflowSkipException(f"not retraining now: {busy}")
        waiting = retrain_waiting(S.config_path, window, S.min_labelled)
        if waiting:
            raise AirflowSkipException(f"not retraining yet: {waiting}")
        return window

    @task(queue=S.gpu_queue, pool=S.gpu_pool, executor_config=S.gpu_executor_config())
    def train(window: dict[str, Any]) -> dict[str, Any]:
        from quiver.pipelines.loop import retrain_train

        return retrain_train(S.config_path, window, S.service)

    @task
    def gate(window: dict[str, Any], trained: dict[str, Any]) -> dict[str, Any]:
        from quiver.pipelines.loop import retrain_gate

        return retrain_gate(S.config_path, window, trained)

    @task(outlets=[CHALLENGER])
    def emit_challenger(window: dict[str, Any], decision: dict[str, Any], outlet_events: Any = None) -> dict[str, Any]:
        from quiver.pipelines.loop_retrain import challenger_event_extra

        if decision["decision"] != "challenger":
            raise AirflowSkipException(f"no new challenger: {decision['reason']}")
        extra = challenger_event_extra(decision, window)
        outlet_events[CHALLENGER].extra = extra
        return extra

    window = plan()
    trained = train(window)
    emit_challenger(window, gate(window, trained))


quiver_retrain()
