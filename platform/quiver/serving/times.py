"""Request times at the HTTP edge: one bounded range (`quiver.online.base.TIME_RANGE`), two spellings.

- `IsoTime`: an ISO-8601 string with a UTC offset; its JSON schema is RFC 3339 `date-time` plus a `pattern`
  that keeps the years inside the range, so a string the schema admits is a string the server accepts.
- `EpochMicros`: an integer as JSON Schema means it (223.0 included, never true or "223").
- `EpochOrIso`: either (`/predict` rows' `at`), with one error that fits what was sent and a clean `loc`.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

import pydantic
from pydantic import AfterValidator, BeforeValidator, PlainValidator, StrictStr, WithJsonSchema

from quiver.online.base import MAX_TIME_US, MIN_TIME_US, TIME_RANGE

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def iso_time_us(value: str) -> int:
    """Epoch µs of an ISO-8601 time with a UTC offset inside TIME_RANGE; ValueError saying why otherwise."""
    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError("must be an ISO-8601 time with a UTC offset, e.g. 2026-11-03T12:00:00Z") from None
    if parsed.tzinfo is None:
        raise ValueError("needs a UTC offset (…Z or …+01:00): a time without one is ambiguous")
    delta = parsed - _EPOCH
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    if not MIN_TIME_US <= micros < MAX_TIME_US:
        raise ValueError(f"is outside the supported range {TIME_RANGE}")
    return micros


def _iso_checked(value: str) -> str:
    iso_time_us(value)
    return value


def _iso_pattern() -> str:
    """RFC 3339 date-times inside TIME_RANGE, as a regular expression (JSON Schema's `pattern`).

    `format: date-time` alone admits years 0000-9999 (and validators need not check formats at all). This
    admits years 1900-2199 and real calendar days only (29 February in leap years), and leaves out the two
    days where the offset decides: 1900-01-01 only with an offset of zero or less, 2199-12-31 only with an
    offset of zero or more. Every string it matches is accepted; the few accepted ones it leaves out are
    those two days' other offsets and ISO-8601 spellings other than RFC 3339's. Unit tests pin both."""
    d31, d30, d28 = "(?:0[1-9]|[12][0-9]|3[01])", "(?:0[1-9]|[12][0-9]|30)", "(?:0[1-9]|1[0-9]|2[0-8])"
    short = f"(?:0[469]|11)-{d30}|02-{d28}"  # the months of 30 days and February
    any_day = f"(?:(?:0[13578]|1[02])-{d31}|{short})"
    not_jan1 = f"(?:01-(?:0[2-9]|[12][0-9]|3[01])|(?:0[3578]|1[02])-{d31}|{short})"
    not_dec31 = f"(?:12-{d30}|(?:0[13578]|10)-{d31}|{short})"
    leap = "(?:(?:19|20|21)(?:0[48]|[2468][048]|[13579][26])|2000)"  # 1900 and 2100 are not
    years = "(?:190[1-9]|19[1-9][0-9]|20[0-9][0-9]|21[0-8][0-9]|219[0-8])"
    time = "[Tt](?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:[.][0-9]{1,9})?"  # no leap second: Python has none
    hours = "(?:[01][0-9]|2[0-3]):[0-5][0-9]"
    offset = f"(?:[Zz]|[+-]{hours})"
    alternatives = [f"{years}-{any_day}{time}{offset}", f"{leap}-02-29{time}{offset}",
                    f"1900-{not_jan1}{time}{offset}", f"1900-01-01{time}(?:[Zz]|[+-]00:00|-{hours})",
                    f"2199-{not_dec31}{time}{offset}", f"2199-12-31{time}(?:[Zz]|[+-]00:00|[+]{hours})"]
    return "^(?:" + "|".join(alternatives) + ")$"


ISO_PATTERN = _iso_pattern()
_ISO_SCHEMA: dict[str, Any] = {
    "type": "string", "format": "date-time", "maxLength": 64, "pattern": ISO_PATTERN,
    "description": f"RFC 3339 date-time (ISO-8601 with a UTC offset), {TIME_RANGE}"}
# An ISO-8601 string with an offset (JSON Schema's `date-time` is RFC 3339, which requires one).
IsoTime = Annotated[StrictStr, AfterValidator(_iso_checked), WithJsonSchema(_ISO_SCHEMA)]


def whole_number(value: Any) -> Any:
    # JSON Schema's "integer" includes 223.0: so does this, but never true/false or "223".
    if isinstance(value, bool | str):
        raise ValueError("must be an integer")
    return value


# An integer as JSON Schema means it (a number without a fractional part), never a boolean or a string.
# (Constraints go before the validator: after it, pydantic writes them into the JSON schema as "ge"/"le".)
EpochMicros = Annotated[int, pydantic.Field(ge=MIN_TIME_US, lt=MAX_TIME_US), BeforeValidator(whole_number)]


def epoch_or_iso(value: Any) -> int | str:
    """An `at` given either way: epoch µs (an integer, or a float without a fraction) or an ISO-8601 string,
    inside TIME_RANGE; one ValueError that fits what was sent otherwise (a pydantic union would answer one
    error per member, with its internal tag in `loc`, "must be an integer" first even for a string)."""
    if isinstance(value, str):
        return _iso_checked(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be epoch microseconds (an integer) or an ISO-8601 string with a UTC offset, "
                         "e.g. 2026-11-03T12:00:00Z")
    if isinstance(value, float) and not value.is_integer():
        raise ValueError("epoch microseconds must be a whole number")
    if not MIN_TIME_US <= value < MAX_TIME_US:
        raise ValueError(f"is outside the supported range {TIME_RANGE} (epoch microseconds from {MIN_TIME_US} "
                         f"to {MAX_TIME_US}, excluded)")
    return int(value)


EpochOrIso = Annotated[int | str, PlainValidator(epoch_or_iso), WithJsonSchema({"anyOf": [
    {"type": "integer", "minimum": MIN_TIME_US, "exclusiveMaximum": MAX_TIME_US,
     "description": "epoch microseconds"}, _ISO_SCHEMA]})]
