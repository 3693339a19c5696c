"""Drift of the champion's serving traffic: what the model received vs what it was trained on.

Runs after each materialization (Asset `quiver://offline/features`) and daily. For the project's model
(`loop_model` in quiver.yaml) it compares the champion's training reference, stored with its model version,
with the champion arm's serving logs of the run's day (features and scores; a feature drifts when its effect
is shown beyond its minimum effect), records the run in the registry and raises alerts. It also estimates the
day's performance per arm without labels (CBPE). When a retrain is called for (an expected ROC-AUC drop beyond
tolerance, or drift held `loop_drift_persist_days` days: drift alone only warns) it emits the Asset
`quiver://drift/<model>` carrying the drift run id, window and reason; `quiver_retrain` is scheduled on it.
The work lives in `quiver.pipelines.loop_drift` and `quiver.pipelines.loop_harm`.

Beside it, `check_consistency` replays the same day's serving logs through the point-in-time engine and
compares the served feature values with the offline ones (`quiver consistency`); features over their
threshold raise `consistency` alerts. The canary's consistency gate reads these runs: it starts and steps only
on a recent one of its model covering the window judged, that compared enough rows and passed.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from airflow.sdk import Asset, AssetOrTimeSchedule, CronDataIntervalTimetable, dag, task
from airflow.sdk.exceptions import AirflowSkipException

from quiver.pipelines.loop import settings
from quiver.pipelines.loop_common import drift_asset_uri

S = settings()
OFFLINE_FEATURES = Asset("quiver://offline/features")
DRIFT = Asset(drift_asset_uri(S.model))


@dag(
    dag_id="quiver_drift",
    schedule=AssetOrTimeSchedule(timetable=CronDataIntervalTimetable("@daily", timezone="UTC"),
                                 assets=[OFFLINE_FEATURES]),
    start_date=datetime(2026, 11, 1),
    catchup=False,
    max_active_runs=1,
    default_args=S.default_args(retries=1, retry_delay_s=120),
    tags=["quiver", "monitoring", "loop"],
    doc_md=__doc__,
)
def quiver_drift() -> None:
    @task
    def check_drift(data_interval_start: Any = None, data_interval_end: Any = None,
                    triggering_asset_events: Any = None, run_id: Any = None) -> dict[str, Any]:
        from quiver.pipelines.loop import drift_step, event_extras

        return drift_step(S.config_path, S.model, data_interval_start, data_interval_end,
                          event_extras(triggering_asset_events), run=str(run_id or ""))

    @task(outlets=[DRIFT], inlets=[DRIFT])
    def emit_drift(result: dict[str, Any], outlet_events: Any = None, inlet_events: Any = None) -> dict[str, Any]:
        from quiver.pipelines.loop import drift_event_extra

        if not result.get("retrain"):  # drift alone warns; expected harm or a lasting drift retrains (loop_harm)
            raise AirflowSkipException(f"retraining not triggered: {result.get('reason')}")
        # Airflow's own record decides: a drift run whose event went out already (a repeated window, a cleared
        # and re-run task) is not emitted again; a retry after a crash before the emit still emits.
        recent = inlet_events[DRIFT].ascending(False).limit(50)
        if any((event.extra or {}).get("drift_run_id") == result["run_id"] for event in recent):
            raise AirflowSkipException(f"drift run #{result['run_id']} was emitted before: not emitted again")
        extra = drift_event_extra(result)
        outlet_events[DRIFT].extra = extra
        return extra

    @task
    def check_consistency(data_interval_start: Any = None, data_interval_end: Any = None) -> dict[str, Any]:
        from quiver.pipelines.loop import consistency_step

        return consistency_step(S.config_path, S.model, data_interval_start, data_interval_end)

    emit_drift(check_drift())
    check_consistency()


quiver_drift()
