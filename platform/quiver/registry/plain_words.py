"""The first sentence of every decision and alert, in plain words, for someone paged at 3 a.m.: what happened
to which version and why, without the statistics' jargon. The numbers follow it wherever it is shown (the
decision's recorded reason, its guardrail table). Pure: reads only what the judge recorded.

    fraud_model:3 was rolled back: its scores were far from the champion's on the same requests.
    fraud_model:3 stays at canary share 0.5: log loss and Brier score need more labelled rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from quiver.registry.rollouts import Decision

# What each guardrail watches, as a noun an operator knows.
GUARDRAIL_WORDS = {"error_rate": "the failed-call rate", "latency_p99": "the slow-call rate",
                   "score_shift": "the score distance", "log_loss": "log loss", "brier": "the Brier score"}


def _word(name: str) -> str:
    return GUARDRAIL_WORDS.get(name, name)


def _failed(name: str, other: str, paired: bool) -> str:
    """Why a failed guardrail rolled a version back, against `other` ("the champion's")."""
    same = " on the same requests" if paired else ""
    return {"error_rate": f"its calls failed more often than {other}",
            "latency_p99": f"more of its calls were slow than {other}",
            "score_shift": f"its scores were far from {other}{same}",
            "log_loss": f"its predictions were worse than {other}{same} (log loss)",
            "brier": f"its probabilities were further from what happened than {other}{same} (Brier score)",
            }.get(name, f"{name} was worse than {other}")


def _waiting(reason: str) -> tuple[str, str]:
    """What a waiting guardrail still needs, from the judge's reason: (said of one, said of several)."""
    for clue, what in (("labelled rows", "more labelled rows"), ("rows, need", "more rows"),
                       ("no latency threshold", "a latency cut-off first"),
                       ("no successful scores", "scores from both models"),
                       ("too few entities or calls", "more users or calls")):
        if clue in reason and (clue != "labelled rows" or "need" in reason):
            return f"needs {what}", f"need {what}"
    return "is not yet shown within its floor", "are not yet shown within their floors"


def _and(items: Sequence[str]) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _needs(guardrails: Sequence[Mapping[str, Any]]) -> str:
    """'log loss and the Brier score need more labelled rows; the failed-call rate is not yet shown within its
    floor'."""
    by_need: dict[tuple[str, str], list[str]] = {}
    for g in guardrails:
        by_need.setdefault(_waiting(str(g.get("reason", ""))), []).append(_word(str(g.get("name"))))
    return "; ".join(f"{_and(names)} {one if len(names) == 1 else several}"
                     for (one, several), names in by_need.items())


# Guardrails that roll back when they fail but are not needed to pass (`canary_settings.ROLLBACK_ONLY`).
_ROLLBACK_ONLY = ("score_shift",)


def _paired(statistics: Mapping[str, Any]) -> bool:
    pairing = statistics.get("pairing") or {}
    return bool(pairing.get("logged") or pairing.get("replayed"))


def _share(value: Any) -> str:
    return f"{value:g}" if isinstance(value, int | float) and not isinstance(value, bool) else "?"


def decision_sentence(decision: Decision) -> str:
    """What was decided, about which version, and why, in one sentence of plain words (no numbers but the
    traffic share)."""
    kind = decision.kind
    if kind == "canary_step":
        return _canary_sentence(decision)
    if kind == "watch":
        return _watch_sentence(decision)
    if kind == "manual_rollback":
        return _manual_sentence(decision)
    if kind == "shadow_evaluation":
        return _shadow_sentence(decision)
    return f"{decision.candidate_version or decision.model}: {decision.outcome}."


def _guardrails(decision: Decision, status: str) -> list[Mapping[str, Any]]:
    return [g for g in decision.statistics.get("guardrails") or [] if g.get("status") == status]


def _canary_sentence(d: Decision) -> str:
    stats, canary = d.statistics, d.candidate_version
    share = _share(d.fraction)
    failed = _guardrails(d, "fail")
    if d.outcome == "promote":
        return (f"{canary} was promoted to champion: at canary share {share} every guardrail showed it no worse "
                f"than the champion {d.champion_version} beyond its floor.")
    if d.outcome == "advance":
        return (f"{canary} moved on from canary share {share} to {_share(stats.get('next_fraction'))}: every "
                f"guardrail showed it no worse than the champion beyond its floor.")
    if d.outcome == "rollback" and failed:
        reasons = [_failed(str(g.get("name")), "the champion's", _paired(stats)) for g in failed]
        return f"{canary} was rolled back: {_and(reasons)}."
    if d.outcome == "rollback":  # the step's limit of canary calls ran out with guardrails still undecided
        names = [_word(str(g.get("name"))) for g in _guardrails(d, "wait") if g.get("name") not in _ROLLBACK_ONLY]
        what = _and(names) if names else "its guardrails"
        return (f"{canary} was rolled back: after the most canary calls a step may take, {what} still could not "
                f"show it within the floors.")
    if d.outcome == "halt":
        return (f"{canary}'s rollout was halted: the router sent a different share of users to the canary than "
                f"planned, so the comparison cannot be trusted.")
    return f"{canary} stays at canary share {share}: {_held_because(d)}."


def _held_because(d: Decision) -> str:
    """Why a canary step held: the consistency gate, lost serving logs, no traffic, or guardrails waiting."""
    stats = d.statistics
    gate = stats.get("consistency")
    if isinstance(gate, Mapping) and gate.get("passed") is False:
        if gate.get("blocked"):
            return "some features it reads were served with values that differ from the offline store's"
        return "no recent online/offline consistency check of its features covers this step's data yet"
    reason = str(stats.get("reason", ""))
    if reason.startswith("holding: the serving loggers dropped"):
        return "the serving logs lost too many of this step's rows for its evidence to count"
    if not stats.get("guardrails"):
        return "no traffic was logged in this step yet" if reason.startswith("no traffic") else "not decisive yet"
    waiting = [g for g in _guardrails(d, "wait") if g.get("name") not in _ROLLBACK_ONLY]
    return _needs(waiting) if waiting else "not decisive yet"


def _watch_sentence(d: Decision) -> str:
    # A watch compares the new champion (recorded as the decision's champion) with the previous one.
    new, previous = d.champion_version, d.candidate_version
    failed = _guardrails(d, "fail")
    if d.outcome == "rollback":
        reasons = [_failed(str(g.get("name")), f"the previous champion {previous}'s", _paired(d.statistics))
                   for g in failed]
        return (f"{new}'s promotion was reverted: after it became champion, "
                + (_and(reasons) if reasons else "it proved worse than the previous champion") + ".")
    if d.outcome == "confirm":
        return f"{new} stays champion: the watch after its promotion ended without it proving worse than {previous}."
    return f"{new} is still watched after its promotion: nothing shows it worse than {previous} so far."


def _manual_sentence(d: Decision) -> str:
    reason = str(d.statistics.get("reason", "")).strip()
    who = f" by {d.decided_by}" if d.decided_by else ""
    because = f": {reason.rstrip('.')}" if reason else ""
    if d.statistics.get("status") == "watching":
        return f"{d.champion_version}'s promotion was reverted by hand{who}{because}."
    return f"{d.candidate_version} was rolled back by hand{who}{because}."


def _shadow_sentence(d: Decision) -> str:
    shadow, champion = d.candidate_version, d.champion_version
    metric = {"log_loss": "log loss", "brier": "Brier score"}.get(
        str((d.statistics.get("settings") or {}).get("metric", "log_loss")), "log loss")
    if d.outcome == "better":
        return (f"{shadow} did better than the champion {champion} on the same requests in shadow ({metric}), so "
                f"it can go on to a canary.")
    if d.outcome == "not worse":
        return (f"{shadow} was no worse than the champion {champion} on the same requests in shadow ({metric}, "
                f"within the margin), so it can go on to a canary.")
    if d.outcome == "worse":
        return (f"{shadow} was worse than the champion {champion} on the same requests in shadow ({metric}), so "
                f"it goes no further.")
    if "need" in str(d.statistics.get("reason", "")):
        return (f"{shadow} cannot be judged against the champion {champion} yet: too few labelled requests were "
                f"scored by both.")
    return f"{shadow} is not yet shown better or worse than the champion {champion} on the same requests in shadow."


def alert_sentence(alert: Any, decision: Decision | None = None) -> str:
    """An alert's first sentence: the decision's when it announces one, else what its kind means."""
    if decision is not None:
        return decision_sentence(decision)
    kind, subject, detail = str(alert.kind), str(alert.subject), dict(alert.detail or {})
    if kind == "retrain":
        version = detail.get("version")
        label = f"{subject}:{version}" if version is not None else f"a new version of {subject}"
        versus = " nor than the champion on the same test rows" if detail.get("comparison") else ""
        return (f"{label} was trained on newer data and made the challenger: it was no worse than its baseline"
                f"{versus}.")
    if kind == "dataset_drift":
        drifted = detail.get("drifted") or []
        return (f"The data {subject} sees no longer looks like its reference: {len(drifted)} of its features "
                f"drifted." if drifted else f"The data {subject} sees no longer looks like its reference.")
    if kind == "drift":
        name, _, feature = subject.rpartition(":")
        return f"Feature {feature} of {name or subject} no longer looks like its reference."
    if kind == "consistency":
        return f"Served values of {subject} differ from what the offline store computes for the same moment."
    if kind == "quality":
        return f"A batch of {subject} failed the data-quality gate."
    return str(alert.title).rstrip(".") + "."
