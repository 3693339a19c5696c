"""`quiver apply` is the gate: readers use the registry's current version, an empty folder is never applied
by accident, `plan` says what needs a backfill, and `training-set` checks --out before the join."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from quiver.serving.store import FeatureStore
from tests.integration.test_cli import ENTITIES, VIEWS, ok, project, quiver, user_error  # noqa: F401  (fixture)
from tests.unit.catalogs.builders import write_catalog

EXTRA = '''
from entities import user as _user
from quiver import FeatureView as _FV, Field as _F, Float64 as _Float, Source as _S

late_view = _FV("late_view", [_user], _S("tx2", "data/tx"), ttl="1d", schema=[_F("amount", _Float)])
'''


def test_empty_catalog_is_refused_unless_allowed(project: Path) -> None:  # noqa: F811
    ok(quiver("apply", cwd=project))
    for path in (project / "feature_defs").glob("*.py"):
        path.unlink()
    [line] = user_error(quiver("apply", cwd=project))
    assert "holds no definitions" in line and "remove all 5 definitions of catalog version 1" in line
    [line] = user_error(quiver("plan", cwd=project))
    assert "--allow-empty" in line
    assert "applied catalog version 2" in ok(quiver("apply", "--allow-empty", cwd=project))


def test_readers_use_the_applied_version(project: Path) -> None:  # noqa: F811
    ok(quiver("apply", cwd=project))
    write_catalog(project / "feature_defs", {"extra.py": EXTRA})  # on disk, never applied
    listed = ok(quiver("list", cwd=project))
    assert "late_view" not in listed and "user_last" in listed
    assert "catalog version 1 (applied); the definitions on disk differ" in listed
    [line] = user_error(quiver("describe", "late_view", cwd=project))
    assert "no definition named 'late_view'" in line
    with FeatureStore(project / "quiver.yaml") as store:
        assert store.catalog_version == 1 and "late_view" not in store.catalog.views
    planned = ok(quiver("plan", cwd=project))
    assert "+ feature view late_view" in planned and "needs a backfill: view late_view (new view)" in planned
    write_catalog(project / "feature_defs", {"views.py": VIEWS.format(ttl="3d")})
    assert "needs a backfill: view user_last (changed ttl_us)" in ok(quiver("plan", cwd=project))
    ok(quiver("apply", cwd=project))
    assert "late_view" in ok(quiver("list", cwd=project))
    with FeatureStore(project / "quiver.yaml") as store:
        assert store.catalog_version == 2 and "late_view" in store.catalog.views


def test_training_set_checks_out_before_the_join(project: Path) -> None:  # noqa: F811
    labels = project / "labels.parquet"
    pd.DataFrame({"user_id": [1], "event_ts": pd.to_datetime(["2026-01-01"], utc=True)}).to_parquet(labels)
    (project / "existing").mkdir()
    # No offline data was ever backfilled: a join would fail with another error; the --out check comes first.
    [line] = user_error(quiver("training-set", str(labels), "--out", str(project / "existing"),
                               "--service", "fraud", cwd=project))
    assert "is a directory" in line
