"""The registry on real SQLite files and a real PostgreSQL server: versions, diffs, lineage, migrations,
and several processes applying at once."""

from __future__ import annotations

import json
import multiprocessing as mp
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from quiver import Catalog, QuiverError
from quiver.catalog.ir import content_hash
from quiver.catalog.validate import build_catalog
from quiver.registry import Registry
from quiver.registry.diff import diff_catalogs
from tests.unit.catalogs.builders import transactions, write_parquet

pytestmark = pytest.mark.integration


@pytest.fixture
def root(tmp_path: Path) -> Path:
    write_parquet(tmp_path / "data/tx/part-0.parquet", transactions())
    return tmp_path


def make_catalog(root: Path, *, ttl: str = "1d", fields: tuple[str, ...] = ("amount",), spend_window: str = "1h",
                 extra_view: str | None = None, service: bool = True) -> Catalog:
    """A small real catalog (validated against the Parquet under `root`), varied by the arguments."""
    from quiver import Aggregation, Entity, FeatureService, FeatureView, Field, Source

    dtypes = {"amount": "float64", "category": "string", "merchant_id": "int64"}
    user = Entity("user", ["user_id"])
    tx = Source("tx", "data/tx")
    last = FeatureView("user_last", [user], tx, schema=[Field(f, dtypes[f]) for f in fields], ttl=ttl)
    spend = FeatureView("user_spend", [user], tx,
                        aggregations=[Aggregation("amount", "sum", spend_window, name="spend")])
    defs: list[object] = [user, tx, last, spend]
    if extra_view:
        defs.append(FeatureView(extra_view, [user], tx, schema=[Field("category", "string")], ttl="1d"))
    if service:
        defs.append(FeatureService("fraud", [last, "user_spend:spend"]))
    return build_catalog(defs, root=root)


def _alembic_head() -> str:
    from alembic.script import ScriptDirectory

    import quiver.registry.repository as repository

    head = ScriptDirectory(str(repository._MIGRATIONS)).get_current_head()
    assert head is not None
    return head


def _tables(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def _alembic_rows(url: str) -> list[str]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as c:
            return [r[0] for r in c.execute(sa.text("SELECT version_num FROM alembic_version"))]
    finally:
        engine.dispose()


# ----- migrations -----

def test_fresh_database_migrates_to_head_and_records_the_revision(registry_url: str) -> None:
    registry = Registry(registry_url)
    assert registry.schema_revision() == _alembic_head()
    assert _alembic_rows(registry_url) == [_alembic_head()]
    assert {"catalog_versions", "definitions", "lineage_edges", "materialization_runs"} <= _tables(registry_url)
    registry.close()


def test_migrating_twice_is_a_no_op(registry_url: str, root: Path) -> None:
    registry = Registry(registry_url)
    registry.apply(make_catalog(root))
    tables = _tables(registry_url)
    registry.migrate()
    Registry(registry_url).close()  # a second process opening the registry migrates again
    assert _tables(registry_url) == tables
    assert _alembic_rows(registry_url) == [_alembic_head()]
    assert [v.version for v in registry.versions()] == [1]  # data untouched
    registry.close()


def test_without_migrate_an_empty_database_has_no_tables(registry_url: str) -> None:
    Registry(registry_url, migrate=False).close()
    assert "catalog_versions" not in _tables(registry_url)


# ----- versions, history, diff -----

def test_apply_versions_only_on_change_and_keeps_history(registry_url: str, root: Path) -> None:
    registry = Registry(registry_url, project="fraud")
    v1 = make_catalog(root)
    first = registry.apply(v1, author="ana")
    assert (first.version, first.created) == (1, True)
    assert [c.action for c in first.diff.changes] == ["added"] * 5

    again = registry.apply(make_catalog(root), author="bob")  # identical content: nothing is stored
    assert (again.version, again.created, again.diff.is_empty) == (1, False, True)
    assert registry.count_versions() == 1

    v2 = make_catalog(root, ttl="3d")
    second = registry.apply(v2, author="bob")
    assert (second.version, second.created) == (2, True)

    reverted = registry.apply(make_catalog(root), author="cy")  # back to v1's content: a new version
    assert (reverted.version, reverted.created) == (3, True)
    assert [c.details for c in reverted.diff.changes] == [["ttl: 3d → 1d"]]

    infos = registry.versions()
    assert [(i.version, i.author) for i in infos] == [(1, "ana"), (2, "bob"), (3, "cy")]
    assert infos[0].content_hash == infos[2].content_hash == v1.content_hash != infos[1].content_hash
    assert infos[1].diff == [{"kind": "feature_view", "name": "user_last", "action": "changed",
                              "details": ["ttl: 1d → 3d"]}]
    assert infos[0].created_at <= infos[1].created_at <= infos[2].created_at
    assert registry.catalog_dict(1) == v1.to_dict()
    assert registry.catalog_dict(2) == v2.to_dict()
    assert registry.catalog_dict() == v1.to_dict()  # latest
    with pytest.raises(QuiverError, match="no catalog version 9"):
        registry.catalog_dict(9)
    registry.close()


def test_diff_names_views_and_features_added_changed_removed(registry_url: str, root: Path) -> None:
    registry = Registry(registry_url)
    registry.apply(make_catalog(root, fields=("amount", "merchant_id"), extra_view="old_view"))
    new = make_catalog(root, fields=("amount", "category"), spend_window="2h", ttl="2d", extra_view="new_view")
    planned = registry.plan(new)
    result = registry.apply(new)
    assert result.diff == planned
    by_name = {(c.kind, c.name): c for c in result.diff.changes}
    assert by_name[("feature_view", "new_view")].action == "added"
    assert by_name[("feature_view", "new_view")].details == ["features: category"]
    assert by_name[("feature_view", "old_view")].action == "removed"
    assert by_name[("feature_view", "user_last")].details == [
        "+feature category", "-feature merchant_id", "ttl: 1d → 2d"]
    assert by_name[("feature_view", "user_spend")].details == ["~feature spend: window: 1h → 2h", "tile: 5m → 10m"]
    assert by_name[("feature_service", "fraud")].details == [
        "+feature user_last:category", "-feature user_last:merchant_id"]
    assert ("entity", "user") not in by_name and ("source", "tx") not in by_name


def test_plan_does_not_write(registry_url: str, root: Path) -> None:
    registry = Registry(registry_url)
    assert [c.action for c in registry.plan(make_catalog(root)).changes] == ["added"] * 5
    assert registry.count_versions() == 0 and registry.latest() is None
    registry.apply(make_catalog(root))
    assert registry.plan(make_catalog(root)).is_empty
    assert not registry.plan(make_catalog(root, ttl="2d")).is_empty
    assert registry.count_versions() == 1
    registry.close()


def test_projects_are_versioned_independently(registry_url: str, root: Path) -> None:
    a, b = Registry(registry_url, project="a"), Registry(registry_url, project="b")
    a.apply(make_catalog(root))
    a.apply(make_catalog(root, ttl="2d"))
    assert b.apply(make_catalog(root)).version == 1
    assert [v.version for v in a.versions()] == [1, 2] and [v.version for v in b.versions()] == [1]
    a.close()
    b.close()


# ----- definitions and lineage -----

def test_lineage_view_to_source_and_entities(registry_url: str, root: Path) -> None:
    registry = Registry(registry_url)
    registry.apply(make_catalog(root))
    edges = set(registry.lineage("user_last"))
    assert edges == {("source", "tx", "feature_view", "user_last"), ("entity", "user", "feature_view", "user_last"),
                     ("feature_view", "user_last", "feature_service", "fraud")}
    assert ("source", "tx", "feature_view", "user_spend") in set(registry.lineage("tx"))
    assert ("entity", "user", "feature_view", "user_spend") in set(registry.lineage("user"))
    registry.apply(make_catalog(root, service=False))
    assert ("feature_view", "user_last", "feature_service", "fraud") not in set(registry.lineage("user_last"))
    assert ("feature_view", "user_last", "feature_service", "fraud") in set(registry.lineage("user_last", version=1))
    registry.close()


def test_each_version_stores_its_definitions(registry_url: str, root: Path) -> None:
    registry = Registry(registry_url)
    catalog = make_catalog(root)
    registry.apply(catalog)
    engine = sa.create_engine(registry_url)
    with engine.connect() as c:
        rows = c.execute(sa.text("SELECT kind, name, content_hash, spec_json, location FROM definitions")).all()
    engine.dispose()
    assert sorted((r.kind, r.name) for r in rows) == [
        ("entity", "user"), ("feature_service", "fraud"), ("feature_view", "user_last"),
        ("feature_view", "user_spend"), ("source", "tx")]
    for row in rows:
        assert content_hash(json.loads(row.spec_json)) == row.content_hash
        assert "test_registry.py:" in row.location  # where make_catalog created it
    registry.close()


# ----- runs -----

def test_materialization_runs_are_recorded(registry_url: str) -> None:
    registry = Registry(registry_url)
    run = registry.start_run("user_spend", "backfill", "duckdb")
    registry.finish_run(run, "succeeded", rows=42, detail={"days": 2})
    [row] = registry.runs(view="user_spend")
    assert (row["status"], row["rows"], json.loads(row["detail_json"])) == ("succeeded", 42, {"days": 2})
    assert registry.runs(kind="materialize") == []
    registry.close()


# ----- errors -----

@pytest.mark.parametrize("url", ["nonsense", "postgresql+psycopg://quiver:secret@127.0.0.1:1/none",
                                 "sqlite:////proc/no/such/dir/registry.db"])
def test_unusable_registry_url_is_a_user_error(url: str) -> None:
    with pytest.raises(QuiverError, match="cannot open registry") as info:
        Registry(url)
    assert "secret" not in str(info.value)


# ----- several processes at once -----

def _apply_worker(url: str, root: str, worker: int, steps: int, barrier: Any, out: Any) -> None:
    try:
        registry = Registry(url, project="conc")
        barrier.wait(timeout=120)
        for step in range(steps):
            catalog = make_catalog(Path(root), extra_view=f"w{worker}_s{step}")
            result = registry.apply(catalog, author=f"w{worker}")
            out.put((worker, result.version, result.created, catalog.content_hash))
        registry.close()
    except BaseException as exc:  # the parent reports it; a child traceback alone is easy to miss
        out.put((worker, "error", repr(exc), ""))
        raise


def _open_worker(url: str, barrier: Any, out: Any) -> None:
    try:
        barrier.wait(timeout=120)
        registry = Registry(url, project="conc")
        out.put(("ok", registry.schema_revision()))
        registry.close()
    except BaseException as exc:
        out.put(("error", repr(exc)))
        raise


def _run_processes(target: Any, args: list[tuple[Any, ...]]) -> list[Any]:
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(len(args)), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*a, barrier, out)) for a in args]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    results = []
    while not out.empty():
        results.append(out.get())
    assert [p.exitcode for p in procs] == [0] * len(procs), results
    return results


def test_concurrent_first_time_migration(registry_url: str) -> None:
    results = _run_processes(_open_worker, [(registry_url,)] * 4)
    assert sorted(results) == [("ok", _alembic_head())] * 4
    assert _alembic_rows(registry_url) == [_alembic_head()]


def test_concurrent_applies_from_several_processes(registry_url: str, root: Path) -> None:
    workers, steps = 4, 5
    results = _run_processes(_apply_worker, [(registry_url, str(root), w, steps) for w in range(workers)])
    assert not [r for r in results if r[1] == "error"], results
    assert len(results) == workers * steps and all(created for _, _, created, _ in results)

    registry = Registry(registry_url, project="conc")
    infos = registry.versions()
    # No duplicates, no gaps: every apply got its own next number.
    assert [i.version for i in infos] == list(range(1, workers * steps + 1))
    assert sorted(v for _, v, _, _ in results) == [i.version for i in infos]
    for worker in range(workers):  # each process saw its own versions increase
        mine = [v for w, v, _, _ in results if w == worker]
        assert mine == sorted(mine)
    # Every stored catalog is intact and is what its process applied; each diff is against its predecessor.
    applied = {version: digest for _, version, _, digest in results}
    previous = None
    for info in infos:
        stored = registry.catalog_dict(info.version)
        assert content_hash(stored) == info.content_hash == applied[info.version]
        assert info.diff == diff_catalogs(previous, stored).to_json()
        previous = stored
    registry.close()


def test_concurrent_identical_applies_store_one_version(registry_url: str, root: Path) -> None:
    results = _run_processes(_apply_same_worker, [(registry_url, str(root))] * 3)
    assert sorted(created for created, _ in results) == [False, False, True]
    assert {version for _, version in results} == {1}


def _apply_same_worker(url: str, root: str, barrier: Any, out: Any) -> None:
    registry = Registry(url, project="conc")
    catalog = make_catalog(Path(root))
    barrier.wait(timeout=120)
    result = registry.apply(catalog)
    out.put((result.created, result.version))
    registry.close()
