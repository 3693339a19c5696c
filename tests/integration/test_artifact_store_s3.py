"""The artifact store on object storage: `quiver train` in one project folder writes to an S3 bucket (moto's
S3-compatible server on 127.0.0.1), and a second folder — another "machine" that shares only the registry, the
bucket and the data lake — loads the model, its reference and its label snapshot, all checksum-verified.
Nothing the registry records is a path of the machine that trained."""

from __future__ import annotations

import shutil
from datetime import date
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.fs as pafs
import pytest

from quiver.artifacts import ArtifactStore
from quiver.catalog.errors import QuiverError
from quiver.catalog.loader import load_catalog
from quiver.config import Config, load_config
from quiver.pipelines.demo_data import generate
from quiver.pipelines.loop_common import Project
from tests.cli_runs import done
from tests.cli_runs import quiver as run_quiver

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
BUCKET = "quiver-models"
quiver = partial(run_quiver, timeout=900)


def _yaml(root: Path, registry: Path, artifact_root: str, offline: Path) -> None:
    (root / "quiver.yaml").write_text(f"project: fraud\nregistry_url: sqlite:///{registry}\n"
                                      f"offline_root: {offline}\nartifact_root: \"{artifact_root}\"\n")


@pytest.fixture(scope="module")
def machines(tmp_path_factory: pytest.TempPathFactory, s3_server: Any) -> tuple[Config, Config]:
    """(trainer, reader): two project folders sharing one registry file, one bucket and one data lake (the
    event files and the offline store) — nothing else."""
    shared = tmp_path_factory.mktemp("shared")
    trainer, reader = tmp_path_factory.mktemp("trainer"), tmp_path_factory.mktemp("reader")
    s3_server.create_bucket(BUCKET)
    root_uri = s3_server.uri(BUCKET, "team/quiver")
    for folder in (trainer, reader):
        (folder / "data").symlink_to(shared / "data", target_is_directory=True)  # one data lake for both
        shutil.copytree(REPO / "feature_defs", folder / "feature_defs", ignore=shutil.ignore_patterns("__pycache__"))
        _yaml(folder, shared / "registry.db", root_uri, shared / "offline")
    generate(shared / "data", days=5, start=date(2026, 11, 1), users=1_000, merchants=100,
             transactions_per_day=4_000, seed=7)
    done(quiver("apply", cwd=trainer))
    done(quiver("backfill", "--start", "2026-11-01", "--end", "2026-11-05", cwd=trainer))
    done(quiver("train", "--service", "fraud_model", "--window", "4d", "--cutoff", "2026-11-05", "--device", "cpu",
                cwd=trainer))
    return load_config(trainer), load_config(reader)


def _recorded_paths(version: Any) -> list[str]:
    # (lineage.pit.offline_root is the configured offline store, as written in quiver.yaml: not a file.)
    return [version.artifact_path, version.reference_path, version.lineage["labels_source"]]


def test_the_registry_records_keys_and_the_bucket_holds_the_files(machines: tuple[Config, Config],
                                                                  s3_server: Any) -> None:
    trainer, _ = machines
    version = Project(trainer).models.get("fraud_model", 1)
    key = version.artifact_path
    assert key == f"models/fraud_model/{version.sha256[:16]}"
    assert version.reference_path == f"{key}/reference.parquet"
    assert version.lineage["labels_source"].startswith("labels/fraud_model/")
    assert version.lineage["labels_origin"] == "data/labels/labels.parquet"
    assert not any(str(p).startswith("/") or str(trainer.root) in str(p) for p in _recorded_paths(version))
    fs = pafs.S3FileSystem(access_key=s3_server.access_key, secret_key=s3_server.secret_key,
                           region=s3_server.region, endpoint_override=s3_server.endpoint, scheme="http")
    listed = {i.path for i in fs.get_file_info(pafs.FileSelector(f"{BUCKET}/team/quiver", recursive=True))
              if i.type == pafs.FileType.File}
    assert {f"{BUCKET}/team/quiver/{key}/{f}" for f in ("model.json", "weights.pt", "reference.parquet",
                                                       "checksum.json")} <= listed
    assert f"{BUCKET}/team/quiver/{version.lineage['labels_source']}" in listed
    assert not (trainer.root / ".quiver" / "models").exists()  # nothing kept on the training machine


def test_another_machine_loads_the_model_reference_and_labels(machines: tuple[Config, Config]) -> None:
    from quiver.pipelines.loop_retrain import rows_of_test_window

    _, reader = machines
    project = Project(reader)
    version = project.models.get("fraud_model", 1)
    reference = project.reference(version)
    scorer = project.models.load("fraud_model", 1, catalog=load_catalog(reader.catalog_dir, root=reader.root))
    np.testing.assert_allclose(scorer.predict(reference.to_pandas()), reference["score"].to_numpy(), rtol=0,
                               atol=1e-6)
    assert str(scorer.path).startswith(str(reader.root / ".quiver" / "cache"))  # downloaded, then verified
    # The retrain gate's view: the test window rebuilt from the label snapshot (no trainer file read).
    frame, labels = rows_of_test_window(project, version)
    assert len(labels) == version.lineage["rows"]["test"]  # the test window: the gate's rows
    # The same rows the trainer tested on: the registered model scores them to the metrics it recorded.
    from quiver.models.metrics import classification_metrics

    rebuilt = classification_metrics(labels, scorer.predict(frame))
    assert rebuilt["roc_auc"] == pytest.approx(version.metrics["roc_auc"], abs=1e-4)  # scores agree to 1e-6
    assert rebuilt["log_loss"] == pytest.approx(version.metrics["log_loss"], abs=1e-5)


def test_a_tampered_object_is_refused(machines: tuple[Config, Config], s3_server: Any) -> None:
    _, reader = machines
    project = Project(reader)
    version = project.models.get("fraud_model", 1)
    store: ArtifactStore = project.artifacts
    fs = pafs.S3FileSystem(access_key=s3_server.access_key, secret_key=s3_server.secret_key,
                           region=s3_server.region, endpoint_override=s3_server.endpoint, scheme="http")
    labels = f"{BUCKET}/team/quiver/{version.lineage['labels_source']}"
    original = fs.open_input_stream(labels).read()
    with fs.open_output_stream(labels) as out:
        out.write(original[:-8] + b"tampered")
    try:
        with pytest.raises(QuiverError, match="checksum mismatch"):
            store.read_table(version.lineage["labels_source"], sha256=version.lineage["labels_sha256"])
    finally:
        with fs.open_output_stream(labels) as out:
            out.write(original)
    weights = f"{BUCKET}/team/quiver/{version.artifact_path}/weights.pt"
    original = fs.open_input_stream(weights).read()
    with fs.open_output_stream(weights) as out:
        out.write(b"not the weights")
    try:
        with pytest.raises(QuiverError, match=r"checksum mismatch for weights\.pt"):
            project.models.load("fraud_model", 1)
    finally:
        with fs.open_output_stream(weights) as out:
            out.write(original)
    assert project.models.load("fraud_model", 1).sha256 == version.sha256
