"""The registry's status rule for a new model version (derive_status), on recorded metrics alone."""

from __future__ import annotations

from typing import Any

import pytest

from quiver.registry.models import derive_status

BASE = {"roc_auc": 0.80, "log_loss": 0.050}


@pytest.mark.parametrize(("metrics", "status", "why"), [
    ({"roc_auc": 0.81, "log_loss": 0.049, "baseline": BASE}, "registered", "Better than its logistic baseline."),
    ({"roc_auc": 0.80, "log_loss": 0.050, "baseline": BASE}, "registered", "Not worse than"),  # a tie is not worse
    # Within the tolerance, and the reason shows it: the gain or loss on each metric beside what is allowed.
    ({"roc_auc": 0.796, "log_loss": 0.0504, "baseline": BASE}, "registered",
     "Not worse than its logistic baseline within the tolerance (not better on every metric). On its test window: "
     "log loss 0.05040 vs the baseline's 0.05000 (+0.8%; at most 1% above), ROC-AUC 0.7960 vs the baseline's "
     "0.8000 (-0.0040; at most 0.005 below)"),
    ({"roc_auc": 0.794, "log_loss": 0.049, "baseline": BASE}, "rejected", "its ROC-AUC is more than 0.005 below"),
    ({"roc_auc": 0.85, "log_loss": 0.0506, "baseline": BASE}, "rejected", "its log loss is more than 1% above"),
    # Started from the baseline's weights and kept that start: registered, and the reason says what it is.
    ({"roc_auc": 0.80, "log_loss": 0.0500001, "best_epoch": -1.0, "baseline": BASE}, "registered",
     "It equals its logistic baseline"),
    ({"roc_auc": 0.81, "log_loss": 0.049, "best_epoch": 3.0, "baseline": BASE}, "registered", "Better than"),
    ({"roc_auc": 0.81}, "rejected", "no ROC-AUC beside a baseline"),
    ({"roc_auc": 0.81, "baseline": {"roc_auc": 0.80}}, "registered", "ROC-AUC 0.8100"),  # no log losses recorded
    ({"roc_auc": 0.79, "baseline": {"roc_auc": 0.80}}, "rejected", "Worse than its baseline by more than"),
    ({"roc_auc": 0.05, "log_loss": 3.0, "baseline": {"roc_auc": 0.95, "log_loss": 0.05}}, "rejected", "Worse"),
])
def test_status_follows_the_metrics(metrics: dict[str, Any], status: str, why: str) -> None:
    got, reason = derive_status(metrics)
    assert (got, why in reason) == (status, True), reason
