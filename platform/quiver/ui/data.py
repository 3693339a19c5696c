"""What the console reads: the registry (catalog, models, rollouts, decisions, drift, alerts), the online
store's freshness and the reports folder. Read-only: nothing here writes."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any

from quiver.config import Config

_WINDOW = re.compile(r"serving_logs\[([^,]+),([^)]+)\)")
_DATE = re.compile(r"date=(\d{4}-\d{2}-\d{2})")


@dataclass
class Console:
    """One project's state as the console reads it (opened once per app, connections pooled)."""

    config: Config
    _store: Any = field(default=None, repr=False)

    @cached_property
    def registry(self) -> Any:
        from quiver.registry import Registry

        return Registry(self.config.registry, project=self.config.project)

    @cached_property
    def models(self) -> Any:
        from quiver.registry.models import ModelRegistry

        return ModelRegistry(self.registry)

    @property
    def reports_dir(self) -> Path:
        return self.config.root / "data" / "reports"

    def applied(self) -> Any:
        from quiver.registry.repository import load_applied_catalog

        return load_applied_catalog(self.config)

    def freshness(self, views: list[str]) -> tuple[dict[str, datetime | None], str]:
        """view → newest event time the online store holds (None: nothing), and an error text ('' if fine)."""
        try:
            if self._store is None:
                from quiver.serving.store import FeatureStore

                self._store = FeatureStore(config=self.config)
            newest = self._store.online.freshness(views, timeout_s=2.0)
        except Exception as exc:  # the console shows the store's trouble instead of failing the page
            return {}, f"online store not reachable: {exc}"
        return {v: None if ts is None else datetime.fromtimestamp(ts / 1e6, UTC) for v, ts in newest.items()}, ""

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
        if "registry" in self.__dict__:
            self.registry.close()


def lineage_rows(catalog: Any, versions: list[Any]) -> list[tuple[str, str, str, list[str]]]:
    """(source, view, service, model versions reading the service) for every view of every service, and
    views no service reads (service '')."""
    rows: list[tuple[str, str, str, list[str]]] = []
    by_service: dict[str, list[str]] = {}
    for v in versions:
        by_service.setdefault(str(v.lineage.get("service", "")), []).append(v.label)
    served: set[str] = set()
    for service in sorted(catalog.services.values(), key=lambda s: s.name):
        for view_name in dict.fromkeys(ref.partition(":")[0] for ref in service.features):
            view = catalog.views[view_name]
            served.add(view_name)
            rows.append((view.source, view_name, service.name, by_service.get(service.name, [])))
    for view in sorted(catalog.views.values(), key=lambda v: v.name):
        if view.name not in served:
            rows.append((view.source, view.name, "", []))
    return rows


def data_window(run: dict[str, Any]) -> tuple[datetime | None, datetime | None, str]:
    """The data window a drift run's current side covers, and where it came from (the serving-log window,
    a date partition in the path, else only when it ran)."""
    current = str(run.get("current", ""))
    match = _WINDOW.search(current)
    if match:
        return _utc(match.group(1)), _utc(match.group(2)), "serving logs"
    dates = _DATE.findall(current)
    if dates:
        start = _utc(dates[0])
        return start, start, "date partition"
    return None, None, "compute time only"


def drift_subject(run: dict[str, Any], model_names: list[str]) -> tuple[str, str]:
    """('model' | 'source' | 'dataset', name) of a drift run."""
    name = str(run.get("name", ""))
    if name in model_names:
        return "model", name
    current = str(run.get("current", ""))
    match = re.search(r"events/([A-Za-z0-9_]+)", current)
    if match:
        return "source", match.group(1)
    return "dataset", name


def report_files(directory: Path) -> list[Path]:
    """HTML reports in the reports folder, newest first."""
    if not directory.is_dir():
        return []
    return sorted((p for p in directory.glob("*.html") if p.is_file()), key=lambda p: p.stat().st_mtime,
                  reverse=True)


def _utc(text: str) -> datetime | None:
    try:
        value = datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)
