"""The canary, as idempotent steps over the registry (aliases, rollouts, decisions).

`start_canary` opens a rollout for the challenger once its shadow verdict is in favour (or for a version an
operator names) and the consistency gate passes; `canary_step` judges the running rollout's current step
once — or, after a promotion, takes one look of the post-promotion watch — through
`quiver.monitoring.canary_judge`, which records the decision and applies it in one transaction (aliases,
rollout, alert). Every step first redelivers alerts a crashed attempt left pending.

The consistency gate (`quiver.monitoring.consistency_gate`, on unless monitoring.yaml sets `consistency_gate:
false`) fails closed: a canary starts, and a running one takes a step, only on a recent, non-empty, passing
consistency check of the model's features covering the window judged; otherwise it waits, or holds with a
decision that names why. A step the judge would roll back or halt is taken whatever the gate says: the gate
stops a canary from growing on unchecked evidence, never from shrinking.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from quiver.pipelines.loop_common import CHALLENGER, Project, iso
from quiver.pipelines.loop_shadow import GOOD_VERDICTS, SHADOW, latest_shadow_decision

RETREATS = ("rollback", "halt")  # outcomes a step takes whatever the consistency gate says

if TYPE_CHECKING:
    from quiver.monitoring.consistency_gate import GateVerdict


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
    moment = at or datetime.now(UTC)
    champion = aliases.get("champion")
    served = project.models.get(model, champion).features if champion is not None else []
    gate = consistency_verdict(project, model, version, None, moment, served=served)
    if not gate.passed:
        return {"model": model, "status": "waiting", "started": False, "challenger": version,
                "reason": f"{gate.reason}: serving may not feed it what it was trained on",
                "consistency": gate.to_dict()}
    rollout = canary_judge.start_canary(project.config, model, version, settings=canary_settings(project),
                                        by="quiver_canary", reason=reason, at=at, again=again)
    return {"model": model, "status": "started", "rollout_id": rollout.id, "step": rollout.step,
            "fraction": rollout.fraction, "canary": f"{model}:{version}", "started": True, "reason": reason,
            "consistency": gate.to_dict()}


def consistency_verdict(project: Project, model: str, version: int, start: datetime | None, moment: datetime,
                        *, served: Sequence[str] | None = None) -> GateVerdict:
    """The consistency gate for `model:version` at `moment` (`quiver.monitoring.consistency_gate`): over
    [start, moment] for a running rollout (`start` its start), or, before a canary starts (`start` None), over
    the gate's maximum age before `moment`, where features the serving champion does not read (`served`) are
    not required yet."""
    from quiver.monitoring.consistency_gate import GateRules, gate_off, gate_verdict
    from quiver.monitoring.settings import load_settings

    settings = load_settings(project.config)
    if not settings.consistency_gate:
        return gate_off()
    rules = GateRules.of_settings(settings)
    features = project.models.get(model, version).features
    first = [f for f in features if f not in set(served)] if start is None and served else []
    return gate_verdict(project.registry, model, version, features, start=start or moment - rules.max_age,
                        moment=moment, rules=rules, first_served=first)


def canary_step(project: Project, model: str, moment: datetime) -> dict[str, Any]:
    """Judge the running rollout's current step (or look at a watched promotion) as of `moment`; the judge
    applies the outcome and its alert in one transaction."""
    from quiver.monitoring import canary_judge
    from quiver.registry import rollouts

    project.alerts.redeliver()
    earlier = _decided_at(project, model, moment)
    if earlier is not None:  # a retry of this run: what the first attempt decided (applied once, now at latest)
        actions = canary_judge.apply_decision(project.config, earlier, by="quiver_canary", at=moment)
        watch = earlier.kind != "canary_step"
        return {"kind": "watch" if watch else "step", "model": model,
                "outcome": earlier.outcome, "reason": earlier.statistics.get("reason", ""),
                **({"champion": earlier.champion_version, "previous": earlier.candidate_version} if watch else
                   {"canary": earlier.candidate_version, "step": earlier.step, "fraction": earlier.fraction}),
                "decision_id": earlier.id, "new_decision": False, "rollout_id": earlier.rollout_id,
                "actions": list(actions), "as_of": iso(moment), "repeated": True}
    running = rollouts.active_rollout(project.registry, model)
    if running is None:
        if rollouts.watching_rollout(project.registry, model) is not None:
            return {"kind": "watch", **canary_judge.watch_step(project.config, model, as_of=moment,
                                                              by="quiver_canary")}
        return {"model": model, "outcome": "none", "reason": "no running rollout"}
    gate = consistency_verdict(project, model, running.canary_version, running.started_at, moment)
    if not gate.passed:
        # Closed to advancing, not to retreating: a step the judge would roll back or halt needs no evidence
        # that serving fed the canary right (less traffic to it is safe either way), so it goes on.
        would = canary_judge.judge_step(project.config, model, as_of=moment, by="quiver_canary", dry_run=True)
        if would.verdict.outcome not in RETREATS:
            return _hold_inconsistent(project, running, gate, moment)
    outcome = canary_judge.judge_step(project.config, model, as_of=moment, by="quiver_canary")
    verdict, rollout, decision = outcome.verdict, outcome.rollout, outcome.decision
    assert decision is not None
    # `step` and `fraction` are what was judged (the decision's); `fraction_after` where the outcome moved it.
    return {"kind": "step", "model": model, "outcome": verdict.outcome, "reason": verdict.reason,
            "decision_id": decision.id, "new_decision": bool(decision.created),
            "rollout_id": rollout.id, "status": rollout.status,
            "step": decision.step if decision.step is not None else rollout.step,
            "fraction": decision.fraction if decision.fraction is not None else rollout.fraction,
            "fraction_after": rollout.fraction, "steps": list(running.settings.get("steps") or []),
            "canary": f"{model}:{rollout.canary_version}",
            "champion_before": f"{model}:{rollout.champion_version}", "actions": list(outcome.actions),
            "as_of": iso(moment), "consistency": gate.to_dict()}


def _hold_inconsistent(project: Project, rollout: Any, gate: GateVerdict, moment: datetime) -> dict[str, Any]:
    """A running canary holds without a look while the consistency gate does not pass (no recent check of
    its features covering the rollout, an empty one, or features served wrong: its evidence might judge a
    model fed values it was not trained on); the hold is a decision that says why, recorded once per rollout
    step and cause."""
    from quiver.monitoring import canary_judge
    from quiver.monitoring.evaluation import idempotency_key
    from quiver.registry import rollouts

    model = rollout.model
    reason = f"holding: {gate.reason}"
    decision = rollouts.record_decision(
        project.registry, model, kind="canary_step", outcome="hold",
        statistics={"outcome": "hold", "reason": reason, "fraction": rollout.fraction,
                    "inconsistent": ", ".join(gate.blocked) or gate.reason, "consistency": gate.to_dict()},
        idempotency_key=idempotency_key("inconsistent inputs", rollout.id, rollout.step, gate.key),
        rollout_id=rollout.id, step=rollout.step, fraction=rollout.fraction,
        champion_version=f"{model}:{rollout.champion_version}", candidate_version=f"{model}:{rollout.canary_version}",
        by="quiver_canary", at=moment)
    actions = canary_judge.apply_decision(project.config, decision, by="quiver_canary", at=moment)
    return {"kind": "step", "model": model, "outcome": "hold", "reason": reason, "decision_id": decision.id,
            "new_decision": bool(decision.created), "rollout_id": rollout.id, "status": rollout.status,
            "step": rollout.step, "fraction": rollout.fraction, "fraction_after": rollout.fraction,
            "steps": list(rollout.settings.get("steps") or []), "canary": f"{model}:{rollout.canary_version}",
            "champion_before": f"{model}:{rollout.champion_version}", "actions": list(actions), "as_of": iso(moment),
            "consistency": gate.to_dict()}


def _decided_at(project: Project, model: str, moment: datetime) -> Any:
    """The canary or watch decision a run judging at `moment` already recorded, or None."""
    from quiver.pipelines.loop_common import utc
    from quiver.registry import rollouts

    for decision in rollouts.list_decisions(project.registry, model, limit=20):
        if decision.kind in ("canary_step", "watch") and utc(decision.decided_at) == utc(moment):
            return decision
    return None
