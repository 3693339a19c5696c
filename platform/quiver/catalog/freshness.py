"""How fresh each view's online values are, in words, measured against data time.

A view's freshness is the newest event time the online store holds for it. Its age is measured against the
newest event time held for any view (the store's data time), not against the wall clock: on replayed or
historical data (the demo's November, a backfill) the wall clock would call a store that is fully up to date
"12.4 d old". How far the store's data time trails the wall clock is said once, beside it, in `summary`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime


@dataclass(frozen=True)
class Freshness:
    """`labels`: view → its newest event and how far it trails the store's newest; `summary`: one line with
    the store's newest event time and its distance from the wall clock ("" when nothing is stored)."""

    labels: dict[str, str]
    summary: str


def freshness(newest: Mapping[str, datetime | None], now: datetime | None = None) -> Freshness:
    """Labels for views whose newest held event times are `newest` (None: nothing stored), against the store's
    newest event time; `now` (default: the wall clock) only for the summary line."""
    held = [moment for moment in newest.values() if moment is not None]
    if not held:
        return Freshness({view: "nothing stored" for view in newest}, "")
    data_time = max(held)
    labels = {}
    for view, moment in newest.items():
        if moment is None:
            labels[view] = "nothing stored"
        elif moment == data_time:
            labels[view] = f"{moment:%Y-%m-%d %H:%M} (the store's newest)"
        else:
            labels[view] = f"{moment:%Y-%m-%d %H:%M} ({span((data_time - moment).total_seconds())} behind the newest)"
    lag = ((now or datetime.now(UTC)) - data_time).total_seconds()
    clock = (f"{span(lag)} before the wall clock" if lag >= 60 else
             f"{span(-lag)} after the wall clock" if lag <= -60 else "the wall clock's now")
    summary = (f"freshness is measured against the newest event the store holds, {data_time:%Y-%m-%d %H:%M} UTC "
               f"(data time; {clock})")
    return Freshness(labels, summary)


def span(seconds: float) -> str:
    """A duration in its largest whole unit, one decimal: 45 s, 12.5 min, 4.1 h, 12.4 d."""
    seconds = max(seconds, 0.0)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"
