"""Where files live: a local folder, or an object store named by a URI.

A root is a folder (relative to the project) or ``s3://bucket/prefix`` (``s3a://`` is read as the same
bucket), ``gs://…`` or ``hdfs://…``. Object stores are reached with pyarrow's own filesystems; DuckDB reads
them through that filesystem (fsspec's Arrow wrapper, so no DuckDB extension has to be downloaded) and Spark
through Hadoop's connector (s3a: `scripts/jars.sh s3a`). The offline store (`quiver.offline.store`) and a
source's files (`quiver.catalog.schema.source_location`) are both opened here.

Options: an S3 endpoint other than AWS comes from the query (``?endpoint_override=host:9000&scheme=http``,
as for `artifact_root`) or from the standard ``AWS_ENDPOINT_URL``. Credentials are never part of the URI or
of Spark's settings: each process (the driver and every executor) finds them the usual way — ``AWS_*``
variables, ``~/.aws``, an instance or pod role — and Quiver never prints them.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qsl, urlsplit

from quiver.catalog.errors import QuiverError

if TYPE_CHECKING:
    import pyarrow.fs as pafs

# Scheme as written → the filesystem family. s3a is Hadoop's name for the same S3 bucket.
SCHEMES = {"s3": "s3", "s3a": "s3", "gs": "gs", "gcs": "gs", "hdfs": "hdfs"}
_S3_OPTIONS = {"endpoint_override", "scheme", "region"}  # what an S3 root may say in its query (no secrets)


def is_remote(value: str) -> bool:
    """True when `value` is a URI (``scheme://…``) rather than a folder."""
    return "://" in value and not value.startswith("file://")


@dataclass(frozen=True)
class Location:
    """An opened root: a pyarrow filesystem and the root's path inside it."""

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
        try:
            staged.write_bytes(data)
            os.replace(staged, target)
        finally:
            staged.unlink(missing_ok=True)

    def read_json(self, path: str) -> Any:
        """The JSON document `path` (inside `fs`) holds, or None when there is no such file."""
        import json

        try:
            with self.fs.open_input_stream(path) as stream:
                return json.loads(stream.read())
        except FileNotFoundError:
            return None

    def children(self, folder: str) -> list[str]:
        """Names of the entries directly in `folder` (files and folders), sorted; none when it is missing."""
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(folder, allow_not_found=True, recursive=False)
        return sorted(i.path.rstrip("/").rsplit("/", 1)[-1] for i in self.fs.get_file_info(selector))

    # ---- engines ----

    def fsspec(self) -> Any:
        """This location's filesystem as fsspec sees it, answering to the root's scheme (DuckDB's
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


def local_location(folder: str | Path) -> Location:
    """A local folder as a Location (absolute)."""
    import pyarrow.fs as pafs

    path = Path(folder).expanduser().absolute()
    return Location(str(path), pafs.LocalFileSystem(), str(path))


def as_location(root: str | Path | Location) -> Location:
    """`root` as a Location: itself, a local folder, or an object-store URI (credentials from the environment)."""
    if isinstance(root, Location):
        return root
    return open_location(root, Path.cwd()) if isinstance(root, str) and is_remote(root) else local_location(root)


def open_location(value: str, project_root: Path, setting: str = "offline_root") -> Location:
    """Open `value`: a folder (relative to `project_root`) or an object-store URI; `setting` names it in errors.

    Raises QuiverError naming the setting for an unknown scheme, a malformed URI, credentials in the URI,
    or (S3) no credentials anywhere the AWS SDK would look.
    """
    import pyarrow.fs as pafs

    root, value = value, value.strip()
    if not is_remote(value):
        folder = Path(value[len("file://"):] if value.startswith("file://") else value).expanduser()
        folder = folder if folder.is_absolute() else project_root / folder
        return Location(root, pafs.LocalFileSystem(), str(folder))
    parts = urlsplit(value)
    family = SCHEMES.get(parts.scheme.lower())
    if family is None:
        raise QuiverError(f"{setting} {value!r}: unknown URI scheme {parts.scheme!r}; use a folder, s3://, "
                          f"s3a://, gs:// or hdfs://")
    if parts.username or parts.password:
        raise QuiverError(f"{setting} for bucket {parts.hostname!r}: credentials do not belong in the URI; "
                          f"set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or a profile or role) instead")
    if not parts.netloc:
        raise QuiverError(f"{setting} {value!r}: no bucket (or HDFS host) after {parts.scheme}://")
    if family == "s3":
        return _open_s3(root, parts.netloc, parts.path, dict(parse_qsl(parts.query)), setting)
    try:
        fs, path = pafs.FileSystem.from_uri(f"{family}://{parts.netloc}{parts.path}"
                                            + (f"?{parts.query}" if parts.query else ""))
    except (OSError, ValueError) as exc:
        raise QuiverError(f"{setting} {family}://{parts.netloc}{parts.path}: cannot open it: {exc}") from None
    return Location(root, fs, str(path).rstrip("/"), family)


def _open_s3(root: str, bucket: str, prefix: str, query: dict[str, str], setting: str) -> Location:
    import pyarrow.fs as pafs

    where = f"s3://{bucket}{prefix}"
    unknown = sorted(set(query) - _S3_OPTIONS)
    if unknown:
        raise QuiverError(f"{setting} {where}: unknown option(s) {', '.join(unknown)} in the query; "
                          f"known: {', '.join(sorted(_S3_OPTIONS))} (credentials go in the environment)")
    _require_aws_credentials(where, setting)
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
    return Location(root, fs, f"{bucket}{prefix}".rstrip("/"), "s3", endpoint)


def _require_aws_credentials(where: str, setting: str) -> None:
    """A clear error up front instead of an anonymous 403 from the first request."""
    try:
        import botocore.session
    except ImportError:  # without botocore we cannot ask; pyarrow's own chain still applies
        return
    if botocore.session.get_session().get_credentials() is None:
        raise QuiverError(f"{setting} {where}: no AWS credentials found; set AWS_ACCESS_KEY_ID and "
                          f"AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or run with an instance or pod role")
