"""Rollouts and decisions in the registry (tables in `quiver.registry.rollout_tables`).

Every write runs under the registry's write lock. State changes are compare-and-set on what the caller saw
(the rollout's step and status), so two judges racing on one step move it once; decisions are keyed by an
idempotency key, so recording the same judgement twice stores one row. The `*_in` functions run inside a
caller's transaction, so a decision, the rollout change, the alias moves it causes (through
`quiver.registry.models.ModelRegistry.set_alias_in`, with the decision's id), its alert and the mark that it
was applied commit together or not at all.

A rollout is `running` while the canary serves a share of traffic, `watching` after a promotion while the new
champion is compared with `previous` on labels that arrive later (until `watch_until`), and ends
`promoted`, `rolled_back` or `halted`.

Two clocks (migration 0007): a decision keeps the data time it judged (`as_of`: labels and serving logs up to
it) and the wall time it was recorded (`recorded_at`). In a replay or a simulation they differ by weeks, so
timelines sort by one of them — the data time, the loop's story (`timeline`) — and say which they show.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import RowMapping, insert, select, update
from sqlalchemy.exc import IntegrityError

from quiver.catalog.errors import QuiverError
from quiver.registry.repository import Registry, _author
from quiver.registry.rollout_tables import decisions, rollouts

RUNNING, WATCHING, PROMOTED, ROLLED_BACK, HALTED = "running", "watching", "promoted", "rolled_back", "halted"
STATUSES = (RUNNING, WATCHING, PROMOTED, ROLLED_BACK, HALTED)
ENDED = (PROMOTED, ROLLED_BACK, HALTED)


@dataclass(frozen=True)
class Rollout:
    """One canary rollout of a model."""

    id: int
    model: str
    champion_version: int
    canary_version: int
    salt: str
    fraction: float
    step: int
    status: str
    settings: dict[str, Any]
    step_started_at: datetime
    started_at: datetime
    finished_at: datetime | None
    started_by: str
    reference: dict[str, Any] = field(default_factory=dict)  # fixed at the start: latency threshold, …
    watch_until: datetime | None = None
    recorded_at: datetime | None = None  # wall time stored; started_at is the data time it started at


@dataclass(frozen=True)
class Decision:
    """One recorded decision with the statistics behind it."""

    id: int
    model: str
    rollout_id: int | None
    kind: str
    outcome: str
    step: int | None
    fraction: float | None
    champion_version: str
    candidate_version: str
    statistics: dict[str, Any]
    idempotency_key: str
    decided_at: datetime
    decided_by: str
    created: bool = field(default=True, compare=False)  # False: an identical decision was already stored
    applied_at: datetime | None = None  # when it was carried out (None: not yet)
    actions: tuple[str, ...] = ()  # what carrying it out did (or why it did nothing)
    as_of: datetime | None = None  # the data time judged (None only on a Decision built by hand)
    recorded_at: datetime | None = None  # the wall time stored (None: a row from before migration 0007)

    @property
    def data_time(self) -> datetime:
        """The data time judged: the one clock timelines sort by."""
        return self.as_of or self.decided_at


def start_rollout(registry: Registry, model: str, *, champion_version: int, canary_version: int,
                  fraction: float, settings: dict[str, Any], by: str = "", salt: str | None = None,
                  now: datetime | None = None, reference: dict[str, Any] | None = None) -> Rollout:
    """Record a running rollout; refused while another rollout of `model` is running or watched."""
    with registry._write() as connection:
        return start_rollout_in(connection, registry.project, model, champion_version=champion_version,
                                canary_version=canary_version, fraction=fraction, settings=settings, by=by,
                                salt=salt, now=now, reference=reference)


def start_rollout_in(connection: Any, project: str, model: str, *, champion_version: int, canary_version: int,
                     fraction: float, settings: dict[str, Any], by: str = "", salt: str | None = None,
                     now: datetime | None = None, reference: dict[str, Any] | None = None) -> Rollout:
    """`start_rollout` inside the caller's write transaction."""
    if champion_version == canary_version:
        raise QuiverError(f"model {model!r}: the canary must differ from the champion (both {champion_version})")
    now = now or datetime.now(UTC)
    running = connection.execute(select(rollouts.c.id, rollouts.c.status).where(
        rollouts.c.project == project, rollouts.c.model == model,
        rollouts.c.status.in_((RUNNING, WATCHING)))).first()
    if running is not None:
        raise QuiverError(f"model {model!r} already has a {running.status} rollout (#{running.id}); step, promote "
                          f"or roll it back first")
    key = connection.execute(insert(rollouts).values(
        project=project, model=model, champion_version=champion_version,
        canary_version=canary_version, salt=salt or secrets.token_hex(8), fraction=float(fraction), step=0,
        status=RUNNING, settings_json=json.dumps(settings, sort_keys=True), step_started_at=now,
        started_at=now, finished_at=None, started_by=(by or _author())[:255], recorded_at=datetime.now(UTC),
        reference_json=json.dumps(reference or {}, sort_keys=True, default=str))).inserted_primary_key
    assert key is not None
    return get_rollout_in(connection, project, int(key[0]))


def get_rollout(registry: Registry, rollout_id: int) -> Rollout:
    with registry.engine.connect() as connection:
        return get_rollout_in(connection, registry.project, rollout_id)


def get_rollout_in(connection: Any, project: str, rollout_id: int) -> Rollout:
    row = connection.execute(select(rollouts).where(rollouts.c.project == project,
                                                    rollouts.c.id == rollout_id)).mappings().first()
    if row is None:
        raise QuiverError(f"no rollout #{rollout_id} in project {project!r}")
    return _rollout(row)


def active_rollout(registry: Registry, model: str) -> Rollout | None:
    """The running rollout of `model`, or None."""
    return _one_with_status(registry, model, RUNNING)


def watching_rollout(registry: Registry, model: str) -> Rollout | None:
    """The promoted rollout of `model` still under its post-promotion watch, or None."""
    return _one_with_status(registry, model, WATCHING)


def _one_with_status(registry: Registry, model: str, status: str) -> Rollout | None:
    with registry.engine.connect() as connection:
        row = connection.execute(select(rollouts).where(
            rollouts.c.project == registry.project, rollouts.c.model == model,
            rollouts.c.status == status).order_by(rollouts.c.id.desc())).mappings().first()
    return _rollout(row) if row else None


def ended_candidacies(registry: Registry, model: str) -> dict[int, Rollout]:
    """Versions whose last rollout was rolled back or halted (the loop never canaries them again unless an
    operator says so), each with that rollout."""
    out: dict[int, Rollout] = {}
    for rollout in reversed(list_rollouts(registry, model)):  # oldest first: the newest rollout wins
        if rollout.status in (ROLLED_BACK, HALTED):
            out[rollout.canary_version] = rollout
        else:
            out.pop(rollout.canary_version, None)
    return out


def set_reference(registry: Registry, rollout_id: int, key: str, value: Any) -> Rollout:
    """Fix `reference[key]` of a rollout once (the first writer wins; later calls keep that value)."""
    with registry._write() as connection:
        rollout = get_rollout_in(connection, registry.project, rollout_id)
        if key not in rollout.reference:
            reference = {**rollout.reference, key: value}
            connection.execute(update(rollouts).where(rollouts.c.id == rollout_id).values(
                reference_json=json.dumps(reference, sort_keys=True, default=str)))
        return get_rollout_in(connection, registry.project, rollout_id)


def list_rollouts(registry: Registry, model: str | None = None) -> list[Rollout]:
    """Rollouts, newest first."""
    query = select(rollouts).where(rollouts.c.project == registry.project)
    if model is not None:
        query = query.where(rollouts.c.model == model)
    with registry.engine.connect() as connection:
        return [_rollout(r) for r in connection.execute(query.order_by(rollouts.c.id.desc())).mappings()]


def advance_rollout(registry: Registry, rollout_id: int, *, from_step: int, fraction: float,
                    at: datetime) -> bool:
    """Move a running rollout from `from_step` to the next step at `fraction`; False when it had moved already."""
    with registry._write() as connection:
        return advance_in(connection, rollout_id, from_step=from_step, fraction=fraction, at=at)


def advance_in(connection: Any, rollout_id: int, *, from_step: int, fraction: float, at: datetime) -> bool:
    result = connection.execute(update(rollouts).where(
        rollouts.c.id == rollout_id, rollouts.c.status == RUNNING, rollouts.c.step == from_step).values(
        step=from_step + 1, fraction=float(fraction), step_started_at=at))
    return bool(result.rowcount)


def finish_rollout(registry: Registry, rollout_id: int, status: str, *, fraction: float,
                   at: datetime | None = None) -> bool:
    """End a running rollout (promoted | rolled_back | halted); False when it was no longer running."""
    with registry._write() as connection:
        return change_status_in(connection, rollout_id, RUNNING, status, fraction=fraction, at=at)


def change_status_in(connection: Any, rollout_id: int, from_status: str, status: str, *, fraction: float,
                     at: datetime | None = None, watch_until: datetime | None = None) -> bool:
    """Move a rollout from `from_status` to `status` (compare-and-set); False when it had moved already."""
    if status not in STATUSES or status == RUNNING:
        raise ValueError(f"a rollout moves on to watching, promoted, rolled_back or halted, not {status!r}")
    values: dict[str, Any] = {"status": status, "fraction": float(fraction), "watch_until": watch_until}
    if status in ENDED or status == WATCHING:
        values["finished_at"] = at or datetime.now(UTC)
    if from_status == WATCHING:
        values.pop("finished_at")  # the promotion's moment stays the rollout's end
        values["watch_until"] = None
    result = connection.execute(update(rollouts).where(
        rollouts.c.id == rollout_id, rollouts.c.status == from_status).values(**values))
    return bool(result.rowcount)


def mark_applied_in(connection: Any, decision_id: int, actions: list[str], at: datetime) -> bool:
    """Record that a decision was carried out (and what that did); False when it already was."""
    result = connection.execute(update(decisions).where(
        decisions.c.id == decision_id, decisions.c.applied_at.is_(None)).values(
        applied_at=at, actions_json=json.dumps(actions)))
    return bool(result.rowcount)


def get_decision_in(connection: Any, project: str, decision_id: int) -> Decision:
    row = connection.execute(select(decisions).where(decisions.c.project == project,
                                                     decisions.c.id == decision_id)).mappings().first()
    if row is None:
        raise QuiverError(f"no decision #{decision_id} in project {project!r}")
    return _decision(row)


def record_decision(registry: Registry, model: str, *, kind: str, outcome: str, statistics: dict[str, Any],
                    idempotency_key: str, rollout_id: int | None = None, step: int | None = None,
                    fraction: float | None = None, champion_version: str = "", candidate_version: str = "",
                    by: str = "", at: datetime | None = None, as_of: datetime | None = None) -> Decision:
    """Store a decision unless one with the same idempotency key exists; either way return the stored one
    (`created` says which).

    `as_of` is the data time judged (default: `at`, else the statistics' `window.as_of`, else now); the wall
    time it is stored at is recorded beside it. `at` is `decided_at`, the moment it takes effect (default now).
    """
    if not 16 <= len(idempotency_key) <= 64:
        raise ValueError("idempotency_key must be 16–64 characters (a digest of the decision's inputs)")
    blob = json.dumps(statistics, sort_keys=True, default=str, allow_nan=False)
    try:
        with registry._write() as connection:
            existing = _decision_by_key(connection, registry.project, idempotency_key)
            if existing is not None:
                return _decision(existing, created=False)
            key = connection.execute(insert(decisions).values(
                project=registry.project, model=model, rollout_id=rollout_id, kind=kind, outcome=outcome,
                step=step, fraction=fraction, champion_version=champion_version,
                candidate_version=candidate_version, statistics_json=blob, idempotency_key=idempotency_key,
                decided_at=at or datetime.now(UTC), decided_by=(by or _author())[:255],
                as_of=as_of or at or judged_time(statistics) or datetime.now(UTC),
                recorded_at=datetime.now(UTC))).inserted_primary_key
    except IntegrityError:  # a concurrent writer stored the same key between our check and insert
        with registry.engine.connect() as connection:
            row = _decision_by_key(connection, registry.project, idempotency_key)
        if row is None:
            raise
        return _decision(row, created=False)
    assert key is not None
    return get_decision(registry, int(key[0]))


def get_decision(registry: Registry, decision_id: int) -> Decision:
    with registry.engine.connect() as connection:
        return get_decision_in(connection, registry.project, decision_id)


def list_decisions(registry: Registry, model: str | None = None, *, rollout_id: int | None = None,
                   kind: str | None = None, limit: int = 100) -> list[Decision]:
    """Decisions, newest first."""
    query = select(decisions).where(decisions.c.project == registry.project)
    if model is not None:
        query = query.where(decisions.c.model == model)
    if rollout_id is not None:
        query = query.where(decisions.c.rollout_id == rollout_id)
    if kind is not None:
        query = query.where(decisions.c.kind == kind)
    with registry.engine.connect() as connection:
        rows = connection.execute(query.order_by(decisions.c.id.desc()).limit(limit)).mappings()
        return [_decision(r) for r in rows]


def timeline(found: Iterable[Decision], *, newest_first: bool = True) -> list[Decision]:
    """Decisions in the order of the data time they judged (ties: the order recorded), never the wall clock:
    a verdict recorded today about last week's data sits beside last week's canary steps."""
    return sorted(found, key=lambda d: (d.data_time, d.id), reverse=newest_first)


def judged_time(detail: Mapping[str, Any] | None) -> datetime | None:
    """The data time a record's statistics or detail say it judged: `as_of`, else its window's `as_of` or
    `end`; None when they say none."""
    detail = detail or {}
    window = detail.get("window")
    window = window if isinstance(window, Mapping) else {}
    for value in (detail.get("as_of"), window.get("as_of"), window.get("end")):
        if isinstance(value, datetime):
            return _utc(value)
        if isinstance(value, str) and value:
            try:
                return _utc(datetime.fromisoformat(value))
            except ValueError:
                continue
    return None


def _decision_by_key(connection: Any, project: str, key: str) -> RowMapping | None:
    row: RowMapping | None = connection.execute(select(decisions).where(
        decisions.c.project == project, decisions.c.idempotency_key == key)).mappings().first()
    return row


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _rollout(row: RowMapping) -> Rollout:
    step_started, started = _utc(row["step_started_at"]), _utc(row["started_at"])
    assert step_started is not None and started is not None
    return Rollout(int(row["id"]), row["model"], int(row["champion_version"]), int(row["canary_version"]),
                   row["salt"], float(row["fraction"]), int(row["step"]), row["status"],
                   json.loads(row["settings_json"]), step_started, started, _utc(row["finished_at"]),
                   row["started_by"], json.loads(row["reference_json"] or "{}"), _utc(row["watch_until"]),
                   _utc(row["recorded_at"]))


def _decision(row: RowMapping, created: bool = True) -> Decision:
    decided = _utc(row["decided_at"])
    assert decided is not None
    return Decision(int(row["id"]), row["model"], row["rollout_id"], row["kind"], row["outcome"], row["step"],
                    row["fraction"], row["champion_version"], row["candidate_version"],
                    json.loads(row["statistics_json"]), row["idempotency_key"], decided, row["decided_by"],
                    created, _utc(row["applied_at"]), tuple(json.loads(row["actions_json"] or "[]")),
                    _utc(row["as_of"]) or decided, _utc(row["recorded_at"]))
