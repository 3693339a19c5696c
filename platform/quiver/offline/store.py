"""Where the offline store lives: a local folder (as it always was) or an object store named by a URI.

`offline_root` in quiver.yaml is a folder (relative to the project) or ``s3://bucket/prefix`` (``s3a://`` is
read as the same bucket), ``gs://…`` or ``hdfs://…``, opened as every root is (`quiver.catalog.locations`:
pyarrow filesystems, endpoints, credentials never in a URI or in Spark's settings).

Atomic replacement of a day, without rename (object stores have none): the day's files are written under
new, run-unique names, then one small ``_manifest.json`` naming them is written in one PUT (atomic and
strongly consistent on S3 and GCS), then files the manifest no longer names are deleted. Readers go through
the manifest, so they see the old day or the new one, never half of one; a day without a manifest does not
exist. Local folders keep their rename-based swap and need no manifest.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from quiver.catalog.locations import SCHEMES, Location, is_remote, open_location
from quiver.offline.layout import LATE_DIR

__all__ = ["MANIFEST", "SCHEMES", "OfflineStore", "is_remote", "open_store", "store_for"]

MANIFEST = "_manifest.json"


@dataclass(frozen=True)
class OfflineStore(Location):
    """An opened offline root (`quiver.catalog.locations.Location`) with its manifests and late events."""

    # ---- listing and manifests ----

    def partition_days(self, view: str, kind: str) -> list[date]:
        """Dates of a view and kind that have a committed manifest, sorted."""
        import pyarrow.fs as pafs

        base = self.path(view, kind)
        days = []
        for info in self.fs.get_file_info(pafs.FileSelector(base, allow_not_found=True, recursive=True)):
            relative = info.path[len(base) + 1:]
            folder, _, name = relative.rpartition("/")
            if name == MANIFEST and folder.startswith("date=") and "/" not in folder:
                days.append(date.fromisoformat(folder[5:]))
        return sorted(days)

    def read_manifest(self, folder: str) -> dict[str, Any] | None:
        """The manifest of a partition folder (a path inside `fs`), or None when it has none."""
        manifest: dict[str, Any] | None = self.read_json(f"{folder}/{MANIFEST}")
        return manifest

    def partition_files(self, folder: str) -> list[str]:
        """The data files (paths inside `fs`) a partition's manifest names; none without a manifest."""
        manifest = self.read_manifest(folder)
        return [f"{folder}/{name}" for name in manifest["files"]] if manifest else []

    def commit(self, folder: str, staged: Sequence[str], rows: int) -> None:
        """Make `staged` (files inside `fs`) the whole content of partition `folder` (see module docstring)."""
        run = uuid.uuid4().hex[:12]
        names = []
        for index, source in enumerate(staged):
            name = f"part-{index:05d}-{run}.parquet"
            self.fs.move(source, f"{folder}/{name}")  # S3/GCS: a server-side copy, no byte through us
            names.append(name)
        manifest = {"run": run, "files": names, "rows": rows,
                    "committed_at": datetime.now(UTC).isoformat(timespec="seconds")}
        with self.fs.open_output_stream(f"{folder}/{MANIFEST}") as out:  # the commit point: one PUT
            out.write(json.dumps(manifest, indent=1).encode())
        self._delete_unlisted(folder, {*names, MANIFEST})

    def remove(self, folder: str) -> None:
        """Remove a partition: its manifest first (the day is gone from then on), then its files."""
        if self.exists(f"{folder}/{MANIFEST}"):
            self.fs.delete_file(f"{folder}/{MANIFEST}")
        self._delete_unlisted(folder, set())

    def _delete_unlisted(self, folder: str, keep: set[str]) -> None:
        for path in self.files_under(folder):
            if path[len(folder) + 1:] not in keep:
                self.fs.delete_file(path)

    # ---- late stream events (`quiver.streaming.late`) ----

    def late_event_files(self, source: str) -> list[str]:
        """Paths (inside `fs`) of `source`'s late and future-dated stream events, in name order:
        `<root>/_late_events/<source>/date=<day>/<batch>.parquet`, hidden and _underscored names skipped."""
        folder = self.path(LATE_DIR, source)
        found = []
        for path in self.files_under(folder):
            day, _, name = path[len(folder) + 1:].partition("/")
            if day.startswith("date=") and "/" not in name and name.endswith(".parquet") \
                    and not name.startswith((".", "_")):
                found.append(path)
        return found

    def arrival_us(self, path: str) -> int:
        """When `path` was written (its modification time, epoch µs)."""
        mtime = self.fs.get_file_info(path).mtime_ns
        return int(mtime or 0) // 1000

def open_store(offline_root: str, project_root: Path) -> OfflineStore:
    """Open `offline_root`: a folder (relative to `project_root`) or an object-store URI.

    Raises QuiverError naming the setting for an unknown scheme, a malformed URI, credentials in the URI,
    or (S3) no credentials anywhere the AWS SDK would look.
    """
    where = open_location(offline_root, project_root)
    return OfflineStore(where.root, where.fs, where.base, where.scheme, where.endpoint)


def store_for(config: Any) -> OfflineStore:
    """The offline store of a `quiver.config.Config`."""
    return open_store(config.offline_root, config.root)

