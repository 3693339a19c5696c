"""Monitoring settings of a project: `monitoring.yaml` beside `quiver.yaml` (optional; the demo project ships
one holding the defaults). Every key and sink option is described in docs/configuration.md.

    alert_sinks:                       # default: [{type: log}]
      - {type: log}
      - {type: webhook, url: "https://hooks.slack.com/services/…"}
      - {type: airflow_asset, trigger_dir: data/triggers}        # or api_url + token
    quarantine_dir: data/offline/_quarantine/batches          # default: <offline_root>/_quarantine/batches
    expectations_dir: feature_defs/expectations               # default: <catalog>/expectations
    on_failure: continue                                      # or stop
    consistency_threshold: 0.001                              # share of served values that may be wrong
    consistency_thresholds: {"user_spend:amount_sum_1h": 0.01}  # per feature (view:feature)
    consistency_gate: true                                    # false: canaries do not wait on consistency checks
    consistency_max_age_hours: 26                             # the gate's check: data at most this old
    consistency_min_rows: 100                                 # … comparing at least this many rows per feature
    freshness_objectives: {"user_spend": 60}                  # per streamed view: p99 event-to-servable seconds
    drift_decision: bounded                                   # or thresholds (PSI/KS levels, share ≥ 0.5)
    drift_min_effect: 0.1                                     # Kolmogorov distance / total variation worth an alert
    drift_min_effects: {"amount_sum_1h": 0.2}                 # per feature
    drift_false_alarms_per_90_days: 0.5                       # expected false dataset alerts on steady traffic

`QUIVER_ALERT_WEBHOOK_URL` adds a webhook sink without a file. Relative paths resolve against the project root.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from quiver.catalog.errors import QuiverError
from quiver.config import Config

if TYPE_CHECKING:
    from quiver.monitoring.drift import DriftConfig

SETTINGS_FILE = "monitoring.yaml"
_KEYS = {"alert_sinks", "quarantine_dir", "expectations_dir", "on_failure", "consistency_threshold",
         "consistency_thresholds", "consistency_gate", "consistency_max_age_hours", "consistency_min_rows",
         "freshness_objectives", "drift_decision", "drift_min_effect", "drift_min_effects",
         "drift_false_alarms_per_90_days"}


@dataclass(frozen=True)
class MonitoringSettings:
    """Where alerts go, where quarantined batches land, where user expectation suites live."""

    alert_sinks: list[dict[str, Any]] = field(default_factory=lambda: [{"type": "log"}])
    quarantine_dir: Path = Path("data/offline/_quarantine/batches")
    expectations_dir: Path = Path("feature_defs/expectations")
    on_failure: str = "continue"
    consistency_threshold: float = 0.001  # `quiver consistency`: share of served values that may be wrong
    consistency_thresholds: dict[str, float] = field(default_factory=dict)  # view:feature → its own
    # The canary's consistency gate (quiver.monitoring.consistency_gate): on unless set false. A step needs a
    # check of its model's features covering the rollout's window, at most `consistency_max_age_hours` old by
    # data time, that compared at least `consistency_min_rows` rows of each feature and passed.
    consistency_gate: bool = True
    consistency_max_age_hours: float = 26.0  # a daily check, with two hours of slack for a late run
    consistency_min_rows: int = 100
    # Per view: the p99 of how far behind its events what serving read may be (seconds). Stream lag within it
    # is freshness, reported against it, not an error; a view without one counts stream lag as wrong.
    freshness_objectives: dict[str, float] = field(default_factory=dict)
    # The drift decision (quiver.monitoring.drift_decision; docs/drift.md): bounded, with its minimum effect
    # and its false-alarm budget, or the previous thresholds rule.
    drift_decision: str = "bounded"
    drift_min_effect: float = 0.1
    drift_min_effects: dict[str, float] = field(default_factory=dict)
    drift_false_alarms_per_90_days: float = 0.5

    def drift_config(self, base: DriftConfig | None = None) -> DriftConfig:
        """`base` (a `DriftConfig`, default the defaults) with these drift settings applied."""
        from dataclasses import replace

        from quiver.monitoring.drift import DriftConfig

        return replace(base or DriftConfig(), decision=self.drift_decision, min_effect=self.drift_min_effect,
                       min_effects=dict(self.drift_min_effects),
                       false_alarms_per_90_days=self.drift_false_alarms_per_90_days)


def load_settings(config: Config) -> MonitoringSettings:
    """Settings for the project of `config` (defaults when monitoring.yaml is absent)."""
    path = config.root / SETTINGS_FILE
    values: dict[str, Any] = {}
    if path.exists():
        loaded = yaml.safe_load(path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise QuiverError(f"{path}: expected a mapping of settings")
        unknown = set(loaded) - _KEYS
        if unknown:
            raise QuiverError(f"{path}: unknown setting(s) {', '.join(sorted(unknown))}; known: "
                              f"{', '.join(sorted(_KEYS))}")
        values = loaded
    sinks = list(values.get("alert_sinks") or [{"type": "log"}])
    webhook = os.environ.get("QUIVER_ALERT_WEBHOOK_URL")
    if webhook:
        sinks.append({"type": "webhook", "url": webhook})
    for sink in sinks:
        if sink.get("type") == "airflow_asset" and sink.get("trigger_dir"):
            sink["trigger_dir"] = str(_resolve(config, sink["trigger_dir"]))

    def directory(key: str, default: Path) -> Path:
        return _resolve(config, values[key]) if values.get(key) else default

    on_failure = str(values.get("on_failure", "continue"))
    if on_failure not in ("continue", "stop"):
        raise QuiverError(f"{path}: on_failure must be continue or stop, got {on_failure!r}")
    thresholds = values.get("consistency_thresholds") or {}
    try:
        threshold = float(values.get("consistency_threshold", 0.001))
        per_feature = {str(k): float(v) for k, v in dict(thresholds).items()}
    except (TypeError, ValueError):
        raise QuiverError(f"{path}: consistency_threshold must be a number and consistency_thresholds a "
                          f"mapping of view:feature to numbers") from None
    gate = values.get("consistency_gate", True)
    if not isinstance(gate, bool):
        raise QuiverError(f"{path}: consistency_gate must be true or false, got {gate!r}")
    max_age = values.get("consistency_max_age_hours", 26.0)
    min_rows = values.get("consistency_min_rows", 100)
    if isinstance(max_age, bool) or not isinstance(max_age, int | float) or not max_age > 0:
        raise QuiverError(f"{path}: consistency_max_age_hours must be a number of hours above 0, got {max_age!r}")
    if isinstance(min_rows, bool) or not isinstance(min_rows, int) or min_rows < 1:
        raise QuiverError(f"{path}: consistency_min_rows must be a whole number of rows, at least 1, got "
                          f"{min_rows!r}")
    objectives = values.get("freshness_objectives") or {}
    try:
        freshness = {str(k): float(v) for k, v in dict(objectives).items()}
    except (TypeError, ValueError):
        freshness = {"": -1.0}
    if any(not v > 0 for v in freshness.values()):
        raise QuiverError(f"{path}: freshness_objectives must map view names to seconds above 0, got {objectives!r}")
    drift = _drift_settings(path, values)
    return MonitoringSettings(
        alert_sinks=sinks,
        quarantine_dir=directory("quarantine_dir", config.offline_dir / "_quarantine" / "batches"),
        expectations_dir=directory("expectations_dir", config.catalog_dir / "expectations"),
        on_failure=on_failure,
        consistency_threshold=threshold,
        consistency_thresholds=per_feature,
        consistency_gate=gate,
        consistency_max_age_hours=float(max_age),
        consistency_min_rows=min_rows,
        freshness_objectives=freshness,
        **drift,
    )


def _drift_settings(path: Path, values: dict[str, Any]) -> dict[str, Any]:
    """The drift keys, checked the way `DriftConfig` checks them (an error names the file)."""
    from quiver.monitoring.drift import DriftConfig

    decision = values.get("drift_decision", "bounded")
    try:
        effect = float(values.get("drift_min_effect", 0.1))
        effects = {str(k): float(v) for k, v in dict(values.get("drift_min_effects") or {}).items()}
        budget = float(values.get("drift_false_alarms_per_90_days", 0.5))
        DriftConfig(decision=str(decision), min_effect=effect, min_effects=effects, false_alarms_per_90_days=budget)
    except (TypeError, ValueError) as exc:
        raise QuiverError(f"{path}: drift settings: {exc}") from None
    return {"drift_decision": str(decision), "drift_min_effect": effect, "drift_min_effects": effects,
            "drift_false_alarms_per_90_days": budget}


def _resolve(config: Config, value: str) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else config.root / path
