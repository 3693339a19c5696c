"""The loader imports a directory of catalog files: sibling imports, errors with file:line, isolation."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from quiver import CatalogError, Entity, FeatureView, QuiverError, load_catalog
from quiver.catalog.loader import collect_definitions
from tests.unit.catalogs.builders import PREAMBLE, line_of, transactions, write_catalog, write_parquet


@pytest.fixture
def project(tmp_path: Path) -> Path:
    write_parquet(tmp_path / "data/tx/part-0.parquet", transactions())
    return tmp_path


def test_siblings_import_each_other_and_share_objects(project: Path) -> None:
    write_catalog(project / "defs", {
        "entities.py": 'from quiver import Entity\nuser = Entity("user", ["user_id"])\n',
        "views.py": 'from entities import user\n'
                    'from quiver import FeatureView, Field, Float64, Source\n'
                    'tx = Source("tx", "data/tx")\n'
                    'v = FeatureView("v", [user], tx, schema=[Field("amount", Float64)], ttl="1d")\n',
    })
    found = collect_definitions(project / "defs")
    users = [d for d in found if isinstance(d, Entity)]
    view = next(d for d in found if isinstance(d, FeatureView))
    assert len(users) == 1 and view.entities[0] is users[0]  # one object, found once
    assert sorted(load_catalog(project / "defs", root=project).views) == ["v"]


def test_python_error_in_a_catalog_file_names_file_and_line(project: Path) -> None:
    paths = write_catalog(project / "defs", {"defs.py": PREAMBLE + 'broken = Field("x", Flaot64)  # <-\n'})
    with pytest.raises(CatalogError) as info:
        load_catalog(project / "defs", root=project)
    [problem] = info.value.problems
    assert (problem.kind, problem.name) == ("catalog_file", "defs.py")
    assert problem.location.file == str(paths["defs.py"])
    assert problem.location.line == line_of(paths["defs.py"])
    assert "NameError: name 'Flaot64' is not defined" in problem.message
    assert f"defs.py:{line_of(paths['defs.py'])}: catalog file 'defs.py': NameError" in str(problem)


def test_error_in_an_imported_sibling_points_at_the_sibling(project: Path) -> None:
    paths = write_catalog(project / "defs", {
        "a_views.py": "from b_helpers import WINDOW\n",
        "b_helpers.py": "WINDOW = '1h'\nraise RuntimeError('helper exploded')  # <-\n",
    })
    with pytest.raises(CatalogError) as info:
        load_catalog(project / "defs", root=project)
    # a_views fails because b_helpers does; both report the same line once.
    [problem] = info.value.problems
    assert problem.name == "b_helpers.py"
    assert (problem.location.file, problem.location.line) == (str(paths["b_helpers.py"]), 2)
    assert "RuntimeError: helper exploded" in problem.message


def test_syntax_error_names_file_and_line(project: Path) -> None:
    paths = write_catalog(project / "defs", {"defs.py": "from quiver import Entity\n\nuser = Entity(\"user\", [\n"})
    with pytest.raises(CatalogError) as info:
        load_catalog(project / "defs", root=project)
    [problem] = info.value.problems
    assert problem.location.file == str(paths["defs.py"])
    assert problem.location.line == 3
    assert problem.message.startswith("SyntaxError: ")


def test_errors_in_several_files_are_reported_together(project: Path) -> None:
    write_catalog(project / "defs", {
        "one.py": "x = 1 / 0\n",
        "two.py": "import no_such_module_anywhere\n",
        "three.py": PREAMBLE,
    })
    with pytest.raises(CatalogError) as info:
        load_catalog(project / "defs", root=project)
    found = {(p.name, p.location.line, p.message.split(":")[0]) for p in info.value.problems}
    assert found == {("one.py", 1, "ZeroDivisionError"), ("two.py", 1, "ModuleNotFoundError")}


def test_missing_catalog_directory(tmp_path: Path) -> None:
    with pytest.raises(QuiverError, match=r"catalog directory .*nowhere does not exist"):
        load_catalog(tmp_path / "nowhere")


def test_catalog_path_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "defs.py").write_text("")
    with pytest.raises(QuiverError, match="is not a directory"):
        load_catalog(tmp_path / "defs.py")


def test_private_hidden_and_cache_files_are_skipped(project: Path) -> None:
    write_catalog(project / "defs", {
        "defs.py": PREAMBLE,
        "_scratch.py": "raise RuntimeError('private files are not catalog files')\n",
        ".hidden/x.py": "raise RuntimeError('hidden folders are not catalog files')\n",
        "_helpers/x.py": "raise RuntimeError('private folders are not catalog files')\n",
    })
    assert sorted(load_catalog(project / "defs", root=project).views) == ["good"]


def test_catalog_inside_a_hidden_directory_still_loads(tmp_path: Path) -> None:
    # Only hidden parts *inside* the catalog are skipped; the catalog itself may live under ~/.something.
    root = tmp_path / ".cache" / "proj"
    write_parquet(root / "data/tx/part-0.parquet", transactions())
    write_catalog(root / "defs", {"defs.py": PREAMBLE})
    assert sorted(load_catalog(root / "defs", root=root).views) == ["good"]


def test_subfolders_are_loaded(project: Path) -> None:
    write_catalog(project / "defs", {
        "base.py": PREAMBLE,
        "team/extra.py": 'from base import tx, user\nfrom quiver import FeatureView, Field, String\n'
                         'extra = FeatureView("extra", [user], tx, schema=[Field("category", String)], ttl="1d")\n',
    })
    assert sorted(load_catalog(project / "defs", root=project).views) == ["extra", "good"]


def test_file_named_like_an_imported_module_is_refused(project: Path) -> None:
    write_catalog(project / "defs", {"json.py": PREAMBLE})
    with pytest.raises(QuiverError, match="shadows the imported module 'json'"):
        load_catalog(project / "defs", root=project)


def test_file_named_like_an_installed_module_is_refused(project: Path) -> None:
    assert "pydoc_data" not in sys.modules  # installed with Python, never imported by these tests
    write_catalog(project / "defs", {"pydoc_data.py": PREAMBLE})
    with pytest.raises(QuiverError, match="shadows the installed module 'pydoc_data'"):
        load_catalog(project / "defs", root=project)
    assert "pydoc_data" not in sys.modules


def test_loads_leave_no_modules_behind_and_do_not_mix(tmp_path: Path) -> None:
    # Two projects with the same file names: the second load must not see the first one's modules.
    for name, view in (("p1", "first"), ("p2", "second")):
        write_parquet(tmp_path / name / "data/tx/part-0.parquet", transactions())
        write_catalog(tmp_path / name / "defs", {
            "entities.py": 'from quiver import Entity\nuser = Entity("user", ["user_id"])\n',
            "views.py": 'from entities import user\nfrom quiver import FeatureView, Field, Float64, Source\n'
                        f'v = FeatureView("{view}", [user], Source("tx", "data/tx"), '
                        'schema=[Field("amount", Float64)], ttl="1d")\n',
        })
    before = set(sys.modules)
    first = load_catalog(tmp_path / "p1/defs", root=tmp_path / "p1")
    second = load_catalog(tmp_path / "p2/defs", root=tmp_path / "p2")
    again = load_catalog(tmp_path / "p1/defs", root=tmp_path / "p1")
    assert sorted(first.views) == ["first"] and sorted(second.views) == ["second"]
    assert again.content_hash == first.content_hash
    assert "entities" not in sys.modules and "views" not in sys.modules
    leftovers = [name for name in set(sys.modules) - before
                 if str(getattr(sys.modules[name], "__file__", "") or "").startswith(str(tmp_path))]
    assert leftovers == []
    assert str(tmp_path / "p1/defs") not in sys.path


def test_definitions_only_referenced_by_others_are_part_of_the_catalog(project: Path) -> None:
    write_catalog(project / "defs", {"defs.py": (
        "from quiver import Entity, FeatureService, FeatureView, Field, Float64, Source\n"
        "svc = FeatureService('svc', [FeatureView('inline', [Entity('user', ['user_id'])],\n"
        "                      Source('tx', 'data/tx'), schema=[Field('amount', Float64)], ttl='1d')])\n")})
    catalog = load_catalog(project / "defs", root=project)
    assert sorted(catalog.entities) == ["user"]
    assert sorted(catalog.sources) == ["tx"]
    assert sorted(catalog.views) == ["inline"]
    assert catalog.services["svc"].features == ("inline:amount",)


def test_empty_catalog_directory_gives_an_empty_catalog(tmp_path: Path) -> None:
    (tmp_path / "defs").mkdir()
    catalog = load_catalog(tmp_path / "defs", root=tmp_path)
    assert catalog.to_dict() == {"entity": {}, "source": {}, "feature_view": {}, "feature_service": {}}
