"""Stream directory → the Flink job's inbox, in time order, with unparseable lines quarantined and counted.

Flink's filesystem source reads the files it finds in one scan in no fixed order, so a backlog of many
small files would arrive shuffled and whole files would fall behind the watermark (DESIGN.md §6). The
feeder therefore hands the job *one* batch file per pass: the pending stream files concatenated in name
order (producers name files by their first event time). Each line is checked to be a JSON object first;
the others go to the quarantine log with reason `unparseable_json`, because Flink's JSON format could
only skip them silently.

Every batch ends with a marker line, `{"ts_ms": "quiver-end-of-batch <batch>"}`: it fails the time check
and lands in the quarantine sink, so once the marker is in a *committed* file, every line before it has
been processed and its results committed in the same checkpoint or an earlier one (checkpoint barriers
follow the records). That is how a bounded run knows it is done, even after a restore.

Crash safety: a batch `upto-<last stream file>` appears by an atomic rename after its hidden manifest
`.upto-<…>.json` (the stream files it holds) and its quarantine file were written. What was fed is read
back from the manifests of the batches present, so a crash between steps re-feeds nothing twice.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quiver.streaming.paths import StreamPaths, visible_files

BATCH_PREFIX = "upto-"
MARKER = "quiver-end-of-batch "
UNPARSEABLE = "unparseable_json"
FEEDER_QUARANTINE_PREFIX = "feeder-"
_MAX_BATCH_BYTES = 64 << 20


def _json_loads() -> Callable[[bytes], Any]:
    try:
        import orjson

        return orjson.loads  # type: ignore[no-any-return]
    except ImportError:  # the main venv has no orjson; the stdlib parser gives the same verdicts
        return json.loads


@dataclass
class FeedResult:
    """What one pass did, per source."""

    files: dict[str, int] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)
    unparseable: dict[str, int] = field(default_factory=dict)

    @property
    def total_lines(self) -> int:
        return sum(self.lines.values())


class Feeder:
    """Moves new stream files of each source into its inbox as validated, time-ordered batches."""

    def __init__(self, streams: Mapping[str, Path], paths: StreamPaths, max_batch_bytes: int = _MAX_BATCH_BYTES):
        self.streams = {name: Path(p) for name, p in streams.items()}
        self.paths = paths
        self.max_batch_bytes = max_batch_bytes
        self._loads = _json_loads()
        self._fed: dict[str, set[str]] = {name: self._read_fed(name) for name in self.streams}

    def _read_fed(self, source: str) -> set[str]:
        inbox = self.paths.inbox(source)
        fed: set[str] = set()
        for batch in visible_files(inbox, BATCH_PREFIX):
            manifest = inbox / f".{batch.name}.json"
            if manifest.exists():
                fed.update(json.loads(manifest.read_text())["files"])
        return fed

    def pending(self, source: str) -> list[Path]:
        """Stream files of `source` not fed yet, in name (time) order."""
        fed = self._fed[source]
        return [p for p in visible_files(self.streams[source]) if p.name not in fed]

    def backlog(self) -> int:
        """Stream files waiting in every source."""
        return sum(len(self.pending(s)) for s in self.streams)

    def feed(self) -> FeedResult:
        """One pass: every pending file of every source into new inbox batches."""
        result = FeedResult()
        for source in self.streams:
            files = self.pending(source)
            while files:
                size, take = 0, 0
                while take < len(files) and (take == 0 or size + files[take].stat().st_size <= self.max_batch_bytes):
                    size += files[take].stat().st_size
                    take += 1
                self._feed_batch(source, files[:take], result)
                files = files[take:]
        return result

    def _feed_batch(self, source: str, files: list[Path], result: FeedResult) -> None:
        inbox = self.paths.inbox(source)
        inbox.mkdir(parents=True, exist_ok=True)
        good: list[bytes] = []
        bad: list[bytes] = []
        for path in files:
            data = path.read_bytes()
            ok, rejected = self._split(data)
            good.extend(ok)
            bad.extend(json.dumps({"reason": UNPARSEABLE, "view": "", "line": line.decode("utf-8", "replace"),
                                   "file": path.name}).encode() for line in rejected)
        name = BATCH_PREFIX + files[-1].name
        good.append(json.dumps({"ts_ms": MARKER + name}).encode())
        if bad:
            target = self.paths.sink("quarantine", source) / f"{FEEDER_QUARANTINE_PREFIX}{name}"
            _atomic_write(target, b"\n".join(bad) + b"\n")
        _atomic_write(inbox / f".{name}.json", json.dumps({"files": [p.name for p in files]}).encode())
        _atomic_write(inbox / name, b"\n".join(good) + b"\n")
        self._fed[source].update(p.name for p in files)
        result.files[source] = result.files.get(source, 0) + len(files)
        result.lines[source] = result.lines.get(source, 0) + len(good) - 1
        result.unparseable[source] = result.unparseable.get(source, 0) + len(bad)

    def _split(self, data: bytes) -> tuple[list[bytes], list[bytes]]:
        """(JSON-object lines, other non-blank lines) of one file."""
        loads = self._loads
        good: list[bytes] = []
        bad: list[bytes] = []
        for raw in data.split(b"\n"):
            line = raw.strip()
            if not line:
                continue
            try:
                is_object = type(loads(line)) is dict
            except ValueError:  # orjson.JSONDecodeError and json.JSONDecodeError are ValueErrors
                is_object = False
            (good if is_object else bad).append(line)
        return good, bad

    def batches(self) -> dict[str, list[str]]:
        """Names of the batches in every inbox (each ends with its marker)."""
        return {source: [p.name for p in visible_files(self.paths.inbox(source), BATCH_PREFIX)]
                for source in self.streams}

    def reset(self) -> None:
        """Forget what was fed: empty every inbox (a fresh job replays the whole stream directory)."""
        for source in self.streams:
            inbox = self.paths.inbox(source)
            if inbox.is_dir():
                for path in inbox.iterdir():
                    if path.is_file():
                        path.unlink()
            self._fed[source] = set()


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
