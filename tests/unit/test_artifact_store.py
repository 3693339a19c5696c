"""The artifact store on a local root: what the registry may record, publishing, and checksum checks."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pyarrow as pa
import pytest

from quiver.artifacts import ArtifactStore, check_key, file_sha256, manifest_sha256
from quiver.catalog.errors import QuiverError
from quiver.config import load_config

MIGRATION = Path(__file__).resolve().parents[2] / "platform/quiver/registry/migrations/versions/0006_artifact_keys.py"


def _migration():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("artifact_keys_migration", MIGRATION)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_registry_records_keys_or_remote_uris_never_a_local_path(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "root")
    assert store.record("models/m/abc") == "models/m/abc"
    assert store.record(tmp_path / "root" / "models" / "m" / "abc") == "models/m/abc"
    assert store.record(f"file://{tmp_path}/root/labels/x.parquet") == "labels/x.parquet"
    assert store.record("s3://elsewhere/models/m") == "s3://elsewhere/models/m"
    for bad in (tmp_path / "other" / "m", f"file://{tmp_path}/other", "../escape", "models/../../x", ""):
        with pytest.raises(QuiverError):
            store.record(str(bad))
    remote = ArtifactStore("s3://bucket/prefix?endpoint_override=127.0.0.1:9&scheme=http")
    assert remote.record("s3://bucket/prefix/models/m/abc") == "models/m/abc"
    assert remote.location("models/m/abc") == "s3://bucket/prefix/models/m/abc"
    with pytest.raises(QuiverError, match="outside the artifact store"):
        remote.record(str(tmp_path / "models"))
    with pytest.raises(QuiverError, match="not an artifact-store key"):
        check_key("/abs/path")


def test_config_resolves_the_root_against_the_project(tmp_path: Path) -> None:
    (tmp_path / "quiver.yaml").write_text("project: p\n")
    assert load_config(tmp_path).artifact_location == str(tmp_path / ".quiver")
    (tmp_path / "quiver.yaml").write_text("project: p\nartifact_root: s3://b/q\n")
    assert load_config(tmp_path).artifact_location == "s3://b/q"
    (tmp_path / "quiver.yaml").write_text("project: p\nartifact_root: ''\n")
    with pytest.raises(QuiverError, match="artifact_root must name"):
        load_config(tmp_path)


def test_publish_then_read_back_with_checksums(tmp_path: Path) -> None:
    store = ArtifactStore(tmp_path / "root")
    table = pa.table({"user_id": [1, 2, 3], "is_fraud": [0, 1, 0]})
    key, sha = store.snapshot_table(table, "fraud_model")
    assert key == f"labels/fraud_model/{sha[:16]}.parquet" and store.exists(key)
    assert store.read_table(key, sha256=sha).equals(table)
    assert store.snapshot_table(table, "fraud_model") == (key, sha)  # content-addressed: written once
    (tmp_path / "root" / key).write_bytes(b"PAR1 damaged")
    with pytest.raises(QuiverError, match="checksum mismatch"):
        store.read_table(key, sha256=sha)
    assert not list((tmp_path / "root").glob(".staging-*"))


def test_a_reference_is_checked_against_its_artifact_manifest(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    store = ArtifactStore(tmp_path / "root")
    with store.staging() as staging:
        folder = staging / "art"
        folder.mkdir()
        pq.write_table(pa.table({"score": [0.1, 0.9]}), folder / "reference.parquet")
        files = {"reference.parquet": file_sha256(folder / "reference.parquet")}
        (folder / "checksum.json").write_text(json.dumps({"files": files, "sha256": manifest_sha256(files)}))
        key = store.publish_dir(folder, "models/m/0123456789abcdef")
    digest = manifest_sha256(files)
    assert store.read_reference(key, f"{key}/reference.parquet", digest)["score"].to_pylist() == [0.1, 0.9]
    with pytest.raises(QuiverError, match="does not match the registry"):
        store.read_reference(key, f"{key}/reference.parquet", "f" * 64)
    pq.write_table(pa.table({"score": [0.5]}), tmp_path / "root" / key / "reference.parquet")
    with pytest.raises(QuiverError, match="checksum mismatch"):
        store.read_reference(key, f"{key}/reference.parquet", digest)


def test_the_migration_maps_legacy_paths_to_keys_or_file_uris() -> None:
    migration = _migration()
    sha = "3f2a" * 16
    assert migration.artifact_key(f"/home/a/proj/.quiver/models/fraud/{sha[:16]}", "fraud", sha) == \
        f"models/fraud/{sha[:16]}"
    assert migration.artifact_key(f"/home/a/proj/.quiver/models/fraud/{sha[:16]}/reference.parquet", "fraud", sha) \
        == f"models/fraud/{sha[:16]}/reference.parquet"
    assert migration.artifact_key(f"/x/models/other/{sha[:16]}", "fraud", sha) == f"file:///x/models/other/{sha[:16]}"
    assert migration.artifact_key("/x/weird", "fraud", sha) == "file:///x/weird"
    assert migration.artifact_key("models/fraud/abc", "fraud", sha) == "models/fraud/abc"
    assert migration.lineage_uris({"labels_source": "/d/labels.parquet", "pit": {"offline_root": "/d/off"}}) == \
        {"labels_source": "file:///d/labels.parquet", "pit": {"offline_root": "file:///d/off"}}
    assert migration.lineage_uris({"labels_source": "<DataFrame>"}) == {"labels_source": "<DataFrame>"}


def test_a_cached_download_already_in_place_is_kept_unless_it_differs(tmp_path: Path) -> None:
    from quiver.artifacts import _install_dir

    def folder(name: str, text: str) -> Path:
        path = tmp_path / name
        path.mkdir()
        (path / "model.json").write_text(text)
        return path

    target = tmp_path / "cache" / "models" / "m" / "abc"
    _install_dir(folder("first", "{}"), target)
    inode = target.stat().st_ino
    _install_dir(folder("second", "{}"), target)  # another process downloaded the same bytes
    assert target.stat().st_ino == inode and not (tmp_path / "second").exists()
    _install_dir(folder("third", '{"fixed": 1}'), target)  # the cached copy was damaged: replaced
    assert (target / "model.json").read_text() == '{"fixed": 1}' and not list(target.parent.glob(".abc.old-*"))
