"""FairSlots: a bounded number of scoring calls at once, the next slot to the client served the fewest rows
lately, waits ended at once when the store goes down, and a bounded queue."""

from __future__ import annotations

import asyncio

import pytest

from quiver.serving.edge import Busy, FairSlots


def test_a_light_client_goes_before_a_heavy_one() -> None:
    async def scenario() -> list[str]:
        slots = FairSlots(1)
        order: list[str] = []
        await slots.acquire("heavy", 1_000)  # the heavy client holds the only slot

        async def call(client: str, rows: int) -> None:
            await slots.acquire(client, rows)
            order.append(client)
            slots.release()

        waiting = [asyncio.create_task(call("heavy", 1_000))]
        await asyncio.sleep(0)
        waiting += [asyncio.create_task(call(f"light{k}", 1)) for k in range(3)]
        await asyncio.sleep(0)
        slots.release()
        await asyncio.gather(*waiting)
        return order

    assert asyncio.run(scenario()) == ["light0", "light1", "light2", "heavy"]  # arrival order among equals


def test_waits_end_when_the_store_goes_down_and_the_queue_is_bounded() -> None:
    async def scenario() -> None:
        slots = FairSlots(1, max_waiting=2)
        await slots.acquire("a", 1)
        first = asyncio.create_task(slots.acquire("b", 1))
        second = asyncio.create_task(slots.acquire("c", 1))
        await asyncio.sleep(0)
        with pytest.raises(Busy):
            await slots.acquire("d", 1)
        slots.fail_waiting(RuntimeError("store down"))
        for task in (first, second):
            with pytest.raises(RuntimeError, match="store down"):
                await task
        slots.release()
        await slots.acquire("e", 1)  # the slot is free again
        assert slots.free == 0 and not slots.waiting

    asyncio.run(scenario())
