"""Late and future-dated stream events, kept for the batch route.

The feeder writes every event it does not hand to the Flink job on time (behind the watermark by more
than the allowed lateness, or dated after its arrival) as Parquet under

    <offline root>/_late_events/<source>/date=<UTC day>/upto-<batch>.parquet

with the source's columns and its event-time column, on the offline store wherever it lives (a folder, or
an object store: one PUT per file). On the Kafka route the job splits late records off itself, and the
loader moves each file it commits to `…/date=<UTC day>/kafka-<sink file>.parquet`, with the same columns
and types (`quiver.streaming.late_kafka`). `OfflineStore.late_event_files` lists them; the batch backfill
reads them together with the source's own files, so the next backfill of their days puts them in the
offline store (and the next materialization in Redis): no event that reached the stream is lost.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

# The folder is the offline store's (the backfill reads it); its names are re-exported here for the writers.
from quiver.offline.layout import LATE_DIR, late_dir
from quiver.offline.store import OfflineStore

__all__ = ["LATE_DIR", "late_dir", "late_events"]


def late_events(store: OfflineStore, source: str) -> pa.Table | None:
    """Every late or future-dated event of `source` as one table (None when there are none)."""
    files = store.late_event_files(source)
    if not files:
        return None
    return pa.concat_tables([pq.read_table(p, partitioning=None, filesystem=store.fs) for p in files],
                            promote_options="default")
