"""The pieces of the prediction service: loaded arms, the arm set swapped as a whole, per-row answers,
counters, canary routing, and the column helpers of a request (see quiver.serving.prediction)."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from quiver.catalog.errors import QuiverError
from quiver.online.base import ColumnBlock
from quiver.serving.micro_batch import MicroBatcher

if TYPE_CHECKING:
    from quiver.serving.result import OnlineResult

_HASH_SCALE = float(1 << 64)
# Error prefix of a routed row whose arm never ran (its request failed first): logged so the canary judge
# counts what the router assigned; never a failure of that arm's model.
NOT_RUN = "not run: "


class Model(Protocol):
    """What the service needs of a scorer (quiver.models.artifact.Scorer has it)."""

    @property
    def features(self) -> list[str]: ...

    @property
    def feature_refs(self) -> list[str]: ...

    version_label: str

    def predict(self, columns: Mapping[str, Any]) -> np.ndarray: ...


@dataclass(frozen=True)
class Arm:
    """One loaded model version (`model` None: it failed to load, `error` says why)."""

    version: int
    label: str
    model: Model | None
    error: str = ""
    batcher: MicroBatcher | None = None

    def predict(self, columns: Mapping[str, Any], n: int) -> np.ndarray:
        """Scores of `n` rows, through the micro-batcher when there is one."""
        assert self.model is not None
        if self.batcher is not None:
            return self.batcher.predict(columns, n)
        return np.asarray(self.model.predict(columns), dtype=np.float64)


@dataclass(frozen=True)
class ArmSet:
    """Everything one request needs, swapped as a whole."""

    champion: Arm
    canary: Arm | None = None
    shadow: Arm | None = None
    salt: str = ""
    fraction: float = 0.0
    rollout_id: int | None = None
    feature_refs: tuple[str, ...] = ()
    step: int = 0

    @cached_property
    def served_features(self) -> tuple[str, ...]:
        """The input columns of the champion and the canary (what the serving log keeps of each row)."""
        names: dict[str, None] = {}
        for arm in (self.champion, self.canary):
            if arm is not None and arm.model is not None:
                names.update(dict.fromkeys(arm.model.features))
        return tuple(names)

    @property
    def rollout(self) -> tuple[int, int, float] | None:
        """(rollout id, step, canary fraction) that rows served by this set are tagged with, or None."""
        return None if self.rollout_id is None else (self.rollout_id, self.step, self.fraction)

    def describe(self) -> str:
        """What this set serves, in one line (printed by `serve-model` at start and on every swap)."""
        def arm(a: Arm | None) -> str:
            if a is None:
                return "-"
            return a.label if a.model is not None else f"{a.label} (not loaded: {a.error})"

        canary = "-" if self.canary is None else (f"{arm(self.canary)} at canary share {self.fraction:g} (rollout "
                                                  f"#{self.rollout_id}, step {self.step + 1})")
        return f"champion {arm(self.champion)}, canary {canary}, shadow {arm(self.shadow)}"

    @property
    def key(self) -> tuple[Any, ...]:
        """What decides whether a fresh set replaces this one: versions, routing, and which arms loaded (an
        arm that failed to load and loads now must be swapped in)."""
        def state(arm: Arm | None) -> tuple[int, bool] | None:
            return None if arm is None else (arm.version, arm.model is not None)

        return (state(self.champion), state(self.canary), state(self.shadow), self.salt, self.fraction,
                self.rollout_id, self.step)


@dataclass(frozen=True)
class Prediction:
    request_id: str
    score: float  # NaN when refused
    model_version: str
    arm: str  # champion | canary
    fallback: bool = False  # routed to the canary, served by the champion
    missing: int = 0  # inputs of the serving model that were missing (NOT_FOUND, OUTSIDE_MAX_AGE, null)
    flagged: bool = False  # more inputs missing than the model's policy allows, scored anyway
    refused: bool = False  # more inputs missing than the model's policy allows: no score
    missing_features: tuple[str, ...] = ()  # which (filled only when asked for)


def missing_inputs(model: Model, statuses: Mapping[str, np.ndarray], n: int) -> tuple[np.ndarray, list[str]]:
    """Per row, how many of `model`'s inputs were not PRESENT, and the model's input names checked."""
    from quiver.online.base import FieldStatus

    names = [f for f in model.features if f in statuses]
    if not names:
        return np.zeros(n, dtype=np.int64), names
    # One comparison over a (features × rows) array, against a plain int: comparing an array with the enum
    # member makes numpy probe the enum's attributes each time (~2 µs per feature).
    codes = np.stack([statuses[name] for name in names])
    return np.count_nonzero(codes != int(FieldStatus.PRESENT), axis=0).astype(np.int64), names


def over_policy(model: Model, missing: np.ndarray) -> tuple[str, np.ndarray]:
    """(policy action, rows beyond the model's missing-input share)."""
    from quiver.models.artifact import MissingPolicy

    policy = getattr(model, "missing_policy", None) or MissingPolicy()
    share = missing / max(len(model.features), 1)
    return policy.action, share > policy.max_missing_share


@dataclass
class ServiceStats:
    """Counters since start (also exported on /metrics)."""

    requests: int = 0
    rows: int = 0
    champion_rows: int = 0
    champion_errors: int = 0
    canary_rows: int = 0
    canary_fallbacks: int = 0
    shadow_rows: int = 0
    shadow_errors: int = 0
    shadow_dropped: int = 0
    paired_rows: int = 0
    paired_errors: int = 0
    paired_dropped: int = 0
    swaps: int = 0
    swap_failures: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        with self.lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return {k: v for k, v in vars(self).items() if k != "lock"}


def routing_key_for(catalog: Any, feature_refs: Sequence[str]) -> str:
    """The entity key canary routing hashes by default: the first join key the model's features need, in
    the online read's key order. The service routes by it and the canary judge counts its distinct values
    as the units of the sample-ratio check, so both take it from here."""
    from quiver.serving.store import resolve

    return resolve(catalog, list(feature_refs)).keys[0][0]


def route_share(salt: str, keys: Sequence[Any]) -> np.ndarray:
    """Stable pseudo-random share in [0, 1) per routing key (blake2b of salt and key)."""
    prefix = salt.encode() + b"\x00"
    return np.array([int.from_bytes(hashlib.blake2b(prefix + str(k).encode(), digest_size=8).digest(), "big")
                     / _HASH_SCALE for k in keys], dtype=np.float64)


class RowInputs:
    """A request's model inputs. A model whose features are one float64 block of the read (the usual case: one
    view's numbers) gets that array as a ColumnBlock, without splitting it into columns and stacking them back;
    any other gets the columns of `to_dict` and the request fields, made once per request."""

    def __init__(self, result: OnlineResult, fields: Mapping[str, Any], n: int):
        self.result, self.fields, self.n = result, fields, n
        self._columns: dict[str, Any] | None = None

    def columns(self) -> dict[str, Any]:
        """Request fields and every feature read, as columns."""
        if self._columns is None:
            self._columns = {**self.fields, **self.result.to_dict()}
        return self._columns

    def of(self, names: Sequence[str], rows: np.ndarray | None = None) -> Mapping[str, Any]:
        """The inputs `names` of the rows `rows` (a mask; None: all)."""
        block = self.result.block(names)
        if block is not None:
            return block if rows is None else block.take(rows)
        columns = self.columns()
        return dict(columns) if rows is None else _take(columns, rows, self.n)


def join_inputs(parts: Sequence[Mapping[str, Any]], names: Sequence[str]) -> Mapping[str, Any]:
    """Several requests' inputs `names` as one: their blocks joined in one call when all are blocks of the
    same names, else one concatenation per column."""
    first = parts[0]
    if isinstance(first, ColumnBlock) and all(isinstance(p, ColumnBlock) and p.names == first.names
                                              for p in parts):
        return first if len(parts) == 1 else ColumnBlock(first.names, np.concatenate(
            [p.array for p in parts if isinstance(p, ColumnBlock)]))
    return {f: _concat([p[f] for p in parts]) for f in names}


def _columns(dicts: list[Mapping[str, Any]], what: str) -> dict[str, list[Any]]:
    names: dict[str, None] = {}
    for d in dicts:
        if not isinstance(d, Mapping):
            raise QuiverError(f"`{what}` of a row must be an object of name → value")
        names.update(dict.fromkeys(d))
    return {name: [d.get(name) for d in dicts] for name in names}


def _take(columns: Mapping[str, Any], mask: np.ndarray, n: int) -> dict[str, Any]:
    if mask.all():
        return dict(columns)
    return {k: (np.asarray(v, dtype=object) if isinstance(v, list) else v)[mask] for k, v in columns.items()
            if len(v) == n}


def _features_of(arms: ArmSet, columns: Mapping[str, Any]) -> dict[str, Any]:
    return {name: columns[name] for name in arms.served_features if name in columns}


def _concat(parts: list[Any]) -> Any:
    if len(parts) == 1:
        return parts[0]
    if all(isinstance(p, np.ndarray) for p in parts):
        return np.concatenate(parts)
    return [v for p in parts for v in (p.tolist() if isinstance(p, np.ndarray) else p)]


def log_failed_request(logger: Any, arms: ArmSet, request_ids: list[str], entities: Mapping[str, Any],
                       on_canary: np.ndarray, latency_ms: float, logged_at: np.ndarray | int, error: str,
                       call_id: str) -> None:
    """Log every row of a request whose champion call raised, in one call: the champion's rows with its
    error, the rows routed to the canary (whose arm never ran) with `NOT_RUN` — every assigned row is
    accounted for, so the judge's sample-ratio check sees what the router did, not what got logged."""
    routed = on_canary.any() and arms.canary is not None
    version: str | np.ndarray = arms.champion.label
    arm: str | np.ndarray = "champion"
    errors: str | np.ndarray = error
    if routed:
        assert arms.canary is not None
        version = np.where(on_canary, arms.canary.label, arms.champion.label)
        arm = np.where(on_canary, "canary", "champion")
        errors = np.where(on_canary, f"{NOT_RUN}champion call failed", error)
    logger.log_batch(request_ids, entities, {}, version, arm, latency_ms, np.full(len(request_ids), np.nan),
                     ts_us=logged_at, error=errors, rollout=arms.rollout, call_id=call_id)
