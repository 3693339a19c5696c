"""Retraining by expected harm, through the drift DAG's step on real parts: a registered model version (a real
artifact and reference), serving logs written by the real logger, the registry, labels arriving later.

* Drift that hurts the model (traffic moving to where its scores are unsure) calls for a retrain on the day it
  is served, from the label-free estimate, before any label of it exists.
* Drift that does not hurt (a feature the model does not read moving, its scores unchanged) only warns.
* When the labels arrive, the next day's check records the realized value beside the estimate.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quiver.monitoring.estimate_records import estimates_of
from quiver.monitoring.labels import write_labels
from quiver.pipelines.loop import drift_step
from quiver.pipelines.loop_common import Project
from quiver.pipelines.loop_harm import HELD_OUT
from quiver.serving.logs import ServingLogger
from tests.integration.test_prediction_service import BEAT_BASELINE, MODEL, save_model

pytestmark = pytest.mark.integration

DAY = datetime(2026, 11, 10, tzinfo=UTC)
ROWS = 3_000


def calibrated_scores(rng: np.random.Generator, n: int) -> np.ndarray:
    """Scores of a confident, calibrated model: most rows near 0 or 1."""
    return np.clip(rng.beta(0.4, 0.9, n), 0.001, 0.999)


@pytest.fixture
def project(tmp_path: Path) -> Project:
    (tmp_path / "quiver.yaml").write_text(f"project: harm\nregistry_url: sqlite:///{tmp_path}/registry.db\n"
                                          f"offline_root: {tmp_path}/offline\n")
    made = Project.load(tmp_path / "quiver.yaml")
    rng = np.random.default_rng(1)
    folder, sha = save_model(made.config.root / ".quiver" / "models", seed=1, reference_rows=ROWS,
                             reference_scores=calibrated_scores(rng, ROWS))  # as the model scored its reference
    version = made.models.register(MODEL, artifact_path=str(folder), sha256=sha,
                                   metrics=BEAT_BASELINE, window_start=DAY - timedelta(days=8),
                                   cutoff=DAY - timedelta(days=1), features=["f0", "f1", "category"],
                                   catalog_version=None, label_column="label", lineage={"seed": 1},
                                   reference_path=str(folder / "reference.parquet"))
    made.models.set_alias(MODEL, "champion", version.version, expected=None, reason="first")
    # The version's held-out rows (its test window, scored): what a trained version's first check would
    # compute from its lineage; this artifact has none, so they are put where that computation keeps them.
    scores = calibrated_scores(rng, 4_000)
    held = pa.table({"score": scores, "label": (rng.random(scores.size) < scores).astype(np.float64)})
    key = f"{HELD_OUT}/{MODEL}/{version.version}/{version.sha256[:16]}.parquet"
    with made.artifacts.staging() as staging:
        pq.write_table(held, staging / "held.parquet")
        made.artifacts.publish_file(staging / "held.parquet", key)
    return made


def serve_day(project: Project, day: datetime, *, scores: np.ndarray, category: list[str], seed: int) -> list[str]:
    """One day of champion traffic in the serving log; returns the request ids."""
    rng = np.random.default_rng(seed)
    n = scores.size
    ids = [f"{day:%m%d}-{i}" for i in range(n)]
    ts = (day.timestamp() * 1e6 + np.sort(rng.integers(0, 86_400_000_000, n))).astype(np.int64)
    with ServingLogger(project.serving_log_root) as logger:
        logger.log_batch(ids, {"user_id": np.arange(n)},
                         {"stats:f0": rng.normal(size=n), "stats:f1": rng.normal(size=n),
                          "stats:category": rng.choice(category, n)},
                         f"{MODEL}:1", "champion", 1.0, scores, ts_us=ts)
    return ids


def test_harmful_drift_retrains_the_day_it_is_served_and_harmless_drift_only_warns(project: Project) -> None:
    config = str(project.config.root / "quiver.yaml")
    rng = np.random.default_rng(7)
    # Day 1: a feature the model does not weigh moves ("c", a category it never saw); its scores keep their shape.
    serve_day(project, DAY, scores=calibrated_scores(rng, ROWS), category=["c"], seed=1)
    harmless = drift_step(config, MODEL, DAY, DAY + timedelta(days=1))
    assert harmless["dataset_drift"] and "category" in harmless["drifted"]
    assert not harmless["retrain"] and harmless["trigger"] is None
    assert harmless["reason"].startswith("drift without expected harm (day 1 of 2)"), harmless["reason"]
    champion = harmless["estimates"]["champion"]
    assert champion["status"] == "estimated" and abs(champion["roc_auc"]["drop"]) < 0.03
    assert not project.alerts.open_alerts("retrain_needed")

    # Day 2: traffic moves to where the model is unsure (scores near ½): the estimate says it will be worse.
    unsure = np.clip(rng.uniform(0.35, 0.65, ROWS), 0.001, 0.999)
    ids = serve_day(project, DAY + timedelta(days=1), scores=unsure, category=["a", "b"], seed=2)
    harmful = drift_step(config, MODEL, DAY + timedelta(days=1), DAY + timedelta(days=2))
    assert harmful["retrain"] and harmful["trigger"] == "expected_harm", harmful["reason"]
    assert harmful["reason"].startswith("expected harm: ROC-AUC estimated")
    [alert] = project.alerts.open_alerts("retrain_needed")
    assert alert.severity == "critical" and alert.subject == MODEL
    rows = estimates_of(project.registry, MODEL, arm="champion", metric="roc_auc")
    assert [r["realized"] for r in rows] == [None, None]  # no label of either day yet: labels could not tell

    # The labels of day 2 arrive; the next day's check records what they show beside the estimate.
    labels = (rng.random(ROWS) < unsure).astype(float)
    write_labels(project.serving_log_root, ids, labels, arrived_at=DAY + timedelta(days=2, hours=12))
    serve_day(project, DAY + timedelta(days=2), scores=unsure, category=["a", "b"], seed=3)
    later = drift_step(config, MODEL, DAY + timedelta(days=2), DAY + timedelta(days=3))
    assert later["realized_windows"] == 1 and later["retrain"]
    [day2] = [r for r in estimates_of(project.registry, MODEL, arm="champion", metric="roc_auc")
              if r["window_end"] == DAY + timedelta(days=2)]
    assert day2["status"] == "realized" and day2["realized_rows"] == ROWS
    assert day2["within_band"], (day2["estimate"], day2["lower"], day2["upper"], day2["realized"])
