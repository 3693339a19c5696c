"""The canary, as idempotent steps over the registry (aliases, rollouts, decisions).

`start_canary` opens a rollout for the challenger once its shadow verdict is in favour (or for a version an
operator names) and, where the project gates on it (`consistency_gate`), no feature it reads is inconsistent
online vs offline (its newest consistency check over threshold; a running canary holds while one is),
`canary_step` judges the running rollout's current step once — or, after a promotion, takes
one look of the post-promotion watch — through `quiver.monitoring.canary_judge`, which records the decision
and applies it in one transaction (aliases, rollout, alert). Every step first redelivers alerts a crashed
attempt left pending.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from quiver.pipelines.loop_common import CHALLENGER, Project, iso
from quiver.pipelines.loop_shadow import GOOD_VERDICTS, SHADOW, latest_shadow_decision


def canary_settings(project: Project) -> Any:
    """The judge's settings for a new rollout: its defaults with the project's steps and row floor."""
    from quiver.monitoring.canary_stats import JudgeSettings

    config = project.config
    steps = tuple(float(s) for s in config.loop_canary_steps.split(",") if s.strip())
    rows = int(config.loop_canary_min_rows)
    values: dict[str, Any] = {"steps": steps, "min_rows": rows, "min_labels": max(2, rows // 2)}
    values.update(judge_overrides(config.loop_canary_judge))
    return JudgeSettings(**values)


def judge_overrides(text: str) -> dict[str, Any]:
    """`loop_canary_judge` ("name=value,…") as typed keyword arguments of the judge's settings."""
    from dataclasses import fields

    from quiver.catalog.errors import QuiverError
    from quiver.monitoring.canary_stats import JudgeSettings

    types = {f.name: f.type for f in fields(JudgeSettings) if f.name != "steps"}
    out: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        name = name.strip()
        if name not in types or not value.strip():
            raise QuiverError(f"loop_canary_judge: {item!r} is not name=value with name one of "
                              f"{', '.join(sorted(types))}")
        kind = str(types[name])
        if "bool" in kind:
            out[name] = value.strip().lower() in ("1", "true", "yes")
        elif "int" in kind:
            out[name] = int(value)
        else:
            out[name] = float(value)
    return out


def start_canary(project: Project, model: str, *, version: int | None = None, at: datetime | None = None,
                 again: bool = False) -> dict[str, Any]:
    """Open a rollout for the shadow-approved challenger (or `version`, an operator's explicit choice).

    Nothing new while a rollout runs or is watched; a challenger without a good shadow verdict waits; a
    version whose rollout was rolled back or halted is not canaried again unless `again`.
    """
    from quiver.monitoring import canary_judge
    from quiver.registry import rollouts

    project.alerts.redeliver()
    running = rollouts.active_rollout(project.registry, model) or rollouts.watching_rollout(project.registry, model)
    if running is not None:
        return {"model": model, "status": running.status, "rollout_id": running.id, "step": running.step,
                "fraction": running.fraction, "canary": f"{model}:{running.canary_version}", "started": False}
    aliases = project.models.aliases(model)
    if version is None:
        version = aliases.get(SHADOW) or aliases.get(CHALLENGER)
        decision = latest_shadow_decision(project, model, version) if version is not None else None
        if decision is None or decision.outcome not in GOOD_VERDICTS:
            return {"model": model, "status": "waiting", "started": False, "challenger": version,
                    "reason": "no shadow verdict in favour of the challenger yet"}
        ended = rollouts.ended_candidacies(project.registry, model).get(version)
        if ended is not None:
            return {"model": model, "status": "waiting", "started": False, "challenger": version,
                    "reason": f"{model}:{version} was {ended.status} in rollout #{ended.id}"}
        reason = f"shadow verdict {decision.outcome} (decision #{decision.id})"
    else:
        reason = f"started by hand for {model}:{version}"
    blocked = inconsistent_inputs(project, model, version)
    if blocked:
        return {"model": model, "status": "waiting", "started": False, "challenger": version,
                "reason": f"{model}:{version} reads {blocked}: serving would not feed it what it was trained on"}
    rollout = canary_judge.start_canary(project.config, model, version, settings=canary_settings(project),
                                        by="quiver_canary", reason=reason, at=at, again=again)
    return {"model": model, "status": "started", "rollout_id": rollout.id, "step": rollout.step,
            "fraction": rollout.fraction, "canary": f"{model}:{version}", "started": True, "reason": reason}


def inconsistent_inputs(project: Project, model: str, version: int) -> str:
    """The features `model:version` reads whose newest consistency check (`quiver consistency`, the drift
    DAG's daily task) found served values differing from offline beyond their threshold; "" when none, or
    when the project does not gate canaries on consistency (`consistency_gate` in monitoring.yaml)."""
    from quiver.monitoring.consistency_records import inconsistent_features
    from quiver.monitoring.settings import load_settings

    if not load_settings(project.config).consistency_gate:
        return ""

    found = inconsistent_features(project.registry, project.models.get(model, version).features)
    return ", ".join(f"{r['feature']} ({r['wrong_rate']:.2%} wrong in consistency run #{r['run_id']})"
                     for r in found)


def canary_step(project: Project, model: str, moment: datetime) -> dict[str, Any]:
    """Judge the running rollout's current step (or look at a watched promotion) as of `moment`; the judge
    applies the outcome and its alert in one transaction."""
    from quiver.monitoring import canary_judge
    from quiver.registry import rollouts

    project.alerts.redeliver()
    earlier = _decided_at(project, model, moment)
    if earlier is not None:  # a retry of this run: what the first attempt decided (applied once, now at latest)
        actions = canary_judge.apply_decision(project.config, earlier, by="quiver_canary", at=moment)
        return {"kind": "step" if earlier.kind == "canary_step" else "watch", "model": model,
                "outcome": earlier.outcome, "reason": earlier.statistics.get("reason", ""),
                "decision_id": earlier.id, "new_decision": False, "rollout_id": earlier.rollout_id,
                "actions": list(actions), "as_of": iso(moment), "repeated": True}
    if rollouts.active_rollout(project.registry, model) is None:
        if rollouts.watching_rollout(project.registry, model) is not None:
            return {"kind": "watch", **canary_judge.watch_step(project.config, model, as_of=moment,
                                                              by="quiver_canary")}
        return {"model": model, "outcome": "none", "reason": "no running rollout"}
    running = rollouts.active_rollout(project.registry, model)
    blocked = inconsistent_inputs(project, model, running.canary_version) if running is not None else ""
    if running is not None and blocked:
        return _hold_inconsistent(project, running, blocked, moment)
    outcome = canary_judge.judge_step(project.config, model, as_of=moment, by="quiver_canary")
    verdict, rollout = outcome.verdict, outcome.rollout
    assert outcome.decision is not None
    return {"kind": "step", "model": model, "outcome": verdict.outcome, "reason": verdict.reason,
            "decision_id": outcome.decision.id, "new_decision": bool(outcome.decision.created),
            "rollout_id": rollout.id, "status": rollout.status, "step": rollout.step,
            "fraction": rollout.fraction, "canary": f"{model}:{rollout.canary_version}",
            "champion_before": f"{model}:{rollout.champion_version}", "actions": list(outcome.actions),
            "as_of": iso(moment)}


def _hold_inconsistent(project: Project, rollout: Any, blocked: str, moment: datetime) -> dict[str, Any]:
    """A running canary holds without a look while a feature it reads is inconsistent online vs offline (its
    evidence would judge a model fed values it was not trained on); the hold is a decision that says why,
    recorded once per rollout step and set of inconsistent features."""
    from quiver.monitoring import canary_judge
    from quiver.monitoring.evaluation import idempotency_key
    from quiver.registry import rollouts

    model = rollout.model
    reason = f"holding: {model}:{rollout.canary_version} reads {blocked}"
    decision = rollouts.record_decision(
        project.registry, model, kind="canary_step", outcome="hold",
        statistics={"outcome": "hold", "reason": reason, "fraction": rollout.fraction, "inconsistent": blocked},
        idempotency_key=idempotency_key("inconsistent inputs", rollout.id, rollout.step, blocked),
        rollout_id=rollout.id, step=rollout.step, fraction=rollout.fraction,
        champion_version=f"{model}:{rollout.champion_version}", candidate_version=f"{model}:{rollout.canary_version}",
        by="quiver_canary", at=moment)
    actions = canary_judge.apply_decision(project.config, decision, by="quiver_canary", at=moment)
    return {"kind": "step", "model": model, "outcome": "hold", "reason": reason, "decision_id": decision.id,
            "new_decision": bool(decision.created), "rollout_id": rollout.id, "status": rollout.status,
            "step": rollout.step, "fraction": rollout.fraction, "canary": f"{model}:{rollout.canary_version}",
            "champion_before": f"{model}:{rollout.champion_version}", "actions": list(actions), "as_of": iso(moment)}


def _decided_at(project: Project, model: str, moment: datetime) -> Any:
    """The canary or watch decision a run judging at `moment` already recorded, or None."""
    from quiver.pipelines.loop_common import utc
    from quiver.registry import rollouts

    for decision in rollouts.list_decisions(project.registry, model, limit=20):
        if decision.kind in ("canary_step", "watch") and utc(decision.decided_at) == utc(moment):
            return decision
    return None
