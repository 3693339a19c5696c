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
        view = catalog.views.get(view_name) or catalog.on_demand.get(view_name)
        if view is None:
            raise QuiverError(f"feature {name!r}: unknown feature view {view_name!r}; views: "
                              f"{', '.join(sorted([*catalog.views, *catalog.on_demand]))}")
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


@dataclass(frozen=True)
class Expanded:
    """What computing `refs` takes: the stored features to read (the requested ones, then the inputs of the
    requested on-demand views not requested themselves), and the on-demand views to run, in request order."""

    stored: list[FeatureRef]
    on_demand: list[str]
    request_fields: dict[str, str]  # every request field those views read → dtype

    def hidden(self, requested: list[FeatureRef]) -> list[FeatureRef]:
        """The stored refs read only as inputs (not asked for)."""
        asked = {(r.view, r.feature) for r in requested}
        return [r for r in self.stored if (r.view, r.feature) not in asked]


def expand_on_demand(catalog: Catalog, refs: list[FeatureRef]) -> Expanded:
    """The stored reads and on-demand views behind `refs` (see `Expanded`). Input columns not asked for get
    hidden names (`__input__view__feature`), so they never clash with requested columns."""
    stored = [r for r in refs if r.view in catalog.views]
    have = {(r.view, r.feature) for r in stored}
    on_demand: list[str] = []
    fields: dict[str, str] = {}
    for ref in refs:
        spec = catalog.on_demand.get(ref.view)
        if spec is None or ref.view in on_demand:
            continue
        on_demand.append(ref.view)
        fields.update(dict(spec.request_fields))
        for view, feature in spec.inputs:
            if (view, feature) not in have:
                have.add((view, feature))
                stored.append(FeatureRef(view, feature, f"__input__{view}__{feature}"))
    return Expanded(stored, on_demand, fields)


def input_column(expanded: Expanded, refs: list[FeatureRef], view: str, feature: str) -> str:
    """The column an on-demand input (view, feature) is read into: its requested column, or its hidden one."""
    for ref in [*refs, *expanded.stored]:
        if (ref.view, ref.feature) == (view, feature):
            return ref.column
    raise KeyError((view, feature))
