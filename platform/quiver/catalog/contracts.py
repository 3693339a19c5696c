"""Validation of source contracts (`Contract`, `Check`) into the IR's `ContractSpec` (called by validate.py and
on_demand.py, for sources and request sources alike).

Each check must name a column of its source and fit the column's type: `finite` only on float columns,
`min`/`max` on numbers and timestamps (bounds of the column's kind; timestamps as datetimes or ISO-8601
text with an offset), `one_of` on text, integer or boolean columns with values of that type, `max_future`
only on timestamps. The spec lists the rules in the order a failing row's reason is taken: columns as
declared, and per column `CHECK_RULES`' order.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from quiver.catalog.definitions import Check, Contract
from quiver.catalog.ir import CheckSpec, ContractSpec
from quiver.catalog.types import duration_label, parse_duration, to_micros

Add = Callable[[str], None]  # one problem of the definition being validated
_NUMERIC = ("int64", "float64")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def contract_spec(add: Add, contract: object, columns: Mapping[str, str]) -> ContractSpec | None:
    """The validated contract, or None (after `add`ing each problem). `columns`: the source's column dtypes."""
    if not isinstance(contract, Contract):
        add(f"contract must be a Contract(checks={{column: Check(...)}}), got {type(contract).__name__}")
        return None
    share = contract.max_invalid_share
    ok = True
    if isinstance(share, bool) or not isinstance(share, int | float) or not 0.0 <= share <= 1.0:
        add(f"contract: max_invalid_share must be a share in [0, 1], got {share!r}")
        ok = False
    if not isinstance(contract.checks, Mapping) or not contract.checks:
        add("contract: checks must map at least one column to a Check")
        return None
    checks: list[CheckSpec] = []
    for column, check in contract.checks.items():
        if not isinstance(check, Check):
            add(f"contract: the check of {column!r} must be a Check(...), got {type(check).__name__}")
            ok = False
        elif column not in columns:
            add(f"contract: {column!r} is not a column (columns: {', '.join(columns)})")
            ok = False
        else:
            found = _column_checks(_prefixed(add, f"contract: {column!r}: "), column, columns[column], check)
            if found is None:
                ok = False
            else:
                checks += found
    return ContractSpec(tuple(checks), float(share)) if ok else None


def _prefixed(add: Add, prefix: str) -> Add:
    return lambda message: add(prefix + message)


def _column_checks(add: Add, column: str, dtype: str, check: Check) -> list[CheckSpec] | None:
    out: list[CheckSpec] = []
    problems = 0

    def fail(message: str) -> None:
        nonlocal problems
        problems += 1
        add(message)

    if check.not_null:
        out.append(CheckSpec(column, dtype, "not_null"))
    if check.finite:
        if dtype == "float64":
            out.append(CheckSpec(column, dtype, "finite"))
        else:
            fail(f"finite applies to float64 columns, not {dtype}")
    bounds: dict[str, Any] = {}
    for rule in ("min", "max"):
        value = getattr(check, rule)
        if value is None:
            continue
        bound = _bound(fail, rule, dtype, value)
        if bound is not None:
            bounds[rule] = bound
            out.append(CheckSpec(column, dtype, rule, bound))
    if len(bounds) == 2 and bounds["min"] > bounds["max"]:
        fail(f"min {check.min!r} is above max {check.max!r}: no value could pass")
    if check.one_of is not None:
        values = _allowed(fail, dtype, check.one_of)
        if values is not None:
            out.append(CheckSpec(column, dtype, "one_of", values))
    if check.max_future is not None:
        if dtype != "timestamp":
            fail(f"max_future applies to timestamp columns, not {dtype}")
        else:
            try:
                tolerance = parse_duration(check.max_future)
            except ValueError as exc:
                fail(f"max_future: {exc}")
            else:
                if tolerance.total_seconds() < 0:
                    fail("max_future must not be negative")
                else:
                    out.append(CheckSpec(column, dtype, "future", to_micros(tolerance)))
    if not out and not problems:
        fail("the Check declares no rule")
    return None if problems else out


def _bound(fail: Add, rule: str, dtype: str, value: object) -> int | float | None:
    if dtype == "timestamp":
        moment = value
        if isinstance(value, str):
            try:
                moment = datetime.fromisoformat(value)
            except ValueError:
                fail(f"{rule} {value!r} is not an ISO-8601 time")
                return None
        if not isinstance(moment, datetime) or moment.tzinfo is None:
            fail(f"{rule} {value!r} must be a datetime with a UTC offset (naive times are ambiguous)")
            return None
        return to_micros(moment - _EPOCH)
    if dtype not in _NUMERIC:
        fail(f"{rule} applies to numbers and timestamps, not {dtype}")
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or (isinstance(value, float) and
                                                                          not math.isfinite(value)):
        fail(f"{rule} must be a finite number, got {value!r}")
        return None
    if dtype == "int64" and isinstance(value, float) and not value.is_integer():
        fail(f"{rule} {value!r} is not an integer (the column is int64)")
        return None
    return int(value) if dtype == "int64" else float(value)


def _allowed(fail: Add, dtype: str, values: object) -> tuple[Any, ...] | None:
    kinds: dict[str, tuple[type, ...]] = {"string": (str,), "int64": (int,), "bool": (bool,)}
    if dtype not in kinds:
        fail(f"one_of applies to string, int64 and bool columns, not {dtype}")
        return None
    if isinstance(values, str | bytes) or not hasattr(values, "__iter__"):
        fail(f"one_of must be a list of values, got {values!r}")
        return None
    out = tuple(values)  # type: ignore[call-overload]
    wrong = [v for v in out if not isinstance(v, kinds[dtype]) or (dtype == "int64" and isinstance(v, bool))]
    if not out or wrong:
        fail(f"one_of must list {dtype} values" + (f"; got {wrong[0]!r}" if wrong else ", not none"))
        return None
    return tuple(dict.fromkeys(out))


def describe_contract(contract: ContractSpec) -> list[str]:
    """One line per checked column, as `quiver describe` shows it: "amount: not null, finite, >= 0.0"."""
    words: dict[str, list[str]] = {}
    for check in contract.checks:
        words.setdefault(check.column, []).append(_rule_text(check))
    lines = [f"{column}: {', '.join(rules)}" for column, rules in words.items()]
    return [*lines, f"the batch gate fails above {contract.max_invalid_share:.2%} of rows refused"]


def _rule_text(check: CheckSpec) -> str:
    if check.rule in ("not_null", "finite"):
        return check.rule.replace("_", " ")
    if check.rule == "one_of":
        return "one of " + ", ".join(map(str, check.value))
    if check.rule == "future":
        return f"at most {duration_label(timedelta(microseconds=int(check.value)))} after the clock"
    bound = check.value
    if check.dtype == "timestamp":
        bound = (_EPOCH + timedelta(microseconds=int(bound))).isoformat()
    return f"{'>=' if check.rule == 'min' else '<='} {bound}"
