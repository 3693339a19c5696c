"""The ISO `at` schema's pattern against what the servers accept: every string it matches is a time the server
takes (so a client that validates against the OpenAPI document never meets a 422 for it), and it matches every
calendar day of the supported range."""

from __future__ import annotations

import re
from datetime import date, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quiver.serving.times import ISO_PATTERN, iso_time_us

MATCHES = re.compile(ISO_PATTERN)


@settings(max_examples=500, deadline=None)
@given(st.from_regex(ISO_PATTERN, fullmatch=True))
def test_every_string_the_pattern_admits_is_accepted(at: str) -> None:
    iso_time_us(at)  # raises ValueError (outside the range, not a time) otherwise


def test_the_pattern_admits_every_day_of_the_range_and_no_other() -> None:
    day = date(1890, 1, 1)
    while day < date(2210, 1, 1):
        at = f"{day.isoformat()}T12:00:00Z"
        assert bool(MATCHES.match(at)) == (date(1900, 1, 1) <= day < date(2200, 1, 1)), at
        day += timedelta(days=1)


@pytest.mark.parametrize("at", ["0380-11-15T00:00:00Z", "2100-02-29T00:00:00Z", "2026-04-31T00:00:00Z",
                                "1900-01-01T00:30:00+01:00", "2199-12-31T23:30:00-01:00", "2026-11-03T12:00:60Z",
                                "2026-11-03T12:00:00", "2026-11-03T24:00:00Z", "2026-11-03T12:00:00+24:00"])
def test_the_pattern_leaves_out_what_the_server_refuses(at: str) -> None:
    assert not MATCHES.match(at)
    with pytest.raises(ValueError):
        iso_time_us(at)
