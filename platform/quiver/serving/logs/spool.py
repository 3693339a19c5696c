"""The spool: a replica's bounded local folder for serving-log files the store could not take yet.

A file whose upload fails (the object store is down, a network partition) is written here under the same
relative path it will have on the store (`serving_logs/date=…/hour=…/part-….parquet`), then uploaded, oldest
first, once the store answers again; a file leaves the spool only after its upload succeeded, so a row the
logger accepted is on the store or here, even across a restart (a new process finds the folder and uploads
it). An upload that is repeated after a crash writes the same name with the same bytes: the store holds
every row once.

The folder is bounded (`max_bytes`): when a new file does not fit, the oldest spooled files are dropped and
counted (`spool_full`), the rule the in-memory buffer follows, since recent traffic is what checks read.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq

log = logging.getLogger("quiver.serving_log")


@dataclass(frozen=True, slots=True)
class Spooled:
    """One file waiting in the spool: its path relative to the store root, rows and bytes."""

    relative: str
    rows: int
    nbytes: int


class Spool:
    """Files waiting for the store, oldest first (see the module docstring). Thread-safe."""

    def __init__(self, folder: str | Path, max_bytes: int = 1 << 30):
        if max_bytes < 1:
            raise ValueError("max_bytes must be >= 1")
        self.folder = Path(folder)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._files: list[Spooled] = self._found()

    def _found(self) -> list[Spooled]:
        """What an earlier process left here (a crash or a stop while the store was down)."""
        found = []
        for path in self.folder.rglob("part-*.parquet") if self.folder.is_dir() else ():
            try:
                rows = pq.read_metadata(path).num_rows
            except Exception as exc:  # a file torn by a crash before its rename cannot exist; anything else is
                log.error("serving-log spool: %s is unreadable and stays where it is: %s", path, exc)
                continue
            found.append(Spooled(path.relative_to(self.folder).as_posix(), rows, path.stat().st_size))
        return sorted(found, key=_age)

    # ----- state -----

    @property
    def files(self) -> int:
        with self._lock:
            return len(self._files)

    @property
    def rows(self) -> int:
        with self._lock:
            return sum(f.rows for f in self._files)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return sum(f.nbytes for f in self._files)

    # ----- in and out -----

    def add(self, relative: str, data: bytes, rows: int) -> list[Spooled]:
        """Keep `data` (the file for `relative`) until it can be uploaded; returns the files dropped to make
        room (oldest first; the new file itself when it alone exceeds the bound). Raises OSError when the
        local folder cannot be written: the caller keeps the rows in memory instead."""
        item = Spooled(relative, rows, len(data))
        if item.nbytes > self.max_bytes:
            return [item]
        target = self.folder / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        staged = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}")
        try:
            with open(staged, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())  # acknowledged rows survive a power loss too, not only a crash
            os.replace(staged, target)
        finally:
            staged.unlink(missing_ok=True)
        dropped = []
        with self._lock:
            self._files.append(item)
            self._files.sort(key=_age)
            while sum(f.nbytes for f in self._files) > self.max_bytes:
                oldest = self._files.pop(0)
                dropped.append(oldest)
                (self.folder / oldest.relative).unlink(missing_ok=True)
        return dropped

    def drain(self, upload: Callable[[str, bytes], None]) -> tuple[int, Exception | None]:
        """Upload spooled files oldest first with `upload(relative, data)`, removing each once it is stored;
        stops at the first failure. Returns (rows uploaded, the failure or None)."""
        uploaded = 0
        while True:
            with self._lock:
                if not self._files:
                    return uploaded, None
                item = self._files[0]
            path = self.folder / item.relative
            try:
                data = path.read_bytes()
            except OSError as exc:  # removed or unreadable by hand: nothing to upload, and it must not block
                log.error("serving-log spool: %s (%d rows) cannot be read, left out: %s", path, item.rows, exc)
                data = None
            if data is not None:
                try:
                    upload(item.relative, data)
                except Exception as exc:
                    return uploaded, exc
                uploaded += item.rows
            with self._lock, contextlib.suppress(ValueError):
                self._files.remove(item)
            path.unlink(missing_ok=True)


def _age(item: Spooled) -> tuple[int, str]:
    """Files sort by their write time (the first number of `part-<ns>-…`), whatever their hour."""
    name = item.relative.rsplit("/", 1)[-1]
    try:
        return int(name.split("-")[1]), item.relative
    except (IndexError, ValueError):
        return 0, item.relative
