"""Quiver monitoring: serving logs, data-quality gates, drift (PSI/KS), alerts, metrics and reports.

Heavy libraries (Evidently, Great Expectations, matplotlib, scipy) load only inside the functions that use
them, so `import monitoring` stays cheap for the serving process.
"""

from quiver.monitoring.alerts import (
    AirflowAssetSink,
    AlertManager,
    AlertSink,
    DeliveryError,
    LogSink,
    WebhookSink,
    sinks_from_config,
)
from quiver.monitoring.checks import DriftCheck, run_drift_check
from quiver.monitoring.drift import DriftConfig, DriftReport, FeatureDrift, Thresholds, compute_drift
from quiver.monitoring.quality import QualityGate, QualityGateError, QualityResult
from quiver.serving.logs import ServingLogger, read_serving_logs

__all__ = [
    "AirflowAssetSink",
    "AlertManager",
    "AlertSink",
    "DeliveryError",
    "DriftCheck",
    "DriftConfig",
    "DriftReport",
    "FeatureDrift",
    "LogSink",
    "QualityGate",
    "QualityGateError",
    "QualityResult",
    "ServingLogger",
    "Thresholds",
    "WebhookSink",
    "compute_drift",
    "read_serving_logs",
    "run_drift_check",
    "sinks_from_config",
]
