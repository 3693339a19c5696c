"""Differences between two catalog versions, down to the feature level."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

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
    order = {"entity": 0, "source": 1, "feature_view": 2, "feature_service": 3}
    changes.sort(key=lambda c: (order.get(c.kind, 9), c.name))
    return CatalogDiff(changes)


def _features_of(spec: dict[str, Any]) -> list[str]:
    names = _feature_map(spec)
    return [f"features: {', '.join(names)}"] if names else []


def _feature_map(spec: dict[str, Any]) -> dict[str, Any]:
    items = list(spec.get("fields", [])) + list(spec.get("aggregations", []))
    return {item["name"]: item for item in items}


def _details(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    details: list[str] = []
    old_features, new_features = _feature_map(before), _feature_map(after)
    for name in new_features.keys() - old_features.keys():
        details.append(f"+feature {name}")
    for name in old_features.keys() - new_features.keys():
        details.append(f"-feature {name}")
    for name in old_features.keys() & new_features.keys():
        if old_features[name] != new_features[name]:
            details.append(f"~feature {name}")
    for key in sorted(before.keys() | after.keys()):
        if key in ("fields", "aggregations"):
            continue
        if before.get(key) != after.get(key):
            details.append(f"{key}: {before.get(key)!r} → {after.get(key)!r}")
    return sorted(details)
