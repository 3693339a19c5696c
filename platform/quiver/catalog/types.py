"""Value types, durations and identifier rules shared by the DSL, the validator and every compiler."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Final

# Logical types a feature or key may have; every engine maps these and nothing else.
Int64: Final = "int64"
Float64: Final = "float64"
String: Final = "string"
Bool: Final = "bool"
Timestamp: Final = "timestamp"

DTYPES: Final = frozenset({Int64, Float64, String, Bool, Timestamp})
NUMERIC_DTYPES: Final = frozenset({Int64, Float64, Bool})

# Plain SQL identifiers only: generated SQL quotes them anyway, but refusing anything else at apply
# time keeps injection out of every engine (Spark, Flink and DuckDB quote differently).
# \Z, not $: "$" also matches before a trailing newline, which would let "amount\n" through.
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}\Z")
_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|min|h|d|w)\s*$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 604800}


def is_identifier(name: object) -> bool:
    """True when `name` is a safe, unquoted-SQL-compatible identifier (letters, digits, _; ≤ 63 chars)."""
    return isinstance(name, str) and _IDENTIFIER.match(name) is not None


def parse_duration(value: timedelta | str | int | float) -> timedelta:
    """Read `timedelta`, seconds, or strings like '5m', '1h', '7d'. Raises ValueError on anything else."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        try:
            return timedelta(seconds=value)
        except (OverflowError, ValueError):  # nan, inf or beyond timedelta's range
            raise ValueError(f"not a duration: {value!r}") from None
    if isinstance(value, str):
        match = _DURATION.match(value)
        if match:
            try:
                return timedelta(seconds=int(match.group(1)) * _UNIT_SECONDS[match.group(2)])
            except OverflowError:
                raise ValueError(f"duration {value!r} is too large") from None
    raise ValueError(f"not a duration: {value!r} (use a timedelta or a string like '30m', '1h', '7d')")


def duration_label(value: timedelta) -> str:
    """Shortest exact label for a duration ('90m' → '90m', 3600 s → '1h', 7 days → '7d')."""
    micros = to_micros(value)
    if micros % 1_000_000:  # sub-second: never round to a label that names another duration
        return f"{micros // 1000}ms" if micros % 1000 == 0 else f"{micros}us"
    seconds = micros // 1_000_000
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def to_micros(value: timedelta) -> int:
    """A duration in whole microseconds (the engines' common time unit)."""
    return (value.days * 86_400 + value.seconds) * 1_000_000 + value.microseconds
