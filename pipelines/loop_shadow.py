"""Shadow evaluation, as idempotent steps over the registry: start, wait for labels, judge, act.

`start_shadow` points alias `shadow` at the challenger (the prediction service then scores every request with
it after answering with the champion) — never while a rollout runs or is watched: the canary serves the
version for real then, and the watch uses `shadow` for the old champion. `labelled_pairs` counts requests both
scored whose label has arrived by a moment (the sensor's condition). `shadow_verdict` runs the paired,
anytime-valid comparison of `quiver.monitoring.evaluation` as of a moment, records it as a decision and
applies it in one registry transaction:

* `better` / `not worse` — handed on to the canary (the DAG emits the canary Asset);
* `worse` — the shadow ends and the challenger is dropped, with an alert;
* `inconclusive` — keeps shadowing, unless the shadow has run `loop_max_shadow_days`: then it ends and the
  challenger is dropped as `expired`, with an alert, so one undecidable model cannot block every retrain.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from quiver.catalog.errors import NoRowsError
from quiver.pipelines.loop_common import CHALLENGER, CHAMPION, Project, iso

SHADOW = "shadow"
GOOD_VERDICTS = ("better", "not worse")


def start_shadow(project: Project, model: str, *, at: datetime | None = None) -> dict[str, Any]:
    """Point `shadow` at the challenger (nothing to do when it already does, when there is none, or while a
    rollout runs or is watched); `at` is the move's data time (the wall clock when None)."""
    from quiver.registry import rollouts

    aliases = project.models.aliases(model)
    challenger, shadow, champion = aliases.get(CHALLENGER), aliases.get(SHADOW), aliases.get(CHAMPION)
    base = {"model": model, "champion": champion, "challenger": challenger}
    busy = rollouts.active_rollout(project.registry, model) or rollouts.watching_rollout(project.registry, model)
    if busy is not None:
        return {**base, "status": "rollout_running", "shadow": shadow, "rollout_id": busy.id}
    if challenger is None or champion is None:
        return {**base, "status": "nothing_to_shadow", "shadow": shadow}
    if shadow != challenger:
        project.models.set_alias(model, SHADOW, challenger, expected=shadow, by="quiver_shadow_eval", as_of=at,
                                 reason=f"shadow evaluation of challenger {model}:{challenger}")
    return {**base, "status": "shadowing", "shadow": challenger,
            "shadow_since": iso(shadow_since(project, model, challenger))}


def shadow_since(project: Project, model: str, version: int) -> datetime:
    """When `shadow` last moved to `version` (its shadow's start), in data time: verdicts judge as of a data
    time too, so the shadow's age is measured on one clock."""
    moves = [m for m in project.models.history(model, SHADOW) if m.to_version == version]
    if not moves:
        raise ValueError(f"{model}:{version} was never the shadow")
    return moves[-1].data_time


def labelled_pairs(project: Project, model: str, as_of: datetime) -> int:
    """Requests scored by champion and shadow before `as_of` whose label arrived by then."""
    from quiver.monitoring.evaluation import _model_rows, join_labels, shadow_pairs
    from quiver.monitoring.labels import read_labels
    from quiver.serving.logs import read_serving_logs

    aliases = project.models.aliases(model)
    if aliases.get(SHADOW) is None or aliases.get(CHAMPION) is None:
        return 0
    logs = _model_rows(read_serving_logs(project.serving_log_root, None, as_of), model)
    joined = join_labels(logs, read_labels(project.serving_log_root, as_of))
    pairs, _ = shadow_pairs(joined, f"{model}:{aliases[CHAMPION]}", f"{model}:{aliases[SHADOW]}")
    return int(pairs["label"].notna().sum())


def shadow_verdict(project: Project, model: str, as_of: datetime, *, min_pairs: int) -> dict[str, Any]:
    """Judge the shadow on every request both versions scored before `as_of` (labels as of `as_of`), record
    the verdict and apply it (see the module docstring). The same `as_of` gives the same decision, applied
    once."""
    from quiver.monitoring.evaluation import ShadowSettings, evaluate_shadow

    aliases = project.models.aliases(model)
    champion, shadow = aliases.get(CHAMPION), aliases.get(SHADOW)
    if champion is None or shadow is None:
        return {"model": model, "verdict": "none", "reason": "no shadow to judge", "handed_on": False}
    try:
        result = evaluate_shadow(project.config, model, champion_version=champion, shadow_version=shadow,
                                 start=None, end=as_of, as_of=as_of, settings=ShadowSettings(min_pairs=min_pairs))
    except NoRowsError as exc:  # no labelled pair at all: no verdict, unless the shadow ran out of time
        return _without_pairs(project, model, champion, shadow, as_of, str(exc))
    assert result.decision_id is not None
    from quiver.monitoring import faults

    faults.point("shadow.recorded")
    summary = {"model": model, "champion": f"{model}:{champion}", "challenger": f"{model}:{shadow}",
               "verdict": result.verdict, "reason": result.reason, "decision_id": result.decision_id,
               "labelled_pairs": result.labeled_pairs, "log_loss_diff": round(result.log_loss.difference, 6),
               "log_loss_upper": round(result.log_loss.upper, 6),
               "auc": {k: round(float(v), 4) for k, v in result.auc.items() if k in ("champion", "shadow")},
               "as_of": iso(as_of)}
    expired = (result.verdict == "inconclusive"
               and as_of - shadow_since(project, model, shadow) >= timedelta(days=project.config.loop_max_shadow_days))
    actions = apply_shadow_decision(project, result.decision_id, shadow, expired=expired)
    return {**summary, "expired": expired, "actions": list(actions),
            "handed_on": result.verdict in GOOD_VERDICTS}


def _without_pairs(project: Project, model: str, champion: int, shadow: int, as_of: datetime,
                   why: str) -> dict[str, Any]:
    """A shadow with no labelled pair yet is not judged (an empty comparison is never recorded as one). Once it
    has shadowed `loop_max_shadow_days`, the lack of evidence is itself the decision: `inconclusive`, recorded
    with why, and the challenger is dropped as expired, so a version no traffic reaches cannot block retraining."""
    from quiver.monitoring.evaluation import idempotency_key
    from quiver.registry import rollouts

    summary = {"model": model, "champion": f"{model}:{champion}", "challenger": f"{model}:{shadow}",
               "labelled_pairs": 0, "log_loss_diff": None, "log_loss_upper": None, "auc": {}, "as_of": iso(as_of),
               "handed_on": False}
    days = project.config.loop_max_shadow_days
    if as_of - shadow_since(project, model, shadow) < timedelta(days=days):
        return {**summary, "verdict": "none", "reason": why, "expired": False, "actions": []}
    reason = f"no labelled pair in {days:g} day(s) of shadowing: {why}"
    decision = rollouts.record_decision(
        project.registry, model, kind="shadow_evaluation", outcome="inconclusive",
        statistics={"verdict": "inconclusive", "reason": reason, "labeled_pairs": 0, "as_of": iso(as_of)},
        idempotency_key=idempotency_key("shadow without pairs", model, champion, shadow, iso(as_of)),
        champion_version=f"{model}:{champion}", candidate_version=f"{model}:{shadow}", by="quiver_shadow_eval",
        at=as_of)
    actions = apply_shadow_decision(project, decision.id, shadow, expired=True)
    return {**summary, "verdict": "inconclusive", "reason": reason, "decision_id": decision.id, "expired": True,
            "actions": list(actions)}


def apply_shadow_decision(project: Project, decision_id: int, version: int, *, expired: bool) -> tuple[str, ...]:
    """Carry out a shadow verdict once, in one transaction: on `worse` (or an expired inconclusive shadow)
    end the shadow, drop the challenger and record the alert; deliver it after the commit."""
    from quiver.monitoring import faults
    from quiver.monitoring.repository import open_alert_in
    from quiver.registry import rollouts

    registry, models = project.registry, project.models
    alert_ids: list[int] = []
    with registry._write() as connection:
        decision = rollouts.get_decision_in(connection, registry.project, decision_id)
        if decision.applied_at is not None:
            return decision.actions
        actions: list[str] = []
        drop = decision.outcome == "worse" or (decision.outcome == "inconclusive" and expired)
        if drop:
            model, aliases = decision.model, models.aliases_in(connection, decision.model)
            why = "expired inconclusive" if decision.outcome == "inconclusive" else "rejected"
            reason = f"{why} in shadow by decision #{decision.id}: {decision.statistics.get('reason', '')}"
            for alias in (SHADOW, CHALLENGER):
                if aliases.get(alias) == version:
                    models.set_alias_in(connection, model, alias, None, expected=version, reason=reason,
                                        by="quiver_shadow_eval", decision_id=decision.id)
                    actions.append(f"{alias} removed")
                    faults.point(f"shadow.alias.{alias}")
            kind = "shadow_expired" if decision.outcome == "inconclusive" else "shadow"
            record, outcome = open_alert_in(
                connection, registry.project, kind, f"{model}:{version}", "warning",
                f"Challenger {model}:{version} {why} in shadow", reason,
                {"decision_id": decision.id, "actions": actions, "as_of": decision.data_time.isoformat()},
                list(project.alerts.sinks))
            if outcome != "repeated":
                alert_ids.append(record.id)
            actions.append(f"alert #{record.id} {kind}")
        faults.point("shadow.before_mark")
        rollouts.mark_applied_in(connection, decision.id, actions, datetime.now(UTC))
    for alert_id in alert_ids:
        project.alerts.deliver(alert_id)
    return tuple(actions)


def latest_shadow_decision(project: Project, model: str, version: int) -> Any:
    """The newest recorded shadow verdict on `model:version`, or None."""
    from quiver.registry import rollouts

    for decision in rollouts.list_decisions(project.registry, model, kind="shadow_evaluation", limit=50):
        if decision.candidate_version == f"{model}:{version}":
            return decision
    return None
