"""A canary rollout's judge settings: its steps, error budget and floors, stored with the rollout so every
step of it is judged alike (see `quiver.monitoring.canary_stats` for what each guardrail tests)."""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np
import numpy.typing as npt

OUTCOMES = ("advance", "hold", "promote", "rollback", "halt")
GUARDRAILS = ("error_rate", "latency_p99", "score_shift", "log_loss", "brier")
# Roll back when they fail, but are not needed to pass: a score shift is bounded from above by the paired mean
# |Δ| or the DKW bands at Kish sizes, and an equivalent model that disagrees row by row may never get either
# below the floor; the quality guardrails carry the proof of a promotion.
ROLLBACK_ONLY = ("score_shift",)
# Stored by rollouts started before score_shift replaced PSI and the timeout counted calls: read, not used.
_LEGACY_SETTINGS = ("psi_floor", "score_bins", "max_canary_rows")


@dataclass(frozen=True)
class JudgeSettings:
    """Steps, error budget and floors of one rollout (stored with it, so every step judges alike)."""

    steps: tuple[float, ...] = (0.05, 0.25, 0.5, 1.0)
    alpha: float = 0.05  # false-rollback budget of a whole rollout
    srm_alpha: float = 0.001
    min_rows: int = 500  # per arm and step before any guardrail may pass
    min_labels: int = 200  # labelled rows per arm and step before log loss / Brier may pass
    # A step still undecided when its canary has made this many model calls (calls with their labels in,
    # when labels are required) rolls back: the canary could not be shown to be within its floors.
    max_canary_calls: int = 100_000
    require_labels: bool = True
    fail_fraction: float = 0.5  # fail = the whole confidence sequence beyond this share of the floor
    error_rate_floor: float = 0.01  # share of model calls
    latency_exceedance_floor: float = 0.01  # share of calls slower than the reference threshold, beyond the champion's
    latency_p99_floor_ms: float = 2.0  # the threshold: champion's reference p99 + this
    score_shift_floor: float = 0.05  # Wasserstein-1 distance of the arms' score distributions, in score units
    log_loss_floor: float = 0.02
    brier_floor: float = 0.01
    watch_hours: float = 24.0  # after a promotion, compare with `previous` this long (0: no watch)
    # A step whose serving loggers dropped more than this share of its answering rows (their accounts, every
    # replica's) holds instead of advancing: its evidence is not the traffic's. A failing guardrail still rolls back.
    max_dropped_share: float = 0.01

    def __post_init__(self) -> None:
        steps = tuple(float(s) for s in self.steps)
        object.__setattr__(self, "steps", steps)
        rising = all(0 < a < b for a, b in itertools.pairwise(steps))
        if len(steps) < 2 or steps[-1] != 1.0 or steps[0] <= 0 or not rising:
            raise ValueError(f"steps must rise strictly from above 0 to 1.0, got {list(steps)}")
        if not 0 < self.alpha < 1 or not 0 < self.srm_alpha < 1 or not 0 < self.fail_fraction <= 1:
            raise ValueError("alpha and srm_alpha must lie in (0, 1), fail_fraction in (0, 1]")
        if self.watch_hours < 0 or not 0 <= self.max_dropped_share <= 1:
            raise ValueError("watch_hours must be >= 0 and max_dropped_share in [0, 1]")
        if self.min_rows < 2 or self.min_labels < 2 or self.max_canary_calls < 2:
            raise ValueError("min_rows, min_labels and max_canary_calls must be at least 2")
        for name in ("error_rate_floor", "latency_exceedance_floor", "latency_p99_floor_ms",
                     "score_shift_floor", "log_loss_floor", "brier_floor"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")

    @property
    def test_alpha(self) -> float:
        """α of one guardrail test: the rollout's budget over guardrails × steps with a champion to compare."""
        return self.alpha / (len(GUARDRAILS) * (len(self.steps) - 1))

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["steps"] = list(self.steps)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JudgeSettings:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k not in _LEGACY_SETTINGS}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown judge settings {sorted(unknown)}; known: {sorted(known)}")
        if "steps" in values:
            values["steps"] = tuple(values["steps"])
        return cls(**values)


def latency_threshold(call_latencies_ms: npt.ArrayLike, settings: JudgeSettings) -> float | None:
    """The latency guardrail's threshold from the champion's reference calls (one latency per call): their
    p99 plus `latency_p99_floor_ms`; None with fewer than `min_rows` calls."""
    values = np.asarray(call_latencies_ms, dtype=np.float64)
    values = values[np.isfinite(values)]
    if len(values) < settings.min_rows:
        return None
    return float(np.quantile(values, 0.99)) + settings.latency_p99_floor_ms
