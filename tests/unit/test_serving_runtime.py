"""StoreGate's rules with a store that fails on demand (the real-Redis stall is in the integration tests):
down after an unavailable call, refused at once while down, back after a probe answers, bounded queue."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from quiver.online.base import OnlineStoreUnavailable
from quiver.serving.runtime import MergedRegistry, StoreGate, StoreUnavailable


class FlakyStore:
    """Only what the gate touches: freshness (the probe) and a timeout."""

    timeout_s = 1.0

    def __init__(self) -> None:
        self.down = False
        self.calls = 0

    def freshness(self, views: Any, *, timeout_s: float | None = None) -> dict[str, int | None]:
        if self.down:
            raise OnlineStoreUnavailable("no answer from redis://secret-host:6379")
        return {v: None for v in views}

    def read(self) -> str:
        self.calls += 1
        if self.down:
            raise OnlineStoreUnavailable("no answer from redis://secret-host:6379")
        return "ok"


def make_gate(store: FlakyStore, **kwargs: Any) -> StoreGate:
    gate = StoreGate(store, ["v"], probe_interval_s=0.0, **kwargs)  # type: ignore[arg-type]
    return gate


def test_down_fails_fast_and_recovers_after_a_probe() -> None:
    async def scenario() -> None:
        store = FlakyStore()
        gate = make_gate(store)
        assert await gate.call(store.read) == "ok"
        store.down = True
        with pytest.raises(StoreUnavailable) as info:
            await gate.call(store.read)
        assert "secret-host" not in str(info.value) and info.value.retry_after_s == 1
        assert not gate.up
        calls = store.calls
        with pytest.raises(StoreUnavailable):
            await gate.call(store.read)  # refused without touching the store
        assert store.calls == calls
        assert not (await gate.health()).up
        store.down = False
        assert (await gate.health()).up and gate.up  # a probe that answers brings it back
        assert await gate.call(store.read) == "ok"
        gate.close()

    asyncio.run(scenario())


def test_async_calls_follow_the_same_rules() -> None:
    async def scenario() -> None:
        store = FlakyStore()
        gate = make_gate(store)

        async def read() -> str:
            return store.read()

        assert await gate.call_async(read) == "ok"
        store.down = True
        with pytest.raises(StoreUnavailable):
            await gate.call_async(read)
        assert not gate.up
        gate.close()

    asyncio.run(scenario())


def test_too_many_waiting_calls_are_refused() -> None:
    async def scenario() -> None:
        store = FlakyStore()
        gate = make_gate(store, workers=1, max_waiting=1)
        release = threading.Event()
        first = asyncio.ensure_future(gate.call(release.wait))
        second = asyncio.ensure_future(gate.call(release.wait))
        await asyncio.sleep(0.05)
        with pytest.raises(StoreUnavailable, match="busy"):
            await gate.call(store.read)
        release.set()
        assert await first and await second
        assert gate.up  # busy is not down
        gate.close()

    asyncio.run(scenario())


def test_merged_registry_keeps_the_first_family_of_a_name() -> None:
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    own, other = CollectorRegistry(), CollectorRegistry()
    Gauge("same_name", "mine", registry=own).set(1)
    Gauge("same_name", "theirs", registry=other).set(2)
    Gauge("only_theirs", "theirs", registry=other).set(3)
    text = generate_latest(MergedRegistry(own, other)).decode()  # type: ignore[arg-type]
    assert "same_name 1.0" in text and "same_name 2.0" not in text and "only_theirs 3.0" in text
