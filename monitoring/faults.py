"""Crash points for fault-injection tests: named places between two writes of the loop's state changes.

`point(name)` costs one global read when nothing is armed (always, in production). A test arms a plan with
`inject(plan)`; the plan sees every point passed, in order, and may raise `InjectedCrash` at one of them —
the process "dies" there, between the write before and the write after, and the test then retries the task
and checks the loop's invariants. `record()` lists the points a task passes, so a harness can crash at each.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["FaultPlan", "InjectedCrash", "inject", "point", "record"]


class InjectedCrash(BaseException):
    """Raised at an armed crash point. A BaseException, so no `except Exception` on the way swallows it (a
    killed process runs no handler either)."""


@dataclass
class FaultPlan:
    """Crash at the `crash_at`-th point passed (0-based; None: never), remembering every point passed."""

    crash_at: int | None = None
    passed: list[str] = field(default_factory=list)

    def hit(self, name: str) -> None:
        index = len(self.passed)
        self.passed.append(name)
        if self.crash_at is not None and index == self.crash_at:
            raise InjectedCrash(f"injected crash at point #{index} {name!r}")


_plan: FaultPlan | None = None


def point(name: str) -> None:
    """A crash point: a no-op unless a test armed a plan."""
    if _plan is not None:
        _plan.hit(name)


@contextlib.contextmanager
def inject(plan: FaultPlan) -> Iterator[FaultPlan]:
    """Arm `plan` for the duration of the block (not thread-safe: tests run loop tasks in one thread)."""
    global _plan
    previous, _plan = _plan, plan
    try:
        yield plan
    finally:
        _plan = previous


def record() -> contextlib.AbstractContextManager[FaultPlan]:
    """Arm a plan that never crashes and only lists the points passed."""
    return inject(FaultPlan())
