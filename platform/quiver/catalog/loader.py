"""Find definitions in a directory of Python files: every module-level Entity, Source, view and service."""

from __future__ import annotations

import importlib
import importlib.util
import sys
import traceback
from pathlib import Path
from typing import Any

from quiver.catalog.definitions import KIND_OF, Location
from quiver.catalog.errors import CatalogError, DefinitionProblem, QuiverError
from quiver.catalog.ir import (
    AggSpec,
    Catalog,
    CheckSpec,
    ContractSpec,
    EntitySpec,
    FieldSpec,
    OnDemandSpec,
    RequestSourceSpec,
    ServiceSpec,
    SourceSpec,
    StreamSpec,
    ViewSpec,
)
from quiver.catalog.validate import SchemaReader, build_catalog


def collect_definitions(catalog_dir: str | Path) -> list[object]:
    """Import every `*.py` under `catalog_dir` (sorted, skipping _private and .hidden) and return its definitions.

    Files import as top-level modules with the directory first on sys.path, so catalog files may import
    their siblings (`from entities import user`) and get the very same objects. The modules are removed
    from `sys.modules` afterwards, so the next load (of this or another catalog) starts fresh.
    Raises CatalogError listing every file that failed to import, each with the failing file and line.
    """
    directory = Path(catalog_dir).resolve()
    if not directory.exists():
        raise QuiverError(f"catalog directory {directory} does not exist")
    if not directory.is_dir():
        raise QuiverError(f"catalog path {directory} is not a directory")
    files = [p for p in sorted(directory.rglob("*.py"))
             if not any(part.startswith((".", "_")) for part in p.relative_to(directory).parts)]
    names = {path: ".".join(path.relative_to(directory).with_suffix("").parts) for path in files}
    _check_shadowing(names, directory)
    found: list[object] = []
    seen_ids: set[int] = set()
    problems: list[DefinitionProblem] = []
    before = set(sys.modules)
    sys.path.insert(0, str(directory))
    try:
        for path, name in names.items():
            try:
                module = importlib.import_module(name)
            except (Exception, SystemExit) as exc:  # any error in user code (even sys.exit) is a located problem
                problem = _load_problem(path, directory, exc)
                if problem not in problems:  # a broken file imported by siblings fails once per importer
                    problems.append(problem)
                continue
            for value in vars(module).values():
                if type(value) in KIND_OF and id(value) not in seen_ids:
                    seen_ids.add(id(value))
                    found.append(value)
    finally:
        sys.path.remove(str(directory))
        for name in set(sys.modules) - before:
            if _inside(getattr(sys.modules[name], "__file__", None), directory):
                del sys.modules[name]
    if problems:
        raise CatalogError(problems)
    return found


def _inside(file: object, directory: Path) -> bool:
    return isinstance(file, str) and Path(file).resolve().is_relative_to(directory)


def _check_shadowing(names: dict[Path, str], directory: Path) -> None:
    # A catalog file named like an already imported or installed module would either never be imported
    # (sys.modules wins) or hijack that module for the rest of the process: refuse both.
    for path, name in names.items():
        top = name.split(".", 1)[0]
        existing = sys.modules.get(top)
        if existing is not None:
            if not _inside(getattr(existing, "__file__", None), directory):
                raise QuiverError(f"{path}: catalog file name shadows the imported module {top!r}; rename it")
            continue
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            continue
        origin = spec.origin if spec else None
        if origin and origin != "namespace" and not _inside(origin, directory):
            raise QuiverError(f"{path}: catalog file name shadows the installed module {top!r}; rename it")


def _load_problem(path: Path, directory: Path, exc: BaseException) -> DefinitionProblem:
    """The innermost catalog-file frame of the error (SyntaxErrors carry their own file and line)."""
    if isinstance(exc, SyntaxError) and _inside(exc.filename, directory):
        where = Location(str(exc.filename), exc.lineno or 0)
        message = f"{type(exc).__name__}: {exc.msg}"
    else:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if _inside(f.filename, directory)]
        where = Location(frames[-1].filename, frames[-1].lineno or 0) if frames else Location(str(path), 0)
        message = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, SystemExit):
            message = f"the file exits the interpreter while loading (sys.exit({exc.code!r})); remove the call"
    name = Path(where.file).relative_to(directory).as_posix() if _inside(where.file, directory) else path.name
    return DefinitionProblem("catalog_file", name, where, message)


def load_catalog(catalog_dir: str | Path, root: str | Path | None = None,
                 schema_reader: SchemaReader | None = None) -> Catalog:
    """Load and validate the catalog in `catalog_dir`; source paths resolve against `root` (default: cwd)."""
    return build_catalog(collect_definitions(catalog_dir), Path(root) if root else None, schema_reader)


def catalog_from_dict(data: dict[str, Any]) -> Catalog:
    """Rebuild a Catalog from its canonical dict (`Catalog.to_dict()`, as the registry stores it)."""

    def pairs(items: Any) -> tuple[tuple[str, str], ...]:
        return tuple((str(a), str(b)) for a, b in items)

    def plain(spec: dict[str, Any], *tuple_pairs: str) -> dict[str, Any]:
        out = dict(spec)
        for name in tuple_pairs:
            out[name] = pairs(out.get(name, ()))
        return out

    entities = {n: EntitySpec(**plain(s, "keys", "tags")) for n, s in data.get("entity", {}).items()}
    sources = {}
    for name, spec in data.get("source", {}).items():
        fields = plain(spec, "columns", "tags")
        fields["stream"] = StreamSpec(**spec["stream"]) if spec.get("stream") else None
        fields["contract"] = _contract(spec.get("contract"))
        sources[name] = SourceSpec(**fields)
    views = {}
    for name, spec in data.get("feature_view", {}).items():
        fields = plain(spec, "keys", "tags")
        fields["entities"] = tuple(spec["entities"])
        fields["fields"] = tuple(FieldSpec(**f) for f in spec.get("fields", ()))
        fields["aggregations"] = tuple(AggSpec(**a) for a in spec.get("aggregations", ()))
        fields["contract"] = _contract(spec.get("contract"))
        views[name] = ViewSpec(**fields)
    services = {n: ServiceSpec(**{**plain(s, "tags"), "features": tuple(s["features"])})
                for n, s in data.get("feature_service", {}).items()}
    requests = {n: RequestSourceSpec(**{**plain(s, "columns", "tags"), "contract": _contract(s.get("contract"))})
                for n, s in data.get("request_source", {}).items()}
    on_demand = {}
    for name, spec in data.get("on_demand_view", {}).items():
        from quiver.catalog.on_demand import udf_from_source

        fields = plain(spec, "request_fields", "inputs", "tags")
        fields["request_sources"] = tuple(spec["request_sources"])
        fields["input_dtypes"] = tuple(spec.get("input_dtypes", ()))
        fields["outputs"] = tuple(FieldSpec(**f) for f in spec.get("outputs", ()))
        fields["udf"] = udf_from_source(name, spec["udf_name"], spec["udf_source"])
        on_demand[name] = OnDemandSpec(**fields)
    return Catalog(entities, sources, views, services, requests, on_demand)


def _contract(data: dict[str, Any] | None) -> ContractSpec | None:
    if not data:
        return None
    checks = tuple(CheckSpec(c["column"], c["dtype"], c["rule"],
                             tuple(c["value"]) if isinstance(c.get("value"), list) else c.get("value"))
                   for c in data["checks"])
    return ContractSpec(checks, float(data.get("max_invalid_share", 0.01)))
