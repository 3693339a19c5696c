"""The streaming state directory, in one place.

    <state>/inbox/<source>/upto-<last stream file>   time-ordered batches the Flink job reads
    <state>/sinks/tiles/<view>/part-*                change files committed by Flink on checkpoints,
    <state>/sinks/last/<view>/part-*                 loaded into the online store, then deleted
    <state>/sinks/late/<source>/part-*               Kafka: late and future records, stored in _late_events/
    <state>/sinks/quarantine/<source>/*              quarantined rows with their reason (kept)
    <state>/checkpoints/<job id>/chk-<n>/            Flink checkpoints (the latest one is restored)
    <state>/job.json                                 what the checkpoints belong to (job SQL hash, mode)
    <state>/status.json, <state>/metrics.prom        written by the running job (see status.py)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from quiver.compile.flink import sink_path


@dataclass(frozen=True)
class StreamPaths:
    """Folders and files of one streaming state directory."""

    root: Path
    checkpoints: Path

    @classmethod
    def at(cls, root: str | Path, checkpoints: str | Path | None = None) -> StreamPaths:
        base = Path(root).resolve()
        return cls(base, Path(checkpoints).resolve() if checkpoints else base / "checkpoints")

    @property
    def sinks(self) -> Path:
        return self.root / "sinks"

    def inbox(self, source: str) -> Path:
        return self.root / "inbox" / source

    def sink(self, kind: str, name: str) -> Path:
        return Path(sink_path(str(self.sinks), kind, name))

    @property
    def job_file(self) -> Path:
        return self.root / "job.json"

    @property
    def status_file(self) -> Path:
        return self.root / "status.json"

    @property
    def error_file(self) -> Path:
        """The whole Java trace of the last run that Flink refused."""
        return self.root / "last-error.txt"

    @property
    def metrics_file(self) -> Path:
        return self.root / "metrics.prom"


def visible_files(folder: Path, prefix: str = "") -> list[Path]:
    """Files of `folder` that readers may use: not hidden ('.', '_' = in progress), sorted by name."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir()
                  if p.is_file() and not p.name.startswith((".", "_")) and p.name.startswith(prefix))
