"""The registry's status rule for a new model version (derive_status), on recorded metrics alone."""

from __future__ import annotations

from typing import Any

import pytest

from quiver.registry.models import derive_status

BASE = {"roc_auc": 0.80, "log_loss": 0.050}


@pytest.mark.parametrize(("metrics", "status", "why"), [
    ({"roc_auc": 0.81, "log_loss": 0.049, "baseline": BASE}, "registered", "not worse than its baseline"),
    ({"roc_auc": 0.80, "log_loss": 0.050, "baseline": BASE}, "registered", "not worse"),  # a tie is not worse
    ({"roc_auc": 0.796, "log_loss": 0.0504, "baseline": BASE}, "registered", "not worse"),  # within the noise
    ({"roc_auc": 0.794, "log_loss": 0.049, "baseline": BASE}, "rejected", "ROC-AUC more than 0.005 below"),
    ({"roc_auc": 0.85, "log_loss": 0.0506, "baseline": BASE}, "rejected", "log loss more than 1% above"),
    # Started from the baseline's weights and kept that start: registered, and the reason says what it is.
    ({"roc_auc": 0.80, "log_loss": 0.0500001, "best_epoch": -1.0, "baseline": BASE}, "registered",
     "it is its baseline"),
    ({"roc_auc": 0.81, "log_loss": 0.049, "best_epoch": 3.0, "baseline": BASE}, "registered", "not worse"),
    ({"roc_auc": 0.81}, "rejected", "no ROC-AUC beside a baseline"),
    ({"roc_auc": 0.81, "baseline": {"roc_auc": 0.80}}, "registered", "ROC-AUC 0.8100"),  # no log losses recorded
    ({"roc_auc": 0.79, "baseline": {"roc_auc": 0.80}}, "rejected", "worse than its baseline by more than"),
    ({"roc_auc": 0.05, "log_loss": 3.0, "baseline": {"roc_auc": 0.95, "log_loss": 0.05}}, "rejected", "worse"),
])
def test_status_follows_the_metrics(metrics: dict[str, Any], status: str, why: str) -> None:
    got, reason = derive_status(metrics)
    assert (got, why in reason) == (status, True), reason
