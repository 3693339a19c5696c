"""Feature references: `view:feature` strings (or a FeatureService name) resolved against the Catalog IR
into views, features and output column names, the same for training sets, online reads and predictions."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from quiver.catalog.errors import QuiverError
from quiver.catalog.ir import Catalog


@dataclass(frozen=True)
class FeatureRef:
    """One requested feature and the column it becomes."""

    view: str
    feature: str
    column: str


def resolve_features(catalog: Catalog, features: str | Sequence[str], full_feature_names: bool) -> list[FeatureRef]:
    """Validated feature references, deduplicated in request order, with their output column names.

    Columns are named by the feature, or `view__feature` with `full_feature_names`; two references that
    would give the same column are an error naming both.
    """
    if isinstance(features, str):
        if ":" in features:
            names: list[str] = [features]
        elif features in catalog.services:
            names = list(catalog.services[features].features)
        else:
            known = ", ".join(sorted(catalog.services)) or "none defined"
            raise QuiverError(f"unknown feature service {features!r} (services: {known}); "
                              f"or list features as 'view:feature'")
    else:
        names = list(features)
    if not names:
        raise QuiverError("no features requested")
    refs: list[FeatureRef] = []
    for name in dict.fromkeys(names):
        if not isinstance(name, str) or ":" not in name:
            raise QuiverError(f"feature {name!r} must be written 'view:feature'")
        view_name, _, feature = name.partition(":")
        if view_name not in catalog.views:
            raise QuiverError(f"feature {name!r}: unknown feature view {view_name!r}; views: "
                              f"{', '.join(sorted(catalog.views))}")
        view = catalog.views[view_name]
        if feature not in view.feature_names:
            raise QuiverError(f"feature {name!r}: view {view_name!r} has no feature {feature!r}; its features: "
                              f"{', '.join(view.feature_names)}")
        column = f"{view_name}__{feature}" if full_feature_names else feature
        refs.append(FeatureRef(view_name, feature, column))
    seen: dict[str, FeatureRef] = {}
    for ref in refs:
        if ref.column in seen:
            other = seen[ref.column]
            raise QuiverError(f"features {other.view}:{other.feature} and {ref.view}:{ref.feature} would both be "
                              f"named {ref.column!r}; pass full_feature_names=True (columns view__feature)")
        seen[ref.column] = ref
    return refs
