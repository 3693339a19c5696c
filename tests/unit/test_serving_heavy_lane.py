"""The heavy lane: big bodies one at a time, resting after each for its share while other clients are active;
small bodies never enter it; and the servers' GC settings."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from quiver.serving.edge import ClientLimit, HeavyLane
from quiver.serving.runtime import GC_THRESHOLDS, ServerLimits, tune_gc


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_big_requests_go_one_at_a_time_and_rest_for_the_others_share() -> None:
    clock = Clock()

    async def scenario() -> None:
        lane = HeavyLane(active_s=1.0, clock=clock)
        lane.seen("heavy")
        await lane.acquire("heavy", 137_000)
        second = asyncio.create_task(lane.acquire("heavy", 137_000))
        await asyncio.sleep(0)
        assert not second.done()  # the lane holds one request
        lane.seen("light-a")
        lane.seen("light-b")  # two other clients active
        clock.now += 0.02  # the big request took 20 ms
        lane.release("heavy")
        assert abs(lane.resume_at - (clock.now + 0.04)) < 1e-9  # rests 20 ms per other active client
        await asyncio.wait_for(second, 1.0)  # let in after its (real) rest
        lane.release("heavy")
        clock.now += 5.0  # the others went quiet
        await lane.acquire("heavy", 137_000)
        clock.now += 0.02
        lane.release("heavy")
        assert lane.resume_at == clock.now  # alone: no rest

    asyncio.run(scenario())


def test_a_waiter_cancelled_during_its_rest_gives_the_lane_back() -> None:
    clock = Clock()

    async def scenario() -> None:
        lane = HeavyLane(clock=clock)
        lane.resume_at = clock.now + 60.0  # a long rest ahead
        resting = asyncio.create_task(lane.acquire("heavy", 1))
        await asyncio.sleep(0.01)
        resting.cancel()
        await asyncio.gather(resting, return_exceptions=True)
        lane.resume_at = 0.0
        await asyncio.wait_for(lane.acquire("next", 1), 1.0)  # not held by the cancelled one

    asyncio.run(scenario())


def test_only_big_or_unsized_bodies_enter_the_lane() -> None:
    entered: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        entered.append("lane" if limit.lane is not None and limit.lane.slots.free == 0 else "direct")

    limit = ClientLimit(app, per_client=8, paths=frozenset({"/predict"}), heavy_body_bytes=1_000)

    def scope(length: int | None) -> dict[str, Any]:
        headers = [] if length is None else [(b"content-length", str(length).encode())]
        return {"type": "http", "path": "/predict", "client": ("10.0.0.1", 1), "headers": headers}

    async def nothing() -> dict[str, Any]:
        return {}

    async def ignore(message: Any) -> None:
        return None

    async def scenario() -> None:
        for length in (10, 1_000, 1_001, None):
            await limit(scope(length), nothing, ignore)

    asyncio.run(scenario())
    assert entered == ["direct", "direct", "lane", "lane"]
    assert ServerLimits().heavy_body_bytes == 32 * 1024
    off = ClientLimit(app, per_client=8, paths=frozenset({"/predict"}), heavy_body_bytes=0)
    assert off.lane is None


def test_the_servers_gc_freezes_start_up_and_collects_less_often() -> None:
    before = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_threshold() == GC_THRESHOLDS and GC_THRESHOLDS[0] > before[0]
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
