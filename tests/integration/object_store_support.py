"""Shared by the object-store tests: an S3 offline root on moto's server, and readers of what it holds."""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from quiver.catalog.ir import ViewSpec
from quiver.config import Config
from quiver.offline.store import OfflineStore, store_for
from tests.integration.test_backfill_support import Row, sort_rows

BUCKET = "quiver-lake"


def s3_config(config: Config, s3_server: Any, name: str = "") -> Config:
    """`config` with a fresh prefix of the test bucket as its offline root."""
    with contextlib.suppress(OSError):  # made by an earlier test of the session
        s3_server.create_bucket(BUCKET)
    prefix = f"offline-{name or uuid.uuid4().hex[:8]}"
    return replace(config, offline_root=s3_server.uri(BUCKET, prefix))


def partition_table(store: OfflineStore, view: str, kind: str) -> pa.Table | None:
    """Every committed partition of a view and kind, read through the manifests."""
    tables = []
    for day in store.partition_days(view, kind):
        for path in store.partition_files(store.path(view, kind, f"date={day.isoformat()}")):
            tables.append(pq.read_table(path, filesystem=store.fs))
    return pa.concat_tables(tables) if tables else None


def s3_rows(config: Config, view: ViewSpec) -> list[Row]:
    kind = "tiles" if view.kind == "agg" else "last_values"
    table = partition_table(store_for(config), view.name, kind)
    return sort_rows(table.to_pylist() if table is not None else [], view)


def listing(store: OfflineStore) -> dict[str, int]:
    """Every object under the root with its size: what a reader could see."""
    import pyarrow.fs as pafs

    infos = store.fs.get_file_info(pafs.FileSelector(store.base, allow_not_found=True, recursive=True))
    return {i.path: i.size for i in infos if i.type == pafs.FileType.File}
