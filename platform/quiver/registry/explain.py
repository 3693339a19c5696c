"""What a recorded decision says, in rows an operator reads: one reading for the CLI and the web console.

A decision's statistics are stored as the judge produced them (`quiver.monitoring.canary_stats`,
`quiver.monitoring.evaluation`). This module turns them into plain rows — a canary step's guardrails with
estimate, confidence sequence, floor and verdict; a shadow verdict's paired intervals; a rollout's looks
per guardrail — and says in one line why a model version has the status and aliases it has. Pure: no I/O.

Traffic shares are fractions of traffic in [0, 1] everywhere (input and output), never percentages.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from quiver.registry.rollouts import Decision, Rollout

KIND_LABELS = {"canary_step": "canary step", "watch": "post-promotion watch", "manual_rollback": "manual rollback",
               "shadow_evaluation": "shadow verdict"}


@dataclass(frozen=True)
class GuardrailRow:
    """One guardrail of one look: the estimate (canary − champion), its confidence sequence, the floor it is
    held to, the line beyond which it fails, and the verdict."""

    name: str
    status: str  # pass | fail | wait
    estimate: float | None
    lower: float | None
    upper: float | None
    floor: float | None
    fail_above: float | None
    test: str
    reason: str


@dataclass(frozen=True)
class IntervalRow:
    """One metric of a shadow verdict: both models on the same labelled requests and the paired difference."""

    metric: str
    champion: float | None
    candidate: float | None
    difference: float | None
    lower: float | None
    upper: float | None


@dataclass(frozen=True)
class Look:
    """One judged look at a rollout, as a point of one guardrail's confidence sequence."""

    decision_id: int
    decided_at: str
    step: int | None
    fraction: float | None
    outcome: str
    status: str
    estimate: float | None
    lower: float | None
    upper: float | None
    floor: float | None
    fail_above: float | None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(float(value)) else None


def guardrail_rows(decision: Decision) -> list[GuardrailRow]:
    """The guardrail table of a canary step or watch decision (empty for other kinds)."""
    out = []
    for g in decision.statistics.get("guardrails") or []:
        s = g.get("statistics") or {}
        out.append(GuardrailRow(str(g.get("name")), str(g.get("status")), _number(s.get("estimate")),
                                _number(s.get("lower")), _number(s.get("upper")), _number(s.get("floor")),
                                _number(s.get("fail_above")), str(s.get("test", "")), str(g.get("reason", ""))))
    return out


def shadow_rows(decision: Decision) -> list[IntervalRow]:
    """The paired intervals of a shadow verdict (empty for other kinds)."""
    if decision.kind != "shadow_evaluation":
        return []
    s = decision.statistics
    out = []
    for metric in ("log_loss", "brier"):
        d = s.get(metric) or {}
        out.append(IntervalRow(metric, _number(d.get("champion")), _number(d.get("shadow")),
                               _number(d.get("difference")), _number(d.get("lower")), _number(d.get("upper"))))
    a = s.get("auc") or {}
    out.append(IntervalRow("auc", _number(a.get("champion")), _number(a.get("shadow")), _number(a.get("difference")),
                           _number(a.get("lower")), _number(a.get("upper"))))
    return out


def headline(decision: Decision) -> str:
    """One line: what was decided about which versions, at which share, and why."""
    kind = KIND_LABELS.get(decision.kind, decision.kind)
    reason = str(decision.statistics.get("reason", ""))
    share = f" at share {decision.fraction:g}" if decision.fraction is not None else ""
    versions = f"{decision.candidate_version} vs {decision.champion_version}" if decision.candidate_version else ""
    return f"#{decision.id} {kind}: {decision.outcome} — {versions}{share}" + (f"; {reason}" if reason else "")


def pairing_line(decision: Decision) -> str:
    """Where the champion's scores of the canary rows came from (paired comparisons need them); "" when the
    decision does not say (older decisions, other kinds)."""
    return pairing_text(decision.statistics.get("pairing") or {}, watch=decision.kind == "watch")


def pairing_text(p: Mapping[str, Any], watch: bool = False) -> str:
    """`pairing_line` from a judgement's `pairing` counts (`quiver.monitoring.canary_replay.Pairing`)."""
    if not p:
        return ""
    whose = "the previous champion's scores of the new champion's rows" if watch else \
        "the champion's scores of the canary rows"
    line = (f"{whose}: {p.get('logged', 0):,} paired while serving, "
            f"{p.get('replayed', 0):,} replayed by the judge from the logged inputs, "
            f"{p.get('unpaired', 0):,} unpaired")
    return line + (f" ({p['reason']})" if p.get("reason") else "")


def decision_record(decision: Decision) -> dict[str, Any]:
    """Everything about a decision as JSON-ready data (what `quiver decisions show --json` prints)."""
    from dataclasses import asdict

    record = asdict(decision)
    record["decided_at"] = decision.decided_at.isoformat()
    record["applied_at"] = decision.applied_at.isoformat() if decision.applied_at else None
    record["as_of"] = decision.data_time.isoformat()  # the data time judged
    record["recorded_at"] = decision.recorded_at.isoformat() if decision.recorded_at else None  # wall clock
    record["actions"] = list(decision.actions)
    record["kind_label"] = KIND_LABELS.get(decision.kind, decision.kind)
    record["headline"] = headline(decision)
    record["guardrails"] = [asdict(r) for r in guardrail_rows(decision)]
    record["intervals"] = [asdict(r) for r in shadow_rows(decision)]
    record.pop("created", None)
    return record


def looks(decisions: Sequence[Decision], kind: str = "canary_step") -> dict[str, list[Look]]:
    """Per guardrail, every look of one kind at a rollout (oldest first): the confidence sequence over looks.
    `canary_step` looks compare canary with champion; `watch` looks the new champion with the previous one."""
    out: dict[str, list[Look]] = {}
    for decision in sorted(decisions, key=lambda d: d.id):
        if decision.kind != kind:
            continue
        for row in guardrail_rows(decision):
            out.setdefault(row.name, []).append(Look(
                decision.id, decision.decided_at.isoformat(), decision.step, decision.fraction, decision.outcome,
                row.status, row.estimate, row.lower, row.upper, row.floor, row.fail_above))
    return out


def step_label(rollout: Rollout) -> str:
    """Where a rollout stands, in the one unit for traffic shares (a fraction): running rollouts by judged
    step, ended ones by how they ended."""
    steps = list((rollout.settings or {}).get("steps") or [])
    judged = max(len(steps) - 1, 1)
    position = f"step {rollout.step + 1} of {judged}"
    if rollout.status == "running":
        return f"{position}, canary share {rollout.fraction:g}"
    share = steps[rollout.step] if rollout.step < len(steps) else rollout.fraction
    ended = {"watching": "promoted (watch running)", "promoted": "promoted", "rolled_back": "rolled back",
             "halted": "halted"}.get(rollout.status, rollout.status)
    return f"{ended} after {position} (canary share {share:g}); share now {rollout.fraction:g}"


def status_reason(version: Any, aliases: Mapping[str, int], history: Sequence[Any],
                  decisions: Mapping[int, Decision]) -> str:
    """Why a model version has its status and aliases: the offline gate, then the newest alias move to it
    with its reason and the decision that caused it."""
    metrics = version.metrics or {}
    baseline = (metrics.get("baseline") or {}).get("roc_auc")
    auc = metrics.get("roc_auc")
    versus = (f"ROC-AUC {auc:.4f} vs baseline {baseline:.4f}" if isinstance(auc, float) and isinstance(baseline, float)
              else "")
    if version.status == "rejected":
        return f"rejected by the offline gate: it was worse than its logistic baseline ({versus or 'no metrics'})"
    if version.status == "archived":
        return "archived: it can get no alias"
    held = sorted(a for a, v in aliases.items() if v == version.version)
    if not held:
        gone = [m for m in history if m.from_version == version.version and m.to_version != version.version]
        tail = (f"; last held {gone[-1].alias} until {gone[-1].data_time:%Y-%m-%d %H:%M} (data time) "
                f"({gone[-1].reason})") if gone else ""
        return f"registered ({versus or 'not worse than its baseline'}), holds no alias{tail}"
    parts = []
    for alias in held:
        moves = [m for m in history if m.alias == alias and m.to_version == version.version]
        if not moves:
            parts.append(alias)
            continue
        move = moves[-1]
        cause = decisions.get(move.decision_id) if move.decision_id else None
        # The data time, as every timeline beside it: the move's wall time would put a promotion judged on
        # last week's data after today's verdicts.
        why = f"{alias} since {move.data_time:%Y-%m-%d %H:%M} (data time): {move.reason}"
        if cause is not None:
            why += f" [decision #{cause.id}, {KIND_LABELS.get(cause.kind, cause.kind)} → {cause.outcome}]"
        parts.append(why)
    return f"registered ({versus or 'not worse than its baseline'}); " + "; ".join(parts)
