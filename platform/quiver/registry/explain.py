"""What a recorded decision says, in rows an operator reads: one reading for the CLI and the web console.

A decision's statistics are stored as the judge produced them (`quiver.monitoring.canary_stats`,
`quiver.monitoring.evaluation`). This module turns them into plain rows — a canary step's guardrails with
estimate, confidence sequence, floor and verdict; a shadow verdict's paired intervals; a rollout's looks
per guardrail — and says in one line why a model version has the status and aliases it has. The first
sentence of every decision and alert, in plain words, is `quiver.registry.plain_words`'s; the settings a
decision was judged on that differ from the defaults, the one latency cut-off a decision names and the data
time of an alert are here. Pure: no I/O.

Traffic shares are fractions of traffic in [0, 1] everywhere (input and output), never percentages.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from quiver.registry.plain_words import alert_sentence as alert_sentence  # one place to read decisions from
from quiver.registry.plain_words import decision_sentence as decision_sentence
from quiver.registry.rollouts import Decision, Rollout, judged_time

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
    data_time: datetime | None = None  # the data time the look judged: what a chart's x-axis reads
    threshold_ms: float | None = None  # the latency cut-off the look recorded (latency_p99 only)


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
    record["sentence"] = decision_sentence(decision)
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
                row.status, row.estimate, row.lower, row.upper, row.floor, row.fail_above, decision.data_time,
                _recorded_cutoff(decision) if row.name == "latency_p99" else None))
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
    if versus and isinstance(metrics.get("best_epoch"), (int, float)) and metrics["best_epoch"] < 0:
        versus = f"it equals its logistic baseline: no epoch improved on the weights it started from; {versus}"
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


# ----- settings that differ from the defaults -----

# The judge setting behind each guardrail's floor (`quiver.monitoring.canary_settings.JudgeSettings`).
FLOOR_SETTINGS = {"error_rate": "error_rate_floor", "latency_p99": "latency_exceedance_floor",
                  "score_shift": "score_shift_floor", "log_loss": "log_loss_floor", "brier": "brier_floor"}
_SETTING_WORDS = {"error_rate_floor": "error-rate floor", "latency_exceedance_floor": "slow-call floor",
                  "score_shift_floor": "score-shift floor", "log_loss_floor": "log-loss floor",
                  "brier_floor": "Brier floor", "latency_p99_floor_ms": "latency cut-off margin (ms)"}


@dataclass(frozen=True)
class SettingChange:
    """One setting a decision was judged on that is not the default."""

    name: str
    used: Any
    default: Any

    @property
    def is_floor(self) -> bool:
        return self.name.endswith("_floor")

    @property
    def way(self) -> str:
        """A floor's 'looser' (higher: a worse canary passes) or 'stricter'; '' for other settings."""
        if self.is_floor and _is_number(self.used) and _is_number(self.default):
            return "looser" if self.used > self.default else "stricter"
        return ""

    @property
    def text(self) -> str:
        """'log-loss floor 0.08 (default 0.02, looser)'."""
        words = _SETTING_WORDS.get(self.name, self.name.replace("_", " "))
        way = f", {self.way}" if self.way else ""
        return f"{words} {_setting(self.used)} (default {_setting(self.default)}{way})"


def _setting(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list | tuple):
        return ", ".join(_setting(v) for v in value)
    return str(value)


def judged_settings(decision: Decision, rollout_settings: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The settings `decision` was judged on: its rollout's (stored with the rollout, so every look of it
    judges alike) or a shadow verdict's own, with the floor each guardrail recorded taking precedence (what
    the judge actually held it to)."""
    used: dict[str, Any] = dict(rollout_settings or {})
    if decision.kind == "shadow_evaluation":
        used = dict(decision.statistics.get("settings") or {})
    for row in guardrail_rows(decision):
        if row.name in FLOOR_SETTINGS and row.floor is not None:
            used[FLOOR_SETTINGS[row.name]] = row.floor
    return used


def non_default_settings(used: Mapping[str, Any], defaults: Mapping[str, Any]) -> list[SettingChange]:
    """The settings in `used` that differ from `defaults` (both as `to_dict()` gives them), floors first;
    settings the defaults do not know (older records) are left out."""
    changes = []
    for name, value in used.items():
        if name not in defaults:
            continue
        default = defaults[name]
        same = (math.isclose(float(value), float(default), rel_tol=1e-9, abs_tol=1e-12)
                if _is_number(value) and _is_number(default) else _plain(value) == _plain(default))
        if not same:
            changes.append(SettingChange(name, value, default))
    return sorted(changes, key=lambda c: (not c.is_floor, c.name))


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _plain(value: Any) -> Any:
    return [float(v) if _is_number(v) else v for v in value] if isinstance(value, list | tuple) else value


def floor_change(row: GuardrailRow, defaults: Mapping[str, Any]) -> SettingChange | None:
    """The guardrail's floor when it is not the default one (None: the default, or nothing to compare)."""
    setting = FLOOR_SETTINGS.get(row.name)
    default = defaults.get(setting) if setting else None
    if setting is None or row.floor is None or default is None or not _is_number(default):
        return None
    return None if math.isclose(row.floor, float(default)) else SettingChange(setting, row.floor, default)


def settings_note(changes: Sequence[SettingChange]) -> str:
    """The non-default settings in words, floors first ('' when every setting is the default)."""
    floors = [c.text for c in changes if c.is_floor]
    others = [c.text for c in changes if not c.is_floor]
    parts = ([f"Judged on non-default floors: {'; '.join(floors)}."] if floors else []) + (
        [("Other" if floors else "Judged on") + f" non-default settings: {'; '.join(others)}."] if others else [])
    return " ".join(parts)


# ----- the latency cut-off -----


def milliseconds(value: float) -> str:
    """A latency cut-off written one way wherever it is shown: at most two decimals ('9.31 ms', '12.5 ms')."""
    return f"{value:.2f}".rstrip("0").rstrip(".") + " ms"


@dataclass(frozen=True)
class LatencyCutoff:
    """The latency cut-off a page names for a decision or rollout: one recorded value, and which it is."""

    ms: float
    decision_id: int | None  # the look that recorded it; None: the rollout's pre-rollout reference

    @property
    def value(self) -> str:
        return milliseconds(self.ms)

    @property
    def source(self) -> str:
        if self.decision_id is None:
            return "the rollout's reference: the champion's p99 before the rollout + the margin"
        return (f"as decision #{self.decision_id} recorded it: the champion's p99 over its latest calls of the "
                f"step + the margin")


def _recorded_cutoff(decision: Decision) -> float | None:
    for g in decision.statistics.get("guardrails") or []:
        if g.get("name") == "latency_p99":
            s = g.get("statistics") or {}
            return _number(s.get("threshold_ms"))
    return None


def latency_cutoff(decisions: Sequence[Decision], reference: Mapping[str, Any] | None = None,
                   upto: int | None = None) -> LatencyCutoff | None:
    """The cut-off to name: the newest of `decisions` (up to decision `upto`) that recorded one — the judge
    moves it with the champion's calls, so each look records its own — else the rollout's reference."""
    for decision in sorted(decisions, key=lambda d: d.id, reverse=True):
        if upto is not None and decision.id > upto:
            continue
        recorded = _recorded_cutoff(decision)
        if recorded is not None:
            return LatencyCutoff(recorded, decision.id)
    start = _number((reference or {}).get("latency_threshold_ms"))
    return LatencyCutoff(start, None) if start is not None else None


_STEP_FROM_ZERO = re.compile(r"step (\d+)'s first look")


def latency_source_text(reference: Mapping[str, Any]) -> str:
    """Where a rollout's latency reference came from, steps counted from 1 as in every timeline (older
    records say "step 0's first look")."""
    text = str(reference.get("latency_source") or "")
    return _STEP_FROM_ZERO.sub(lambda m: f"the first look at step {int(m.group(1)) + 1}", text)


# ----- alerts -----


def alert_data_time(alert: Any, decision: Decision | None = None,
                    trained_until: datetime | None = None) -> tuple[datetime, str]:
    """(the data time an alert is about, where that comes from). Its own record when its detail names one;
    else the decision it announces; else (a retrain alert) the new version's training cutoff; else only the
    wall clock it was raised at, said so."""
    judged = judged_time(alert.detail)
    if judged is not None:
        return judged, "recorded"
    if decision is not None:
        return decision.data_time, f"decision #{decision.id}'s data time"
    if trained_until is not None:
        return trained_until, "the version's training cutoff"
    return alert.created_at, "wall clock (no data time recorded)"


SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}
