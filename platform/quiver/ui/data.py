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


class NotFound(Exception):
    """A page asked for something the project does not have (an unknown model, decision, rollout): the
    console answers 404 with this message. Any other exception is the console's own failure, a 500."""


@dataclass(frozen=True)
class LineageRow:
    """One view's place in the lineage: what it reads, the service that serves it ('' when none does) and
    the model versions trained on that service."""

    inputs: tuple[tuple[str, str], ...]  # (kind, name): kind 'source', 'request source' or 'view'
    view: str
    kind: str  # 'view' (stored), 'on-demand view', or 'unknown' (a service names something not in the catalog)
    service: str
    models: tuple[str, ...]


def lineage_rows(catalog: Any, versions: list[Any]) -> list[LineageRow]:
    """A row for every view (stored or on demand) of every service, then the views no service reads.

    A stored view reads its source; an on-demand view its request sources and the stored views it takes
    features from."""
    by_service: dict[str, list[str]] = {}
    for v in versions:
        by_service.setdefault(str(v.lineage.get("service", "")), []).append(v.label)

    def row(name: str, service: str) -> LineageRow:
        models = tuple(by_service.get(service, [])) if service else ()
        if name in catalog.views:
            return LineageRow((("source", catalog.views[name].source),), name, "view", service, models)
        if name in catalog.on_demand:
            spec = catalog.on_demand[name]
            inputs = tuple(("request source", r) for r in spec.request_sources) + tuple(
                ("view", view) for view in dict.fromkeys(view for view, _ in spec.inputs))
            return LineageRow(inputs, name, "on-demand view", service, models)
        # A validated catalog never gets here; a stored version from an older release might: show it.
        return LineageRow((), name, "unknown", service, models)

    rows: list[LineageRow] = []
    served: set[str] = set()
    for service in sorted(catalog.services.values(), key=lambda s: s.name):
        for name in dict.fromkeys(ref.partition(":")[0] for ref in service.features):
            served.add(name)
            rows.append(row(name, service.name))
    for name in sorted({*catalog.views, *catalog.on_demand} - served):
        rows.append(row(name, ""))
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
