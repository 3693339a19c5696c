"""The drift reference a training run stores represents the traffic the model was trained for.

Reproduction (issue 36): the reference was the time split's newest rows, in the demo hours 13-23 of the
last labelled day, so the drift check flagged `hour_of_day` and `is_night` on undrifted traffic and fed the
retrain trigger false alerts by construction. Here a real training run (`run_training`, a real point-in-time
join over a backfilled view) trains on three days of the demo generator's traffic; its stored reference is
checked the way the drift DAG checks it against fourteen steady days (no alert on any) and against the
demo's drift (alerts).
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quiver.catalog.loader import load_catalog
from quiver.config import load_config
from quiver.monitoring.alerts import AlertManager
from quiver.monitoring.checks import run_drift_check
from quiver.pipelines.demo_data import generate
from quiver.pipelines.loop_common import Project
from quiver.pipelines.loop_drift import SCORE, window_label

pytestmark = pytest.mark.integration
MODEL = "fraud_model"
START = date(2026, 11, 1)
TRAIN_DAYS, STEADY_DAYS, DRIFT_DAYS = 3, 14, 2
FEATURES = ["amount", "is_online", "category", "hour_of_day"]

DEFINITIONS = '''"""One view of what each scoring request carried (a compact stand-in for the demo's request features)."""

from quiver import Bool, Entity, FeatureService, FeatureView, Field, Float64, Int64, Source, String

transaction = Entity(name="transaction", join_keys=["transaction_id"], dtype=String, description="A transaction.")
requests = Source(name="requests", path="data/events/requests", timestamp_field="event_ts",
                  description="Scoring requests.", owner="fraud-team@example.com")
request = FeatureView(name="request", entities=[transaction], source=requests, ttl="1h",
                      schema=[Field("amount", Float64), Field("is_online", Bool), Field("category", String),
                              Field("hour_of_day", Int64)],
                      owner="fraud-team@example.com", description="The request's own facts.")
fraud_model = FeatureService(name="fraud_model", features=[request], owner="fraud-team@example.com",
                             description="Inputs of the fraud classifier.")
'''


def day(index: int) -> datetime:
    return datetime.combine(START + timedelta(days=index), datetime.min.time(), UTC)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The demo generator's traffic (drift from the 17th day), three days backfilled and trained on."""
    from quiver.models.train import TrainConfig
    from quiver.offline.backfill import backfill
    from quiver.pipelines.training import run_training

    root = tmp_path_factory.mktemp("drift_reference")
    (root / "quiver.yaml").write_text("project: fraud\ncatalog: feature_defs\nregistry_url: sqlite:///.quiver/r.db\n"
                                      "offline_root: data/offline\nengine: duckdb\n")
    (root / "feature_defs").mkdir()
    (root / "feature_defs" / "drift_reference_defs.py").write_text(DEFINITIONS)
    days = TRAIN_DAYS + STEADY_DAYS + DRIFT_DAYS
    generate(root / "generated", days=days, start=START, users=500, merchants=50, transactions_per_day=2_500,
             seed=7, drift_from_day=TRAIN_DAYS + STEADY_DAYS)
    labels = pq.read_table(root / "generated" / "labels" / "labels.parquet").to_pandas()
    category = pa.concat_tables(pq.read_table(p, columns=["transaction_id", "category"]) for p in
                                sorted((root / "generated" / "events" / "transactions").rglob("*.parquet")))
    traffic = labels.merge(category.to_pandas(), on="transaction_id")
    traffic["hour_of_day"] = traffic.event_ts.dt.hour.astype("int64")
    # The request event a moment before its label time: features are as of strictly before it.
    requests = traffic[["transaction_id", *FEATURES]].assign(
        event_ts=traffic.event_ts - pd.Timedelta(milliseconds=1))
    for index in range(TRAIN_DAYS):
        folder = root / "data" / "events" / "requests" / f"date={START + timedelta(days=index)}"
        folder.mkdir(parents=True)
        rows = requests[(requests.event_ts >= day(index)) & (requests.event_ts < day(index + 1))]
        pq.write_table(pa.Table.from_pandas(rows, preserve_index=False), folder / "part-00000.parquet")
    config = load_config(root / "quiver.yaml")
    catalog = load_catalog(config.catalog_dir, root=root)
    backfill(config, catalog, START, START + timedelta(days=TRAIN_DAYS), engine="duckdb")
    lines: list[str] = []
    result = run_training(config, MODEL, f"{TRAIN_DAYS}d", day(TRAIN_DAYS), device="cpu", catalog=catalog,
                          labels=labels[["transaction_id", "event_ts", "is_fraud", "label_arrived_at"]],
                          train_config=TrainConfig(epochs=2, patience=1), log=lines.append)
    return {"project": Project(config), "version": result.version, "traffic": traffic, "log": lines}


def test_the_stored_reference_holds_the_windows_traffic_hour_by_hour(trained: dict[str, Any]) -> None:
    project, version = trained["project"], trained["version"]
    reference = project.reference(version).to_pandas()
    # Day 0's labels had all arrived by the cutoff, day 1's partly (its late hours are thin), day 2's not
    # at all: the reference mixes days 0 and 1 and still holds every hour in the traffic's share.
    assert set(reference.event_ts.dt.strftime("%Y-%m-%d")) == {f"{START}", f"{START + timedelta(days=1)}"}
    assert set(reference.event_ts.dt.hour) == set(range(24))
    assert reference.hour_of_day.tolist() == reference.event_ts.dt.hour.tolist()
    traffic = trained["traffic"]
    window = traffic[(traffic.event_ts >= day(0)) & (traffic.event_ts < day(TRAIN_DAYS))]
    hour_mix = window.event_ts.dt.hour.value_counts(normalize=True)
    drawn_mix = reference.event_ts.dt.hour.value_counts(normalize=True)
    assert (drawn_mix - hour_mix).abs().max() < 0.005, (drawn_mix - hour_mix).abs().max()
    assert len(reference) >= 2_000 and reference[SCORE].between(0, 1).all()
    recorded = version.lineage["reference"]
    assert recorded["rows"] == len(reference) and recorded["hours"] == list(range(24)) and recorded["problems"] == []
    assert "arrived by the cutoff" in recorded["thinned"][f"{START + timedelta(days=1)}"]
    assert not any(line.startswith("warning: the drift reference") for line in trained["log"])
    # The stored scores are the registered model's.
    scorer = project.models.load(MODEL, version.version)
    assert abs(scorer.predict(reference) - reference[SCORE].to_numpy()).max() < 1e-6


def drift_check(trained: dict[str, Any], index: int) -> Any:
    """Day `index`'s traffic against the stored reference, as the drift DAG's task runs it."""
    project, version = trained["project"], trained["version"]
    traffic = trained["traffic"]
    reference = project.reference(version)
    features = [f for f in [*version.features, SCORE] if f in reference.column_names]
    current = traffic[(traffic.event_ts >= day(index)) & (traffic.event_ts < day(index + 1))].reset_index(drop=True)
    current = current.assign(**{SCORE: project.models.load(MODEL, version.version).predict(current)})
    return run_drift_check(reference.select(features), current[features], name=MODEL, features=features,
                           registry=project.registry, alerts=AlertManager(project.registry),
                           reference_label=f"{version.label} reference",
                           current_label=window_label(day(index), day(index + 1)))


def test_fourteen_steady_days_raise_no_alert_and_the_demo_drift_does(trained: dict[str, Any]) -> None:
    for index in range(TRAIN_DAYS, TRAIN_DAYS + STEADY_DAYS):
        check = drift_check(trained, index)
        assert len(check.report.judged) == len(FEATURES) + 1  # every feature and the score was judged
        assert [f.feature for f in check.report.drifted] == [] and check.alerts == [], f"day {index}"
    for index in range(TRAIN_DAYS + STEADY_DAYS, TRAIN_DAYS + STEADY_DAYS + DRIFT_DAYS):
        check = drift_check(trained, index)
        assert check.report.dataset_drift and "amount" in [f.feature for f in check.report.drifted]
        assert "dataset_drift" in {a.alert.kind for a in check.alerts}  # what the retrain trigger hears
