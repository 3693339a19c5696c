"""Training end to end on the synthetic demo data (pre-drift window, CPU): `quiver train` as a user runs it,
the registered version beats the logistic-regression baseline, its artifact and reference distribution load
back, the `quiver models` commands, a rejected version, and a feature removed from the catalog. And the
demo's own first champion (its data, window and seed): a network that earns its place beside its baseline."""

from __future__ import annotations

import shutil
from dataclasses import replace
from datetime import date
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from quiver.artifacts import ArtifactStore
from quiver.catalog.errors import QuiverError
from quiver.catalog.loader import load_catalog
from quiver.config import load_config
from quiver.pipelines.demo_data import generate
from quiver.registry import Registry
from quiver.registry.models import ModelRegistry
from tests.cli_runs import done
from tests.cli_runs import quiver as run_quiver

pytestmark = [pytest.mark.integration, pytest.mark.slow]


REPO = Path(__file__).resolve().parents[2]
quiver = partial(run_quiver, timeout=900)  # training runs take minutes


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's data (same seed and defects) up to its drift day, applied and backfilled, then trained."""
    root = tmp_path_factory.mktemp("models")
    shutil.copytree(REPO / "feature_defs", root / "feature_defs", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "quiver.yaml", root / "quiver.yaml")
    generate(root / "data", days=11, start=date(2026, 11, 1), seed=7, drift_from_day=10, late_fraction=0.01,
             malformed_fraction=0.001)
    done(quiver("apply", cwd=root))
    done(quiver("backfill", "--start", "2026-11-01", "--end", "2026-11-11", cwd=root))
    out = done(quiver("train", "--service", "fraud_model", "--window", "10d", "--cutoff", "2026-11-11",
                      "--device", "cpu", "--alias", "champion", cwd=root))
    (root / "train.out").write_text(out)
    return root


def test_training_is_not_worse_than_the_baseline_and_registers_a_champion(project: Path) -> None:
    out = (project / "train.out").read_text()
    assert "training on cpu (fp32)" in out and "samples/s" in out
    assert "fraud_model:1 registered" in out and "alias champion: - → 1" in out
    models = ModelRegistry(Registry(load_config(project).registry, project="fraud"))
    version = models.get("fraud_model", 1)
    assert version.status == "registered" and models.aliases("fraud_model") == {"champion": 1}
    # The registry's rule (derive_status): log loss and ranking not worse than the baseline's beyond noise.
    assert version.metrics["log_loss"] <= version.metrics["baseline"]["log_loss"] * 1.01
    assert version.metrics["roc_auc"] >= version.metrics["baseline"]["roc_auc"] - 0.005 > 0.6
    assert version.lineage["positive_rate"]["train"] > 0  # the split's label rates are recorded
    for key in ("pr_auc", "log_loss", "brier", "ece", "latency_ms_batch_1", "latency_ms_batch_1000"):
        assert np.isfinite(version.metrics[key]) and np.isfinite(version.metrics["baseline"].get(key, 0.0))
    assert version.catalog_version == 1 and version.label_column == "is_fraud"
    assert "risk_score" in version.features and len(version.features) == 24
    assert {"tx_amount", "log_amount_vs_usual", "hour_of_day"} <= set(version.features)  # request-time features
    rows = version.lineage["rows"]
    assert rows["train"] + rows["validation"] + rows["test"] == rows["labels"]
    assert version.lineage["split"]["test_boundary"] > version.lineage["split"]["validation_boundary"] >= "2026-11-06"
    assert version.lineage["pit"]["engine"] == "duckdb" and version.lineage["split"]["metrics_on"] == "test"


def test_training_at_a_cutoff_learns_only_labels_that_had_arrived_by_it(project: Path) -> None:
    # Chargebacks arrive days late: a window ending at the cutoff holds labels nobody knew yet. Counted
    # independently from the label file, every one of them is left out, and only they are.
    import pyarrow.parquet as pq

    labels = pq.read_table(project / "data/labels/labels.parquet").to_pandas()
    cutoff = pd.Timestamp("2026-11-11", tz="UTC")
    window = labels[(labels.event_ts >= cutoff - pd.Timedelta(days=10)) & (labels.event_ts < cutoff)]
    known = int((window.label_arrived_at <= cutoff).sum())
    version = ModelRegistry(Registry(load_config(project).registry, project="fraud")).get("fraud_model", 1)
    rows = version.lineage["rows"]
    assert 0 < rows["not_arrived_by_cutoff"] == len(window) - known
    assert rows["labels"] == known  # null labels are quarantined after this count (none in the demo's labels)
    assert version.lineage["knowledge_time"]["arrival_column"] == "label_arrived_at"
    late_fraud = window[(window.label_arrived_at > cutoff) & (window.is_fraud == 1)]
    assert len(late_fraud) > 0  # the late labels are not a random subset: fraud arrives later
    assert not (project / ".quiver" / "checkpoints" / "fraud_model").exists() or not any(
        (project / ".quiver" / "checkpoints" / "fraud_model").iterdir())


def test_the_artifact_and_reference_distribution_load_back(project: Path) -> None:
    config = load_config(project)
    models = ModelRegistry(Registry(config.registry, project="fraud"), ArtifactStore.from_config(config))
    version = models.get("fraud_model", 1)
    assert version.artifact_path == f"models/fraud_model/{version.sha256[:16]}"  # a key under artifact_root
    assert (project / ".quiver" / version.artifact_path / "checksum.json").exists()
    reference = models.artifacts.read_reference(version.artifact_path, version.reference_path,
                                                version.sha256).to_pandas()
    assert list(reference.columns) == ["event_ts", *version.features, "score"]
    # The window's traffic hour by hour, every hour (never the time split's newest hours).
    assert len(reference) == version.lineage["reference"]["rows"] >= 2_000
    assert set(reference["event_ts"].dt.hour) == set(range(24)) and version.lineage["reference"]["problems"] == []
    scorer = models.load("fraud_model", "champion", catalog=load_catalog(config.catalog_dir, root=project))
    assert scorer.version_label == "fraud_model:1" and scorer.features == version.features
    np.testing.assert_allclose(scorer.predict(reference), reference["score"].to_numpy(), rtol=0, atol=1e-6)


def test_a_feature_removed_from_the_catalog_makes_loading_fail_clearly(project: Path, tmp_path: Path) -> None:
    changed = tmp_path / "feature_defs"
    shutil.copytree(project / "feature_defs", changed, ignore=shutil.ignore_patterns("__pycache__"))
    source = (changed / "user_features.py").read_text()
    (changed / "user_features.py").write_text(source.replace('Field("credit_limit", Float64), ', ""))
    catalog = load_catalog(changed, root=project)
    config = load_config(project)
    models = ModelRegistry(Registry(config.registry, project="fraud"), ArtifactStore.from_config(config))
    with pytest.raises(QuiverError, match="no longer defines: user_profile:credit_limit"):
        models.load("fraud_model", 1, catalog=catalog)


def test_models_commands(project: Path) -> None:
    listed = done(quiver("models", "list", cwd=project))
    assert "fraud_model" in listed and "registered" in listed and "champion" in listed
    described = done(quiver("models", "describe", "fraud_model", "champion", cwd=project))
    assert "roc_auc" in described and "risk_score" in described and "sha256" in described
    assert '"status": "registered"' in done(quiver("models", "describe", "fraud_model", "1", "--json", cwd=project))
    done(quiver("models", "alias", "set", "fraud_model", "shadow", "1", "--expected", "none", "--reason",
                "shadow the champion", cwd=project))
    stale = quiver("models", "alias", "set", "fraud_model", "shadow", "none", "--expected", "2", "--reason", "x",
                   cwd=project)
    assert stale.returncode == 2 and stale.stderr.startswith("error: ") and "not the expected version 2" in stale.stderr
    no_previous = quiver("models", "alias", "rollback", "fraud_model", "--reason", "x", cwd=project)
    assert no_previous.returncode == 2 and "no 'previous' version" in no_previous.stderr
    history = done(quiver("models", "history", "fraud_model", cwd=project))
    assert "shadow the champion" in history and "champion" in history
    missing = quiver("models", "describe", "fraud_model", "canary", cwd=project)
    assert missing.returncode == 2 and "no alias 'canary'" in missing.stderr
    bad_cutoff = quiver("train", "--cutoff", "soon", cwd=project)
    assert bad_cutoff.returncode == 2 and "is not a date" in bad_cutoff.stderr
    bad_window = quiver("train", "--cutoff", "2026-11-11", "--window", "fortnight", cwd=project)
    assert bad_window.returncode == 2 and "window: not a duration" in bad_window.stderr
    empty = quiver("train", "--cutoff", "2027-01-01", "--window", "1d", cwd=project)
    assert empty.returncode == 2 and "no labels with event_ts in [2026-12-31" in empty.stderr
    import torch

    if not torch.cuda.is_available():
        no_gpu = quiver("train", "--cutoff", "2026-11-11", "--device", "cuda", cwd=project)
        assert no_gpu.returncode == 2 and "no CUDA device" in no_gpu.stderr


def test_a_model_worse_than_the_baseline_is_rejected_and_gets_no_alias(project: Path) -> None:
    from quiver.models.train import TrainConfig
    from quiver.pipelines.training import run_training

    config = load_config(project)
    # A learning rate of ~0 leaves the network at its random initialisation: no better than chance. (Without
    # the wide path, which would start it as the baseline itself.)
    untrained = replace(TrainConfig(), epochs=1, learning_rate=1e-12, wide=False)
    result = run_training(config, "fraud_model", "10d", "2026-11-11", device="cpu", model_name="weak",
                          train_config=untrained, alias="champion", log=lambda _: None)
    assert result.status == "rejected" and result.alias_move is None
    assert result.metrics["roc_auc"] < result.baseline["roc_auc"]
    models = ModelRegistry(Registry(config.registry, project="fraud"))
    assert models.aliases("weak") == {}
    with pytest.raises(QuiverError, match=r"rejected .* can never get an alias"):
        models.set_alias("weak", "champion", result.version.version, expected=None, reason="force it")


@pytest.fixture(scope="module")
def demo_champion(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The demo's first champion, trained as `make demo` trains it: the demo's generator settings (seed 7,
    6,000 transactions a day, 1,500 users, drift from day 8), its pre-drift window [11-01, 11-09), seed 0."""
    from quiver.offline.backfill import backfill
    from quiver.pipelines.training import run_training

    root = tmp_path_factory.mktemp("demo_champion")
    shutil.copytree(REPO / "feature_defs", root / "feature_defs", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "quiver.yaml", root / "quiver.yaml")
    start = date(2026, 11, 1)
    generate(root / "data", days=10, start=start, seed=7, drift_from_day=8, late_fraction=0.01,
             malformed_fraction=0.001, transactions_per_day=6_000, users=1_500)
    config = load_config(root)
    catalog = load_catalog(config.catalog_dir, root=root)
    Registry(config.registry, project=config.project).apply(catalog, author="test")
    backfill(config, catalog, start, date(2026, 11, 9), threads=1)
    return run_training(config, "fraud_model", "8d", "2026-11-09", device="cpu", seed=0, log=lambda _: None)


def test_the_demos_first_champion_beats_its_logistic_baseline_on_the_test_window(demo_champion: Any) -> None:
    # Before: the network started as the baseline and no epoch improved on it ("best epoch -1"), so the
    # champion equalled its logistic regression on every metric (ROC-AUC 0.8670 both). Now an ensemble of
    # small MLPs on log-scaled amounts and counts, started at the base rate, is ahead on the rows neither
    # model selected on (seeds 0-4: +0.011 to +0.014 ROC-AUC, docs/models.md).
    metrics, baseline = demo_champion.metrics, demo_champion.baseline
    assert demo_champion.status == "registered"
    assert metrics["best_epoch"] >= 0  # a trained epoch, not the starting point
    assert metrics["roc_auc"] >= baseline["roc_auc"] + 0.01, (metrics["roc_auc"], baseline["roc_auc"])
    assert metrics["log_loss"] < baseline["log_loss"] and metrics["brier"] <= baseline["brier"]
    assert demo_champion.rows["test"] > 5_000 and baseline["positive_rate"] * baseline["rows"] > 50
