"""What a point-in-time join reads: validated label rows, one request per feature view, and the Parquet
files of the offline store and of the view's source that can hold the rows a request needs.

Shared by every PIT engine, so they all read the same files (date partitions pruned the same way).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from quiver.catalog.errors import QuiverError
from quiver.catalog.ir import AggSpec, Catalog, FieldSpec, ViewSpec
from quiver.catalog.references import FeatureRef
from quiver.catalog.schema import SourceFiles, source_location
from quiver.offline.layout import LAST_VALUES, TILES, partition_days, view_dir

if TYPE_CHECKING:
    import pyarrow.fs as pafs

    from quiver.config import Config
    from quiver.offline.store import OfflineStore

US_PER_DAY = 86_400_000_000
_EPOCH = date(1970, 1, 1)


@dataclass(frozen=True)
class LabelSet:
    """Validated label rows: timestamps as epoch µs UTC, join keys cast to the types the catalog declares."""

    t_us: np.ndarray
    keys: Mapping[str, pa.Array]

    @property
    def n(self) -> int:
        return len(self.t_us)


@dataclass(frozen=True)
class ViewRequest:
    """The features wanted from one view, and where its data lives."""

    view: ViewSpec
    features: tuple[str, ...]
    offline_root: Path
    project_root: Path
    source_path: str
    store: OfflineStore | None = None  # an object-store offline root; None: `offline_root` is a folder

    @property
    def remote(self) -> OfflineStore | None:
        return self.store if self.store is not None and not self.store.is_local else None

    @property
    def filesystem(self) -> pafs.FileSystem | None:
        """The filesystem `partition_files` paths live in (None: the local one)."""
        return self.remote.fs if self.remote else None

    @property
    def fields(self) -> list[FieldSpec]:
        return [f for f in self.view.fields if f.name in self.features]

    @property
    def aggregations(self) -> list[AggSpec]:
        return [a for a in self.view.aggregations if a.name in self.features]

    def source_files(self) -> SourceFiles:
        """The view source's Parquet files (raw events: the head of every window), on disk or an object store."""
        return source_location(self.source_path, self.project_root, f"source {self.view.source!r} path")

    def partition_files(self, kind: str, lo_us: int | None, hi_us: int) -> list[Path] | list[str]:
        """Files of `kind` (tiles or last values) whose date partition can hold times in [lo_us, hi_us):
        local paths, or paths inside `filesystem` (as each committed day's manifest names them)."""
        first = None if lo_us is None else day_of(lo_us)
        last = day_of(hi_us - 1)
        if self.remote:
            store = self.remote
            return [f for day in store.partition_days(self.view.name, kind)
                    if (first is None or day >= first) and day <= last
                    for f in store.partition_files(store.path(self.view.name, kind, f"date={day.isoformat()}"))]
        files: list[Path] = []
        for day in partition_days(self.offline_root, self.view.name, kind):
            if (first is None or day >= first) and day <= last:
                folder = view_dir(self.offline_root, self.view.name, kind) / f"date={day.isoformat()}"
                files += sorted(p for p in folder.glob("*.parquet") if not p.name.startswith((".", "_")))
        return files

    def has_data(self) -> bool:
        kind = LAST_VALUES if self.view.kind == "last" else TILES
        if self.remote:
            return bool(self.remote.partition_days(self.view.name, kind))
        return bool(partition_days(self.offline_root, self.view.name, kind))


def day_of(us: int) -> date:
    """The UTC date of an epoch-µs instant."""
    return _EPOCH + timedelta(days=us // US_PER_DAY)


def timestamps_us(column: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray | None]:
    """Epoch µs of a timestamp (or date) column, and its null mask (None when it has no nulls).

    Naive timestamps in stored data are read as UTC, the convention of every Quiver writer. The catalog's
    time resolution is the microsecond: finer times are floored to it (toward the past, also before 1970),
    the one rule of every path (labels, source events, the SQL engines).
    """
    kind = column.type
    nanos = pa.types.is_timestamp(kind) and kind.unit == "ns"
    if pa.types.is_date(kind):
        column = pc.cast(column, pa.timestamp("us"))
    elif not pa.types.is_timestamp(kind):
        raise TypeError(f"expected a timestamp column, got {kind}")
    elif kind.unit != "us" and not nanos:
        column = pc.cast(column, pa.timestamp("us", tz=kind.tz))  # s / ms: exact
    ints = pc.cast(column, pa.int64())
    nulls = None
    if ints.null_count:
        nulls = np.asarray(pc.is_null(ints))
        ints = pc.fill_null(ints, 0)
    if isinstance(ints, pa.ChunkedArray):
        ints = ints.combine_chunks() if ints.num_chunks != 1 else ints.chunk(0)
    values = np.asarray(ints.to_numpy(zero_copy_only=False), dtype=np.int64)
    if nanos:  # Arrow's cast truncates toward zero; numpy's // floors
        values = values // 1000
    return values, nulls


def ascending_order(table: pa.Table, names: list[str]) -> pa.Array:
    """Row indices sorting `table` ascending by `names`, null lowest and NaN greatest (above every number).

    The project's value order for ties (catalog.aggregations); pyarrow alone would sort NaN with the nulls.
    """
    keys: dict[str, pa.Array | pa.ChunkedArray] = {}
    for i, name in enumerate(names):
        column = table.column(name)
        if pa.types.is_floating(column.type):
            nan = pc.fill_null(pc.is_nan(column), False)
            rank = pc.if_else(pc.is_null(column), 0, pc.if_else(nan, 2, 1))
            keys[f"r{i}"] = pc.cast(rank, pa.int8())
            column = pc.if_else(nan, pa.scalar(0.0, column.type), column)
        keys[f"v{i}"] = column
    order = pa.table(keys)
    if int(pa.__version__.split(".")[0]) >= 25:  # per-key null placement; the streaming venv has pyarrow 16
        return pc.sort_indices(order, sort_keys=[(k, "ascending", "at_start") for k in keys])
    return pc.sort_indices(order, sort_keys=[(k, "ascending") for k in keys], null_placement="at_start")


def plan_requests(catalog: Catalog, config: Config, refs: list[FeatureRef]) -> list[ViewRequest]:
    """One request per view, in first-request order; a view without offline data is a user error."""
    from quiver.offline.store import store_for

    wanted: dict[str, list[str]] = {}
    for ref in refs:
        wanted.setdefault(ref.view, []).append(ref.feature)
    store = store_for(config)
    where = config.offline_dir if store.is_local else store.uri(store.base)
    requests = []
    for name, feats in wanted.items():
        view = catalog.views[name]
        req = ViewRequest(view, tuple(feats), config.offline_dir, config.root, catalog.sources[view.source].path,
                          store if not store.is_local else None)
        if not req.has_data():
            raise QuiverError(f"feature view {name!r} has no offline data under {where}; "
                              f"run the backfill for it first")
        requests.append(req)
    return requests
