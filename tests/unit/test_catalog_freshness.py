"""Online freshness in words, against data time (issue 55): on the demo's November data, read weeks later, the
wall clock called an up-to-date store "12.4 d old"."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from quiver.catalog.freshness import freshness, span

NEWEST = datetime(2026, 11, 24, 13, 59, tzinfo=UTC)  # the demo's last streamed event
NOW = NEWEST + timedelta(days=12.4)  # when someone opens the console


def test_views_age_against_the_newest_event_the_store_holds() -> None:
    fresh = freshness({"user_spend": NEWEST, "user_profile": NEWEST - timedelta(hours=4.1),
                       "merchant_profile": None}, now=NOW)
    assert fresh.labels == {"user_spend": "2026-11-24 13:59 (the store's newest)",
                            "user_profile": "2026-11-24 09:53 (4.1 h behind the newest)",
                            "merchant_profile": "nothing stored"}
    assert not any("12.4 d" in label for label in fresh.labels.values())
    # The wall clock is said once, as what it is.
    assert fresh.summary == ("freshness is measured against the newest event the store holds, 2026-11-24 13:59 "
                             "UTC (data time; 12.4 d before the wall clock)")


def test_a_live_store_and_an_empty_one() -> None:
    assert freshness({"v": NEWEST}, now=NEWEST + timedelta(seconds=5)).summary.endswith("(data time; the wall "
                                                                                       "clock's now)")
    empty = freshness({"v": None, "w": None}, now=NOW)
    assert empty.labels == {"v": "nothing stored", "w": "nothing stored"} and empty.summary == ""
    assert [span(s) for s in (45, 750, 4.1 * 3600, 12.4 * 86400, -3)] == ["45 s", "12.5 min", "4.1 h", "12.4 d",
                                                                          "0 s"]
