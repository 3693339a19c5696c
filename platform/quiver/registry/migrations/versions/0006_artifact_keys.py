"""Artifact keys: model versions record paths relative to the artifact root, never host-local absolute paths.

Until now training wrote `<project>/.quiver/models/<name>/<sha256[:16]>` and the registry kept that absolute
path, readable only on the machine that trained. Rows are rewritten in place:

* `artifact_path` / `reference_path` of the form `…/models/<name>/<sha256[:16]>[/file]` (the row's own name
  and checksum, the layout every Quiver version wrote) become the key `models/<name>/<sha256[:16]>[/file]`.
  The files stay where they are: that is the default `artifact_root` (`.quiver`); a project that moves to a
  shared folder or a bucket copies `.quiver/models/` there.
* any other absolute path becomes an explicit `file://` URI (still readable where it was written, and
  plainly host-bound), and so do the absolute paths in the lineage (`labels_source`, `pit.offline_root`).

The downgrade keeps the rewritten values: the absolute paths are not recoverable without the project root,
and keys are what every reader understands.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import json
import re
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_LAYOUT = re.compile(r"^.*/models/(?P<name>[^/]+)/(?P<digest>[0-9a-f]{16})(?P<rest>(?:/.*)?)$")


def _is_local_absolute(value: Any) -> bool:
    return isinstance(value, str) and value.startswith("/") and not _SCHEME.match(value)


def artifact_key(path: str, name: str, sha256: str) -> str:
    """The store key of a legacy absolute artifact (or reference) path, else a file:// URI."""
    if not _is_local_absolute(path):
        return path
    found = _LAYOUT.match(path.rstrip("/"))
    if found and found["name"] == name and found["digest"] == sha256[:16]:
        return f"models/{name}/{found['digest']}{found['rest']}"
    return "file://" + path


def lineage_uris(lineage: dict[str, Any]) -> dict[str, Any]:
    """The lineage with its absolute paths as file:// URIs."""
    out = dict(lineage)
    if _is_local_absolute(out.get("labels_source")):
        out["labels_source"] = "file://" + out["labels_source"]
    pit = out.get("pit")
    if isinstance(pit, dict) and _is_local_absolute(pit.get("offline_root")):
        out["pit"] = {**pit, "offline_root": "file://" + pit["offline_root"]}
    return out


def upgrade() -> None:
    connection = op.get_bind()
    versions = sa.table("model_versions", sa.column("id", sa.Integer), sa.column("name", sa.String),
                        sa.column("sha256", sa.String), sa.column("artifact_path", sa.String),
                        sa.column("reference_path", sa.String), sa.column("lineage_json", sa.Text))
    rows = connection.execute(sa.select(versions.c.id, versions.c.name, versions.c.sha256, versions.c.artifact_path,
                                        versions.c.reference_path, versions.c.lineage_json)).all()
    for row in rows:
        try:
            lineage = json.loads(row.lineage_json or "{}")
        except ValueError:
            lineage = None
        values: dict[str, Any] = {
            "artifact_path": artifact_key(row.artifact_path, row.name, row.sha256),
            "reference_path": artifact_key(row.reference_path, row.name, row.sha256),
        }
        if isinstance(lineage, dict):
            values["lineage_json"] = json.dumps(lineage_uris(lineage), sort_keys=True, default=str)
        if values["artifact_path"] != row.artifact_path or values["reference_path"] != row.reference_path \
                or values.get("lineage_json", row.lineage_json) != row.lineage_json:
            connection.execute(sa.update(versions).where(versions.c.id == row.id).values(**values))


def downgrade() -> None:
    """Nothing to undo (see the module docstring)."""
