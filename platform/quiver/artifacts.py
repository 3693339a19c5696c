"""The artifact store: one root that every worker, serving pod and drift task can read.

`artifact_root` in quiver.yaml names it: a folder (relative to the project, or a shared mount such as NFS) or
a URI — ``s3://bucket/prefix`` (options in the query, e.g. ``?endpoint_override=host:9000&scheme=http``;
credentials from the usual ``AWS_*`` variables), ``gs://…``, ``hdfs://…``, or any fsspec protocol with its
package installed. The registry records *keys* relative to that root (``models/fraud_model/3f2a…``), never a
path of the machine that wrote them, so a model trained on a ``gpu`` worker loads anywhere the root does.

    models/<name>/<sha256[:16]>/         model artifacts (model.json, weights.pt, reference.parquet, checksum.json)
    labels/<name>/<sha256[:16]>.parquet  the label rows each version was trained on (lineage ``labels_source``)
    checkpoints/<name>/<run>/            training checkpoints (local roots only: a retry on another host that
                                         shares the folder resumes; object stores keep them on the worker)

Everything under ``models/`` and ``labels/`` is content-addressed and written once; readers verify sha256s
(artifact manifests, label snapshots) before using a byte. Local folders and files this module (or a model
save) creates are owner-only, 0700 and 0600 (`private_dirs`, `make_private`): weights, reference rows and
labels are nobody else's on a shared machine. A recorded value that already is a URI
(``s3://…``, ``file:///…`` from a migrated registry) is used as it is; a bare absolute path is a legacy row
(read, never written). Remote files are copied into a local cache folder before use.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from quiver.catalog.errors import QuiverError

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.fs as pafs

    from quiver.config import Config

MODELS, LABELS, CHECKPOINTS = "models", "labels", "checkpoints"
CHECKSUM_FILE = "checksum.json"
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_CHUNK = 1 << 20


def is_uri(value: str) -> bool:
    """True for ``scheme://…`` (s3, gs, file, …)."""
    return bool(_SCHEME.match(value))


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def manifest_sha256(files: Mapping[str, str]) -> str:
    """One sha256 over a folder's {file: sha256} list (what the registry records for an artifact)."""
    return hashlib.sha256(json.dumps(dict(sorted(files.items())), sort_keys=True).encode()).hexdigest()


def check_key(key: str) -> str:
    """A store key: a relative POSIX path without `.`/`..` parts (it names a place under the root)."""
    parts = PurePosixPath(key).parts
    if not key or key.startswith("/") or "\\" in key or any(p in (".", "..") for p in parts) or is_uri(key):
        raise QuiverError(f"{key!r} is not an artifact-store key (a relative path under artifact_root)")
    return "/".join(parts)


@dataclass(frozen=True)
class _Remote:
    fs: pafs.FileSystem
    base: str  # the root's path inside `fs` (bucket/prefix), no trailing slash


def _remote(uri: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and the path inside it for `uri` (native s3/gs/hdfs, else through fsspec)."""
    import pyarrow.fs as pafs

    try:
        fs, path = pafs.FileSystem.from_uri(uri)
        return fs, str(path)
    except (pafs.ArrowInvalid, ValueError) as native:  # type: ignore[attr-defined]
        try:
            import fsspec
        except ImportError:
            raise QuiverError(f"cannot open artifact location {uri}: {native}") from None
        try:
            fs, _, paths = fsspec.get_fs_token_paths(uri)
        except (ImportError, ValueError) as exc:
            raise QuiverError(f"cannot open artifact location {uri}: {exc}") from None
        return pafs.PyFileSystem(pafs.FSSpecHandler(fs)), paths[0]
    except OSError as exc:
        raise QuiverError(f"cannot open artifact location {uri}: {exc}") from None


PRIVATE_DIR, PRIVATE_FILE = 0o700, 0o600


def private_dirs(folder: Path) -> None:
    """Create `folder` and its missing parents owner-only (0700, through the umask); folders that exist are
    kept as they are (their owner chose their mode)."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it meanwhile
            path.mkdir(mode=PRIVATE_DIR)


def make_private(path: Path) -> None:
    """chmod a file 0600, or a folder 0700 and everything in it 0600 / 0700 (libraries such as torch and
    pyarrow create files 0666 less the umask, usually 0644: readable by every user)."""
    if path.is_dir():
        for child in path.rglob("*"):
            os.chmod(child, PRIVATE_DIR if child.is_dir() else PRIVATE_FILE)
        os.chmod(path, PRIVATE_DIR)
    else:
        os.chmod(path, PRIVATE_FILE)


def _tree(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): file_sha256(p) for p in folder.rglob("*") if p.is_file()}


def _install_dir(staging: Path, target: Path) -> None:
    """Move a fresh download into the cache. Another process may have put the same folder there first (keys
    are content-addressed): an identical copy is kept as it is — a reader may be using it — and only a
    copy that differs (damaged) is replaced."""
    private_dirs(target.parent)
    make_private(staging)
    try:
        os.rename(staging, target)
        return
    except OSError:
        if not target.is_dir():
            raise
    if _tree(staging) == _tree(target):
        shutil.rmtree(staging, ignore_errors=True)
        return
    trash = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
    os.rename(target, trash)
    os.rename(staging, target)
    shutil.rmtree(trash, ignore_errors=True)


class ArtifactStore:
    """Reads and writes under one artifact root (a local folder or a URI); see the module docstring."""

    def __init__(self, root: str | Path, *, cache_dir: str | Path | None = None, scratch_dir: str | Path | None = None):
        text = str(root)
        self.uri = text if is_uri(text) else None
        local = None
        if self.uri is not None and self.uri.startswith("file://"):
            local, self.uri = Path(self.uri[len("file://"):]), None
        elif self.uri is None:
            local = Path(text).expanduser()
        if local is not None and not local.is_absolute():
            raise QuiverError(f"artifact root {text!r} must be absolute here (quiver.yaml resolves relative ones)")
        self.local_root = local.resolve() if local is not None else None
        base = Path(tempfile.gettempdir()) / "quiver-artifacts"
        self.cache_dir = Path(cache_dir) if cache_dir else base / "cache"
        self.scratch_dir = Path(scratch_dir) if scratch_dir else base / "scratch"
        self._remote_root: _Remote | None = None

    @classmethod
    def from_config(cls, config: Config) -> ArtifactStore:
        """The project's store: `artifact_root` (relative to the project), cache and scratch under .quiver/."""
        return cls(config.artifact_location, cache_dir=config.root / ".quiver" / "cache" / "artifacts",
                   scratch_dir=config.root / ".quiver" / "scratch")

    @property
    def root(self) -> str:
        """The root as configured (absolute folder or URI), for messages and docs."""
        return str(self.local_root) if self.local_root is not None else str(self.uri)

    @property
    def is_local(self) -> bool:
        return self.local_root is not None

    def __repr__(self) -> str:
        return f"ArtifactStore({self.root})"

    # ----- what the registry records -----

    def record(self, location: str | Path) -> str:
        """The value to store in the registry for `location`: its key under the root, or a remote URI.

        A key is kept (checked); a path or URI inside the root becomes its key; another remote URI is kept;
        a local path outside the root is refused — no other host could read it.
        """
        text = str(location)
        if not is_uri(text) and not Path(text).is_absolute():
            return check_key(text)
        if self.local_root is not None:
            path = Path(text[len("file://"):]) if text.startswith("file://") else None if is_uri(text) else Path(text)
            if path is not None:
                try:
                    return check_key(path.resolve().relative_to(self.local_root).as_posix())
                except ValueError:
                    pass
        elif self.uri is not None:
            prefix = self.uri.split("?", 1)[0].rstrip("/") + "/"
            if text.startswith(prefix):
                return check_key(text[len(prefix):].split("?", 1)[0])
        if is_uri(text) and not text.startswith("file://"):
            return text
        raise QuiverError(f"{text} is outside the artifact store ({self.root}): a path of this machine cannot be "
                          f"recorded (other workers could not read it); write it under artifact_root")

    def location(self, recorded: str) -> str:
        """Where a recorded value lives, in full (path or URI), for messages."""
        if is_uri(recorded) or Path(recorded).is_absolute():
            return recorded
        if self.local_root is not None:
            return str(self.local_root / check_key(recorded))
        return self.uri.split("?", 1)[0].rstrip("/") + "/" + check_key(recorded)  # type: ignore[union-attr]

    # ----- reading -----

    def _resolve(self, recorded: str) -> tuple[Path | None, pafs.FileSystem | None, str]:
        """(local path, None, "") or (None, filesystem, path inside it) for a recorded value."""
        if recorded.startswith("file://"):
            return Path(recorded[len("file://"):]), None, ""
        if is_uri(recorded):
            fs, path = _remote(recorded)
            return None, fs, path.rstrip("/")
        if Path(recorded).is_absolute():  # a legacy row from before the store: readable where it was written
            return Path(recorded), None, ""
        key = check_key(recorded)
        if self.local_root is not None:
            return self.local_root / key, None, ""
        remote = self._root_fs()
        return None, remote.fs, f"{remote.base}/{key}"

    def _root_fs(self) -> _Remote:
        if self._remote_root is None:
            assert self.uri is not None
            fs, base = _remote(self.uri)
            self._remote_root = _Remote(fs, base.rstrip("/"))
        return self._remote_root

    def exists(self, recorded: str) -> bool:
        import pyarrow.fs as pafs

        path, fs, inner = self._resolve(recorded)
        if path is not None:
            return path.exists()
        assert fs is not None
        return bool(fs.get_file_info(inner).type != pafs.FileType.NotFound)

    def local_dir(self, recorded: str) -> Path:
        """A local folder with the files of a recorded folder (remote ones are downloaded into the cache)."""
        path, fs, inner = self._resolve(recorded)
        if path is not None:
            if not path.is_dir():
                raise QuiverError(f"artifact folder {self.location(recorded)} does not exist")
            return path
        import pyarrow.fs as pafs

        assert fs is not None
        infos = [i for i in fs.get_file_info(pafs.FileSelector(inner, recursive=True, allow_not_found=True))
                 if i.type == pafs.FileType.File]
        if not infos:
            raise QuiverError(f"artifact folder {self.location(recorded)} does not exist (or is empty)")
        target = self._cache_path(recorded)
        staging = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}")
        private_dirs(staging)
        try:
            for info in infos:
                rel = info.path[len(inner):].lstrip("/")
                dest = staging / check_key(rel)
                dest.parent.mkdir(parents=True, exist_ok=True)
                with fs.open_input_stream(info.path) as src, open(dest, "wb") as out:
                    shutil.copyfileobj(src, out, _CHUNK)  # type: ignore[misc]
            _install_dir(staging, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return target

    def local_file(self, recorded: str, *, sha256: str | None = None) -> Path:
        """A local copy of a recorded file; with `sha256`, QuiverError unless its bytes hash to it."""
        path, fs, inner = self._resolve(recorded)
        if path is None:
            assert fs is not None
            target = self._cache_path(recorded)
            private_dirs(target.parent)
            staging = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}")
            try:
                with fs.open_input_stream(inner) as src, open(staging, "wb") as out:
                    shutil.copyfileobj(src, out, _CHUNK)  # type: ignore[misc]
            except FileNotFoundError:
                staging.unlink(missing_ok=True)
                raise QuiverError(f"{self.location(recorded)} does not exist in the artifact store") from None
            make_private(staging)
            os.replace(staging, target)
            path = target
        elif not path.is_file():
            raise QuiverError(f"{self.location(recorded)} does not exist in the artifact store")
        if sha256 is not None and file_sha256(path) != sha256:
            raise QuiverError(f"{self.location(recorded)}: checksum mismatch (the registry recorded "
                              f"{sha256[:16]}…); refusing a modified or damaged file")
        return path

    def read_table(self, recorded: str, *, sha256: str | None = None, columns: list[str] | None = None) -> pa.Table:
        """A Parquet file of the store, verified against `sha256` when given."""
        import pyarrow.parquet as pq

        return pq.read_table(self.local_file(recorded, sha256=sha256), columns=columns)

    def read_reference(self, artifact_path: str, reference_path: str, artifact_sha256: str,
                       columns: list[str] | None = None) -> pa.Table:
        """A model version's reference Parquet, checked against its artifact's manifest (and the manifest
        against the sha256 the registry recorded) when the reference lies inside the artifact folder."""
        import pyarrow.parquet as pq

        prefix = artifact_path.rstrip("/") + "/"
        if not reference_path.startswith(prefix):
            return self.read_table(reference_path, columns=columns)
        folder = self.local_dir(artifact_path)
        manifest = json.loads((folder / CHECKSUM_FILE).read_text()) if (folder / CHECKSUM_FILE).exists() else {}
        files: dict[str, str] = manifest.get("files", {})
        name = reference_path[len(prefix):]
        if manifest_sha256(files) != artifact_sha256 or name not in files:
            raise QuiverError(f"artifact {self.location(artifact_path)}: its manifest does not match the registry's "
                              f"sha256 {artifact_sha256[:16]}…; refusing its reference")
        path = folder / check_key(name)
        if not path.is_file() or file_sha256(path) != files[name]:
            raise QuiverError(f"{self.location(reference_path)}: checksum mismatch; refusing a modified reference")
        return pq.read_table(path, columns=columns)

    def _cache_path(self, recorded: str) -> Path:
        if is_uri(recorded) or Path(recorded).is_absolute():
            return self.cache_dir / "uri" / hashlib.sha256(recorded.encode()).hexdigest()[:24]
        return self.cache_dir / check_key(recorded)

    # ----- writing -----

    @contextmanager
    def staging(self) -> Iterator[Path]:
        """A local folder to write new files in before `publish_*`: inside the root when it is local (so
        publishing is a rename on one filesystem), else a scratch folder removed afterwards."""
        if self.local_root is not None:
            folder = self.local_root / f".staging-{uuid.uuid4().hex[:12]}"
        else:
            folder = self.scratch_dir / f"staging-{uuid.uuid4().hex[:12]}"
        private_dirs(folder)
        try:
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def publish_dir(self, folder: Path, key: str) -> str:
        """Put a local folder at `key` (content-addressed: an existing one is kept) and return the key.

        Remote: files go up one by one with checksum.json last, so a reader that finds the manifest finds
        every file it lists."""
        key = check_key(key)
        if self.local_root is not None:
            dest = self.local_root / key
            if folder.resolve() == dest.resolve():
                make_private(dest)
                return key
            private_dirs(dest.parent)
            if dest.exists():
                shutil.rmtree(folder, ignore_errors=True)
            else:
                make_private(folder)
                os.replace(folder, dest)
            return key
        remote = self._root_fs()
        files = sorted((p for p in folder.rglob("*") if p.is_file()), key=lambda p: (p.name == CHECKSUM_FILE, str(p)))
        for file in files:
            self._upload(remote, file, f"{remote.base}/{key}/{file.relative_to(folder).as_posix()}")
        return key

    def publish_file(self, file: Path, key: str) -> str:
        """Put a local file at `key` (an existing one is kept: keys are content-addressed) and return the key."""
        key = check_key(key)
        if self.local_root is not None:
            dest = self.local_root / key
            private_dirs(dest.parent)
            if dest.exists():
                file.unlink(missing_ok=True)
            else:
                make_private(file)
                os.replace(file, dest)
            return key
        remote = self._root_fs()
        self._upload(remote, file, f"{remote.base}/{key}")
        return key

    @staticmethod
    def _upload(remote: _Remote, file: Path, path: str) -> None:
        parent = path.rsplit("/", 1)[0]
        remote.fs.create_dir(parent, recursive=True)
        with open(file, "rb") as src, remote.fs.open_output_stream(path) as out:
            shutil.copyfileobj(src, out, _CHUNK)  # type: ignore[misc]

    def checkpoint_dir(self, *parts: str) -> Path | None:
        """Where a training run keeps its checkpoints: under a local root (shared folders let a retry on
        another host resume), None for object stores (the caller keeps them on the worker)."""
        if self.local_root is None:
            return None
        return self.local_root / CHECKPOINTS / check_key("/".join(parts))

    def snapshot_table(self, table: Any, name: str) -> tuple[str, str]:
        """Write a table as `labels/<name>/<sha16>.parquet`; returns (key, sha256 of the file)."""
        import pyarrow.parquet as pq

        with self.staging() as folder:
            file = folder / "snapshot.parquet"
            pq.write_table(table, file)
            digest = file_sha256(file)
            key = self.publish_file(file, f"{LABELS}/{check_key(name)}/{digest[:16]}.parquet")
        return key, digest
