"""Validation of request sources and on-demand feature views into the Catalog IR (called by validate.py).

An on-demand view may read the fields of its request sources, stored features (`inputs`, "view:feature" of
views of the same catalog) and the request's time `request_ts`; never another on-demand view, so the
features a request needs form no cycle. Every name it sees as a column — request fields, input features,
`request_ts` — must be distinct, and its outputs are new names. The function must be a plain Python
function whose source can be read (the registry keeps the source: a serving process that rebuilds the
applied version from the registry runs exactly that code).
"""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable
from typing import Any

from quiver.catalog.contracts import contract_spec
from quiver.catalog.definitions import Field, Location, OnDemandFeatureView, RequestSource
from quiver.catalog.ir import FieldSpec, OnDemandSpec, RequestSourceSpec, ViewSpec
from quiver.catalog.types import DTYPES, is_identifier

REQUEST_TS = "request_ts"  # the request's time, always passed to the function
MODES = ("pandas", "python")  # what the function takes and returns: a DataFrame, or a dict of lists
Add = Callable[[str, str, Location, str], None]  # (kind, name, location, message)


def request_source_spec(add: Add, source: RequestSource) -> RequestSourceSpec | None:
    fields = _fields(add, "request_source", source.name, source.location, source.schema, "field")
    if not fields:
        add("request_source", source.name, source.location, "declares no fields")
    for name in (f.name for f in fields):
        if name == REQUEST_TS:
            add("request_source", source.name, source.location,
                f"field {REQUEST_TS!r} is reserved: it is the request's own time")
    contract = None
    if source.contract is not None:
        where = getattr(source.contract, "location", source.location)
        contract = contract_spec(lambda message: add("request_source", source.name, where, message),
                                 source.contract, {f.name: f.dtype for f in fields})
    return RequestSourceSpec(source.name, tuple((f.name, f.dtype) for f in fields), source.description,
                             source.owner, tuple(sorted(source.tags.items())), source.location, contract)


def _fields(add: Add, kind: str, name: str, where: Location, schema: Any, what: str) -> list[FieldSpec]:
    out: list[FieldSpec] = []
    seen: set[str] = set()
    for f in schema:
        if not isinstance(f, Field):
            add(kind, name, where, f"{what} {f!r} must be a Field(name, dtype)")
            continue
        if not is_identifier(f.name):
            add(kind, name, where, f"{what} {f.name!r} must be a plain identifier")
        elif f.dtype not in DTYPES:
            add(kind, name, where, f"{what} {f.name!r} has unknown dtype {f.dtype!r}; use one of "
                                   f"{', '.join(sorted(DTYPES))}")
        elif f.name in seen:
            add(kind, name, where, f"{what} {f.name!r} is declared twice")
        else:
            seen.add(f.name)
            out.append(FieldSpec(f.name, f.name, f.dtype, f.description))
    return out


def on_demand_spec(add: Add, view: OnDemandFeatureView, views: dict[str, ViewSpec | None],
                   request_specs: dict[str, RequestSourceSpec | None], on_demand_names: set[str]) -> OnDemandSpec | None:
    kind, name, where = "on_demand_view", view.name, view.location
    problems_before = _Counter(add)
    report = problems_before.add
    outputs = _fields(report, kind, name, where, view.schema, "output")
    if not outputs:
        report(kind, name, where, "declares no output features (schema=[Field(...)])")
    sources: list[str] = []
    seen: dict[str, str] = {REQUEST_TS: "the request time"}
    request_fields: list[tuple[str, str]] = []
    for source in view.request_sources:
        if not isinstance(source, RequestSource):
            report(kind, name, where, f"request source {source!r} must be a RequestSource")
            continue
        spec = request_specs.get(source.name)
        sources.append(source.name)
        for field_name, dtype in (spec.columns if spec else ()):
            if field_name in seen:
                report(kind, name, where, f"request field {field_name!r} clashes with {seen[field_name]}")
                continue
            seen[field_name] = f"request field {source.name}.{field_name}"
            request_fields.append((field_name, dtype))
    inputs: list[tuple[str, str]] = []
    dtypes: list[str] = []
    for ref in view.inputs:
        view_name, sep, feature = ref.partition(":") if isinstance(ref, str) else ("", "", "")
        if not sep:
            report(kind, name, where, f"input {ref!r} must be 'view:feature'")
            continue
        if view_name in on_demand_names:
            report(kind, name, where, f"input {ref!r} is an on-demand view's output: on-demand views read stored "
                                      f"features and request fields only (no chains, so no cycles)")
            continue
        if view_name not in views:
            report(kind, name, where, f"input {ref!r} names unknown view {view_name!r}; views: "
                                      f"{', '.join(sorted(views))}")
            continue
        stored = views[view_name]
        if stored is not None and feature not in stored.feature_names:
            report(kind, name, where, f"input {ref!r}: view {view_name!r} has no feature {feature!r}; its "
                                      f"features: {', '.join(stored.feature_names)}")
            continue
        if stored is not None and not stored.online:
            report(kind, name, where, f"input {ref!r}: view {view_name!r} is offline-only, so the function "
                                      f"could not run online")
            continue
        if feature in seen:
            report(kind, name, where, f"input {ref!r}: its column {feature!r} clashes with {seen[feature]}")
            continue
        seen[feature] = f"input {ref}"
        inputs.append((view_name, feature))
        dtypes.append(stored.feature_dtype(feature) if stored is not None else "float64")
    for output in outputs:
        if output.name in seen:
            report(kind, name, where, f"output {output.name!r} has the name of {seen[output.name]}; outputs "
                                      f"are new features")
    udf_name, source_text = _udf_source(report, kind, name, where, view.udf)
    if view.mode not in MODES:
        report(kind, name, where, f"mode {view.mode!r} is not one of {', '.join(map(repr, MODES))} (pandas: "
                                  f"DataFrame in and out; python: lists in and out)")
    if problems_before.count:
        return None
    return OnDemandSpec(name, tuple(sources), tuple(request_fields), tuple(inputs), tuple(dtypes), tuple(outputs),
                        udf_name, source_text, view.description, view.owner, tuple(sorted(view.tags.items())),
                        where, udf=view.udf, mode=view.mode)


def _udf_source(add: Add, kind: str, name: str, where: Location, udf: Any) -> tuple[str, str]:
    if not inspect.isfunction(udf) or udf.__name__ == "<lambda>":
        add(kind, name, where, f"udf must be a named Python function (def …), got {type(udf).__name__}")
        return "", ""
    try:
        text = textwrap.dedent(inspect.getsource(udf))
    except (OSError, TypeError):
        add(kind, name, where, f"the source of udf {udf.__name__!r} cannot be read (define it in a file)")
        return udf.__name__, ""
    return udf.__name__, text


class _Counter:
    """Counts the problems one definition adds (so a spec is built only when it has none)."""

    def __init__(self, add: Add):
        self._add, self.count = add, 0

    def add(self, kind: str, name: str, where: Location, message: str) -> None:
        self.count += 1
        self._add(kind, name, where, message)


def udf_from_source(spec_name: str, udf_name: str, source: str) -> Callable[[Any], Any]:
    """The function of an applied on-demand view, rebuilt from the source the registry stored."""
    import math

    import numpy as np
    import pandas as pd

    namespace: dict[str, Any] = {"np": np, "numpy": np, "pd": pd, "pandas": pd, "math": math}
    try:
        exec(compile(source, f"<on-demand view {spec_name}>", "exec"), namespace)
    except Exception as exc:
        from quiver.catalog.errors import QuiverError

        raise QuiverError(f"on-demand view {spec_name!r}: its stored function does not load ({exc})") from None
    function = namespace.get(udf_name)
    if not callable(function):
        from quiver.catalog.errors import QuiverError

        raise QuiverError(f"on-demand view {spec_name!r}: the stored source defines no function {udf_name!r}")
    return function  # type: ignore[no-any-return]
