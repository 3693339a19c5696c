"""Files that hold models, labels or the registry are owner-only (0600 files, 0700 folders) when Quiver creates
them, whatever the umask lets through (libraries write 0644 under the usual 022)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from quiver.artifacts import ArtifactStore
from quiver.registry import Registry


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    old = os.umask(0o022)  # the common default: 0644 files, 0755 folders unless the code says otherwise
    yield
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def assert_private(top: Path) -> None:
    for path in [top, *top.rglob("*")]:
        assert mode(path) == (0o700 if path.is_dir() else 0o600), (path, oct(mode(path)))


def test_a_new_sqlite_registry_is_owner_only(tmp_path: Path) -> None:
    Registry(f"sqlite:///{tmp_path}/state/registry.db").engine.dispose()
    assert mode(tmp_path / "state") == 0o700 and mode(tmp_path / "state" / "registry.db") == 0o600
    existing = tmp_path / "shared.db"
    existing.touch(mode=0o640)  # made by its owner on purpose: kept as it is
    Registry(f"sqlite:///{existing}").engine.dispose()
    assert mode(existing) == 0o640


def test_published_artifacts_and_label_snapshots_are_owner_only(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "root")
    with store.staging() as folder:
        (folder / "model").mkdir()
        (folder / "model" / "weights.pt").write_bytes(b"w")
        (folder / "model" / "sub").mkdir()
        (folder / "model" / "sub" / "x.json").write_text("{}")
        key = store.publish_dir(folder / "model", "models/m/abc")
        (folder / "one.txt").write_text("1")
        store.publish_file(folder / "one.txt", "labels/m/one.txt")
    store.snapshot_table(pa.table({"x": [1]}), "m")
    assert_private(tmp_path / "root")
    assert (tmp_path / "root" / key / "sub" / "x.json").exists()


def test_a_saved_model_artifact_is_owner_only(tmp_path: Path) -> None:
    import pandas as pd

    from quiver.models.artifact import save_artifact
    from quiver.models.network import NetworkConfig, TabularNet
    from quiver.models.scoring import Preprocessor

    prep = Preprocessor(("f0",), (), (0.0,), (1.0,), ())
    net = TabularNet(NetworkConfig(n_numeric=1, cardinalities=(), hidden=(4,), dropout=0.0))
    save_artifact(tmp_path / "models", "m", net, prep, feature_refs=["v:f0"], catalog_version=None,
                  catalog_hash="h", label_column="y", reference=pd.DataFrame({"f0": [0.0], "score": [0.5]}))
    assert_private(tmp_path / "models")
