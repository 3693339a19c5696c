"""The closed loop's entry points, one per DAG task: each takes plain values and returns a JSON-ready summary.

    quiver_materialize  quality gate → backfill → materialize              (quiver.pipelines.scheduled)
    quiver_drift        champion reference vs serving logs → Asset quiver://drift/<model>   (loop_drift);
                        served values vs point-in-time values        (monitoring.consistency_job)
    quiver_retrain      sliding-window training set → train (gpu queue) → challenger gate  (loop_retrain)
    quiver_shadow_eval  challenger → shadow → wait for labels → verdict → Asset canary      (loop_shadow)
    quiver_canary       one judge step (or watch look) per run → promote / continue / roll back  (loop_rollout)

Time: a run judges *as of* one moment, so a retried task records the same decision. Scheduled runs take
their data interval's end; Asset-triggered runs the moment carried by the event (`as_of`, else its
`window_end`); a sensor judges what had arrived when it poked and hands that moment on.

DAG files import only `settings()` at parse time (it reads quiver.yaml, nothing heavy); the rest is imported
inside the tasks.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from quiver.pipelines.loop_common import Project, run_window


@dataclass(frozen=True)
class LoopSettings:
    """What the DAG files need at parse time, from the project config (quiver.yaml + QUIVER_* overrides)."""

    config_path: str | None
    model: str
    service: str
    window_days: float
    gpu_queue: str
    gpu_pool: str
    min_labelled: int
    poke_interval_s: float
    wait_timeout_s: float
    retrain_calendar: str = "@weekly"
    gpu_pod_template: str = ""
    owner: str = "quiver"

    def gpu_executor_config(self) -> dict[str, Any]:
        """The GPU task's executor_config: the KubernetesExecutor's pod template when one is set (other
        executors ignore it; Celery routes by `gpu_queue`)."""
        return {"pod_template_file": self.gpu_pod_template} if self.gpu_pod_template else {}

    def default_args(self, retries: int = 2, retry_delay_s: float = 60.0) -> dict[str, Any]:
        return {"owner": self.owner, "retries": retries, "retry_delay": timedelta(seconds=retry_delay_s)}


def settings() -> LoopSettings:
    """Loop settings of the project that QUIVER_CONFIG (or ./quiver.yaml) names."""
    from quiver.config import load_config

    path = os.environ.get("QUIVER_CONFIG") or None
    config = load_config(path)
    return LoopSettings(config_path=str(config.root / "quiver.yaml") if path is None else path,
                        model=config.loop_model, service=config.loop_service,
                        window_days=config.loop_window_days, gpu_queue=config.gpu_queue, gpu_pool=config.gpu_pool,
                        min_labelled=int(config.loop_min_labelled),
                        poke_interval_s=config.loop_poke_interval_s, wait_timeout_s=config.loop_wait_timeout_s,
                        retrain_calendar=config.loop_retrain_calendar.strip(),
                        gpu_pod_template=config.gpu_pod_template.strip())


def event_extras(triggering_asset_events: Mapping[Any, Iterable[Any]] | None) -> list[dict[str, Any]]:
    """The `extra` of every Asset event that triggered a run (Airflow's `triggering_asset_events`)."""
    out: list[dict[str, Any]] = []
    for events in (triggering_asset_events or {}).values():
        for event in events:
            extra = getattr(event, "extra", None) if not isinstance(event, Mapping) else event.get("extra")
            if extra:
                out.append(dict(extra))
    return out


def drift_step(config_path: str | None, model: str, start: datetime | None, end: datetime | None,
               events: list[dict[str, Any]] | None = None, run: str = "") -> dict[str, Any]:
    """Drift of `model`'s serving traffic over the run's window (one day ending at the interval's end), the
    day's performance estimated without labels, and whether it calls for a retrain (`retrain`, `trigger`,
    `reason`: see `loop_harm`); `run` is the Airflow run id (a retry of the same run re-emits a drift it
    recorded but never emitted)."""
    from quiver.pipelines.loop_drift import check_serving_drift
    from quiver.pipelines.loop_harm import judge_harm

    begin, stop = run_window(start, end, days=1.0, events=events or [])
    project = Project.load(config_path)
    project.alerts.redeliver()
    result = check_serving_drift(project, model, begin, stop, run=run)
    if result["status"] in ("computed", "recorded"):
        result.update(judge_harm(project, model, begin, stop, result))
    else:
        result.update(retrain=False, trigger=None, reason=f"nothing judged ({result['status']})")
    return result


def consistency_step(config_path: str | None, model: str, start: datetime | None,
                     end: datetime | None) -> dict[str, Any]:
    """Online/offline consistency of what `model` was served over the run's window (one day)."""
    from quiver.monitoring.consistency_job import check_window

    begin, stop = run_window(start, end, days=1.0)
    return check_window(Project.load(config_path), model, begin, stop)


def compact_logs_step(config_path: str | None, end: datetime | None, hours: float = 48.0) -> dict[str, Any]:
    """Compact the serving log's closed hours of the `hours` before `end` (every replica's files of an hour
    into one; idempotent, so a run that missed hours catches up)."""
    from quiver.serving.logs.compact import as_rows, compact

    project = Project.load(config_path)
    stop = end or datetime.now(UTC)
    done = compact(project.serving_log_root, stop - timedelta(hours=hours), stop)
    return {"hours": as_rows(done), "compacted": len(done)}


def drift_event_extra(result: Mapping[str, Any]) -> dict[str, Any]:
    """What the drift Asset event carries: the run id and the window it judged (retraining ends there)."""
    return {"drift_run_id": result["run_id"], "model": result["model"], "champion": result.get("champion"),
            "window_start": result["window_start"], "window_end": result["window_end"],
            "drift_share": result.get("drift_share"), "drifted": list(result.get("drifted") or []),
            "trigger": result.get("trigger"), "reason": result.get("reason")}


def retrain_plan(model: str, window_days: float, interval_end: datetime | None,
                 events: list[dict[str, Any]], conf: Mapping[str, Any] | None) -> dict[str, Any]:
    from quiver.pipelines.loop_retrain import plan_retrain

    # A run started by hand (or by `make demo` standing in for the scheduler) may hand the events in its conf.
    handed = [dict(e) for e in (conf or {}).get("asset_events", [])]
    return plan_retrain(model, window_days, interval_end, [*events, *handed], conf)


def retrain_busy(config_path: str | None, model: str) -> str | None:
    from quiver.pipelines.loop_retrain import busy_with

    project = Project.load(config_path)
    project.alerts.redeliver()
    return busy_with(project, model)


def retrain_waiting(config_path: str | None, plan: Mapping[str, Any], min_labelled: int) -> str | None:
    from quiver.pipelines.loop_retrain import waiting_for_labels

    return waiting_for_labels(Project.load(config_path), plan, min_labelled)


def retrain_train(config_path: str | None, plan: Mapping[str, Any], service: str) -> dict[str, Any]:
    from quiver.pipelines.loop_retrain import train_step

    return train_step(Project.load(config_path), plan, service, device="auto")


def retrain_gate(config_path: str | None, plan: Mapping[str, Any], trained: Mapping[str, Any]) -> dict[str, Any]:
    from quiver.pipelines.loop_retrain import gate_step

    return gate_step(Project.load(config_path), plan["model"], int(trained["version"]))


def as_of(start: datetime | None, end: datetime | None, events: Iterable[Mapping[str, Any]] = ()) -> datetime:
    """The moment a run judges at: the latest moment its triggering Asset events carry (`as_of`, else
    `window_end`), else its data interval's end, else now (manual runs)."""
    from datetime import UTC

    from quiver.pipelines.loop_common import utc

    carried = [utc(e.get("as_of") or e["window_end"]) for e in events if e.get("as_of") or e.get("window_end")]
    if carried:
        return max(carried)
    if start is not None and end is not None and utc(start) < utc(end):
        return utc(end)
    return datetime.now(UTC)


def pinned_clock(conf: Mapping[str, Any] | None) -> datetime | None:
    """The moment a run's conf pins the loop's clock to (`as_of`, ISO): a replay or the demo runs days of
    data in minutes, and its sensors must judge what had arrived by then, not by the wall clock."""
    from quiver.pipelines.loop_common import utc

    pinned = (conf or {}).get("as_of")
    return utc(pinned) if pinned else None


def shadow_start(config_path: str | None, model: str, at: datetime | None = None) -> dict[str, Any]:
    from quiver.pipelines.loop_shadow import start_shadow

    project = Project.load(config_path)
    project.alerts.redeliver()
    return start_shadow(project, model, at=at)


def shadow_labels_ready(config_path: str | None, model: str, min_labelled: int,
                        at: datetime | None = None) -> tuple[bool, str]:
    """(enough labelled pairs have arrived, the moment looked at): a sensor judges what has arrived by the
    moment it pokes (`at` when a run pins its clock), and the verdict is taken as of that same moment."""
    from datetime import UTC

    from quiver.pipelines.loop_common import iso
    from quiver.pipelines.loop_shadow import labelled_pairs

    moment = at or datetime.now(UTC)
    return labelled_pairs(Project.load(config_path), model, moment) >= min_labelled, iso(moment)


def shadow_verdict(config_path: str | None, model: str, moment: datetime | str, min_labelled: int) -> dict[str, Any]:
    from quiver.pipelines.loop_common import utc
    from quiver.pipelines.loop_shadow import shadow_verdict as verdict

    return verdict(Project.load(config_path), model, utc(moment), min_pairs=min_labelled)


def canary_start(config_path: str | None, model: str, conf: Mapping[str, Any] | None,
                 moment: datetime) -> dict[str, Any]:
    from quiver.pipelines.loop_rollout import start_canary

    conf = conf or {}
    version = conf.get("canary_version")
    return start_canary(Project.load(config_path), model, version=int(version) if version is not None else None,
                        at=moment, again=bool(conf.get("again", False)))


def canary_judge_step(config_path: str | None, model: str, moment: datetime) -> dict[str, Any]:
    from quiver.pipelines.loop_rollout import canary_step

    return canary_step(Project.load(config_path), model, moment)
