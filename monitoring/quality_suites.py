"""How a source's expectation suite is built: from the catalog, its contract, `expect.*` tags and user suite
files (the rules are listed in `quiver.monitoring.quality`'s docstring, which re-exports these names)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from quiver.catalog.errors import QuiverError
from quiver.catalog.ir import Catalog, ContractSpec

_TYPE_LISTS = {
    "int64": ["int64", "int32", "Int64Dtype", "Int32Dtype"],
    "float64": ["float64", "float32", "Float64Dtype"],
    "bool": ["bool", "BooleanDtype"],
    "string": ["str", "object", "StringDtype"],
    "timestamp": ["datetime64[us]", "datetime64[ns]", "datetime64[ms]"],
}
REFUSED_COLUMN = "__refused"
CONTRACT_REASON = "contract_reason"
REFUSED_BY = "__refused_by."


# ----- building suites -----


def catalog_expectations(catalog: Catalog, source: str, now: datetime | None = None,
                         future_skew: timedelta = timedelta(hours=1)) -> list[dict[str, Any]]:
    """Expectations the catalog implies for `source` (see the module docstring)."""
    spec = catalog.sources.get(source)
    if spec is None:
        raise QuiverError(f"unknown source {source!r}; known: {', '.join(sorted(catalog.sources))}")
    dtypes = dict(spec.columns)
    views = [v for v in catalog.views.values() if v.source == source]
    used: dict[str, None] = dict.fromkeys([spec.timestamp_field])
    not_null: dict[str, None] = dict.fromkeys([spec.timestamp_field])
    for view in views:
        used.update(dict.fromkeys(view.key_names))
        not_null.update(dict.fromkeys(view.key_names))
        used.update(dict.fromkeys(f.column for f in view.fields))
        used.update(dict.fromkeys(a.column for a in view.aggregations))
    used.update(dict.fromkeys(spec.contract.columns if spec.contract else ()))
    origin = {"origin": "catalog"}
    out: list[dict[str, Any]] = []
    for col in used:
        out.append(_exp("expect_column_to_exist", origin, column=col))
        if dtypes.get(col) in _TYPE_LISTS:
            out.append(_exp("expect_column_values_to_be_in_type_list", origin, column=col,
                            type_list=_TYPE_LISTS[dtypes[col]]))
    if spec.contract is not None:  # the contract is the one statement of what a valid row is
        out += contract_expectations(spec.contract)
    else:
        for col in not_null:
            out.append(_exp("expect_column_values_to_not_be_null", origin, column=col))
        limit = (now or datetime.now(UTC)) + future_skew
        out.append(_exp("expect_column_values_to_be_between", origin, column=spec.timestamp_field,
                        max_value=limit.astimezone(UTC).replace(tzinfo=None).isoformat()))
    tags = dict(spec.tags)
    for view in views:
        tags.update(dict(view.tags))
    return out + tag_expectations(tags, dtypes)


def contract_expectations(contract: ContractSpec) -> list[dict[str, Any]]:
    """The gate of a source with a contract: the share of rows it refuses at most `max_invalid_share`, and
    (for the report) the same bound on the rows each check refused first. They run on the columns
    `contract_columns` adds, which the row filter of every path computes the same way, so the gate and the
    filter cannot disagree: the batch passes exactly when refused rows / rows <= max_invalid_share."""
    mostly = 1.0 - contract.max_invalid_share
    meta = {"origin": "contract", "max_invalid_share": contract.max_invalid_share}
    out = [_exp("expect_column_values_to_be_in_set", {**meta, "check": "any"}, column=REFUSED_COLUMN,
                value_set=[False], mostly=mostly)]
    out += [_exp("expect_column_values_to_be_in_set", {**meta, "check": c.reason}, column=REFUSED_BY + c.reason,
                 value_set=[False], mostly=mostly) for c in contract.checks]
    return out


def contract_columns(frame: pd.DataFrame, contract: ContractSpec, now: datetime | None = None,
                     table: pa.Table | None = None) -> pd.DataFrame:
    """`frame` with the columns the contract expectations read: `__refused` (the row fails a check), one
    `__refused_by.<rule>:<column>` per check (that check is the first it fails) and `contract_reason`.

    The rules run on `table` (the batch as Arrow, row for row with `frame`) when given: pandas cannot tell a
    null float from NaN, Arrow can. From a DataFrame alone a float NaN counts as NaN."""
    from quiver.compile.contracts import reason_strings, violations

    moment = now or datetime.now(UTC)
    if table is None:
        table = pa.table({c: pa.array(frame[c].to_numpy() if frame[c].dtype.kind == "f" else frame[c],
                                      from_pandas=frame[c].dtype.kind != "f") for c in contract.columns})
    first = violations(table.select(contract.columns), contract, int(moment.timestamp() * 1_000_000))
    out = frame.copy()
    out[REFUSED_COLUMN] = first >= 0
    for index, check in enumerate(contract.checks):
        out[REFUSED_BY + check.reason] = first == index
    out[CONTRACT_REASON] = reason_strings(first, contract)
    return out


def tag_expectations(tags: Mapping[str, str], dtypes: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Expectations declared as `expect.<column>.<rule>` tags."""
    dtypes = dtypes or {}
    rules: dict[str, dict[str, str]] = {}
    for key, value in tags.items():
        parts = key.split(".")
        if len(parts) == 3 and parts[0] == "expect":
            rules.setdefault(parts[1], {})[parts[2]] = value
    out: list[dict[str, Any]] = []
    for col, rule in rules.items():
        meta = {"origin": "tag"}
        mostly = {"mostly": float(rule["mostly"])} if "mostly" in rule else {}
        if "min" in rule or "max" in rule:
            bounds = {k + "_value": _bound(rule[k]) for k in ("min", "max") if k in rule}
            out.append(_exp("expect_column_values_to_be_between", meta, column=col, **bounds, **mostly))
        if "in" in rule:
            values = [_typed(v.strip(), dtypes.get(col)) for v in rule["in"].split(",")]
            out.append(_exp("expect_column_values_to_be_in_set", meta, column=col, value_set=values, **mostly))
        if rule.get("not_null", "").lower() == "true":
            out.append(_exp("expect_column_values_to_not_be_null", meta, column=col, **mostly))
        if rule.get("unique", "").lower() == "true":
            out.append(_exp("expect_column_values_to_be_unique", meta, column=col, **mostly))
        if "regex" in rule:
            out.append(_exp("expect_column_values_to_match_regex", meta, column=col, regex=rule["regex"],
                            **mostly))
        unknown = set(rule) - {"min", "max", "in", "not_null", "unique", "regex", "mostly"}
        if unknown:
            raise QuiverError(f"unknown expectation tag(s) for column {col!r}: "
                              f"{', '.join(f'expect.{col}.{u}' for u in sorted(unknown))}")
    return out


def _exp(kind: str, meta: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    return {"type": kind, "kwargs": kwargs, "meta": dict(meta)}


def _bound(value: str) -> float | str:
    try:
        return float(value)
    except ValueError:
        return value  # an ISO timestamp


def _typed(value: str, dtype: str | None) -> Any:
    if dtype == "int64":
        return int(value)
    if dtype == "float64":
        return float(value)
    if dtype == "bool":
        return value.lower() == "true"
    return value


def load_user_expectations(directory: str | Path | None, source: str) -> list[dict[str, Any]]:
    """Entries of `<directory>/<source>.json` (GE suite JSON or a bare list); none when absent."""
    if directory is None:
        return []
    path = Path(directory) / f"{source}.json"
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise QuiverError(f"{path}: not valid JSON: {exc}") from None
    entries = data.get("expectations", []) if isinstance(data, dict) else data
    if not isinstance(entries, list) or not all(isinstance(e, dict) and "type" in e for e in entries):
        raise QuiverError(f"{path}: expected a list of {{'type': …, 'kwargs': …}} expectations")
    return [{"type": e["type"], "kwargs": dict(e.get("kwargs", {})),
             "meta": {**e.get("meta", {}), "origin": f"user:{path.name}"}} for e in entries]
