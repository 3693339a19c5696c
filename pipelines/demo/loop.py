"""`make demo`, the closed loop: drift → retraining → shadow → canary → promotion, then a bad model rolled back.

The simulated clock moves in ticks of six hours. Each tick the tick's traffic is replayed through the
in-process prediction service (`quiver.pipelines.replay`: online features as of each request, serving logs written)
and the labels of the requests served a day earlier arrive. At each tick this script stands in for Airflow's
scheduler and starts the DAG runs that would be due — every task runs inside Airflow (`dag.test()` in a worker
process with its own metadata DB, `quiver.pipelines.loop_airflow`): at midnight `quiver_materialize` and, on its
Asset, `quiver_drift`; on a drift Asset event `quiver_retrain`, started by the scheduler's own code from the
queued events (its tasks see them in `triggering_asset_events`); daily while a challenger waits
`quiver_shadow_eval`; every tick while a rollout runs or is watched `quiver_canary` (runs on the simulated
clock: their data interval). What a DAG emits (Asset events) is read back from Airflow's DB, and the queue
entry the scheduler would consume is checked and consumed.

After the challenger is promoted, an operator fast-tracks a model trained on a broken label feed (labels
flipped) straight into a canary (registering it by hand if the offline gate rejected it); the judge rolls it
back and the champion stays.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from quiver.config import Config, load_config
from quiver.pipelines.loop_common import Project, canary_asset_uri, challenger_asset_uri, drift_asset_uri, iso

TICK = timedelta(hours=6)


@dataclass(frozen=True)
class Story:
    """Knobs of the story (embedded defaults sized for a 2-core machine)."""

    start: date
    days: int
    drift_from_day: int
    # A week, as production's default: the champion learnt from 8 days, and a challenger trained on 3 lost to
    # it on its own test rows (ROC-AUC 0.874 vs 0.890); on 7 days it wins (0.885 vs 0.875 at the first cutoff).
    retrain_window_days: int = 7
    label_delay: timedelta = timedelta(days=1)
    canary_steps: str = "0.5,1.0"
    canary_min_rows: int = 250
    # Floors the story's traffic can decide within a simulated day or two: the replay makes one call a minute
    # per arm (~1,400 timed calls a day, too few for a 1-point p99 exceedance difference), and a few thousand
    # labels a day pin log loss to about ±0.05 and the Brier score to about ±0.01. The watch is shorter than
    # production's day so the story goes on to its second rollout.
    canary_judge: str = "latency_exceedance_floor=0.2,log_loss_floor=0.08,brier_floor=0.02,watch_hours=12"
    min_labelled: int = 300
    poke_interval_s: float = 0.5
    wait_timeout_s: float = 1.0  # the simulated clock stands still while a sensor waits: no label arrives

    def env(self) -> dict[str, str]:
        """The loop settings as QUIVER_* overrides, seen by this process and the Airflow worker alike."""
        # A busy 2-core machine stalls Redis replies for over the serving default of 1 s now and then.
        return {"QUIVER_REDIS_TIMEOUT_S": os.environ.get("QUIVER_REDIS_TIMEOUT_S", "10"),
                "QUIVER_LOOP_WINDOW_DAYS": str(self.retrain_window_days),
                "QUIVER_LOOP_CANARY_STEPS": self.canary_steps,
                "QUIVER_LOOP_CANARY_MIN_ROWS": str(self.canary_min_rows),
                "QUIVER_LOOP_CANARY_JUDGE": self.canary_judge,
                "QUIVER_LOOP_MIN_LABELLED": str(self.min_labelled),
                "QUIVER_LOOP_POKE_INTERVAL_S": str(self.poke_interval_s),
                "QUIVER_LOOP_WAIT_TIMEOUT_S": str(self.wait_timeout_s)}

    def day(self, index: int) -> datetime:
        return datetime.combine(self.start + timedelta(days=index), datetime.min.time(), tzinfo=UTC)


@dataclass
class StoryLog:
    """Every DAG run and notable event of the story, in simulated time."""

    runs: list[dict[str, Any]] = field(default_factory=list)
    events: list[tuple[datetime, str]] = field(default_factory=list)
    drift_alert_at: datetime | None = None
    drift_alert_wall: float | None = None
    promoted_at: datetime | None = None
    promoted_wall: float | None = None
    rolled_back_at: datetime | None = None
    reports: dict[str, str] = field(default_factory=dict)


def decision_of(run: dict[str, Any]) -> tuple[str, str]:
    """(decision, key numbers) of a DAG run, from its task results."""
    r, tasks = run["results"], run["tasks"]
    dag = run["dag_id"]
    if dag == "quiver_materialize":
        gate = r.get("quality_gate", {})
        mat = r.get("materialize", {})
        quarantined = gate.get("quarantined") or []
        return (f"gate {'passed' if gate.get('passed') else 'quarantined ' + ','.join(quarantined)}",
                f"{r.get('backfill', {}).get('rows_written', 0):,} rows; {mat.get('entities_written', 0):,} to Redis")
    if dag == "quiver_drift":
        d = r.get("check_drift", {})
        if tasks.get("emit_drift") == "success":
            trigger = str(d.get("trigger") or "").replace("_", " ")
            verdict = f"RETRAIN → Asset ({trigger})" if trigger else "RETRAIN → Asset"
        else:
            verdict = "drift: warning only" if d.get("dataset_drift") else f"no drift ({d.get('status')})"
        numbers = f"share {d.get('drift_share', 0):.0%} of {d.get('champion')}, {d.get('rows', 0):,} rows"
        return verdict, f"{numbers}; {d['reason']}" if d.get("reason") else numbers
    if dag == "quiver_retrain":
        if "plan" not in r:
            return "skipped", run.get("why") or "see the plan task's log"
        t, g = r.get("train", {}), r.get("gate", {})
        numbers = (f"{t.get('label')} test AUC {_metric(t.get('metrics', {}), 'roc_auc')} "
                   f"(baseline {_metric(t, 'baseline_roc_auc')})")
        comparison = g.get("comparison") or {}
        if comparison:
            numbers += f"; champion on the same rows {comparison['champion']['roc_auc']:.3f}"
        return g.get("decision", "?"), numbers
    if dag == "quiver_shadow_eval":
        if tasks.get("verdict") != "success":
            return "waiting for labels", run.get("why") or f"label sensor {tasks.get('wait_for_labels')}"
        v = r["verdict"]
        if not v.get("labelled_pairs"):  # no labelled pair: no comparison, only why (and an expiry)
            return v["verdict"], str(v.get("reason", ""))
        return (f"{v['verdict']}{' → canary' if v.get('handed_on') else ''}",
                f"{v['labelled_pairs']:,} labelled pairs, log-loss Δ {v['log_loss_diff']:+.4f}, "
                f"AUC {v['auc'].get('champion', 0):.3f} → {v['auc'].get('shadow', 0):.3f}")
    if dag == "quiver_canary":
        j = r.get("judge", {})
        if not j:
            return "skipped", ""
        return j.get("outcome", "?"), canary_numbers(j)
    return run["state"], ""


def canary_numbers(judged: dict[str, Any]) -> str:
    """What a canary run judged: the step and share it looked at (not where the decision moved them), or the
    promoted version under watch."""
    if judged.get("kind") == "watch":
        if not judged.get("champion"):  # no promotion under watch any more: say why
            return str(judged.get("reason", ""))
        return f"watch of champion {judged.get('champion')} against {judged.get('previous')}"
    if judged.get("step") is None:
        return str(judged.get("reason", ""))
    steps = judged.get("steps") or []  # the last step (share 1) is the promotion, not judged
    of = f" of {len(steps) - 1}" if len(steps) > 1 else ""
    moved = judged.get("fraction_after")
    after = f" → share {moved:g}" if moved is not None and moved != judged.get("fraction") else ""
    return (f"{judged.get('canary')} at canary share {judged.get('fraction', 0):g} "
            f"(step {int(judged['step']) + 1}{of}){after}")


def _metric(values: dict[str, Any], key: str) -> str:
    value = values.get(key)
    return "-" if value is None else f"{float(value):.3f}"


class Scheduler:
    """Starts the DAG runs a scheduler would start at a tick, and records them."""

    def __init__(self, airflow: Any, project: Project, log: StoryLog, say: Any):
        self.airflow, self.project, self.log, self.say = airflow, project, log, say
        self.model = project.config.loop_model
        self.seen: dict[str, int] = {}

    def run(self, dag_id: str, at: datetime, conf: dict[str, Any] | None = None) -> dict[str, Any]:
        began = time.perf_counter()
        run = self.airflow.run(dag_id, logical_date=at, conf=conf)
        run["at"], run["wall"] = at, time.perf_counter() - began
        if dag_id == "quiver_shadow_eval" and run["tasks"].get("verdict") != "success":
            run["why"] = self._why_waiting(at)
        return self._record(run)

    def _record(self, run: dict[str, Any]) -> dict[str, Any]:
        dag_id, at = run["dag_id"], run["at"]
        decision, numbers = decision_of(run)
        run["decision"], run["numbers"] = decision, numbers
        self.log.runs.append(run)
        self.say(f"  {at:%m-%d %H:%M}  {dag_id:<19} {run['state']:<8} {decision:<26} {numbers} "
                 f"[dim]({run['wall']:.1f} s)[/dim]")
        return run

    def new_events(self, uri: str, consumer: str, *, consume: bool = True) -> list[dict[str, Any]]:
        """Asset events of `uri` not handed on yet; the consumer's queue entry is checked and (unless the
        consumer is started from the queue itself) consumed."""
        events = self.airflow.asset_events(uri)
        fresh = [e for e in events if e["id"] > self.seen.get(uri, 0)]
        if fresh:
            self.seen[uri] = fresh[-1]["id"]
            queued = self.airflow.queued_dags(uri)
            if consumer not in queued:
                raise RuntimeError(f"Airflow did not queue {consumer} for {uri} (queued: {queued})")
            if consume:
                self.airflow.dequeue(uri, consumer)
        return fresh

    def run_triggered(self, dag_id: str, at: datetime, events: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
        began = time.perf_counter()
        run = self.airflow.run_triggered(dag_id)
        run["at"], run["wall"] = at, time.perf_counter() - began
        if dag_id == "quiver_retrain" and "plan" not in run["results"]:
            run["why"] = self._why_retrain_skipped(at, events)
        return self._record(run)

    def _why_retrain_skipped(self, at: datetime, events: Sequence[dict[str, Any]]) -> str:
        """The plan task's reason for skipping, asked of the same functions it asks (nothing moved since)."""
        from quiver.pipelines.loop_retrain import busy_with, plan_retrain, waiting_for_labels

        config = self.project.config
        busy = busy_with(self.project, self.model)
        if busy:
            return f"one candidate at a time: {busy}"
        plan = plan_retrain(self.model, config.loop_window_days, at, [e["extra"] for e in events])
        return waiting_for_labels(self.project, plan, int(config.loop_min_labelled)) or "see the plan task's log"

    def _why_waiting(self, at: datetime) -> str:
        from quiver.pipelines.loop_shadow import labelled_pairs

        needed = int(self.project.config.loop_min_labelled)
        return f"{labelled_pairs(self.project, self.model, at):,} labelled pairs by {at:%m-%d %H:%M}, {needed:,} needed"

    def tick(self, at: datetime) -> None:
        from quiver.registry import rollouts

        model = self.model
        if at.hour == 0:
            self.run("quiver_materialize", at)
            if self.new_events("quiver://offline/features", "quiver_drift"):
                self.run("quiver_drift", at)
            drift = self.new_events(drift_asset_uri(model), "quiver_retrain", consume=False)
            if drift:
                if self.log.drift_alert_at is None:
                    self.log.drift_alert_at, self.log.drift_alert_wall = at, time.perf_counter()
                    extra = drift[-1]["extra"]
                    self.log.events.append((at, f"retrain called for (drift run #{extra['drift_run_id']}, share "
                                                f"{extra['drift_share']:.0%}: {', '.join(extra.get('drifted', []))}): "
                                                f"{extra.get('reason')}"))
                retrain = self.run_triggered("quiver_retrain", at, drift)
                gate = retrain["results"].get("gate")
                if gate:
                    self.log.events.append((at, f"retrain: {gate['decision']} ({gate['reason']})"))
            challenger = self.new_events(challenger_asset_uri(model), "quiver_shadow_eval")
            if challenger or "shadow" in self.project.models.aliases(model):
                self.run("quiver_shadow_eval", at, conf={"as_of": iso(at)})  # the simulated clock
        canary = self.new_events(canary_asset_uri(model), "quiver_canary")
        open_rollout = rollouts.active_rollout(self.project.registry, model) or \
            rollouts.watching_rollout(self.project.registry, model)
        if canary or open_rollout is not None:
            run = self.run("quiver_canary", at)
            self._note_canary(run, at)

    def _note_canary(self, run: dict[str, Any], at: datetime) -> None:
        judged = run["results"].get("judge") or {}
        if judged.get("outcome") == "promote" and self.log.promoted_at is None:
            self.log.promoted_at, self.log.promoted_wall = at, time.perf_counter()
            self.log.events.append((at, f"{judged['canary']} promoted to champion"))
        if judged.get("outcome") in ("rollback", "halt"):
            from quiver.registry import rollouts
            from quiver.registry.plain_words import decision_sentence

            self.log.rolled_back_at = at
            decision = rollouts.get_decision(self.project.registry, judged["decision_id"])
            self.log.events.append((at, f"{decision_sentence(decision)} Decision #{decision.id}, the numbers: "
                                        f"{judged.get('reason', '')}"))


def ensure_champion(config: Config, story: Story, say: Any) -> Any:
    """The champion trained on the pre-drift window (reused when one is already registered)."""
    from quiver.pipelines.training import run_training

    project = Project(config)
    drift_day = story.day(story.drift_from_day)
    champion = project.models.alias(config.loop_model, "champion")
    if champion is not None and champion.cutoff <= drift_day:
        say(f"champion {champion.label}: trained on [{champion.window_start:%m-%d}, {champion.cutoff:%m-%d})")
        return champion
    # One seed, no shopping: a version worse than its baseline is rejected and cannot serve.
    result = run_training(config, config.loop_service, f"{story.drift_from_day - 1}d", drift_day, device="auto",
                          seed=0, model_name=config.loop_model, alias="champion", log=lambda _: None)
    say(f"{result.version.label} ({result.status}) trained on the pre-drift window "
        f"[{result.version.window_start:%m-%d}, {drift_day:%m-%d}): ROC-AUC {result.metrics['roc_auc']:.3f}, log loss "
        f"{result.metrics['log_loss']:.4f} (baseline {result.baseline['roc_auc']:.3f}, "
        f"{result.baseline['log_loss']:.4f})")
    if result.status != "registered":
        raise RuntimeError(f"no champion: {result.version.label} was worse than its logistic baseline on the "
                           f"pre-drift window (see `quiver models describe {result.version.label}`)")
    return result.version


def train_bad_model(config: Config, cutoff: datetime, say: Any) -> Any:
    """A model trained on a broken label feed (every label flipped) that an operator pushes through.

    When training rejects it (it was worse than its equally fooled baseline), the operator registers its
    artifact by hand, overriding the offline gate — the mistake the canary is there to catch."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from quiver.pipelines.training import run_training

    labels = pq.read_table(config.root / "data/labels/labels.parquet")
    flipped = labels.set_column(labels.schema.get_field_index("is_fraud"), "is_fraud",
                                pc.subtract(1, labels["is_fraud"]))
    # Three days: the newest day's labels have not arrived by the cutoff (knowledge time), so one day is empty.
    result = run_training(config, config.loop_service, "3d", cutoff, device="auto", model_name=config.loop_model,
                          labels=flipped.to_pandas(), log=lambda _: None)
    version = result.version
    say(f"{version.label} trained on a broken label feed (labels flipped): {result.status}, offline ROC-AUC "
        f"{result.metrics['roc_auc']:.3f} on its own labels")
    if result.status != "registered":
        version = Project(config).models.register(
            version.name, artifact_path=version.artifact_path, sha256=version.sha256, metrics=version.metrics,
            window_start=version.window_start, cutoff=version.cutoff, features=version.features,
            catalog_version=version.catalog_version, label_column=version.label_column, lineage=version.lineage,
            reference_path=version.reference_path, created_by="operator",
            override=f"fast-tracked by hand over the offline gate that rejected {version.label}")
        say(f"an operator registers its artifact by hand as {version.label}, overriding the offline gate "
            f"(recorded with the version)")
    return version


def run_story(config: Config, story: Story, say: Any = print) -> StoryLog:
    """The whole loop (see the module docstring); returns what happened."""
    import torch

    saved = {key: os.environ.get(key) for key in story.env()}
    os.environ.update(story.env())
    threads = torch.get_num_threads()
    # The replay makes thousands of small scoring calls: one intra-op thread each, as `quiver serve-model`
    # runs them, beats two threads fighting over 2 cores (a 6-hour tick's replay took about half the time).
    torch.set_num_threads(1)
    try:
        return _run_story(config, story, say)
    finally:  # the overrides are the story's, not the caller's
        torch.set_num_threads(threads)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _run_story(config: Config, story: Story, say: Any) -> StoryLog:
    from quiver.pipelines.loop_airflow import AIRFLOW_HOME_DIR, AirflowWorker
    from quiver.pipelines.replay import deliver_labels, replay
    from quiver.registry import rollouts
    from quiver.serving.logs import log_schema, logger_for
    from quiver.serving.prediction import PredictionService
    from quiver.serving.store import FeatureStore

    config = load_config(config.root / "quiver.yaml") if (config.root / "quiver.yaml").exists() else config
    project = Project(config)
    log = StoryLog()
    ensure_champion(config, story, say)
    home = config.root / AIRFLOW_HOME_DIR  # the metadata DB `make airflow` opens: the story's runs show there
    first, last = story.drift_from_day - 1, story.days  # replay from the last calm day to the end of the data
    bad_version: int | None = None
    with AirflowWorker(home, config.root / "quiver.yaml") as airflow, FeatureStore(config=config) as store, \
            logger_for(config, log_schema(store.catalog), flush_interval_s=3600) as logger, \
            PredictionService(store, config.loop_model, logger=logger, poll_interval_s=3600) as service:
        # Start the online store empty: earlier steps loaded it as of the end of the data, and newer-wins last
        # values would otherwise leak the future into the replayed days (the next materialization is full).
        flush = getattr(store.online, "flush_project", None)
        if flush is not None:
            flush()
        scheduler = Scheduler(airflow, project, log, say)
        say(f"Airflow worker ready ({len(airflow.dags)} DAGs, metadata DB under {home})")
        at = story.day(first)
        while at < story.day(last):
            served = replay(config, service, at, at + TICK)
            deliver_labels(config, at, at + TICK, delay=story.label_delay)
            at += TICK
            if at.hour == 0:
                arms = ", ".join(f"{k} {v:,}" for k, v in sorted(served.arms.items()) if v)
                say(f"{at - timedelta(days=1):%Y-%m-%d} served ({arms} in the last 6 h, {served.seconds:.1f} s)")
            scheduler.tick(at)
            watched = rollouts.watching_rollout(project.registry, config.loop_model) is not None
            if log.promoted_at is not None and bad_version is None and at.hour == 0 and not watched:
                bad_version = train_bad_model(config, at, say).version
                scheduler.run("quiver_canary", at, conf={"canary_version": bad_version})
            if bad_version is not None and log.rolled_back_at is not None:
                break
    return log


def canary_steps(project: Project, model: str, rollout_id: int) -> list[dict[str, Any]]:
    """The recorded judge looks of one rollout, oldest first, as rows for the report."""
    from quiver.registry import rollouts

    rows = []
    decisions = rollouts.list_decisions(project.registry, model, rollout_id=rollout_id, kind="canary_step")
    for decision in reversed(decisions):
        stats = decision.statistics
        guard = {g["name"]: g for g in stats.get("guardrails", [])}
        estimate = (guard.get("log_loss") or {}).get("statistics", {}).get("estimate")
        bands = {name: {k: (g.get("statistics") or {}).get(k) for k in ("estimate", "lower", "upper", "floor",
                                                                         "fail_above", "threshold_ms")} | {"status": g.get("status")}
                 for name, g in guard.items()}
        rows.append({"label": f"{decision.decided_at:%m-%d %H:%M}", "fraction": decision.fraction,
                     "outcome": decision.outcome, "rows": stats.get("canary", {}).get("rows"),
                     "log_loss_diff": None if estimate is None else round(float(estimate), 5),
                     "reason": str(stats.get("reason", ""))[:120], "guardrails": bands})
    return rows


def write_reports(project: Project, log: StoryLog, end: datetime) -> dict[str, str]:
    """The evaluation page of the promoted challenger (and the drift page the drift DAG wrote)."""
    import pandas as pd

    from quiver.monitoring.evaluation import _model_rows, join_labels, shadow_pairs
    from quiver.monitoring.evaluation_report import write_evaluation_report
    from quiver.monitoring.labels import read_labels
    from quiver.registry import rollouts
    from quiver.serving.logs import read_serving_logs

    model = project.config.loop_model
    reports: dict[str, str] = {}
    drift_reports = [r["results"]["check_drift"].get("report") for r in log.runs
                     if r["dag_id"] == "quiver_drift" and r["tasks"].get("emit_drift") == "success"]
    if drift_reports and drift_reports[0]:
        reports["drift"] = drift_reports[0]
    promoted = [r for r in rollouts.list_rollouts(project.registry, model) if r.status == rollouts.PROMOTED]
    if not promoted:
        return reports
    rollout = promoted[-1]
    logs = _model_rows(read_serving_logs(project.serving_log_root, None, end), model)
    joined = join_labels(logs, read_labels(project.serving_log_root, end))
    pairs, _ = shadow_pairs(joined, f"{model}:{rollout.champion_version}", f"{model}:{rollout.canary_version}")
    pairs = pairs[pairs["label"].notna()]
    if len(pairs):
        served = pd.to_datetime(pairs["ts"], utc=True) if "ts" in pairs else None
        first, last = (served.min(), served.max()) if served is not None and len(served) else (end, end)
        page = write_evaluation_report(
            project.reports_dir / (f"evaluation-{model}-v{rollout.canary_version}-vs-v{rollout.champion_version}-"
                                   f"{first:%Y%m%d}-{last:%Y%m%d}.html"),
            labels=pairs["label"].to_numpy(), champion_scores=pairs["prediction_champion"].to_numpy(),
            challenger_scores=pairs["prediction_shadow"].to_numpy(), champion=f"{model}:{rollout.champion_version}",
            challenger=f"{model}:{rollout.canary_version}", canary_steps=canary_steps(project, model, rollout.id),
            title=(f"{model}:{rollout.canary_version} vs {model}:{rollout.champion_version}: shadow pairs served "
                   f"{first:%Y-%m-%d %H:%M} … {last:%Y-%m-%d %H:%M} UTC, and the canary"),
            facts=[("rollout", f"#{rollout.id} {rollout.status}"), ("labels as of", f"{end:%Y-%m-%d %H:%M} UTC"),
                   ("requests served", f"{first:%Y-%m-%d %H:%M} … {last:%Y-%m-%d %H:%M} UTC")])
        reports["evaluation"] = str(page)
    return reports


def summary_table(log: StoryLog) -> Any:
    """Every DAG run of the story: when (simulated), which DAG, its state, decision and key numbers."""
    from rich.table import Table

    table = Table("simulated time", "DAG", "state", "decision", "key numbers", "wall s")
    for run in log.runs:
        table.add_row(f"{run['at']:%m-%d %H:%M}", run["dag_id"], run["state"], run["decision"], run["numbers"],
                      f"{run['wall']:.1f}")
    return table


def latency_lines(log: StoryLog) -> list[str]:
    """The loop's latency from the drift alert to the promotion, in simulated hours and wall seconds."""
    if log.drift_alert_at is None or log.promoted_at is None:
        return ["the loop did not complete: no promotion after the drift alert"]
    hours = (log.promoted_at - log.drift_alert_at).total_seconds() / 3600
    wall = (log.promoted_wall or 0.0) - (log.drift_alert_wall or 0.0)
    return [f"drift alert {log.drift_alert_at:%m-%d %H:%M} → promotion {log.promoted_at:%m-%d %H:%M}: "
            f"{hours:.0f} simulated hours (labels arrive a day late), {wall:.0f} s of wall time"]


def tell_story(config: Config, start: date, days: int, drift_from_day: int, console: Any) -> StoryLog:
    """Run the story, then print the table of DAG runs, the latency and the report paths."""
    began = time.perf_counter()
    story = Story(start=start, days=days, drift_from_day=drift_from_day)
    if days < drift_from_day + 6:
        raise ValueError(f"the loop needs about 6 days of traffic after the drift: days >= {drift_from_day + 6}")
    log = run_story(config, story, say=lambda line: console.print(line, highlight=False))
    project = Project(load_config(config.root / "quiver.yaml") if (config.root / "quiver.yaml").exists() else config)
    end = max((r["at"] for r in log.runs), default=story.day(days))
    log.reports = write_reports(project, log, end)
    console.print(summary_table(log))
    for at, event in log.events:
        console.print(f"{at:%m-%d %H:%M}  {event}", highlight=False)
    for line in latency_lines(log):
        console.print(line, highlight=False)
    aliases = project.models.aliases(config.loop_model)
    console.print(f"aliases now: {aliases}")
    for name, path in log.reports.items():
        console.print(f"{name} report: {path}")
    console.print(f"[dim](the loop took {time.perf_counter() - began:.0f} s)[/dim]")
    return log
