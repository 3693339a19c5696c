"""Differences between two catalog versions, down to the feature level."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any

from quiver.catalog.types import duration_label

CatalogDict = dict[str, dict[str, dict[str, Any]]]


@dataclass(frozen=True)
class Change:
    """One definition added, removed or changed; `details` says what changed inside it."""

    kind: str
    name: str
    action: str  # added | removed | changed
    details: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        sign = {"added": "+", "removed": "-", "changed": "~"}[self.action]
        text = f"{sign} {self.kind.replace('_', ' ')} {self.name}"
        return text + (f" ({'; '.join(self.details)})" if self.details else "")


@dataclass(frozen=True)
class CatalogDiff:
    """All changes from an old catalog to a new one."""

    changes: list[Change]

    @property
    def is_empty(self) -> bool:
        return not self.changes

    def to_json(self) -> list[dict[str, Any]]:
        return [asdict(c) for c in self.changes]

    def __str__(self) -> str:
        return "\n".join(str(c) for c in self.changes) if self.changes else "no changes"


def diff_catalogs(old: CatalogDict | None, new: CatalogDict) -> CatalogDiff:
    """Changes from `old` (None: empty registry) to `new`, ordered by kind then name."""
    old = old or {}
    changes: list[Change] = []
    for kind in new.keys() | old.keys():
        before, after = old.get(kind, {}), new.get(kind, {})
        for name in sorted(after.keys() - before.keys()):
            changes.append(Change(kind, name, "added", _features_of(after[name])))
        for name in sorted(before.keys() - after.keys()):
            changes.append(Change(kind, name, "removed"))
        for name in sorted(before.keys() & after.keys()):
            if before[name] != after[name]:
                changes.append(Change(kind, name, "changed", _details(before[name], after[name])))
    order = {"entity": 0, "source": 1, "request_source": 2, "feature_view": 3, "on_demand_view": 4,
             "feature_service": 5}
    changes.sort(key=lambda c: (order.get(c.kind, 9), c.name))
    return CatalogDiff(changes)


def _features_of(spec: dict[str, Any]) -> list[str]:
    names = list(_feature_map(spec)) or [str(ref) for ref in spec.get("features", [])]
    return [f"features: {', '.join(names)}"] if names else []


def _feature_map(spec: dict[str, Any]) -> dict[str, Any]:
    items = list(spec.get("fields", [])) + list(spec.get("aggregations", [])) + list(spec.get("outputs", []))
    return {item["name"]: item for item in items}


# Keys compared member by member (views' features, services' references, sources' columns, on-demand outputs).
_MEMBERS = {"fields": "feature", "aggregations": "feature", "features": "feature", "columns": "column",
            "outputs": "feature"}


def _members(spec: dict[str, Any], key: str) -> dict[str, Any]:
    if key in ("fields", "aggregations", "outputs"):
        return {item["name"]: item for item in spec.get(key, [])}
    if key == "columns":
        return {name: dtype for name, dtype in spec.get("columns", [])}
    return {str(ref): ref for ref in spec.get(key, [])}


def _details(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    details: list[str] = []
    for key in sorted(before.keys() | after.keys()):
        if key in _MEMBERS:
            if key == "aggregations":
                continue  # compared together with "fields": a feature may move from one to the other
            keys = ("fields", "aggregations") if key == "fields" else (key,)
            old = {k: v for part in keys for k, v in _members(before, part).items()}
            new = {k: v for part in keys for k, v in _members(after, part).items()}
            details += _member_changes(_MEMBERS[key], old, new)
        elif before.get(key) != after.get(key):
            details.append(_value_change(key, before.get(key), after.get(key)))
    return details


def _member_changes(noun: str, old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    changes = [f"+{noun} {name}" for name in new if name not in old]
    changes += [f"-{noun} {name}" for name in old if name not in new]
    for name in old.keys() & new.keys():
        if old[name] != new[name]:
            inner = old[name], new[name]
            if isinstance(inner[0], dict) and isinstance(inner[1], dict):
                what = [_value_change(k, inner[0].get(k), inner[1].get(k))
                        for k in sorted(inner[0].keys() | inner[1].keys()) if inner[0].get(k) != inner[1].get(k)]
            else:
                what = [f"{inner[0]} → {inner[1]}"]
            changes.append(f"~{noun} {name}: {', '.join(what)}")
    return sorted(changes, key=lambda text: ({"+": 0, "-": 1, "~": 2}[text[0]], text))


def _value_change(key: str, old: Any, new: Any) -> str:
    if key.endswith("_us"):  # durations in µs read better as 7d, 5m
        return f"{key[:-3]}: {_duration(old)} → {_duration(new)}"
    if isinstance(old, dict) and isinstance(new, dict):
        inner = [_value_change(f"{key}.{k}", old.get(k), new.get(k))
                 for k in sorted(old.keys() | new.keys()) if old.get(k) != new.get(k)]
        return "; ".join(inner)
    return f"{key}: {old!r} → {new!r}"


def _duration(value: Any) -> str:
    if not isinstance(value, int) or isinstance(value, bool):
        return repr(value)
    return duration_label(timedelta(microseconds=value))
