"""`quiver alerts show ID`: an alert's history (opened, updated, resolved and why) with both clocks, as a user
runs it; `quiver alerts resolve` says in that history that a person resolved it."""

from __future__ import annotations

from pathlib import Path

import pytest

from quiver.monitoring.repository import open_alert
from quiver.registry import Registry
from tests.cli_runs import done, quiver

pytestmark = pytest.mark.integration


def test_alerts_show_prints_the_history_with_both_clocks(tmp_path: Path) -> None:
    (tmp_path / "quiver.yaml").write_text(f"project: fraud\nregistry_url: sqlite:///{tmp_path}/registry.db\n")
    registry = Registry(f"sqlite:///{tmp_path}/registry.db", project="fraud")
    detail = {"reference": "fraud_model:2 reference", "drifted": ["amount", "hour"], "drift_share": 0.5}
    alert, _ = open_alert(registry, "dataset_drift", "fraud_model", "critical", "Dataset drift in fraud_model",
                          "Share 50 %", {**detail, "as_of": "2026-11-11T00:00:00+00:00"}, [])
    open_alert(registry, "dataset_drift", "fraud_model", "critical", "Dataset drift in fraud_model", "Share 75 %",
               {**detail, "drifted": ["amount", "hour", "tx_count"], "as_of": "2026-11-12T00:00:00+00:00"}, [])
    registry.close()
    # Before: "No such command 'show'" (exit 2), and a resolution left no word of who or why.
    done(quiver("alerts", "resolve", str(alert.id), cwd=tmp_path))
    shown = done(quiver("alerts", "show", str(alert.id), cwd=tmp_path))
    assert f"alert #{alert.id} [critical] resolved: Dataset drift in fraud_model" in shown
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in shown.splitlines() if line.startswith("│")]
    assert [r[0] for r in rows] == ["opened", "updated", "resolved"], shown
    assert [r[2][:10] for r in rows[:2]] == ["2026-11-11", "2026-11-12"]  # data time, beside the wall clock
    assert "drifted features changed: +tx_count" in rows[1][4] and rows[2][4] == "resolved by hand"
    assert "no alert 999" in quiver("alerts", "show", "999", cwd=tmp_path).stderr


def test_drift_alerts_of_a_model_come_from_its_champion_arm_only(tmp_path: Path) -> None:
    (tmp_path / "quiver.yaml").write_text(f"project: fraud\nregistry_url: sqlite:///{tmp_path}/registry.db\n")
    # Before: a canary check raised alerts under the champion's subjects (and would now resolve them as "the
    # model changed" on every alternating check).
    refused = quiver("drift", "--model", "fraud_model", "--arm", "canary", "--record", "--alert", cwd=tmp_path)
    assert refused.returncode != 0 and "--alert works with --arm champion only" in refused.stderr


def test_estimates_prints_each_day_estimated_beside_its_realized_value(tmp_path: Path) -> None:
    from datetime import UTC, datetime, timedelta

    import numpy as np

    from quiver.monitoring.estimate_records import record_estimate, record_realized
    from quiver.monitoring.performance_estimation import check_calibration, estimate_performance

    (tmp_path / "quiver.yaml").write_text(f"project: fraud\nregistry_url: sqlite:///{tmp_path}/registry.db\n")
    registry = Registry(f"sqlite:///{tmp_path}/registry.db", project="fraud")
    rng = np.random.default_rng(4)
    held = rng.beta(0.5, 3, 5_000)
    calibration = check_calibration(held, (rng.random(held.size) < held).astype(float))
    day = datetime(2026, 11, 10, tzinfo=UTC)
    for n in range(2):
        scores = rng.beta(0.5, 3, 3_000)
        start = day + timedelta(days=n)
        record_estimate(registry, "fraud_model", "fraud_model:2", "champion", start, start + timedelta(days=1),
                        estimate_performance(scores, calibration))
        if n == 0:  # the first day's labels have arrived
            record_realized(registry, "fraud_model", "fraud_model:2", "champion", start, start + timedelta(days=1),
                            scores, (rng.random(scores.size) < scores).astype(float))
    registry.close()
    shown = done(quiver("estimates", "fraud_model", cwd=tmp_path))
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in shown.splitlines() if line.startswith("│")]
    assert [r[0] for r in rows] == ["11-10 00:00 → 11-11 00:00", "11-11 00:00 → 11-12 00:00"], shown
    assert rows[0][7] == "3,000" and rows[0][9] in ("yes", "NO") and rows[1][7] == "no labels yet"
    assert "roc_auc: 1 window(s) with labels, mean |estimate − realized|" in shown
    assert "--metric 'auc' is not estimated" in quiver("estimates", "fraud_model", "--metric", "auc",
                                                        cwd=tmp_path).stderr
    assert "no performance estimates of 'other'" in quiver("estimates", "other", cwd=tmp_path).stderr
