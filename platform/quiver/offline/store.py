"""Where the offline store lives: a local folder (as it always was) or an object store named by a URI.

`offline_root` in quiver.yaml is a folder (relative to the project) or ``s3://bucket/prefix`` (``s3a://`` is
read as the same bucket), ``gs://…`` or ``hdfs://…``. Object stores are reached with pyarrow's own
filesystems; DuckDB reads and writes them through that filesystem (fsspec's Arrow wrapper, so no DuckDB
extension has to be downloaded) and Spark through Hadoop's connector (s3a: `scripts/jars.sh s3a`).

Options: an S3 endpoint other than AWS comes from the query (``?endpoint_override=host:9000&scheme=http``,
as for `artifact_root`) or from the standard ``AWS_ENDPOINT_URL``. Credentials are never part of the URI or
of Spark's settings: each process (the driver and every executor) finds them the usual way — ``AWS_*``
variables, ``~/.aws``, an instance or pod role — and Quiver never prints them.

Atomic replacement of a day, without rename (object stores have none): the day's files are written under
new, run-unique names, then one small ``_manifest.json`` naming them is written in one PUT (atomic and
strongly consistent on S3 and GCS), then files the manifest no longer names are deleted. Readers go through
the manifest, so they see the old day or the new one, never half of one; a day without a manifest does not
exist. Local folders keep their rename-based swap and need no manifest.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

from quiver.catalog.errors import QuiverError
from quiver.offline.layout import LATE_DIR

if TYPE_CHECKING:
    import pyarrow.fs as pafs

MANIFEST = "_manifest.json"
# Scheme as written → the filesystem family. s3a is Hadoop's name for the same S3 bucket.
SCHEMES = {"s3": "s3", "s3a": "s3", "gs": "gs", "gcs": "gs", "hdfs": "hdfs"}
_S3_OPTIONS = {"endpoint_override", "scheme", "region"}  # what an S3 root may say in its query (no secrets)


def is_remote(value: str) -> bool:
    """True when `value` is a URI (``scheme://…``) rather than a folder."""
    return "://" in value and not value.startswith("file://")


@dataclass(frozen=True)
class OfflineStore:
    """An opened offline root: a pyarrow filesystem and the root's path inside it."""

    root: str  # as configured (never holds credentials: they are refused in the query)
    fs: pafs.FileSystem
    base: str  # the root's path inside `fs`: bucket/prefix, or an absolute local folder
    scheme: str = ""  # "" (local), "s3", "gs" or "hdfs"
    endpoint: str = ""  # S3 endpoint URL when not AWS, e.g. http://127.0.0.1:9000

    @property
    def is_local(self) -> bool:
        return not self.scheme

    def path(self, *parts: str) -> str:
        """A path inside `fs` under the root."""
        return "/".join([self.base.rstrip("/"), *[p.strip("/") for p in parts if p]])

    def uri(self, path: str, spark: bool = False) -> str:
        """`path` (inside `fs`) as a URI an engine opens: s3://… for DuckDB, s3a://… for Spark."""
        if self.is_local:
            return path
        scheme = "s3a" if spark and self.scheme == "s3" else self.scheme
        return f"{scheme}://{path}"

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
        try:
            with self.fs.open_input_stream(f"{folder}/{MANIFEST}") as stream:
                manifest: dict[str, Any] = json.loads(stream.read())
        except FileNotFoundError:
            return None
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

    def exists(self, path: str) -> bool:
        import pyarrow.fs as pafs

        return bool(self.fs.get_file_info(path).type != pafs.FileType.NotFound)

    def files_under(self, folder: str) -> list[str]:
        """Every file below `folder` (recursively), sorted."""
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(folder, allow_not_found=True, recursive=True)
        return sorted(i.path for i in self.fs.get_file_info(selector) if i.type == pafs.FileType.File)

    def delete_tree(self, folder: str) -> None:
        """Delete `folder` and everything below it (missing: nothing to do)."""
        import pyarrow.fs as pafs

        if self.fs.get_file_info(folder).type != pafs.FileType.NotFound:
            self.fs.delete_dir(folder)

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

    def put(self, path: str, data: bytes) -> None:
        """Write `data` as the whole file `path` (inside `fs`), all or nothing: a folder store writes a hidden
        file and renames it; an object store's single PUT is atomic already."""
        if not self.is_local:
            with self.fs.open_output_stream(path) as out:
                out.write(data)
            return
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        staged = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}")
        staged.write_bytes(data)
        os.replace(staged, target)

    def arrival_us(self, path: str) -> int:
        """When `path` was written (its modification time, epoch µs)."""
        mtime = self.fs.get_file_info(path).mtime_ns
        return int(mtime or 0) // 1000

    # ---- engines ----

    def fsspec(self) -> Any:
        """This store's filesystem as fsspec sees it, answering to the root's scheme (DuckDB's
        `register_filesystem`: DuckDB then reads and writes s3://… through pyarrow's client)."""
        from fsspec.implementations.arrow import ArrowFSWrapper

        protocols = tuple(k for k, v in SCHEMES.items() if v == self.scheme)
        wrapper = type("QuiverArrowFS", (ArrowFSWrapper,), {"protocol": protocols})
        return wrapper(self.fs)

    def spark_conf(self) -> dict[str, str]:
        """Hadoop settings Spark needs for this root (never credentials: each JVM finds its own)."""
        if self.scheme != "s3":
            return {}
        conf = {"spark.hadoop.fs.s3a.impl": "org.apache.hadoop.fs.s3a.S3AFileSystem"}
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        if region:
            conf["spark.hadoop.fs.s3a.endpoint.region"] = region
        if self.endpoint:
            conf["spark.hadoop.fs.s3a.endpoint"] = self.endpoint
            conf["spark.hadoop.fs.s3a.path.style.access"] = "true"  # S3-compatible servers (MinIO, moto)
            conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(self.endpoint.startswith("https")).lower()
        return conf


def open_store(offline_root: str, project_root: Path) -> OfflineStore:
    """Open `offline_root`: a folder (relative to `project_root`) or an object-store URI.

    Raises QuiverError naming the setting for an unknown scheme, a malformed URI, credentials in the URI,
    or (S3) no credentials anywhere the AWS SDK would look.
    """
    import pyarrow.fs as pafs

    value = offline_root.strip()
    if not is_remote(value):
        folder = Path(value[len("file://"):] if value.startswith("file://") else value).expanduser()
        folder = folder if folder.is_absolute() else project_root / folder
        return OfflineStore(offline_root, pafs.LocalFileSystem(), str(folder))
    parts = urlsplit(value)
    family = SCHEMES.get(parts.scheme.lower())
    if family is None:
        raise QuiverError(f"offline_root {value!r}: unknown URI scheme {parts.scheme!r}; use a folder, s3://, "
                          f"s3a://, gs:// or hdfs://")
    if parts.username or parts.password:
        raise QuiverError(f"offline_root for bucket {parts.hostname!r}: credentials do not belong in the URI; "
                          f"set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or a profile or role) instead")
    if not parts.netloc:
        raise QuiverError(f"offline_root {value!r}: no bucket (or HDFS host) after {parts.scheme}://")
    if family == "s3":
        return _open_s3(offline_root, parts.netloc, parts.path, dict(parse_qsl(parts.query)))
    try:
        fs, path = pafs.FileSystem.from_uri(f"{family}://{parts.netloc}{parts.path}"
                                            + (f"?{parts.query}" if parts.query else ""))
    except (OSError, ValueError) as exc:
        raise QuiverError(f"offline_root {family}://{parts.netloc}{parts.path}: cannot open it: {exc}") from None
    return OfflineStore(offline_root, fs, str(path).rstrip("/"), family)


def _open_s3(root: str, bucket: str, prefix: str, query: dict[str, str]) -> OfflineStore:
    import pyarrow.fs as pafs

    where = f"s3://{bucket}{prefix}"
    unknown = sorted(set(query) - _S3_OPTIONS)
    if unknown:
        raise QuiverError(f"offline_root {where}: unknown option(s) {', '.join(unknown)} in the query; "
                          f"known: {', '.join(sorted(_S3_OPTIONS))} (credentials go in the environment)")
    _require_aws_credentials(where)
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or ""
    if "endpoint_override" in query:
        endpoint = f"{query.get('scheme', 'https')}://{query['endpoint_override']}"
    options: dict[str, Any] = {}
    if endpoint:
        host = endpoint.split("://", 1)[-1].rstrip("/")
        options.update(endpoint_override=host, scheme=endpoint.split("://", 1)[0] if "://" in endpoint else "https")
    region = query.get("region") or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        options["region"] = region
    fs = pafs.S3FileSystem(**options)
    return OfflineStore(root, fs, f"{bucket}{prefix}".rstrip("/"), "s3", endpoint)


def _require_aws_credentials(where: str) -> None:
    """A clear error up front instead of an anonymous 403 from the first request."""
    try:
        import botocore.session
    except ImportError:  # without botocore we cannot ask; pyarrow's own chain still applies
        return
    if botocore.session.get_session().get_credentials() is None:
        raise QuiverError(f"offline_root {where}: no AWS credentials found; set AWS_ACCESS_KEY_ID and "
                          f"AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or run with an instance or pod role")


def store_for(config: Any) -> OfflineStore:
    """The offline store of a `quiver.config.Config`."""
    return open_store(config.offline_root, config.root)

