"""How the replay cuts a minute's recorded requests into calls while the online store follows the events: a
call is served as of its first row, so a row whose entity had an event after that row starts a new call."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from quiver.pipelines.replay import calls_of

T0 = datetime(2026, 11, 10, 9, 30, tzinfo=UTC)


class Events:
    """A follower's view of the events: (time, key, value) triples."""

    def __init__(self, *events: tuple[datetime, str, int]):
        self.events = events

    def touched(self, since: datetime, until: datetime) -> dict[str, set[Any]]:
        found: dict[str, set[Any]] = {}
        for at, key, value in self.events:
            if since <= at < until:
                found.setdefault(key, set()).add(value)
        return found


def row(seconds: int, user: int, merchant: int) -> dict[str, Any]:
    return {"request_id": f"r{seconds}", "entities": {"user_id": user, "merchant_id": merchant},
            "at": T0 + timedelta(seconds=seconds)}


def ids(calls: list[list[dict[str, Any]]]) -> list[list[str]]:
    return [[r["request_id"] for r in call] for call in calls]


def test_rows_stay_in_one_call_while_none_of_their_entities_had_an_event_since_the_first():
    batch = [row(1, 1, 10), row(20, 2, 20), row(40, 3, 30)]
    events = Events((T0 + timedelta(seconds=1), "user_id", 1), (T0 + timedelta(seconds=30), "merchant_id", 99))
    assert ids(calls_of(batch, events)) == [["r1", "r20", "r40"]]


def test_a_row_whose_user_or_merchant_had_an_event_after_the_calls_first_row_starts_a_new_call():
    batch = [row(1, 1, 10), row(20, 2, 20), row(40, 3, 30), row(50, 4, 40)]
    events = Events((T0 + timedelta(seconds=10), "user_id", 2),       # before r20, after r1: r20 must see it
                    (T0 + timedelta(seconds=45), "merchant_id", 40))  # before r50, after r20
    assert ids(calls_of(batch, events)) == [["r1"], ["r20", "r40"], ["r50"]]


def test_an_event_at_the_rows_own_time_is_not_before_it():
    batch = [row(1, 1, 10), row(20, 2, 20)]
    assert ids(calls_of(batch, Events((T0 + timedelta(seconds=20), "user_id", 2)))) == [["r1", "r20"]]


def test_without_a_follower_a_minute_is_one_call():
    assert ids(calls_of([row(1, 1, 10), row(2, 1, 10)])) == [["r1", "r2"]]
    assert calls_of([]) == []
