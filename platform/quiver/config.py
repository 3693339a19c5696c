"""Project configuration: one `quiver.yaml`, every key overridable by a QUIVER_* environment variable.

Relative paths (catalog, offline root, SQLite registry file) resolve against the config file's directory,
so commands behave the same from any working directory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from quiver.catalog.errors import QuiverError
from quiver.catalog.types import is_identifier

CONFIG_FILE = "quiver.yaml"


@dataclass(frozen=True)
class Config:
    """Settings of one Quiver project."""

    root: Path = field(default_factory=Path.cwd)
    project: str = "default"
    catalog: str = "feature_defs"
    registry_url: str = "sqlite:///.quiver/registry.db"
    offline_root: str = "data/offline"
    redis_url: str = ""  # empty: an embedded Redis is started for the demo
    engine: str = "duckdb"
    spark_master: str = "local[2]"
    redis_timeout_s: float = 1.0

    @property
    def catalog_dir(self) -> Path:
        return self._path(self.catalog)

    @property
    def offline_dir(self) -> Path:
        return self._path(self.offline_root)

    @property
    def registry(self) -> str:
        """The registry URL with a relative SQLite path made absolute against the project root."""
        prefix = "sqlite:///"
        if self.registry_url.startswith(prefix) and not self.registry_url.startswith(prefix + "/"):
            relative = self.registry_url[len(prefix):]
            if relative and relative != ":memory:":
                return prefix + str(self._path(relative))
        return self.registry_url

    def _path(self, value: str) -> Path:
        path = Path(value).expanduser()
        return path if path.is_absolute() else self.root / path


_ENV_PREFIX = "QUIVER_"
_KEYS = {f.name for f in fields(Config)} - {"root"}


def load_config(path: str | Path | None = None) -> Config:
    """Read `path` (default: ./quiver.yaml when present) and apply QUIVER_* environment overrides."""
    explicit = path is not None
    config_path = Path(path) if path else Path.cwd() / CONFIG_FILE
    values: dict[str, Any] = {}
    if config_path.exists():
        try:
            loaded = yaml.safe_load(config_path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise QuiverError(f"{config_path}: not valid YAML: {exc}") from None
        if not isinstance(loaded, dict):
            raise QuiverError(f"{config_path}: expected a mapping of settings at the top level")
        values.update(loaded)
    elif explicit:
        raise QuiverError(f"config file {config_path} does not exist")
    for key in _KEYS:
        env = os.environ.get(_ENV_PREFIX + key.upper())
        if env is not None:
            values[key] = env
    unknown = set(values) - _KEYS
    if unknown:
        raise QuiverError(f"{config_path}: unknown setting(s) {', '.join(sorted(unknown))}; "
                          f"known: {', '.join(sorted(_KEYS))}")
    config = Config(root=config_path.resolve().parent, **values)
    if config.engine not in ("duckdb", "spark"):
        raise QuiverError(f"{config_path}: engine must be duckdb or spark, got {config.engine!r}")
    if not is_identifier(config.project):
        raise QuiverError(f"{config_path}: project {config.project!r} must be a plain identifier")
    return replace(config, redis_timeout_s=float(config.redis_timeout_s))


DEFAULT_CONFIG_TEXT = """\
# Quiver project settings. Every key can be overridden by QUIVER_<KEY> (e.g. QUIVER_REDIS_URL).
project: {project}
catalog: feature_defs          # directory of Python feature definitions
registry_url: sqlite:///.quiver/registry.db   # or postgresql+psycopg://user@host/db
offline_root: data/offline     # Parquet offline store
redis_url: ""                  # empty: embedded Redis for demos; e.g. redis://:password@host:6379/0
engine: duckdb                 # duckdb (embedded) or spark
spark_master: local[2]         # or spark://host:7077
"""
