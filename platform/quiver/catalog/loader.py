"""Find definitions in a directory of Python files: every module-level Entity, Source, view and service."""

from __future__ import annotations

import importlib
import sys
import traceback
from pathlib import Path
from types import ModuleType

from quiver.catalog.definitions import KIND_OF
from quiver.catalog.errors import QuiverError
from quiver.catalog.ir import Catalog
from quiver.catalog.validate import SchemaReader, build_catalog


def collect_definitions(catalog_dir: str | Path) -> list[object]:
    """Import every `*.py` under `catalog_dir` (sorted, skipping _private files) and return its definitions.

    Files import as top-level modules with the directory first on sys.path, so catalog files may import
    their siblings (`from entities import user`) and get the very same objects.
    """
    directory = Path(catalog_dir).resolve()
    if not directory.is_dir():
        raise QuiverError(f"catalog directory {directory} does not exist")
    files = [p for p in sorted(directory.rglob("*.py"))
             if not p.name.startswith("_") and not any(part.startswith(".") for part in p.parts)]
    names = {path: ".".join(path.relative_to(directory).with_suffix("").parts) for path in files}
    for path, name in names.items():
        loaded = sys.modules.get(name)
        if loaded is None:
            continue
        origin = str(getattr(loaded, "__file__", "") or "<built-in>")
        if origin == "<built-in>" or origin.startswith((sys.prefix, sys.base_prefix)):
            raise QuiverError(f"{path}: catalog file name shadows the installed module {name!r}; rename it")
        del sys.modules[name]  # left by an earlier load of a catalog with the same file names
    found: list[object] = []
    seen_ids: set[int] = set()
    sys.path.insert(0, str(directory))
    try:
        for path, name in names.items():
            module = _import_file(path, name)
            for value in vars(module).values():
                if type(value) in KIND_OF and id(value) not in seen_ids:
                    seen_ids.add(id(value))
                    found.append(value)
    finally:
        sys.path.remove(str(directory))
    return found


def _import_file(path: Path, name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except QuiverError:
        raise
    except Exception as exc:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.startswith(str(path.parent))]
        where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else str(path)
        raise QuiverError(f"{where}: error while loading {path.name}: {type(exc).__name__}: {exc}") from exc


def load_catalog(catalog_dir: str | Path, root: str | Path | None = None,
                 schema_reader: SchemaReader | None = None) -> Catalog:
    """Load and validate the catalog in `catalog_dir`; source paths resolve against `root` (default: cwd)."""
    return build_catalog(collect_definitions(catalog_dir), Path(root) if root else None, schema_reader)
