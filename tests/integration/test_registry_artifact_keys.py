"""Migration 0006 on real registries (SQLite and PostgreSQL): a registry written before the artifact store,
with the absolute paths training recorded then, comes out with keys — and the model still loads, through the
store, from where it always was (the default artifact root, .quiver)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sqlalchemy import insert, select

from quiver.artifacts import ArtifactStore
from quiver.registry import Registry
from quiver.registry.model_tables import model_versions
from quiver.registry.models import ModelRegistry
from quiver.registry.repository import make_engine
from tests.integration.registry_upgrade import upgrade_to

pytestmark = pytest.mark.integration


def _artifact(root: Path) -> tuple[Path, str]:
    import torch

    from quiver.models.artifact import save_artifact
    from quiver.models.network import NetworkConfig, TabularNet
    from quiver.models.scoring import Preprocessor

    torch.manual_seed(0)
    prep = Preprocessor(("f0",), (), (0.0,), (1.0,), ())
    net = TabularNet(NetworkConfig(n_numeric=1, cardinalities=(), hidden=(4,), dropout=0.0))
    reference = pd.DataFrame({"f0": np.linspace(-1, 1, 20)})
    reference["score"] = 0.5
    return save_artifact(root, "fraud", net, prep, feature_refs=["v:f0"], catalog_version=None, catalog_hash="h",
                         label_column="y", reference=reference)


def test_0006_rewrites_absolute_paths_to_keys_and_uris(registry_url: str, tmp_path: Path) -> None:
    upgrade_to(registry_url, "0005")
    folder, sha = _artifact(tmp_path / ".quiver" / "models")  # where training used to write
    now = datetime(2026, 11, 1, tzinfo=UTC)
    row = {"project": "p", "status": "registered", "sha256": sha, "window_start": now, "cutoff": now,
           "features_json": json.dumps(["f0"]), "catalog_version": None, "label_column": "y", "metrics_json": "{}",
           "created_at": now, "created_by": "test"}
    legacy = {"labels_source": str(tmp_path / "data/labels/labels.parquet"),
              "pit": {"offline_root": str(tmp_path / "data/offline"), "engine": "duckdb"}}
    engine = make_engine(registry_url)
    with engine.begin() as connection:
        connection.execute(insert(model_versions).values(
            **row, name="fraud", version=1, artifact_path=str(folder),
            reference_path=str(folder / "reference.parquet"), lineage_json=json.dumps(legacy)))
        connection.execute(insert(model_versions).values(  # written by hand somewhere else: kept, made explicit
            **row, name="manual", version=1, artifact_path="/srv/models/manual", reference_path="/srv/ref.parquet",
            lineage_json=json.dumps({"labels_source": "<DataFrame>"})))
    engine.dispose()

    registry = Registry(registry_url, project="p")  # migrates to head
    assert (registry.schema_revision() or "") >= "0006"  # later migrations keep what 0006 wrote
    models = ModelRegistry(registry, ArtifactStore(tmp_path / ".quiver"))
    fraud, manual = models.get("fraud", 1), models.get("manual", 1)
    assert fraud.artifact_path == f"models/fraud/{sha[:16]}"
    assert fraud.reference_path == f"models/fraud/{sha[:16]}/reference.parquet"
    assert fraud.lineage["labels_source"] == f"file://{tmp_path}/data/labels/labels.parquet"
    assert fraud.lineage["pit"] == {"offline_root": f"file://{tmp_path}/data/offline", "engine": "duckdb"}
    assert (manual.artifact_path, manual.reference_path) == ("file:///srv/models/manual", "file:///srv/ref.parquet")
    assert manual.lineage == {"labels_source": "<DataFrame>"}
    with registry.engine.connect() as connection:
        stored = connection.execute(select(model_versions.c.artifact_path, model_versions.c.reference_path)).all()
    assert not any(p.startswith("/") for pair in stored for p in pair)
    scorer = models.load("fraud", 1)  # the same bytes, verified against the recorded sha256
    assert scorer.sha256 == sha and scorer.path == folder
    assert models.artifacts is not None
    assert models.artifacts.read_reference(fraud.artifact_path, fraud.reference_path, sha).num_rows == 20
    Registry(registry_url, project="p").close()  # a second open is a no-op
    assert models.get("fraud", 1) == fraud
    registry.close()
