"""What the prediction service scores after the response: the shadow's copy of each request and the
champion's scores of the canary's rows (`log_arm` "paired"), batched by the service's worker thread and
logged without feature columns (the same vectors are logged once, on the rows' own arm)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from quiver.serving.arms import Arm, ServiceStats, _concat, join_inputs

if TYPE_CHECKING:
    from quiver.monitoring.serving_log import ServingLogger


@dataclass(frozen=True)
class OffPath:
    """Rows an arm scores after the response: the shadow's copy of a request, or the champion's of its
    canary rows (`log_arm` "paired")."""

    arm: Arm
    log_arm: str
    request_ids: list[str]
    entities: Mapping[str, Any]
    columns: Mapping[str, Any]
    feature_ms: float
    logged_at: np.ndarray | int
    rollout: tuple[int, int, float] | None
    call_id: str


def score_off_path(batch: list[OffPath], stats: ServiceStats, logger: ServingLogger | None) -> None:
    """Score a batch of queued items, one model call and one log call per (arm, log arm, rollout tag)."""
    groups: dict[tuple[int, str, tuple[int, int, float] | None], list[OffPath]] = {}
    for item in batch:
        groups.setdefault((id(item.arm), item.log_arm, item.rollout), []).append(item)
    for items in groups.values():
        _score(items, stats, logger)


def _score(items: list[OffPath], stats: ServiceStats, logger: ServingLogger | None) -> None:
    arm, log_arm = items[0].arm, items[0].log_arm
    assert arm.model is not None
    names = [f for f in arm.model.features if f in items[0].columns]
    columns = join_inputs([item.columns for item in items], names)
    n = sum(len(item.request_ids) for item in items)
    t = time.perf_counter()
    error = ""
    try:
        scores = np.asarray(arm.model.predict(columns), dtype=np.float64)
        if scores.shape != (n,):
            raise ValueError(f"{log_arm} returned {scores.shape} scores for {n} rows")
    except Exception as exc:  # a broken shadow is logged and counted, never seen by a client
        error = f"{type(exc).__name__}: {exc}"[:500]
        scores = np.full(n, np.nan)
        stats.add(**{f"{log_arm}_errors": n})
    scoring_ms = (time.perf_counter() - t) * 1e3
    stats.add(**{f"{log_arm}_rows": n})
    if logger is None:
        return
    # One log call for the group, each row with its own request's call_id, time and latency. No features: the
    # same vector is logged on the primary row of this request_id.
    counts = [len(item.request_ids) for item in items]
    sized = list(zip(items, counts, strict=True))
    keys = dict.fromkeys(key for item in items for key in item.entities)
    logger.log_batch([r for item in items for r in item.request_ids],
                     {key: _concat([item.entities.get(key, [None] * k) for item, k in sized]) for key in keys}, {},
                     arm.label, log_arm, np.repeat([item.feature_ms + scoring_ms for item in items], counts), scores,
                     ts_us=np.concatenate([np.broadcast_to(np.asarray(item.logged_at, dtype=np.int64), (k,))
                                           for item, k in sized]),
                     error=error, rollout=items[0].rollout,
                     call_id=np.repeat(np.array([item.call_id for item in items], dtype=object), counts))
