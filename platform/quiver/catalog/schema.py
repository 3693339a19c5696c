"""Find a source's Parquet files (a folder or an object store), read their real schema (footers only) and map
Arrow types to Quiver's logical dtypes."""

from __future__ import annotations

import fnmatch
import glob
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from quiver.catalog.errors import QuiverError
from quiver.catalog.locations import Location, is_remote, open_location


def logical_dtype(arrow_type: pa.DataType) -> str | None:
    """Quiver dtype for an Arrow type, or None when Quiver has no mapping for it."""
    if pa.types.is_boolean(arrow_type):
        return "bool"
    if pa.types.is_integer(arrow_type):
        return "int64"
    if pa.types.is_floating(arrow_type) or pa.types.is_decimal(arrow_type):
        return "float64"
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return "string"
    if pa.types.is_timestamp(arrow_type) or pa.types.is_date(arrow_type):
        return "timestamp"
    if pa.types.is_dictionary(arrow_type):
        return logical_dtype(arrow_type.value_type)
    return None


def source_files(path: str, root: Path) -> list[Path]:
    """Parquet files of a source path: a file, a directory (searched recursively) or a glob.

    Hidden and _underscored files and folders are skipped: writers stage partitions there (.tmp-…) and
    leave markers (_SUCCESS), neither of which is data.
    """
    full = Path(path) if Path(path).is_absolute() else root / path
    if full.is_dir():
        return sorted(p for p in full.rglob("*.parquet") if not _hidden(p.relative_to(full)))
    return sorted(Path(p) for p in glob.glob(str(full), recursive=True)
                  if Path(p).is_file() and not Path(p).name.startswith((".", "_")))


def _hidden(relative: Path) -> bool:
    return any(part.startswith((".", "_")) for part in relative.parts)


@dataclass(frozen=True)
class SourceFiles:
    """A source's Parquet files: the location holding them and their paths inside its filesystem."""

    location: Location
    paths: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.paths)

    def __len__(self) -> int:
        return len(self.paths)

    def uris(self, spark: bool = False) -> list[str]:
        """The files as an engine opens them: folder paths, or s3://… (s3a://… for Spark)."""
        return [self.location.uri(p, spark) for p in self.paths]

    def read_schema(self, path: str) -> pa.Schema:
        return pq.read_schema(path, filesystem=self.location.fs)


def source_location(path: str, root: Path, setting: str = "source path") -> SourceFiles:
    """The Parquet files of a source path: on disk as `source_files` finds them, or under an object-store URI
    (``s3://bucket/prefix`` searched recursively, one file, or a glob such as ``s3://b/events/date=*/*``),
    hidden and _underscored names skipped. `setting` names the path in errors."""
    import pyarrow.fs as pafs

    if not is_remote(path):
        local = Location(path, pafs.LocalFileSystem(), str(root))
        return SourceFiles(local, tuple(str(p) for p in source_files(path, root)))
    where = open_location(path, root, setting)
    base = where.base
    pattern = None
    if any(c in base for c in "*?["):  # list below the last folder without a wildcard, then match
        parts = base.split("/")
        fixed = next(i for i, part in enumerate(parts) if any(c in part for c in "*?["))
        base, pattern = "/".join(parts[:fixed]), where.base
    try:
        info = where.fs.get_file_info(base)
        if pattern is None and info.type == pafs.FileType.File:
            return SourceFiles(where, (base,))
        found = [p for p in where.files_under(base) if p.endswith(".parquet")
                 and not _hidden(Path(p[len(base) + 1:])) and (pattern is None or fnmatch.fnmatchcase(p, pattern))]
    except OSError as exc:
        raise QuiverError(f"{setting} {where.uri(where.base)}: cannot list it: {exc}") from None
    return SourceFiles(where, tuple(found))


def read_source_schema(path: str, root: Path) -> dict[str, str | None]:
    """Column → logical dtype over all files of a source (a folder, file or glob; or an object-store URI).

    Raises QuiverError naming the file when one is not Parquet or disagrees with the others (schema drift).
    """
    if not isinstance(path, str) or not path.strip():
        raise QuiverError(f"path must name Parquet files (a file, folder or glob), got {path!r}")
    files = source_location(path, root)
    if not files:
        raise QuiverError(f"no Parquet files match {path!r}" + ("" if is_remote(path) else f" (under {root})"))
    merged: dict[str, str | None] = {}
    first_seen: dict[str, str] = {}
    names = files.uris()
    for index, (inside, file) in enumerate(zip(files.paths, names, strict=True)):
        try:
            schema = files.read_schema(inside)
        except (pa.ArrowException, OSError) as exc:
            raise QuiverError(f"cannot read Parquet file {file}: {exc}") from None
        for arrow_field in schema:
            dtype = logical_dtype(arrow_field.type)
            previous = merged.setdefault(arrow_field.name, dtype)
            first_seen.setdefault(arrow_field.name, file)
            if previous != dtype:
                raise QuiverError(
                    f"schema drift in {file}: column {arrow_field.name!r} is {dtype}, "
                    f"but {previous} in {first_seen[arrow_field.name]}"
                )
        # A column some files lack would read as null there in one engine and fail in another.
        missing = [name for name in merged if name not in schema.names]
        if missing:
            raise QuiverError(f"schema drift in {file}: it lacks column {missing[0]!r} "
                              f"found in {first_seen[missing[0]]}")
        added = [name for name in schema.names if first_seen[name] == file]
        if index and added:
            raise QuiverError(f"schema drift in {names[0]}: it lacks column {added[0]!r} found in {file}")
    return merged
