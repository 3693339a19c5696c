"""What every step of the closed loop shares: the project (config, registry, alerts) and run windows.

The loop's DAGs (dags/quiver_*.py) call the step functions of `pipelines.loop_*` with plain values: the
project's quiver.yaml, the model name, and the run's window as UTC datetimes. Every step is idempotent: it
first looks for the record a previous attempt left for the same inputs and returns that instead of acting
twice, so a retried or re-run task changes nothing further.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cached_property
from pathlib import Path
from typing import Any

from quiver.config import Config, load_config

CHAMPION, CHALLENGER = "champion", "challenger"


def drift_asset_uri(model: str) -> str:
    """The Asset a dataset-drift verdict on `model`'s serving traffic emits (retraining listens to it)."""
    return f"quiver://drift/{model}"


def challenger_asset_uri(model: str) -> str:
    """The Asset a newly set challenger emits (shadow evaluation listens to it)."""
    return f"quiver://challenger/{model}"


def canary_asset_uri(model: str) -> str:
    """The Asset a shadow verdict in favour of the challenger emits (the canary listens to it)."""
    return f"quiver://canary/{model}"


@dataclass
class Project:
    """One project's config with its registry, model registry and alert manager, opened lazily."""

    config: Config

    @classmethod
    def load(cls, config_path: str | Path | None = None) -> Project:
        return cls(load_config(Path(config_path) if config_path else None))

    @cached_property
    def registry(self) -> Any:
        from quiver.registry import Registry

        return Registry(self.config.registry, project=self.config.project)

    @cached_property
    def artifacts(self) -> Any:
        """The artifact store (quiver.artifacts): model folders, references and label snapshots."""
        from quiver.artifacts import ArtifactStore

        return ArtifactStore.from_config(self.config)

    @cached_property
    def models(self) -> Any:
        from quiver.registry.models import ModelRegistry

        return ModelRegistry(self.registry, self.artifacts)

    def reference(self, version: Any, columns: list[str] | None = None) -> Any:
        """A model version's reference table, read through the artifact store and checked against its sha256."""
        return self.artifacts.read_reference(version.artifact_path, version.reference_path, version.sha256,
                                             columns=columns)

    @cached_property
    def alerts(self) -> Any:
        from quiver.monitoring.alerts import AlertManager, sinks_from_config
        from quiver.monitoring.settings import load_settings

        return AlertManager(self.registry, sinks_from_config(load_settings(self.config).alert_sinks))

    @cached_property
    def serving_log_root(self) -> Any:
        """Where every replica's serving logs (and the delayed labels) live: the store root (`offline_root`, a
        folder or an object store), opened once."""
        from quiver.offline.store import store_for

        return store_for(self.config)

    @property
    def reports_dir(self) -> Path:
        return self.config.root / "data" / "reports"



def utc(value: datetime | str) -> datetime:
    """A timezone-aware UTC datetime from a datetime (naive = UTC) or an ISO string."""
    # A subclass (Airflow's pendulum DateTime) is made a plain datetime first: pendulum's astimezone(UTC)
    # returns a DateTime whose tzinfo is None, naive where every other moment here is aware.
    moment = datetime.fromisoformat(value if isinstance(value, str) else value.isoformat())
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def run_window(start: datetime | str | None, end: datetime | str | None, *, days: float = 1.0,
               events: Iterable[Mapping[str, Any]] = (), now: datetime | None = None) -> tuple[datetime, datetime]:
    """The [start, end) a run covers, from its data interval.

    Airflow 3 gives asset-triggered and manual runs no (or an empty) data interval; then the window ends at the
    latest `window_end` carried by the triggering Asset events, else at `end`, else `now`, and spans `days`.
    """
    ends = [utc(e["window_end"]) for e in events if e.get("window_end")]
    stop = max(ends) if ends else utc(end) if end is not None else (now or datetime.now(UTC))
    begin = utc(start) if start is not None else None
    if begin is None or begin >= stop or ends:
        begin = stop - timedelta(days=days)
    return begin, stop


def iso(moment: datetime) -> str:
    return utc(moment).isoformat()
