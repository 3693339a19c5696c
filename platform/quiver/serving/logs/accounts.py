"""The serving log's accounts: per replica and hour, what became of every row it was given.

A row the logger was given is written, quarantined, dropped (by reason) or waits in the spool; only written
rows are in the log, so what a reader cannot see would otherwise be invisible to it: a judge would take a
split that lost rows for the traffic's split, and a training set built from logs would not know what is
missing. Each logger keeps a ledger per hour (of the rows' own time) and stores a changed hour's whole
ledger beside the hour's files (after each flush on a folder; on an object store at once for drops,
quarantines and spooling, at each explicit flush and stop, else at most once a minute):

    <root>/serving_logs/date=YYYY-MM-DD/hour=HH/_accounts/<replica>-<process start ns>.json
    {"replica": "web-1", "process": "web-1-1793…", "hour": "2026-11-03T09",
     "written": {"champion": 1200, "canary": 61}, "quarantined": {…}, "spooled": {…},
     "dropped": {"buffer_full": {"champion": 40}}}

Counts are cumulative for the process (a later file of the same process replaces the earlier one: one PUT,
never half), per arm where the rows' arm is known ("?" otherwise). A process killed with SIGKILL loses the
rows logged since its last flush; the next process of the replica counts them from the dead one's journal
(`quiver.serving.logs.journal`) as dropped for `killed`.
`read_accounts` sums every replica's and process's files of a window.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from quiver.catalog.locations import Location, as_location
from quiver.online.base import MAX_TIME_US, MIN_TIME_US
from quiver.serving.logs.spool import Spooled
from quiver.serving.logs.tables import US_PER_HOUR, Batch, FailedPart, QuarantinedBatch

ACCOUNTS_DIR = "_accounts"
OUTCOMES = ("written", "quarantined", "spooled", "dropped")


def hour_folder(hour: int) -> str:
    """`date=…/hour=…` of an hour number (hours since the epoch, UTC)."""
    return f"{datetime.fromtimestamp(hour * 3600, UTC):date=%Y-%m-%d/hour=%H}"


class Ledger:
    """Per-hour counts of one logger process (thread-safe); `dirty` hours changed since they were stored."""

    def __init__(self, replica: str, process: str) -> None:
        self.replica, self.process = replica, process
        self._counts: dict[int, dict[str, Counter[str]]] = {}
        self._dirty: set[int] = set()
        self._urgent = False  # an outcome other than "written" changed since the last `dirty()`
        self._lock = threading.Lock()

    def add(self, hour: int, outcome: str, by_arm: Iterable[tuple[str, int]]) -> None:
        """Count rows of `hour` with `outcome` ("written", "quarantined", "spooled" or "dropped:<reason>")."""
        with self._lock:
            counter = self._counts.setdefault(hour, {}).setdefault(outcome, Counter())
            for arm, rows in by_arm:
                if rows:
                    counter[arm] += int(rows)
                    self._dirty.add(hour)
                    self._urgent = self._urgent or outcome != "written"

    def dirty(self) -> list[tuple[int, dict[str, Any]]]:
        """The changed hours with their whole account, oldest first (marked clean: `keep_dirty` on failure)."""
        with self._lock:
            hours, self._dirty, self._urgent = sorted(self._dirty), set(), False
            return [(hour, self._account(hour)) for hour in hours]

    @property
    def urgent(self) -> bool:
        """Whether rows were dropped, quarantined or spooled since the accounts were last taken."""
        with self._lock:
            return self._urgent

    @property
    def pending(self) -> bool:
        """Whether some hour's account is not stored yet."""
        with self._lock:
            return bool(self._dirty)

    def keep_dirty(self, hour: int) -> None:
        with self._lock:
            self._dirty.add(hour)

    def total(self, outcome: str) -> int:
        with self._lock:
            return sum(sum(c.get(outcome, Counter()).values()) for c in self._counts.values())

    def _account(self, hour: int) -> dict[str, Any]:
        counts = self._counts.get(hour, {})
        out: dict[str, Any] = {"replica": self.replica, "process": self.process,
                               "hour": f"{datetime.fromtimestamp(hour * 3600, UTC):%Y-%m-%dT%H}", "dropped": {}}
        for outcome, by_arm in counts.items():
            kind, _, reason = outcome.partition(":")
            if kind == "dropped":
                out["dropped"][reason] = dict(by_arm)
            else:
                out[kind] = dict(by_arm)
        return out


def account_path(location: Location, log_dir: str, hour: int, process: str) -> str:
    return location.path(log_dir, hour_folder(hour), ACCOUNTS_DIR, f"{process}.json")


@dataclass
class Accounts:
    """Every replica's accounts of a window, summed: rows by outcome (and reason) and arm."""

    written: Counter[str] = field(default_factory=Counter)
    quarantined: Counter[str] = field(default_factory=Counter)
    spooled: Counter[str] = field(default_factory=Counter)
    dropped: dict[str, Counter[str]] = field(default_factory=dict)
    replicas: set[str] = field(default_factory=set)
    files: int = 0

    @property
    def dropped_rows(self) -> int:
        return sum(sum(c.values()) for c in self.dropped.values())

    def dropped_by_arm(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for by_arm in self.dropped.values():
            total.update(by_arm)
        return total

    @property
    def served(self) -> int:
        """Rows the loggers were given: written, quarantined or dropped (spooled rows are written later)."""
        return sum(self.written.values()) + sum(self.quarantined.values()) + self.dropped_rows

    @property
    def dropped_share(self) -> float:
        return self.dropped_rows / self.served if self.served else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"served": self.served, "written": sum(self.written.values()),
                "quarantined": sum(self.quarantined.values()), "dropped": self.dropped_rows,
                "dropped_by_reason": {r: sum(c.values()) for r, c in self.dropped.items()},
                "dropped_by_arm": dict(self.dropped_by_arm()), "dropped_share": self.dropped_share,
                "replicas": sorted(self.replicas), "account_files": self.files}


def read_accounts(root: str | Path | Location, start: datetime | None = None, end: datetime | None = None,
                  log_dir: str = "serving_logs") -> Accounts:
    """The accounts of every replica for the hours overlapping [start, end), summed."""
    from quiver.serving.logs.read import hour_folders

    location = as_location(root)
    found = Accounts()
    for folder in hour_folders(location, start, end):
        accounts = f"{folder}/{ACCOUNTS_DIR}"
        for name in location.children(accounts):
            if not name.endswith(".json"):
                continue
            account = location.read_json(f"{accounts}/{name}") or {}
            found.files += 1
            found.replicas.add(str(account.get("replica", "?")))
            for outcome in ("written", "quarantined", "spooled"):
                getattr(found, outcome).update(account.get(outcome) or {})
            for reason, by_arm in (account.get("dropped") or {}).items():
                found.dropped.setdefault(reason, Counter()).update(by_arm)
    return found


def arm_counts(table: pa.Table) -> list[tuple[str, int]]:
    """Rows per arm of a log table."""
    import pyarrow.compute as pc

    if "arm" not in table.column_names:
        return [("?", table.num_rows)]
    return [(str(item["values"]), int(item["counts"])) for item in pc.value_counts(table["arm"]).to_pylist()]


def hours_and_arms(what: Any, rows: int) -> list[tuple[int, list[tuple[str, int]]]]:
    """Hours (since the epoch) and rows per arm of something dropped or quarantined: a buffered item, a
    failed part, a table, batches or a spooled file; an hour that cannot be told is left out of the accounts
    (the totals in `dropped_by` still count it)."""
    if isinstance(what, FailedPart):
        return [(what.hour, arm_counts(what.table))]
    if isinstance(what, Spooled):
        folder = what.relative.split("/")
        try:
            moment = datetime.strptime(f"{folder[1][5:]} {folder[2][5:]}", "%Y-%m-%d %H").replace(tzinfo=UTC)
        except (IndexError, ValueError):
            return []
        return [(int(moment.timestamp()) // 3600, [("?", rows)])]
    if isinstance(what, QuarantinedBatch):
        what = what.batch
    if isinstance(what, list):
        return [pair for item in what for pair in hours_and_arms(item, getattr(item, "n", 0))]
    if isinstance(what, tuple):  # one `log()` record: (ts_us, request_id, keys, features, version, arm, …)
        return _group(np.array([int(what[0]) // US_PER_HOUR]), np.array([str(what[5])], dtype=object))
    if isinstance(what, pa.Table):
        ts_name = "ts" if "ts" in what.column_names else "ts_us"
        if ts_name not in what.column_names or not what.num_rows:
            return []
        ts = what[ts_name].cast(pa.int64()).to_numpy(zero_copy_only=False)
        arms = what["arm"].to_numpy(zero_copy_only=False) if "arm" in what.column_names else np.full(len(ts), "?")
        return _group(ts // US_PER_HOUR, arms)
    if isinstance(what, Batch):
        ts = np.broadcast_to(np.asarray(what.ts_us, dtype=np.int64), (what.n,))
        arms = np.broadcast_to(np.asarray(what.arm, dtype=object), (what.n,))
        return _group(ts // US_PER_HOUR, arms)
    return []


def _group(hours: np.ndarray, arms: np.ndarray) -> list[tuple[int, list[tuple[str, int]]]]:
    """Rows per arm of each hour; hours outside TIME_RANGE (quarantined for that) have no account."""
    out = []
    valid = (hours >= MIN_TIME_US // US_PER_HOUR) & (hours < MAX_TIME_US // US_PER_HOUR)
    for hour in np.unique(hours[valid]):
        chosen = arms[hours == hour]
        values, counts = np.unique(chosen.astype(str), return_counts=True)
        out.append((int(hour), [(str(v), int(c)) for v, c in zip(values, counts, strict=True)]))
    return out
