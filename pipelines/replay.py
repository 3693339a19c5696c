"""Replay recorded traffic through the prediction service, slot by slot, and deliver its labels a day late.

The demo's transactions (`data/labels/labels.parquet`: transaction_id, user_id, merchant_id, event_ts, amount,
is_online, is_fraud, label_arrived_at) are the requests: each is scored by the in-process `PredictionService`
with `at` = its event time and the transaction's `fields` (amount, is_online), so online features,
serving-log timestamps (the service logs each row at its `at`) and every window downstream live on the
simulated clock. The online store is materialized as of the window's start and then follows the events
(`quiver.online.follow.EventFollower`): before each call it holds every event older than the call, as a stream
with no lag would, so a request reads what the offline point-in-time join computes at its time. A slot's call
is cut in two where a row's entity had an event after the call's first row (that row must see it). A request's label
arrives when its `label_arrived_at` says (`quiver.monitoring.labels`; older label files without it: a fixed
delay after the request).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from datetime import time as clock
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from quiver.config import Config
from quiver.offline.store import store_for

LABELS = "data/labels/labels.parquet"
_TS = pa.timestamp("us", tz="UTC")
# One service call per slot: the slot's transactions are scored together (as one request of many rows). A
# minute keeps calls many enough for the judge's per-call tests (errors, latency, Brier) to decide in a day.
REQUEST_EVERY = timedelta(minutes=1)


@dataclass
class Replay:
    """What one replayed window did."""

    start: datetime
    end: datetime
    requests: int = 0
    arms: Counter[str] = field(default_factory=Counter)
    versions: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"start": self.start.isoformat(), "end": self.end.isoformat(), "requests": self.requests,
                "arms": dict(self.arms), "versions": dict(self.versions), "seconds": round(self.seconds, 2)}


def day_start(day: date) -> datetime:
    return datetime.combine(day, clock(), tzinfo=UTC)


def requests_between(config: Config, start: datetime, end: datetime, path: str | Path = LABELS) -> pa.Table:
    """The recorded requests with start <= event_ts < end, oldest first."""
    table = pq.read_table(config.root / path)
    ts = table["event_ts"].cast(_TS)
    keep = pc.and_(pc.greater_equal(ts, pa.scalar(start, _TS)), pc.less(ts, pa.scalar(end, _TS)))
    return table.filter(keep).sort_by([("event_ts", "ascending"), ("transaction_id", "ascending")])


def replay(config: Config, service: Any, start: datetime, end: datetime, *, materialize: bool = True,
           path: str | Path = LABELS) -> Replay:
    """Score the requests of [start, end) through `service` (a started PredictionService), one call per
    `REQUEST_EVERY` of simulated time, the online store following the events (`materialize=False`: left as
    it is)."""
    from quiver.online.follow import EventFollower

    began = time.perf_counter()
    report = Replay(start, end)
    shadow_before = service.stats.snapshot().get("shadow_rows", 0)
    service.refresh()  # aliases and rollouts moved by the DAGs (another process) since the last window
    requests = requests_between(config, start, end, path)
    slot_us = int(REQUEST_EVERY.total_seconds() * 1_000_000)
    offsets = pc.divide(pc.subtract(requests["event_ts"].cast(pa.int64()), int(start.timestamp() * 1_000_000)),
                        slot_us)
    follower = None
    if materialize:
        service.store.materialize(end=start)  # what the stream had loaded by the window's start
        follower = EventFollower(config, service.store.catalog, service.store.online, start, end)
    try:
        calls = []
        for index in range(int((end - start) / REQUEST_EVERY)):
            rows = requests.filter(pc.equal(offsets, index))
            if rows.num_rows:
                calls += calls_of(request_rows(rows), follower)
        if follower is not None:
            follower.plan([call[0]["at"] for call in calls])
        for call in calls:
            if follower is not None:
                follower.advance(call[0]["at"])
            for prediction in service.predict(call):
                report.arms[prediction.arm] += 1
                report.versions[prediction.model_version] += 1
            report.requests += len(call)
    finally:
        if follower is not None:
            follower.close()
    service.drain()
    report.arms["shadow"] = service.stats.snapshot().get("shadow_rows", 0) - shadow_before
    if service.logger is not None:
        service.logger.flush()
    report.seconds = time.perf_counter() - began
    return report


def calls_of(batch: list[dict[str, Any]], follower: Any = None) -> list[list[dict[str, Any]]]:
    """A slot's rows (oldest first) as calls: a row starts a new call when one of its entities had an event
    between the call's first row and itself, which a call served as of its first row would not show."""
    if follower is None:
        return [batch] if batch else []
    calls: list[list[dict[str, Any]]] = []
    for row in batch:
        if calls:
            changed = follower.touched(calls[-1][0]["at"], row["at"])
            if not any(value in changed.get(key, ()) for key, value in row["entities"].items()):
                calls[-1].append(row)
                continue
        calls.append([row])
    return calls


def request_rows(rows: pa.Table) -> list[dict[str, Any]]:
    """The prediction service's request rows for recorded transactions, in their order."""
    ids, times = rows["transaction_id"].to_pylist(), rows["event_ts"].to_pylist()
    return [{"request_id": i, "entities": {"user_id": u, "merchant_id": m}, "at": t, "fields": f}
            for i, u, m, t, f in zip(ids, rows["user_id"].to_pylist(), rows["merchant_id"].to_pylist(), times,
                                     request_fields(rows), strict=True)]


REQUEST_FIELDS = ("amount", "is_online")  # what the transaction itself says, sent as `fields`


def request_fields(rows: pa.Table) -> list[dict[str, Any]]:
    """Per request, the transaction's own fields the label file carries (none for older files)."""
    present = [name for name in REQUEST_FIELDS if name in rows.column_names]
    columns = [rows[name].to_pylist() for name in present]
    return [dict(zip(present, values, strict=True)) for values in zip(*columns, strict=True)] if present else \
        [{} for _ in range(rows.num_rows)]


def deliver_labels(config: Config, start: datetime, end: datetime, *, delay: timedelta = timedelta(days=1),
                   path: str | Path = LABELS) -> tuple[int, int]:
    """Labels arriving in [start, end), at their `label_arrived_at` (files without it: of the requests
    served in [start − delay, end − delay), `delay` after each); (written, quarantined)."""
    from quiver.monitoring.labels import write_labels

    table = pq.read_table(config.root / path)
    if "label_arrived_at" in table.column_names:
        arrival = table["label_arrived_at"].cast(_TS)
        keep = pc.and_(pc.greater_equal(arrival, pa.scalar(start, _TS)), pc.less(arrival, pa.scalar(end, _TS)))
        rows = table.filter(keep)
        if rows.num_rows == 0:
            return 0, 0
        written = write_labels(store_for(config), rows["transaction_id"].to_pylist(), rows["is_fraud"].to_pylist(),
                               arrived_at=rows["label_arrived_at"].to_pylist())
        return written.written, written.quarantined
    rows = requests_between(config, start - delay, end - delay, path)
    if rows.num_rows == 0:
        return 0, 0
    arrived = [t + delay for t in rows["event_ts"].to_pylist()]
    written = write_labels(store_for(config), rows["transaction_id"].to_pylist(), rows["is_fraud"].to_pylist(),
                           arrived_at=arrived)
    return written.written, written.quarantined
