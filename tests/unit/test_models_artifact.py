"""The artifact folder: round trip scores identically, checksums refuse tampering, removed features are named."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from quiver.catalog.errors import QuiverError
from quiver.catalog.ir import Catalog
from quiver.catalog.validate import build_catalog
from quiver.models import data
from quiver.models.artifact import CHECKSUM_FILE, MODEL_FILE, WEIGHTS_FILE, load_model, save_artifact
from quiver.models.network import NetworkConfig, TabularNet
from tests.unit.catalogs.builders import transactions, write_parquet


def make_catalog(root: Path, with_category: bool = True) -> Catalog:
    from quiver import Aggregation, Entity, FeatureView, Field, Source

    user = Entity("user", ["user_id"])
    tx = Source("tx", "data/tx")
    fields = [Field("amount", "float64")] + ([Field("category", "string")] if with_category else [])
    last = FeatureView("user_last", [user], tx, schema=fields, ttl="1d")
    spend = FeatureView("user_spend", [user], tx, aggregations=[Aggregation("amount", "sum", "1h", name="spend")])
    return build_catalog([user, tx, last, spend], root=root)


@pytest.fixture
def saved(tmp_path: Path) -> tuple[Path, str, pd.DataFrame, np.ndarray, Catalog]:
    write_parquet(tmp_path / "data/tx/part-0.parquet", transactions())
    catalog = make_catalog(tmp_path)
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"amount": np.where(rng.random(300) < 0.1, np.nan, rng.normal(size=300)),
                          "spend": rng.normal(size=300),
                          "category": rng.choice(["grocery", "fuel", None], 300).astype(object)})
    prep = data.fit_preprocessor(frame, ["amount", "spend"], ["category"], min_count=1)
    torch.manual_seed(0)
    model = TabularNet(NetworkConfig(2, prep.cardinalities, (8,), 0.0)).eval()
    numeric, categorical = prep.transform(frame)
    with torch.inference_mode():
        expected = torch.sigmoid(model(torch.from_numpy(numeric), torch.from_numpy(categorical)).double()).numpy()
    reference = frame.assign(score=expected)
    folder, sha = save_artifact(tmp_path / "models", "fraud", model, prep,
                                feature_refs=["user_last:amount", "user_spend:spend", "user_last:category"],
                                catalog_version=3, catalog_hash=catalog.content_hash, label_column="is_fraud",
                                reference=reference)
    return folder, sha, frame, expected, catalog


def test_round_trip_scores_identically_from_a_frame_or_a_mapping(saved) -> None:  # type: ignore[no-untyped-def]
    folder, sha, frame, expected, catalog = saved
    scorer = load_model(folder, catalog, expected_sha256=sha, version_label="fraud:1")
    assert scorer.version_label == "fraud:1" and scorer.sha256 == sha
    assert scorer.features == ["amount", "spend", "category"]
    assert np.array_equal(scorer.predict(frame), expected)
    as_arrays = {c: frame[c].to_numpy() for c in frame.columns}
    assert np.array_equal(scorer.predict(as_arrays), expected)
    # Another batch size blocks the matrix products differently: equal to float rounding, not bit for bit.
    np.testing.assert_allclose(scorer.predict(as_arrays, batch_size=7), expected, rtol=0, atol=1e-6)
    assert scorer.predict(frame).dtype == np.float64
    reference = pd.read_parquet(folder / "reference.parquet")
    assert list(reference.columns) == ["amount", "spend", "category", "score"]
    assert folder.name == sha[:16] and load_model(folder).version_label == f"fraud:{sha[:12]}"


def test_the_folder_holds_exactly_the_artifact_files(saved) -> None:  # type: ignore[no-untyped-def]
    folder, *_ = saved
    assert sorted(p.name for p in folder.iterdir()) == sorted([MODEL_FILE, WEIGHTS_FILE, "reference.parquet",
                                                               CHECKSUM_FILE])
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".staging")]


def test_a_modified_weights_file_is_refused(saved) -> None:  # type: ignore[no-untyped-def]
    folder, *_ = saved
    state = torch.load(folder / WEIGHTS_FILE, weights_only=True)
    state["head.bias"] += 1.0
    torch.save(state, folder / WEIGHTS_FILE)
    with pytest.raises(QuiverError, match=r"checksum mismatch for weights\.pt"):
        load_model(folder)


def test_a_consistently_rewritten_artifact_is_refused_against_the_registry_sha(saved) -> None:  # type: ignore[no-untyped-def]
    from quiver.models.artifact import file_sha256, manifest_sha256

    folder, sha, *_ = saved
    meta = json.loads((folder / MODEL_FILE).read_text())
    meta["label_column"] = "other"
    (folder / MODEL_FILE).write_text(json.dumps(meta))
    manifest = json.loads((folder / CHECKSUM_FILE).read_text())
    manifest["files"][MODEL_FILE] = file_sha256(folder / MODEL_FILE)
    manifest["sha256"] = manifest_sha256(manifest["files"])
    (folder / CHECKSUM_FILE).write_text(json.dumps(manifest))
    load_model(folder)  # self-consistent again…
    with pytest.raises(QuiverError, match="the registry recorded"):
        load_model(folder, expected_sha256=sha)  # …but not what the registry recorded


def test_a_feature_removed_from_the_catalog_makes_loading_fail_naming_it(saved, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    folder, sha, *_ = saved
    without = make_catalog(tmp_path, with_category=False)
    with pytest.raises(QuiverError, match=r"no longer defines: user_last:category; retrain"):
        load_model(folder, without, expected_sha256=sha)


def test_not_an_artifact(tmp_path: Path) -> None:
    with pytest.raises(QuiverError, match="not a model artifact"):
        load_model(tmp_path)


def test_scoring_imports_only_torch_numpy_and_the_light_core() -> None:
    import subprocess
    import sys

    code = ("import sys, quiver.models.artifact; "
            "print(sorted(m for m in ('sklearn', 'scipy', 'duckdb', 'pyspark', 'airflow', 'fastapi', 'evidently', "
            "'pipelines', 'quiver.models.train', 'quiver.offline.pit') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_an_ensemble_with_log_scaled_inputs_round_trips_and_scores_as_trained(tmp_path: Path) -> None:
    write_parquet(tmp_path / "data/tx/part-0.parquet", transactions())
    catalog = make_catalog(tmp_path)
    rng = np.random.default_rng(1)
    frame = pd.DataFrame({"amount": np.exp(rng.normal(3.0, 1.2, 400)), "spend": rng.normal(size=400),
                          "category": rng.choice(["grocery", "fuel", None], 400).astype(object)})
    prep = data.fit_preprocessor(frame, ["amount", "spend"], ["category"], min_count=1)
    assert prep.log_ == (True, False)
    torch.manual_seed(0)
    model = TabularNet(NetworkConfig(2, prep.cardinalities, (8,), 0.0, wide=True, members=3)).eval()
    numeric, categorical = prep.transform(frame)
    with torch.inference_mode():
        expected = torch.sigmoid(model.member_logits(torch.from_numpy(numeric),
                                                     torch.from_numpy(categorical)).mean(dim=1).double()).numpy()
    folder, sha = save_artifact(tmp_path / "models", "fraud", model, prep,
                                feature_refs=["user_last:amount", "user_spend:spend", "user_last:category"],
                                catalog_version=3, catalog_hash=catalog.content_hash, label_column="is_fraud",
                                reference=frame.assign(score=expected))
    scorer = load_model(folder, catalog, expected_sha256=sha)
    assert scorer.model.config.members == 3 and scorer.preprocessor.log_ == (True, False)
    np.testing.assert_allclose(scorer.predict(frame), expected, rtol=0, atol=1e-6)
