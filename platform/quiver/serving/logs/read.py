"""Reading serving logs back, every replica's: the hourly files (`read_serving_logs`), the quarantine (`read_quarantine`), the
feature columns (`feature_frame`), and which rows served a catalog feature (`logged_column`, `rows_reading`).
Layout and columns: `quiver.serving.logs`."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from quiver.catalog.locations import Location, as_location
from quiver.serving.logs.tables import BASE_SCHEMA, FEATURE_PREFIX, conform

LOG_DIR = "serving_logs"
ANSWERING_ARMS = ("champion", "canary")  # the arms whose answers went back; shadow and paired rows repeat reads
QUARANTINE_DIR = "_quarantine/serving_logs"
MANIFEST = "_compacted.json"  # an hour's compaction commit (`quiver.serving.logs.compact`)


def read_quarantine(root: str | Path | Location) -> pa.Table:
    """Every quarantined serving-log row under `root` (columns as logged, `ts_us`, `quarantine_reason`)."""
    location = as_location(root)
    folder = location.path(QUARANTINE_DIR)
    files = [f"{folder}/{name}" for name in location.children(folder) if _is_part(name)]
    if not files:
        return pa.table({"ts_us": pa.array([], pa.int64()), "quarantine_reason": pa.array([], pa.string())})
    return pa.concat_tables(read_files(location, files), promote_options="permissive")


def read_manifest(location: Location, folder: str) -> dict[str, Any] | None:
    """An hour folder's compaction manifest (see `quiver.serving.logs.compact`), or None."""
    manifest: dict[str, Any] | None = location.read_json(f"{folder}/{MANIFEST}")
    return manifest


def hour_files(location: Location, folder: str) -> list[str]:
    """The files a reader reads for one hour folder (names; see the module docstring), oldest first."""
    names = location.children(folder)
    parts = [n for n in names if n.startswith("part-") and n.endswith(".parquet")]
    manifest = read_manifest(location, folder) if MANIFEST in names else None
    if manifest is None:
        return parts
    replaced = set(manifest["replaces"])
    return [*manifest["files"], *(n for n in parts if n not in replaced)]


def log_files(root: str | Path | Location, start: datetime | None = None, end: datetime | None = None) -> list[str]:
    """Paths (inside the root's filesystem) of every replica's log files of the hours overlapping
    [start, end), oldest hour first. Lists only the days and hours asked for, not the whole log."""
    location = as_location(root)
    return [f"{folder}/{name}" for folder in hour_folders(location, start, end)
            for name in hour_files(location, folder)]


def hour_folders(location: Location, start: datetime | None = None, end: datetime | None = None) -> list[str]:
    """The log's hour folders (paths inside the root's filesystem) overlapping [start, end), oldest first."""
    directory = location.path(LOG_DIR)
    folders = []
    for day in location.children(directory):
        if not (day.startswith("date=") and _overlaps(day[5:], "00", start, end, hours=24)):
            continue
        folders += [f"{directory}/{day}/{hour}" for hour in location.children(f"{directory}/{day}")
                    if hour.startswith("hour=") and _overlaps(day[5:], hour[5:], start, end)]
    return folders


def logged_span(root: str | Path | Location) -> tuple[datetime, datetime] | None:
    """[start of the first hour, end of the last hour) holding serving logs, or None when there are none: what
    an empty read names so its reader can ask for a window that has rows. Lists day folders and the hours of
    the first and last day only."""
    location = as_location(root)
    directory = location.path(LOG_DIR)
    days = sorted(d for d in location.children(directory) if d.startswith("date="))

    def hours(day: str) -> list[datetime]:
        found = []
        for hour in location.children(f"{directory}/{day}"):
            try:
                found.append(datetime.strptime(f"{day[5:]} {hour[5:]}", "%Y-%m-%d %H").replace(tzinfo=UTC))
            except ValueError:
                continue  # not an hour folder
        return sorted(found)

    first = next((h[0] for d in days if (h := hours(d))), None)
    last = next((h[-1] for d in reversed(days) if (h := hours(d))), None)
    if first is None or last is None:
        return None
    return first, last + timedelta(hours=1)


def span_hint(root: str | Path | Location) -> str:
    """'the serving logs hold 2026-11-08 00:00 … 2026-11-18 12:00 UTC' (or 'there are no serving logs under
    ROOT'): the second half of every "no rows" error about serving logs."""
    span = logged_span(root)
    if span is None:
        return f"there are no serving logs under {as_location(root).root}"
    return f"the serving logs hold {span[0]:%Y-%m-%d %H:%M} … {span[1]:%Y-%m-%d %H:%M} UTC"


def read_files(location: Location, files: list[str]) -> list[pa.Table]:
    """Each Parquet file as a table, in order; an object store's are fetched several at a time."""
    def read(path: str) -> pa.Table:
        return pq.read_table(path, filesystem=location.fs)

    if location.is_local or len(files) < 2:
        return [read(p) for p in files]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(16, len(files))) as pool:  # round trips, not CPU, bound these
        return list(pool.map(read, files))


def read_serving_logs(root: str | Path | Location, start: datetime | None = None, end: datetime | None = None,
                      arm: str | None = None, schema: pa.Schema | None = None) -> pa.Table:
    """Serving-log rows of every replica with start <= ts < end (optionally one arm), oldest first, under
    `root` (the store root: a folder, an object-store URI, or an opened Location), schemas unified: columns
    of `schema` (`log_schema(catalog)`) in its types where the values allow, and a column written as integers
    (or booleans) in some files and as floats in others — older writers turned an integer column with a null
    into floats with NaN — as integers with nulls when every float is whole or NaN."""
    location = as_location(root)
    files = log_files(location, start, end)
    try:
        tables = read_files(location, files)
    except FileNotFoundError:  # a compaction replaced a file since the listing: its rows are in the new one
        files = log_files(location, start, end)
        tables = read_files(location, files)
    if not files:
        return BASE_SCHEMA.empty_table()
    declared = {f.name: f.type for f in schema} if schema is not None else {}
    table = merge_tables(tables, declared)
    import pyarrow.compute as pc

    mask = None
    if start is not None:
        mask = pc.greater_equal(table["ts"], pa.scalar(start, BASE_SCHEMA.field("ts").type))
    if end is not None:
        upper = pc.less(table["ts"], pa.scalar(end, BASE_SCHEMA.field("ts").type))
        mask = upper if mask is None else pc.and_(mask, upper)
    if arm is not None:
        same = pc.equal(table["arm"], arm)
        mask = same if mask is None else pc.and_(mask, same)
    if mask is not None:
        table = table.filter(mask)
    for field in BASE_SCHEMA:  # files from older servers lack the newer columns: they read as nulls
        if field.name not in table.column_names:
            table = table.append_column(field, pa.nulls(table.num_rows, field.type))
    return table.sort_by([("ts", "ascending")])


def merge_tables(tables: list[pa.Table], declared: dict[str, pa.DataType]) -> pa.Table:
    """Tables of several files (and writers) as one, each column in one type (see `read_serving_logs`)."""
    return _concat(_harmonise(tables, declared))


def _harmonise(tables: list[pa.Table], declared: dict[str, pa.DataType]) -> list[pa.Table]:
    """Each table's columns cast to one type per column where that loses nothing: the declared type, else the
    one exact (integer or boolean) type of a column that is otherwise floats. A column whose values do not all
    fit is left as written (then `_concat` decides)."""
    seen: dict[str, set[pa.DataType]] = defaultdict(set)
    for table in tables:
        for field in table.schema:
            if field.type != pa.null():
                seen[field.name].add(field.type)
    targets: dict[str, pa.DataType] = {}
    for name, types in seen.items():
        want = declared.get(name)
        if want is None and len(types) > 1:
            exact = [t for t in types if not pa.types.is_floating(t)]
            if len(exact) == 1 and (pa.types.is_integer(exact[0]) or pa.types.is_boolean(exact[0])):
                want = exact[0]
        if want is not None and types != {want}:
            targets[name] = want
    if not targets:
        return tables
    unfit: set[str] = set()
    for table in tables:
        unfit |= set(conform(table, {n: t for n, t in targets.items() if n in table.column_names})[1])
    wanted = {n: t for n, t in targets.items() if n not in unfit}
    return [conform(table, {n: t for n, t in wanted.items() if n in table.column_names})[0] for table in tables]


def _concat(tables: list[pa.Table]) -> pa.Table:
    """Tables of several flushes as one. A key or feature logged as numbers in one flush and as text in
    another (a client sending user_id 7, another "7") becomes text in all, as within one flush."""
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        types: dict[str, set[pa.DataType]] = defaultdict(set)
        for table in tables:
            for field in table.schema:
                if field.type != pa.null():
                    types[field.name].add(field.type)
        mixed = {name for name, kinds in types.items() if len(kinds) > 1}
        fixed = []
        for table in tables:
            for name in mixed & set(table.column_names):
                index = table.schema.get_field_index(name)
                table = table.set_column(index, name, table.column(name).cast(pa.string()))
            fixed.append(table)
        return pa.concat_tables(fixed, promote_options="permissive")


def _is_part(name: str) -> bool:
    return name.startswith("part-") and name.endswith(".parquet")


def _overlaps(day: str, hour: str, start: datetime | None, end: datetime | None, hours: int = 1) -> bool:
    """Whether the `hours` from `day` `hour`:00 UTC overlap [start, end); a malformed name never does."""
    try:
        hour_start = datetime.strptime(f"{day} {hour}", "%Y-%m-%d %H").replace(tzinfo=UTC)
    except ValueError:
        return False
    hour_end = hour_start.timestamp() + 3600 * hours
    if start is not None and hour_end <= start.timestamp():
        return False
    return not (end is not None and hour_start >= end)


def feature_frame(table: pa.Table) -> pa.Table:
    """Only the feature columns, with the `feature.` prefix removed (ready for drift checks)."""
    names = [n for n in table.column_names if n.startswith(FEATURE_PREFIX)]
    return table.select(names).rename_columns([n[len(FEATURE_PREFIX):] for n in names])


def logged_column(logged: pa.Table, view: str, feature: str) -> str | None:
    """The logged column of `view:feature`: `feature.view:feature` when it holds values, else the bare name
    (what a model's input columns are called), else None."""
    full, bare = f"{FEATURE_PREFIX}{view}:{feature}", f"{FEATURE_PREFIX}{feature}"
    if full in logged.column_names and logged[full].null_count < logged.num_rows:
        return full
    return bare if bare in logged.column_names else (full if full in logged.column_names else None)


def version_rows(logged: pa.Table) -> dict[Any, np.ndarray]:
    """Model-version label → mask of its logged rows (computed once, read by every `rows_reading`)."""
    import pyarrow.compute as pc

    encoded = pc.dictionary_encode(logged["model_version"]).combine_chunks()
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    nulls = np.asarray(encoded.is_null()) if encoded.null_count else None
    out: dict[Any, np.ndarray] = {}
    for code, label in enumerate(encoded.dictionary.to_pylist()):
        out[label] = codes == code if nulls is None else (codes == code) & ~nulls
    if nulls is not None:
        out[None] = nulls
    return out


def rows_reading(logged: pa.Table, column: str, view: str, feature: str, versions: Mapping[str, Any],
                 groups: Mapping[Any, np.ndarray] | None = None) -> np.ndarray:
    """Mask of the logged rows whose model read `view:feature` (logged in `column`): for a version the model
    registry knows (`versions`: label → ModelVersion), its recorded inputs say; for one it does not, its rows
    say (some hold a value). A null on such a row is what serving saw: a missing value, not an unlogged one.
    `groups`: `version_rows(logged)`, when the caller has it already."""
    import pyarrow.compute as pc

    groups = version_rows(logged) if groups is None else groups
    valid = None
    mask = np.zeros(logged.num_rows, dtype=bool)
    for label, rows in groups.items():
        version = versions.get(label) if label is not None else None
        if version is not None:
            reads = feature in version.features or f"{view}:{feature}" in version.features
        else:
            if valid is None:
                valid = np.asarray(pc.is_valid(logged[column]))
            reads = bool(valid[rows].any())
        if reads:
            mask |= rows
    return mask
