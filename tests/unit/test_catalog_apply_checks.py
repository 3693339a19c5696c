"""Catalog errors caught at load/apply with the right file and line: a file calling sys.exit(), a bad
Aggregation (its own line, with the closest column), two views of a service giving one output column;
and the registry's stored version rebuilt exactly."""

from __future__ import annotations

from pathlib import Path

import pytest

from quiver import CatalogError, load_catalog
from quiver.catalog.loader import catalog_from_dict
from tests.unit.catalogs.builders import PREAMBLE, line_of, transactions, write_catalog, write_parquet

VIEWS = PREAMBLE + '''\
user = Entity("user", ["user_id"])
tx = Source("tx", "data/tx")
'''


@pytest.fixture
def project(tmp_path: Path) -> Path:
    write_parquet(tmp_path / "data/tx/part-0.parquet", transactions())
    return tmp_path


def test_sys_exit_in_a_catalog_file_is_a_catalog_error(project: Path) -> None:
    paths = write_catalog(project / "defs", {"defs.py": "import sys\nsys.exit(3)  # <-\n"})
    with pytest.raises(CatalogError) as info:
        load_catalog(project / "defs", root=project)
    [problem] = info.value.problems
    assert (problem.kind, problem.name) == ("catalog_file", "defs.py")
    assert problem.location.line == line_of(paths["defs.py"])
    assert "sys.exit(3)" in problem.message


def test_bad_aggregation_points_at_its_own_line_and_suggests_a_column(project: Path) -> None:
    paths = write_catalog(project / "defs", {"defs.py": VIEWS + '''\
spend = FeatureView(
    "spend", [user], tx,
    aggregations=[
        Aggregation("amount", "sum", "1h"),
        Aggregation("amonut", "sum", "1h"),  # <-
    ],
)
'''})
    with pytest.raises(CatalogError) as info:
        load_catalog(project / "defs", root=project)
    [problem] = info.value.problems
    assert problem.location.line == line_of(paths["defs.py"])
    assert "'amonut'" in problem.message and "did you mean 'amount'?" in problem.message


def test_two_views_giving_one_output_column_are_refused_at_load(project: Path) -> None:
    paths = write_catalog(project / "defs", {"defs.py": VIEWS + '''\
a = FeatureView("a", [user], tx, ttl="1d", schema=[Field("amount", Float64)])
b = FeatureView("b", [user], tx, ttl="2d", schema=[Field("amount", Float64)])
svc = FeatureService("svc", [a, b])  # <-
'''})
    with pytest.raises(CatalogError) as info:
        load_catalog(project / "defs", root=project)
    [problem] = info.value.problems
    assert (problem.kind, problem.name) == ("feature_service", "svc")
    assert problem.location.line == line_of(paths["defs.py"])
    assert "'a:amount' and 'b:amount' both give the output column 'amount'" in problem.message


def test_catalog_rebuilt_from_its_dict_is_equal(project: Path) -> None:
    write_catalog(project / "defs", {"defs.py": VIEWS + '''\
last = FeatureView("last", [user], tx, ttl="1d", schema=[Field("amount", Float64)], tags={"team": "risk"})
spend = FeatureView("spend", [user], tx, aggregations=[Aggregation("amount", "sum", "1h")])
svc = FeatureService("svc", [last, spend])
'''})
    catalog = load_catalog(project / "defs", root=project)
    rebuilt = catalog_from_dict(catalog.to_dict())
    assert rebuilt == catalog and rebuilt.content_hash == catalog.content_hash
    assert rebuilt.views["spend"].tile_us == catalog.views["spend"].tile_us
