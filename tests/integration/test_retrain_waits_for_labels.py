"""A drift-triggered retrain waits for labels of the drifted traffic (knowledge time), on a real registry.

Reproduction: with labels arriving a day after their events, the retrain the first drift check triggers
trained on a window holding no label of the drifted traffic, learned the old world again, and sat as a
challenger the shadow could not tell from the champion for a week ("one candidate at a time" blocked every
later retrain). The drift runs here are recorded by the real drift check; the labels are a real file with
`label_arrived_at`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from quiver.config import load_config
from quiver.monitoring.checks import run_drift_check
from quiver.pipelines.loop_common import Project
from quiver.pipelines.loop_drift import window_label
from quiver.pipelines.loop_retrain import drift_began, plan_retrain, waiting_for_labels

pytestmark = pytest.mark.integration
MODEL = "fraud_model"
DAY = timedelta(days=1)
T0 = datetime(2026, 11, 1, tzinfo=UTC)


@pytest.fixture
def project(tmp_path: Path) -> Project:
    (tmp_path / "quiver.yaml").write_text("project: waits\nregistry_url: sqlite:///.quiver/registry.db\n")
    # One label an hour from day 0 to day 10; each arrives 30 h after its event.
    ts = pd.date_range(T0, T0 + 10 * DAY, freq="1h", inclusive="left", tz="UTC")
    labels = pd.DataFrame({"transaction_id": [f"t{i}" for i in range(len(ts))], "event_ts": ts,
                           "is_fraud": np.zeros(len(ts), dtype=np.int64),
                           "label_arrived_at": ts + pd.Timedelta(hours=30)})
    (tmp_path / "data" / "labels").mkdir(parents=True)
    labels.to_parquet(tmp_path / "data" / "labels" / "labels.parquet")
    return Project(load_config(tmp_path / "quiver.yaml"))


def check(project: Project, day: int, drifted: bool) -> None:
    """The drift check of day `day`'s serving window, as the drift DAG records it."""
    rng = np.random.default_rng(day)
    reference = pd.DataFrame({"amount": rng.normal(0, 1, 2_000)})
    current = pd.DataFrame({"amount": rng.normal(3.0 if drifted else 0.0, 1, 2_000)})
    start = T0 + day * DAY
    result = run_drift_check(reference, current, name=MODEL, features=["amount"], registry=project.registry,
                             reference_label=f"{MODEL}:1 reference", current_label=window_label(start, start + DAY))
    assert result.report.dataset_drift is drifted


def plan(day: int) -> dict[str, object]:
    end = T0 + day * DAY
    return plan_retrain(MODEL, 3, None, [{"drift_run_id": 1, "window_start": (end - DAY).isoformat(),
                                          "window_end": end.isoformat()}])


def test_a_drift_retrain_waits_until_labels_of_the_drifted_traffic_have_arrived(project: Project) -> None:
    for day, drifted in ((5, False), (6, False), (7, True), (8, True), (9, True)):
        check(project, day, drifted)
    # The drift began with day 7's window and has not stopped.
    assert drift_began(project, MODEL, T0 + 8 * DAY) == T0 + 7 * DAY
    assert drift_began(project, MODEL, T0 + 10 * DAY) == T0 + 7 * DAY
    assert drift_began(project, MODEL, T0 + 7 * DAY) is None  # the newest check up to then was calm
    # Seen at the end of day 7: no label of day 7 has arrived (30 h late), so the run waits.
    why = waiting_for_labels(project, plan(8), min_labelled=10)
    assert why is not None and "0 label(s)" in why and "2026-11-08" in why
    # A day later, day 7's events up to 18:00 are known (arrived by day 9): enough for 10, not for 20.
    assert waiting_for_labels(project, plan(9), min_labelled=10) is None
    assert "19 label(s)" in str(waiting_for_labels(project, plan(9), min_labelled=20))
    # Manual and calendar runs never wait; neither does a drift that ended.
    assert waiting_for_labels(project, {**plan(8), "trigger": "manual"}, min_labelled=10) is None
    assert waiting_for_labels(project, {**plan(8), "trigger": "schedule"}, min_labelled=10) is None


def test_a_calm_check_ends_the_drift_and_a_new_one_starts_over(project: Project) -> None:
    for day, drifted in ((5, True), (6, False), (7, True)):
        check(project, day, drifted)
    assert drift_began(project, MODEL, T0 + 8 * DAY) == T0 + 7 * DAY  # not day 5: day 6 was calm
