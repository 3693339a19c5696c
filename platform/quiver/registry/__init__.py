"""The SQLAlchemy registry: catalog versions, lineage, runs; schema evolved by migrations."""

from quiver.registry.repository import ApplyResult, Registry, VersionInfo

__all__ = ["ApplyResult", "Registry", "VersionInfo"]
