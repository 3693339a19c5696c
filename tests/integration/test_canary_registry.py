"""Rollout and decision records on SQLite and PostgreSQL (migration 0004): one running rollout per model,
compare-and-set step moves, decisions stored once per idempotency key even when writers race."""

from __future__ import annotations

import threading

import pytest

from quiver.catalog.errors import QuiverError
from quiver.registry import Registry, rollouts

pytestmark = pytest.mark.integration


def test_rollouts_and_decisions(registry_url: str) -> None:
    registry = Registry(registry_url, project="p")
    try:
        assert (registry.schema_revision() or "") >= "0004"
        first = rollouts.start_rollout(registry, "m", champion_version=1, canary_version=2, fraction=0.05,
                                       settings={"steps": [0.05, 1.0]}, by="t")
        assert first.status == rollouts.RUNNING and first.step == 0 and len(first.salt) == 16
        with pytest.raises(QuiverError, match="already has a running rollout"):
            rollouts.start_rollout(registry, "m", champion_version=1, canary_version=3, fraction=0.05, settings={})
        other = rollouts.start_rollout(registry, "other", champion_version=1, canary_version=2, fraction=0.5,
                                       settings={})
        assert rollouts.active_rollout(registry, "m") == first

        moment = first.step_started_at
        assert rollouts.advance_rollout(registry, first.id, from_step=0, fraction=0.25, at=moment)
        assert not rollouts.advance_rollout(registry, first.id, from_step=0, fraction=0.25, at=moment)  # moved
        current = rollouts.get_rollout(registry, first.id)
        assert (current.step, current.fraction) == (1, 0.25)

        results: list[rollouts.Decision] = []

        def record() -> None:
            results.append(rollouts.record_decision(
                registry, "m", kind="canary_step", outcome="hold", statistics={"reason": "waiting", "n": 3},
                idempotency_key="k" * 64, rollout_id=first.id, step=1, fraction=0.25))

        threads = [threading.Thread(target=record) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len({d.id for d in results}) == 1 and sum(d.created for d in results) == 1
        assert len(rollouts.list_decisions(registry, "m")) == 1
        assert results[0].statistics == {"reason": "waiting", "n": 3}

        assert rollouts.finish_rollout(registry, first.id, rollouts.PROMOTED, fraction=1.0)
        assert not rollouts.finish_rollout(registry, first.id, rollouts.ROLLED_BACK, fraction=0.0)
        assert rollouts.active_rollout(registry, "m") is None
        again = rollouts.start_rollout(registry, "m", champion_version=2, canary_version=3, fraction=0.05,
                                       settings={})
        assert [r.id for r in rollouts.list_rollouts(registry, "m")] == [again.id, first.id]
        assert rollouts.active_rollout(registry, "other") == other
        with pytest.raises(ValueError, match="idempotency_key"):
            rollouts.record_decision(registry, "m", kind="x", outcome="hold", statistics={}, idempotency_key="short")
    finally:
        registry.close()
