"""Read a source's real Parquet schema (footers only) and map Arrow types to Quiver's logical dtypes."""

from __future__ import annotations

import glob
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from quiver.catalog.errors import QuiverError


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
    """Parquet files of a source path: a file, a directory (searched recursively) or a glob."""
    full = Path(path) if Path(path).is_absolute() else root / path
    if full.is_dir():
        return sorted(p for p in full.rglob("*.parquet") if not p.name.startswith((".", "_")))
    return sorted(Path(p) for p in glob.glob(str(full), recursive=True) if Path(p).is_file())


def read_source_schema(path: str, root: Path) -> dict[str, str | None]:
    """Column → logical dtype over all files of a source.

    Raises QuiverError naming the file when one is not Parquet or disagrees with the others (schema drift).
    """
    files = source_files(path, root)
    if not files:
        raise QuiverError(f"no Parquet files match {path!r} (under {root})")
    merged: dict[str, str | None] = {}
    first_seen: dict[str, Path] = {}
    for file in files:
        try:
            schema = pq.read_schema(file)
        except (pa.ArrowInvalid, OSError) as exc:
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
    return merged
