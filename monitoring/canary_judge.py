"""The canary rollout as registry state: start, judge a step, carry a decision out, watch, roll back.

The statistics live in `quiver.monitoring.canary_stats` (pure) and the evidence in
`quiver.monitoring.canary_evidence` (serving logs → statistics); this module only moves state, and every
move follows one pattern:

1. **Decide**: judge what the logs and labels say *as of* a given moment and record the decision with its
   statistics under an idempotency key (the same judgement twice stores one row).
2. **Apply in one transaction**: re-read the decision (applied already? then return what it did) and the
   rollout (still in the state and step the decision was made in? else the decision is stale and does
   nothing), compare-and-set every alias it moves, change the rollout, record its alert as pending for every
   sink, and mark the decision applied with its actions — all or nothing.
3. **Deliver** the alert after the commit, claiming each sink's delivery so it goes out once; a crash before
   that leaves it pending for `AlertManager.redeliver()` (every loop task calls it first).

Rollouts: `start_canary` (alias `canary` + a running rollout at the first step, with the champion's latency
reference fixed), `judge_step` (one look; advance / hold / promote / roll back / halt), after a promotion a
post-promotion **watch** (`watch_step`: the new champion against `previous`, which keeps scoring as the
shadow, on labels that arrive later; rolls back with an alert if the new one proves worse), and `rollback`
(an operator's: ends a running rollout, or reverts a watched promotion; refuses when there is neither).
A version whose rollout was rolled back or halted is never canaried again unless asked (`again=True`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import numpy as np

from quiver.catalog.errors import QuiverError
from quiver.monitoring.canary_stats import JudgeSettings, StepVerdict, judge, latency_threshold, watch_verdict
from quiver.offline.store import store_for
from quiver.registry import Registry, rollouts
from quiver.registry.rollouts import Decision, Rollout

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

    from quiver.config import Config
    from quiver.monitoring.canary_replay import Pairing

REFERENCE_WINDOW = timedelta(hours=1)  # champion traffic before a rollout that fixes its latency reference
# Rows are judged by their rollout tag; the time bound only limits the files read. Rows a server served in
# the moment before the rollout's recorded start (a clock a little behind) still carry its tag.
_READ_SLACK = timedelta(hours=1)


@dataclass(frozen=True)
class JudgeOutcome:
    """What one `judge_step` did: the verdict, its decision record (`created` False on a repeat; None on a
    dry run), the actions applied, the rollout afterwards, and where the champion's scores of the canary
    rows came from."""

    verdict: StepVerdict
    decision: Decision | None
    actions: tuple[str, ...]
    rollout: Rollout
    pairing: Pairing | None = None


class _Loop:
    """The registries and the alert manager of one project (opened once per call)."""

    def __init__(self, config: Config):
        from quiver.artifacts import ArtifactStore
        from quiver.monitoring.alerts import AlertManager, sinks_from_config
        from quiver.monitoring.settings import load_settings
        from quiver.registry.models import ModelRegistry

        self.config = config
        self.registry = Registry(config.registry, project=config.project)
        self.models = ModelRegistry(self.registry, ArtifactStore.from_config(config))
        self.alerts = AlertManager(self.registry, sinks_from_config(load_settings(config).alert_sinks))


# ----- judging -----


def judge_step(config: Config, model_name: str, *, as_of: datetime | None = None, apply: bool = True,
               by: str = "canary-judge", dry_run: bool = False) -> JudgeOutcome:
    """Judge the running rollout's current step on rows served under it and labels arrived by `as_of`
    (default now), record the decision (judging the same data again records nothing new) and apply it.
    `dry_run`: judge and return, record nothing."""
    loop = _Loop(config)
    as_of = as_of or datetime.now(UTC)
    rollout = rollouts.active_rollout(loop.registry, model_name)
    if rollout is None:
        raise QuiverError(f"model {model_name!r} has no running rollout; start one with `quiver canary start`")
    settings = JudgeSettings.from_dict(rollout.settings)
    logs, joined = _read(config, rollout.started_at - _READ_SLACK, as_of)
    from quiver.monitoring.canary_evidence import step_evidence, step_rows

    rows, pairing = _replayed(loop, rollout, step_rows(joined, rollout), logs)
    threshold = rollout.reference.get("latency_threshold_ms")
    if threshold is None and not dry_run:  # no traffic before the rollout: fix it once, from the first look
        first = _call_latencies(rows[rows["arm"] == "champion"])
        found = latency_threshold(first, settings)
        if found is not None:
            rollout = rollouts.set_reference(loop.registry, rollout.id, "latency_threshold_ms", found)
            rollout = rollouts.set_reference(loop.registry, rollout.id, "latency_source",
                                             f"champion calls of the first look at step {rollout.step + 1}")
            threshold = rollout.reference["latency_threshold_ms"]
    stats = step_evidence(rows, settings, threshold, _routing_columns(loop, model_name, rollout, joined))
    losses = _logging_losses(config, rollout.step_started_at, as_of)
    verdict = _hold_on_losses(judge(stats, rollout.fraction), losses, settings)
    if dry_run:
        return JudgeOutcome(verdict, None, (), rollout, pairing)
    statistics = {**verdict.to_dict(), "pairing": pairing.to_dict(), "serving_log": losses}
    key = _key("canary_step", rollout.id, rollout.step, statistics)
    statistics["window"] = {"step_started_at": rollout.step_started_at.isoformat(), "as_of": as_of.isoformat()}
    statistics["reference"] = rollout.reference
    decision = rollouts.record_decision(
        loop.registry, model_name, kind="canary_step", outcome=verdict.outcome, statistics=statistics,
        idempotency_key=key, rollout_id=rollout.id, step=rollout.step, fraction=rollout.fraction,
        champion_version=f"{model_name}:{rollout.champion_version}",
        candidate_version=f"{model_name}:{rollout.canary_version}", by=by, at=as_of)
    from quiver.monitoring import faults

    faults.point("judge.recorded")
    actions = apply_decision(config, decision, by=by, at=as_of) if apply else ()
    return JudgeOutcome(verdict, decision, actions, rollouts.get_rollout(loop.registry, rollout.id), pairing)


def _logging_losses(config: Config, start: datetime, end: datetime) -> dict[str, Any]:
    """What the serving loggers of every replica did not write in the step's hours (their accounts): rows
    dropped by reason and arm, and their share of the answering rows served."""
    from quiver.serving.logs.accounts import read_accounts
    from quiver.serving.logs.read import ANSWERING_ARMS

    accounts = read_accounts(store_for(config), start, end)
    lost = {arm: n for arm, n in accounts.dropped_by_arm().items() if arm in ANSWERING_ARMS or arm == "?"}
    served = sum(n for arm, n in accounts.written.items() if arm in ANSWERING_ARMS) + sum(lost.values())
    return {**accounts.to_dict(), "answering_dropped": sum(lost.values()),
            "answering_dropped_share": sum(lost.values()) / served if served else 0.0}


def _hold_on_losses(verdict: StepVerdict, losses: dict[str, Any], settings: JudgeSettings) -> StepVerdict:
    """An advance or promotion on evidence the loggers lost part of becomes a hold that says so."""
    share = losses["answering_dropped_share"]
    if verdict.outcome not in ("advance", "promote") or share <= settings.max_dropped_share:
        return verdict
    reasons = ", ".join(f"{n:,} {why}" for why, n in losses["dropped_by_reason"].items())
    return replace(verdict, outcome="hold", next_fraction=None, reason=(
        f"holding: the serving loggers dropped {losses['answering_dropped']:,} answering rows in this step's hours "
        f"({share:.1%}: {reasons}), more than max_dropped_share {settings.max_dropped_share:.1%}; the logged rows "
        f"are not the traffic (would have been: {verdict.reason})"))


def watch_step(config: Config, model_name: str, *, as_of: datetime | None = None,
               by: str = "canary-watch") -> dict[str, Any]:
    """One look of the post-promotion watch: new champion vs `previous` on every pair of scores of the same
    row (the rollout's canary rows scored by both, and since the promotion the shadow's), labels as of
    `as_of`. Rolls back when the new champion proves worse, confirms when the watch ends."""
    loop = _Loop(config)
    as_of = as_of or datetime.now(UTC)
    rollout = rollouts.watching_rollout(loop.registry, model_name)
    if rollout is None:
        return {"model": model_name, "outcome": "none", "reason": "no promotion under watch"}
    settings = JudgeSettings.from_dict(rollout.settings)
    logs, joined = _read(config, rollout.started_at - _READ_SLACK, as_of)
    from quiver.monitoring.canary_evidence import step_evidence, watch_rows

    # Since the promotion a row logs the new champion's inputs only: the old one's must be among them.
    served = loop.models.get(model_name, rollout.canary_version).features
    rows, pairing = _replayed(loop, rollout, watch_rows(joined, rollout), logs, served)
    stats = step_evidence(rows, settings, None, _routing_columns(loop, model_name, rollout, joined))
    assert rollout.watch_until is not None
    verdict = watch_verdict(stats, ended=as_of >= rollout.watch_until)
    statistics = {**verdict.to_dict(), "pairing": pairing.to_dict()}
    key = _key("watch", rollout.id, statistics, as_of >= rollout.watch_until)
    statistics["window"] = {"promoted_at": rollout.finished_at.isoformat() if rollout.finished_at else None,
                            "watch_until": rollout.watch_until.isoformat(), "as_of": as_of.isoformat()}
    decision = rollouts.record_decision(
        loop.registry, model_name, kind="watch", outcome=verdict.outcome, statistics=statistics,
        idempotency_key=key, rollout_id=rollout.id, step=rollout.step, fraction=1.0,
        champion_version=f"{model_name}:{rollout.canary_version}",
        candidate_version=f"{model_name}:{rollout.champion_version}", by=by, at=as_of)
    from quiver.monitoring import faults

    faults.point("watch.recorded")
    actions = apply_decision(config, decision, by=by, at=as_of)
    return {"model": model_name, "outcome": verdict.outcome, "reason": verdict.reason,
            "decision_id": decision.id, "new_decision": decision.created, "actions": list(actions),
            "rollout_id": rollout.id, "as_of": as_of.isoformat(), "champion": decision.champion_version,
            "previous": decision.candidate_version, "watch_until": rollout.watch_until.isoformat()}


def _replayed(loop: _Loop, rollout: Rollout, rows: pd.DataFrame, logs: pa.Table,
              served_inputs: list[str] | None = None) -> tuple[pd.DataFrame, Pairing]:
    """`rows` with the rollout's champion's scores replayed from the logged inputs of the canary-side rows
    the serving path did not pair (`quiver.monitoring.canary_replay`). During a rollout every row logs the
    inputs of both models, so `served_inputs` is needed only after it."""
    from quiver.monitoring.canary_replay import replay_pairs

    version = rollout.champion_version
    return replay_pairs(rows, logs, lambda: loop.models.load(rollout.model, version),
                        f"{rollout.model}:{version}", served_inputs=served_inputs)


def _read(config: Config, start: datetime, as_of: datetime) -> tuple[pa.Table, pd.DataFrame]:
    """The serving logs of [start, as_of) (feature columns and all), and their rows joined to the labels
    arrived by `as_of` (without the feature columns)."""
    from quiver.monitoring.evaluation import join_labels
    from quiver.monitoring.labels import read_labels
    from quiver.serving.logs import read_serving_logs

    logs = read_serving_logs(store_for(config), start, as_of)
    return logs, join_labels(logs, read_labels(store_for(config), as_of))


def _call_latencies(rows: pd.DataFrame) -> np.ndarray:
    if rows.empty:
        return np.zeros(0)
    calls = rows.drop_duplicates("call_id") if "call_id" in rows else rows
    return np.asarray(calls["latency_ms"].to_numpy(np.float64, na_value=np.nan), dtype=np.float64)


def _key(*parts: Any) -> str:
    from quiver.monitoring.evaluation import idempotency_key

    return idempotency_key(*parts)


# ----- applying, in one transaction -----


def apply_decision(config: Config, decision: Decision, *, by: str = "canary-judge",
                   at: datetime | None = None) -> tuple[str, ...]:
    """Carry out a recorded decision at most once, in one registry transaction (see the module docstring).
    A decision made on a rollout that has since moved on (another step, finished, rolled back by hand)
    does nothing and says so."""
    from quiver.monitoring import faults

    loop = _Loop(config)
    at = at or datetime.now(UTC)
    alert_ids: list[int] = []
    with loop.registry._write() as connection:
        current = rollouts.get_decision_in(connection, loop.registry.project, decision.id)
        if current.applied_at is not None:
            actions = current.actions
        else:
            if current.rollout_id is None:
                raise QuiverError(f"decision #{current.id} belongs to no rollout")
            rollout = rollouts.get_rollout_in(connection, loop.registry.project, current.rollout_id)
            moves = _Moves(loop, connection, current, rollout, by, at, alert_ids)
            actions = tuple(moves.carry_out())
            faults.point("apply.before_mark")
            rollouts.mark_applied_in(connection, current.id, list(actions), at)
    faults.point("apply.after_commit")
    for alert_id in alert_ids:
        loop.alerts.deliver(alert_id)
    return actions


class _Moves:
    """The state changes of one decision, inside its transaction."""

    def __init__(self, loop: _Loop, connection: Any, decision: Decision, rollout: Rollout, by: str,
                 at: datetime, alert_ids: list[int]):
        self.loop, self.connection, self.decision, self.rollout = loop, connection, decision, rollout
        self.by, self.at, self.alert_ids = by, at, alert_ids
        self.model = rollout.model
        self.aliases = loop.models.aliases_in(connection, self.model)
        self.actions: list[str] = []

    def carry_out(self) -> list[str]:
        decision, rollout = self.decision, self.rollout
        outcome = decision.outcome
        if decision.kind == "watch" or (decision.kind == "manual_rollback" and rollout.status == rollouts.WATCHING):
            if rollout.status != rollouts.WATCHING:
                return [f"stale: rollout #{rollout.id} is {rollout.status}, no longer watched; nothing done"]
            if outcome == "rollback":
                self._revert_promotion()
            elif outcome == "confirm":
                self._confirm()
            return self.actions
        if rollout.status != rollouts.RUNNING or rollout.step != decision.step:
            return [f"stale: decided at step {decision.step}, rollout #{rollout.id} is now {rollout.status} at "
                    f"step {rollout.step}; nothing done"]
        if outcome == "advance":
            following = float(decision.statistics["next_fraction"])
            if rollouts.advance_in(self.connection, rollout.id, from_step=rollout.step, fraction=following,
                                   at=self.at):
                self.actions.append(f"fraction {rollout.fraction:g} → {following:g}")
        elif outcome == "promote":
            self._promote()
        elif outcome in ("rollback", "halt"):
            self._stop(outcome)
        return self.actions

    def _reason(self, what: str) -> str:
        return f"{what} by decision #{self.decision.id}: {self.decision.statistics.get('reason', '')}"

    def _move(self, alias: str, version: int | None, expected: int | None, reason: str) -> None:
        from quiver.monitoring import faults

        self.loop.models.set_alias_in(self.connection, self.model, alias, version, expected=expected,
                                      reason=reason, by=self.by, decision_id=self.decision.id)
        self.aliases = self.loop.models.aliases_in(self.connection, self.model)
        self.actions.append(f"{alias} → {self.model}:{version}" if version is not None else f"{alias} removed")
        faults.point(f"apply.alias.{alias}")

    def _clear_if(self, alias: str, version: int, reason: str) -> None:
        if self.aliases.get(alias) == version:
            self._move(alias, None, version, reason)

    def _champion_is(self, version: int) -> bool:
        """Whether the champion is still the one the decision was made about (else: stale, do nothing)."""
        if self.aliases.get("champion") == version:
            return True
        self.actions.append(f"stale: champion is {self.aliases.get('champion')}, not {version} as when "
                            f"decided; nothing done")
        return False

    def _promote(self) -> None:
        rollout = self.rollout
        if not self._champion_is(rollout.champion_version):
            return
        reason = self._reason("canary promoted")
        self._move("champion", rollout.canary_version, rollout.champion_version, reason)
        self._model_changed(rollout.canary_version)
        self._clear_if("canary", rollout.canary_version, reason)
        self._clear_if("challenger", rollout.canary_version, reason)
        settings = JudgeSettings.from_dict(rollout.settings)
        watch = settings.watch_hours > 0
        if watch and self.aliases.get("shadow") is None:  # the old champion keeps scoring, off the path
            self._move("shadow", rollout.champion_version, None,
                       f"post-promotion watch of {self.model}:{rollout.canary_version} against the old champion")
        status = rollouts.WATCHING if watch else rollouts.PROMOTED
        until = self.at + timedelta(hours=settings.watch_hours) if watch else None
        if rollouts.change_status_in(self.connection, rollout.id, rollouts.RUNNING, status, fraction=1.0,
                                     at=self.at, watch_until=until):
            self.actions.append(f"rollout {status}" + (f" until {until:%Y-%m-%d %H:%M}" if until else ""))
        self._alert("canary_promoted", "info", f"{self.model}:{rollout.canary_version} promoted to champion")

    def _stop(self, outcome: str) -> None:
        rollout = self.rollout
        reason = self._reason("rolled back" if outcome == "rollback" else "halted")
        self._clear_if("canary", rollout.canary_version, reason)
        self._clear_if("challenger", rollout.canary_version, reason)  # the candidacy ends here
        status = rollouts.ROLLED_BACK if outcome == "rollback" else rollouts.HALTED
        if rollouts.change_status_in(self.connection, rollout.id, rollouts.RUNNING, status, fraction=0.0,
                                     at=self.at):
            self.actions.append(f"rollout {status}")
        kind = "canary_rollback" if outcome == "rollback" else "canary_halted"
        self._alert(kind, "critical", f"canary {self.model}:{rollout.canary_version} "
                                      f"{'rolled back' if outcome == 'rollback' else 'halted'} at {rollout.fraction:g}")

    def _revert_promotion(self) -> None:
        from quiver.monitoring import faults

        rollout = self.rollout
        if not self._champion_is(rollout.canary_version):
            return
        reason = self._reason("promotion reverted")
        move = self.loop.models.rollback_in(self.connection, self.model, reason=reason, by=self.by,
                                            decision_id=self.decision.id, expected=rollout.canary_version)
        self.aliases = self.loop.models.aliases_in(self.connection, self.model)
        self.actions.append(f"champion {move.from_version} → {move.to_version}")
        self._model_changed(move.to_version)
        faults.point("apply.alias.champion")
        self._clear_if("shadow", rollout.champion_version, reason)
        if rollouts.change_status_in(self.connection, rollout.id, rollouts.WATCHING, rollouts.ROLLED_BACK,
                                     fraction=0.0, at=self.at):
            self.actions.append(f"rollout {rollouts.ROLLED_BACK}")
        self._alert("promotion_reverted", "critical",
                    f"{self.model}:{rollout.canary_version} rolled back to {self.model}:{move.to_version} after "
                    f"its promotion")

    def _model_changed(self, version: Any) -> None:
        """Drift alerts judged against the old champion's reference resolve with the change (same transaction);
        the new champion's own drift check raises its own."""
        from quiver.monitoring import repository

        repository.resolve_model_changed_in(self.connection, self.loop.registry.project, self.model,
                                            f"{self.model}:{version}", keep_unlabelled=False, as_of=self.at)

    def _confirm(self) -> None:
        rollout = self.rollout
        self._clear_if("shadow", rollout.champion_version, self._reason("post-promotion watch ended"))
        if rollouts.change_status_in(self.connection, rollout.id, rollouts.WATCHING, rollouts.PROMOTED,
                                     fraction=1.0, at=self.at):
            self.actions.append(f"rollout {rollouts.PROMOTED}")

    def _alert(self, kind: str, severity: str, title: str) -> None:
        from quiver.monitoring import faults
        from quiver.monitoring.repository import open_alert_in

        decision, rollout = self.decision, self.rollout
        record, outcome = open_alert_in(
            self.connection, self.loop.registry.project, kind, f"{self.model}:{rollout.canary_version}",
            severity, title, str(decision.statistics.get("reason", "")),
            {"decision_id": decision.id, "rollout_id": rollout.id, "actions": list(self.actions),
             "as_of": decision.data_time.isoformat()},  # the data time it judged, for every sink
            list(self.loop.alerts.sinks))
        if outcome != "repeated":
            self.alert_ids.append(record.id)
        self.actions.append(f"alert #{record.id} {kind}")
        faults.point("apply.alert")


# ----- starting and stopping -----


def start_canary(config: Config, model_name: str, version: int, *, settings: JudgeSettings | None = None,
                 by: str = "", reason: str = "", at: datetime | None = None, again: bool = False) -> Rollout:
    """Point alias `canary` at `version` and start a rollout at the first step (needs a champion), in one
    transaction. The latency reference is fixed from the champion's calls of the hour before `at` (default
    now; replays of simulated time pass theirs). A version whose last rollout was rolled back or halted is
    refused unless `again`."""
    loop = _Loop(config)
    settings = settings or JudgeSettings()
    at = at or datetime.now(UTC)
    reference = _latency_reference(config, settings, at)
    ended = rollouts.ended_candidacies(loop.registry, model_name).get(version)
    if ended is not None and not again:
        raise QuiverError(f"{model_name}:{version} was {ended.status.replace('_', ' ')} in rollout #{ended.id}; "
                          f"canary it again only on purpose (`quiver canary start --again`)")
    from quiver.monitoring import faults

    with loop.registry._write() as connection:
        current = loop.models.aliases_in(connection, model_name)
        champion = current.get("champion")
        if champion is None:
            raise QuiverError(f"model {model_name!r} has no champion to compare a canary with")
        why = reason or f"canary rollout of {model_name}:{version}"
        if current.get("shadow") == version:  # the canary serves it for real now; shadowing too would double-log
            loop.models.set_alias_in(connection, model_name, "shadow", None, expected=version,
                                     reason=f"moved on to canary: {why}", by=by, as_of=at)  # data time, as below
        if current.get("canary") != version:
            loop.models.set_alias_in(connection, model_name, "canary", version, expected=current.get("canary"),
                                     reason=why, by=by, as_of=at)
            faults.point("start.alias.canary")
        return rollouts.start_rollout_in(connection, loop.registry.project, model_name, champion_version=champion,
                                         canary_version=version, fraction=settings.steps[0],
                                         settings=settings.to_dict(), by=by, now=at, reference=reference)


def _latency_reference(config: Config, settings: JudgeSettings, at: datetime) -> dict[str, Any]:
    from quiver.serving.logs import read_serving_logs

    logs = read_serving_logs(store_for(config), at - REFERENCE_WINDOW, at, arm="champion")
    if logs.num_rows == 0:
        return {}
    frame = logs.select([c for c in ("call_id", "latency_ms") if c in logs.column_names]).to_pandas()
    threshold = latency_threshold(_call_latencies(frame), settings)
    if threshold is None:
        return {}
    return {"latency_threshold_ms": threshold,
            "latency_source": f"champion calls in [{(at - REFERENCE_WINDOW).isoformat()}, {at.isoformat()})"}


def rollback(config: Config, model_name: str, *, reason: str, by: str = "") -> tuple[Decision, tuple[str, ...]]:
    """An operator's rollback: end the running rollout (canary removed, the candidacy ended) or revert a
    promotion still under watch (champion ← previous). Refused when there is neither — moving the
    production champion is `quiver models alias rollback --expected N`."""
    loop = _Loop(config)
    rollout = rollouts.active_rollout(loop.registry, model_name) or rollouts.watching_rollout(loop.registry,
                                                                                            model_name)
    if rollout is None:
        done = _manual_rollback_of_latest(loop, model_name)
        if done is not None:  # a retry (or a second operator): the rollback that already ended it
            return done, apply_decision(config, done, by=by)
        champion = loop.models.aliases(model_name).get("champion")
        raise QuiverError(f"model {model_name!r} has no running or watched rollout: nothing to roll back. To put "
                          f"the previous champion back, run `quiver models alias rollback {model_name} "
                          f"--expected {champion} --reason …`")
    stats = {"reason": reason, "aliases_before": loop.models.aliases(model_name), "status": rollout.status}
    watching = rollout.status == rollouts.WATCHING
    decision = rollouts.record_decision(
        loop.registry, model_name, kind="manual_rollback", outcome="rollback", statistics=stats,
        idempotency_key=_key("manual_rollback", rollout.id, rollout.status), rollout_id=rollout.id,
        step=rollout.step, fraction=rollout.fraction,
        champion_version=f"{model_name}:{rollout.canary_version if watching else rollout.champion_version}",
        candidate_version=f"{model_name}:{rollout.champion_version if watching else rollout.canary_version}", by=by)
    from quiver.monitoring import faults

    faults.point("rollback.recorded")
    return decision, apply_decision(config, decision, by=by)


# ----- helpers -----


def _manual_rollback_of_latest(loop: _Loop, model: str) -> Decision | None:
    """The manual rollback that ended `model`'s newest rollout, if that is how it ended and nothing has moved
    the champion since (then a second call is a retry of the first; else a new request, refused)."""
    latest = rollouts.list_rollouts(loop.registry, model)[:1]
    if not latest or latest[0].status != rollouts.ROLLED_BACK:
        return None
    found = rollouts.list_decisions(loop.registry, model, rollout_id=latest[0].id, kind="manual_rollback", limit=1)
    if not found:
        return None
    decision = found[0]
    # Ending a running rollout keeps the champion; reverting a watched promotion puts back the candidate.
    expected = decision.candidate_version if decision.statistics.get("status") == rollouts.WATCHING \
        else decision.champion_version
    champion = loop.models.aliases(model).get("champion")
    return decision if f"{model}:{champion}" == expected else None


def _routing_columns(loop: _Loop, model: str, rollout: Rollout, joined: pd.DataFrame) -> list[str]:
    """The serving-log column of the key the split hashed (rows of one user share an arm, so counting
    user × merchant pairs would see a mismatch that is not there); every key column when it is unknown."""
    import json

    from quiver.models.artifact import MODEL_FILE
    from quiver.registry.repository import load_applied_catalog
    from quiver.serving.arms import routing_key_for
    from quiver.serving.logs import KEY_PREFIX

    keys = [c for c in joined.columns if c.startswith(KEY_PREFIX)]
    with contextlib.suppress(OSError, KeyError, ValueError, QuiverError):
        version = loop.models.get(model, rollout.champion_version)
        meta = json.loads((loop.models.artifacts.local_dir(version.artifact_path) / MODEL_FILE).read_text())
        column = KEY_PREFIX + routing_key_for(load_applied_catalog(loop.config).catalog, meta["feature_refs"])
        if column in keys:
            return [column]
    return keys
