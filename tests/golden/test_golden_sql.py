"""Golden snapshots of generated SQL: tests/golden/<target>/<view>__<kind>.sql.

The generated SQL must equal the files exactly. After an intended compiler change, rewrite them with
`QUIVER_UPDATE_GOLDEN=1 .venv/bin/pytest tests/golden` and review the diff like code.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

from quiver.catalog.ir import Catalog
from quiver.catalog.loader import load_catalog
from quiver.compile import dialect_for
from quiver.compile.sql import compile_values_at_boundary, compile_view

HERE = Path(__file__).parent
CATALOG_DIR = HERE / "catalog"
TARGETS = ("duckdb", "spark")
# The golden catalog's source schema; the cross-engine tests write real files with these columns.
COLUMNS = {"user_id": "int64", "merchant_id": "int64", "amount": "float64", "qty": "int64", "flag": "bool",
           "cat": "string", "ts": "timestamp"}
UPDATE = os.environ.get("QUIVER_UPDATE_GOLDEN") == "1"


def golden_catalog() -> Catalog:
    return load_catalog(CATALOG_DIR, root=HERE, schema_reader=lambda source: dict(COLUMNS))


def generated() -> dict[Path, str]:
    """Every golden file's path → the SQL the compiler generates for it now."""
    catalog = golden_catalog()
    out: dict[Path, str] = {}
    for target in TARGETS:
        dialect = dialect_for(target)
        for name, view in sorted(catalog.views.items()):
            for kind, sql in compile_view(dialect, view).items():
                out[HERE / target / f"{name}__{kind}.sql"] = sql
            if view.kind == "agg":
                out[HERE / target / f"{name}__values_at_boundary.sql"] = compile_values_at_boundary(dialect, view)
    return out


CASES = generated()


@pytest.mark.parametrize("path", sorted(CASES), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_generated_sql_matches_golden_file(path: Path) -> None:
    sql = CASES[path]
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(sql)
    assert path.exists(), f"missing golden file {path}; run with QUIVER_UPDATE_GOLDEN=1 to create it"
    expected = path.read_text()
    if sql != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), sql.splitlines(True),
                                            str(path), "generated"))
        pytest.fail(f"generated SQL differs from {path} (QUIVER_UPDATE_GOLDEN=1 rewrites it):\n{diff}")


def test_no_stale_golden_files() -> None:
    on_disk = {p for target in TARGETS for p in (HERE / target).glob("*.sql")}
    if UPDATE:
        for stale in on_disk - set(CASES):
            stale.unlink()
        on_disk &= set(CASES)
    assert on_disk == set(CASES), f"golden files without a generated query: {sorted(on_disk - set(CASES))}"


def test_golden_catalog_covers_every_fn_input_type_and_view_shape() -> None:
    from quiver.catalog.aggregations import AGG_FUNCTIONS

    catalog = golden_catalog()
    aggs = [a for v in catalog.views.values() for a in v.aggregations]
    assert {a.fn for a in aggs} == set(AGG_FUNCTIONS)
    for dtype in ("float64", "int64", "bool"):
        assert {a.fn for a in aggs if a.input_dtype == dtype} == set(AGG_FUNCTIONS), dtype
    assert any(v.kind == "last" for v in catalog.views.values())
    assert any(v.kind == "agg" and len(v.keys) == 2 for v in catalog.views.values())
    assert any(v.kind == "last" and len(v.keys) == 2 for v in catalog.views.values())
