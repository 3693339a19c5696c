"""Prometheus metrics of the feature and monitoring paths, in one place (import the objects; never re-create them).

They live in the default `prometheus_client.REGISTRY`, so `prometheus_client.start_http_server(port)` or
`make_asgi_app()` in the serving process exposes them; `render()` returns the text format.

Other components update them:
    from quiver import metrics
    metrics.set_freshness("user_spend", last_event_ts)      # online/offline writers
    metrics.LATE_EVENTS.labels(source="transactions").inc(n) # the streaming job's late-event split
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram, generate_latest

FEATURE_FRESHNESS = Gauge(
    "quiver_feature_freshness_seconds",
    "Seconds since the newest event reflected in a feature view (set via set_freshness)", ["view"])
FEATURE_LAST_EVENT = Gauge(
    "quiver_feature_last_event_timestamp_seconds", "Event time of the newest event reflected in a view", ["view"])
DRIFT_SCORE = Gauge(
    "quiver_drift_score", "Latest drift score of a feature by method (psi, ks_statistic, ks_pvalue, …)",
    ["name", "feature", "method"])
DRIFT_DETECTED = Gauge(
    "quiver_drift_detected", "1 when the latest check judged the feature drifted, else 0", ["name", "feature"])
DRIFT_SHARE = Gauge("quiver_drift_share", "Share of judged features that drifted in the latest check", ["name"])
DRIFT_RUNS = Counter("quiver_drift_runs_total", "Drift checks run", ["name", "dataset_drift"])
QUALITY_BATCHES = Counter(
    "quiver_quality_batches_total", "Batches validated by the data-quality gate", ["source", "outcome"])
QUALITY_FAILURES = Counter(
    "quiver_quality_failures_total", "Failed expectations in validated batches", ["source", "expectation"])
QUALITY_BAD_ROWS = Counter("quiver_quality_bad_rows_total", "Rows flagged by row-level expectations", ["source"])
CONTRACT_REFUSED = Counter(
    "quiver_contract_refused_rows_total", "Rows refused by their source's contract, by failed check and path "
    "(backfill, request; the stream's are quiver_stream_quarantined_total)", ["source", "check", "path"])
LATE_EVENTS = Counter("quiver_late_events_total", "Events that arrived behind the watermark", ["source"])
ALERTS = Counter("quiver_alerts_total", "Alerts raised (created, escalated or repeated)",
                 ["kind", "severity", "outcome"])
ALERT_DELIVERY_FAILURES = Counter("quiver_alert_delivery_failures_total", "Alert deliveries that failed",
                                  ["sink"])
SERVING_LOG_ROWS = Counter("quiver_serving_log_rows_total", "Serving-log rows written to Parquet")
SERVING_LOG_DROPPED = Counter("quiver_serving_log_dropped_total",
                              "Serving-log rows dropped, by reason (buffer_full, closed, write_failed, "
                              "unconvertible)", ["reason"])
SERVING_LOG_FAILED_WRITES = Counter("quiver_serving_log_failed_writes_total",
                                    "Serving-log file writes that failed (their rows wait for a retry)")
SERVING_LOG_QUARANTINED = Counter("quiver_serving_log_quarantined_total",
                                  "Serving-log rows quarantined, by reason (time_out_of_range, unconvertible, "
                                  "write_failed)", ["reason"])
SERVING_LOG_FLUSH_SECONDS = Histogram("quiver_serving_log_flush_seconds", "Time to write one serving-log flush")


def set_freshness(view: str, last_event: datetime | float, now: float | None = None) -> float:
    """Record the newest event time of `view`; returns its age in seconds."""
    ts = last_event.timestamp() if isinstance(last_event, datetime) else float(last_event)
    age = max(0.0, (time.time() if now is None else now) - ts)
    FEATURE_LAST_EVENT.labels(view=view).set(ts)
    FEATURE_FRESHNESS.labels(view=view).set(age)
    return age


def observe_drift(name: str, report: Any) -> None:
    """Publish a `quiver.monitoring.drift.DriftReport`'s scores, verdicts and drift share under `name`."""
    for f in report.features:
        for method, value in f.scores.items():
            if method != "psi_bins":
                DRIFT_SCORE.labels(name=name, feature=f.feature, method=method).set(value)
        DRIFT_DETECTED.labels(name=name, feature=f.feature).set(1.0 if f.drifted else 0.0)
    DRIFT_SHARE.labels(name=name).set(report.drift_share)
    DRIFT_RUNS.labels(name=name, dataset_drift=str(report.dataset_drift).lower()).inc()


def render() -> bytes:
    """All metrics of the default registry in Prometheus text format."""
    return bytes(generate_latest(REGISTRY))
