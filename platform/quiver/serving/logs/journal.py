"""The journal: how many rows a logger process was given, per hour, kept on the replica's local disk every
second, so that what a killed process lost is counted, not guessed.

A process killed with SIGKILL (or a power loss) loses the rows logged since its last flush, and its
accounts (`quiver.serving.logs.accounts`) stop at that flush. Its journal, `<journal dir>/<process>.json`
({"replica", "process", "given": {hour: rows}}), was replaced (written, then renamed) about every second. The
next process of the replica finds it (`reconcile`), compares each hour's rows given with what the dead
process's account says became of them (written, quarantined, spooled, dropped), and records the difference
in that account as dropped for `killed`. The count is an upper bound (rows written after the process's
last stored account count as killed: at most a flush on a folder, a minute on an object store) and misses
at most the last second's rows (given after the journal's last write). A clean stop deletes the journal: nothing to settle.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from quiver.catalog.locations import Location
from quiver.online.base import MAX_TIME_US, MIN_TIME_US
from quiver.serving.logs.accounts import account_path, hour_folder

log = logging.getLogger("quiver.serving_log")
US_PER_HOUR = 3_600_000_000
KILLED = "killed"


class Journal:
    """Rows given to one logger process, per hour (thread-safe), written to `folder` on `write()`."""

    def __init__(self, folder: Path, replica: str, process: str) -> None:
        self.folder, self.replica, self.process = folder, replica, process
        self._given: Counter[int] = Counter()
        self._changed = False
        self._lock = threading.Lock()

    @property
    def path(self) -> Path:
        return self.folder / f"{self.process}.json"

    def give(self, ts_us: int | np.ndarray, rows: int) -> None:
        """Count `rows` given with times `ts_us` (one for all, or one per row): cheap, on the request path."""
        if isinstance(ts_us, np.ndarray):
            hours = ts_us // US_PER_HOUR
            low, high = int(hours.min()), int(hours.max())
            counts = {low: rows} if low == high else dict(zip(*np.unique(hours, return_counts=True), strict=True))
        else:
            counts = {int(ts_us) // US_PER_HOUR: rows}
        valid = range(MIN_TIME_US // US_PER_HOUR, MAX_TIME_US // US_PER_HOUR)  # others are quarantined: no hour
        with self._lock:
            for hour, n in counts.items():
                if int(hour) in valid:
                    self._given[int(hour)] += int(n)
            self._changed = True

    def write(self) -> None:
        """Replace the journal file when the counts changed (a temp file renamed: never half)."""
        with self._lock:
            if not self._changed:
                return
            body = {"replica": self.replica, "process": self.process,
                    "given": {str(h): n for h, n in sorted(self._given.items())}}
            self._changed = False
        self.folder.mkdir(parents=True, exist_ok=True)
        staged = self.folder / f".{self.process}.{uuid.uuid4().hex[:8]}"
        try:
            staged.write_text(json.dumps(body))
            os.replace(staged, self.path)
        finally:
            staged.unlink(missing_ok=True)

    def discard(self) -> None:
        """A clean stop: every row given is accounted for on the store."""
        self.path.unlink(missing_ok=True)


def reconcile(folder: Path, location: Location, log_dir: str, current: str) -> int:
    """Settle the journals of earlier processes in `folder` (not `current`): each hour's rows given but not
    in the process's account are recorded there as dropped (`killed`); returns the rows so counted. A journal
    is deleted once every hour of it is settled; one whose account cannot be stored (the store is down) stays
    for the next try."""
    lost_total = 0
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        if path.stem == current:
            continue
        try:
            journal = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            log.error("serving-log journal %s is unreadable and stays where it is: %s", path, exc)
            continue
        try:
            lost = sum(_settle(location, log_dir, journal, int(hour), int(given))
                       for hour, given in journal.get("given", {}).items())
        except OSError as exc:
            log.warning("serving-log journal %s not settled yet (the store: %s)", path.name, exc)
            continue
        if lost:
            log.warning("serving log: process %s of replica %s stopped without closing; %d rows it was given "
                        "were never written (counted as dropped: %s)", journal.get("process"),
                        journal.get("replica"), lost, KILLED)
        lost_total += lost
        path.unlink(missing_ok=True)
    return lost_total


def _settle(location: Location, log_dir: str, journal: dict[str, Any], hour: int, given: int) -> int:
    path = account_path(location, log_dir, hour, str(journal["process"]))
    account: dict[str, Any] = location.read_json(path) or {
        "replica": journal.get("replica"), "process": journal["process"], "hour": hour_folder(hour), "dropped": {}}
    dropped = account.setdefault("dropped", {})
    known = sum(sum((account.get(kind) or {}).values()) for kind in ("written", "quarantined", "spooled"))
    known += sum(sum(by_arm.values()) for reason, by_arm in dropped.items() if reason != KILLED)
    lost = max(0, given - known)
    if lost and sum((dropped.get(KILLED) or {}).values()) != lost:
        dropped[KILLED] = {"?": lost}
        location.put(path, json.dumps(account).encode())
    return lost
