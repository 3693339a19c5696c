"""Shadow evaluation and the canary, as idempotent steps over the registry (aliases, rollouts, decisions).

Shadow: `start_shadow` points alias `shadow` at the challenger (the prediction service then scores every
request with it after answering with the champion); `labelled_pairs` counts requests both scored whose
label has arrived (the sensor's condition); `shadow_verdict` runs the paired comparison of
`quiver.monitoring.evaluation` on the shadow's window and records it as a decision. A verdict of `better` or
`not worse` hands the challenger on to the canary; `worse` ends its shadow and drops the challenger alias;
`inconclusive` keeps shadowing (the next run looks again). Canary: `start_canary` opens a rollout at the first
step; `canary_step` judges the current step once (`quiver.monitoring.canary_judge.judge_step`), which promotes,
advances, holds or rolls back; promotion and rollback raise alerts either way.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from quiver.pipelines.loop_common import CHALLENGER, CHAMPION, Project, iso

SHADOW = "shadow"
GOOD_VERDICTS = ("better", "not worse")


def start_shadow(project: Project, model: str) -> dict[str, Any]:
    """Point `shadow` at the challenger (nothing to do when it already does, or when there is none)."""
    aliases = project.models.aliases(model)
    challenger, shadow, champion = aliases.get(CHALLENGER), aliases.get(SHADOW), aliases.get(CHAMPION)
    base = {"model": model, "champion": champion, "challenger": challenger}
    if challenger is None or champion is None:
        return {**base, "status": "nothing_to_shadow", "shadow": shadow}
    if shadow != challenger:
        project.models.set_alias(model, SHADOW, challenger, expected=shadow, by="quiver_shadow_eval",
                                 reason=f"shadow evaluation of challenger {model}:{challenger}")
    return {**base, "status": "shadowing", "shadow": challenger}


def _pairs(project: Project, model: str, champion: int, shadow: int, start: datetime | None, end: datetime,
           as_of: datetime) -> Any:
    from quiver.monitoring.evaluation import _model_rows, join_labels, shadow_pairs
    from quiver.monitoring.labels import read_labels
    from quiver.monitoring.serving_log import read_serving_logs

    logs = _model_rows(read_serving_logs(project.serving_log_root, start, end), model)
    joined = join_labels(logs, read_labels(project.serving_log_root, as_of))
    pairs, _ = shadow_pairs(joined, f"{model}:{champion}", f"{model}:{shadow}")
    return pairs


def labelled_pairs(project: Project, model: str, start: datetime | None, end: datetime, as_of: datetime) -> int:
    """Requests scored by champion and shadow in [start, end) whose label arrived by `as_of`."""
    aliases = project.models.aliases(model)
    if aliases.get(SHADOW) is None or aliases.get(CHAMPION) is None:
        return 0
    pairs = _pairs(project, model, aliases[CHAMPION], aliases[SHADOW], start, end, as_of)
    return int(pairs["label"].notna().sum())


def shadow_verdict(project: Project, model: str, end: datetime, *, min_pairs: int) -> dict[str, Any]:
    """Judge the shadow on every request both versions scored before `end` (labels as of `end`), record the
    verdict, act on it. Pairs exist only while this shadow ran, so the window needs no start."""
    from quiver.monitoring.evaluation import ShadowSettings, evaluate_shadow

    aliases = project.models.aliases(model)
    champion, shadow = aliases.get(CHAMPION), aliases.get(SHADOW)
    if champion is None or shadow is None:
        return {"model": model, "verdict": "none", "reason": "no shadow to judge", "handed_on": False}
    result = evaluate_shadow(project.config, model, champion_version=champion, shadow_version=shadow,
                             start=None, end=end, as_of=end, settings=ShadowSettings(min_pairs=min_pairs))
    summary = {"model": model, "champion": f"{model}:{champion}", "challenger": f"{model}:{shadow}",
               "verdict": result.verdict, "reason": result.reason, "decision_id": result.decision_id,
               "labelled_pairs": result.labeled_pairs, "log_loss_diff": round(result.log_loss.difference, 6),
               "log_loss_upper": round(result.log_loss.upper, 6),
               "auc": {k: round(float(v), 4) for k, v in result.auc.items() if k in ("champion", "shadow")},
               "as_of": iso(end)}
    if result.verdict == "worse":
        _end_shadow(project, model, shadow, f"shadow verdict worse: {result.reason}", result.decision_id)
        if aliases.get(CHALLENGER) == shadow:
            project.models.set_alias(model, CHALLENGER, None, expected=shadow, by="quiver_shadow_eval",
                                     reason=f"rejected in shadow: {result.reason}", decision_id=result.decision_id)
        project.alerts.raise_alert("shadow", model, "warning", f"Challenger {model}:{shadow} rejected in shadow",
                                   result.reason, summary)
    return {**summary, "handed_on": result.verdict in GOOD_VERDICTS}


def _end_shadow(project: Project, model: str, version: int, reason: str, decision_id: int | None) -> None:
    if project.models.aliases(model).get(SHADOW) == version:
        project.models.set_alias(model, SHADOW, None, expected=version, reason=reason, by="quiver_loop",
                                 decision_id=decision_id)


def canary_settings(project: Project) -> Any:
    """The judge's settings for a new rollout: its defaults with the project's steps and row floor."""
    from quiver.monitoring.canary_judge import JudgeSettings

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
    from quiver.monitoring.canary_judge import JudgeSettings

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


def latest_shadow_decision(project: Project, model: str, version: int) -> Any:
    """The newest recorded shadow verdict on `model:version`, or None."""
    from quiver.registry import rollouts

    for decision in rollouts.list_decisions(project.registry, model, kind="shadow_evaluation", limit=50):
        if decision.candidate_version == f"{model}:{version}" or \
                decision.statistics.get("shadow_version") == f"{model}:{version}":
            return decision
    return None


def start_canary(project: Project, model: str, *, version: int | None = None,
                 at: datetime | None = None) -> dict[str, Any]:
    """Open a rollout for the shadow-approved challenger (or `version`, an operator's explicit choice).

    Nothing new when a rollout is already running; a challenger without a good shadow verdict waits.
    """
    from quiver.monitoring import canary_judge
    from quiver.registry import rollouts

    running = rollouts.active_rollout(project.registry, model)
    if running is not None:
        return {"model": model, "status": "running", "rollout_id": running.id, "step": running.step,
                "fraction": running.fraction, "canary": f"{model}:{running.canary_version}", "started": False}
    aliases = project.models.aliases(model)
    if version is None:
        version = aliases.get(SHADOW) or aliases.get(CHALLENGER)
        decision = latest_shadow_decision(project, model, version) if version is not None else None
        if decision is None or decision.outcome not in GOOD_VERDICTS:
            return {"model": model, "status": "waiting", "started": False, "challenger": version,
                    "reason": "no shadow verdict in favour of the challenger yet"}
        reason = f"shadow verdict {decision.outcome} (decision #{decision.id})"
    else:
        reason = f"started by hand for {model}:{version}"
    rollout = canary_judge.start_canary(project.config, model, version, settings=canary_settings(project),
                                        by="quiver_canary", reason=reason, at=at)
    if aliases.get(SHADOW) == version:  # the canary now serves it for real; shadowing it too would double-log
        _end_shadow(project, model, version, f"moved on to canary rollout #{rollout.id}", None)
    return {"model": model, "status": "started", "rollout_id": rollout.id, "step": rollout.step,
            "fraction": rollout.fraction, "canary": f"{model}:{version}", "started": True, "reason": reason}


def canary_step(project: Project, model: str, moment: datetime) -> dict[str, Any]:
    """Judge the running rollout's current step on logs and labels up to `moment`, and apply the outcome."""
    from quiver.monitoring import canary_judge
    from quiver.registry import rollouts

    if rollouts.active_rollout(project.registry, model) is None:
        return {"model": model, "outcome": "none", "reason": "no running rollout"}
    outcome = canary_judge.judge_step(project.config, model, as_of=moment, by="quiver_canary")
    verdict, rollout = outcome.verdict, outcome.rollout
    summary = {"model": model, "outcome": verdict.outcome, "reason": verdict.reason,
               "decision_id": outcome.decision.id, "new_decision": bool(outcome.decision.created),
               "rollout_id": rollout.id, "status": rollout.status, "step": rollout.step,
               "fraction": rollout.fraction, "canary": f"{model}:{rollout.canary_version}",
               "champion_before": f"{model}:{rollout.champion_version}", "actions": list(outcome.actions),
               "as_of": iso(moment)}
    if verdict.outcome == "promote" and outcome.decision.created:
        # Rollback and halt alert from the judge itself; a promotion is announced here, once.
        project.alerts.resolve("canary", model)
        project.alerts.raise_alert("canary", model, "info", f"{model}:{rollout.canary_version} promoted to champion",
                                   verdict.reason, summary)
        if project.models.aliases(model).get(CHALLENGER) == rollout.canary_version:
            project.models.set_alias(model, CHALLENGER, None, expected=rollout.canary_version, by="quiver_canary",
                                     reason="promoted to champion", decision_id=outcome.decision.id)
    if verdict.outcome in ("rollback", "halt") and \
            project.models.aliases(model).get(CHALLENGER) == rollout.canary_version:
        project.models.set_alias(model, CHALLENGER, None, expected=rollout.canary_version, by="quiver_canary",
                                 reason=f"canary {verdict.outcome}: {verdict.reason}", decision_id=outcome.decision.id)
    return summary
