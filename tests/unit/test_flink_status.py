"""Streaming status: Prometheus text and the liveness of a job that claims to run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from quiver.streaming.paths import StreamPaths
from quiver.streaming.status import effective_state, prometheus_text, read_status, write_status


def test_status_round_trip_and_metrics(tmp_path: Path) -> None:
    paths = StreamPaths.at(tmp_path)
    status = {"state": "running", "pid": os.getpid(), "feeder": {"lines": 12},
              "loader": {"files": 3, "late": {"tx": 2}, "quarantined": {"tx": {"null_key:v": 4}},
                         "newest_event_us": {"v": 1_500_000}},
              "checkpoint": {"path": "x", "at": 10.5}}
    write_status(paths, status)
    assert read_status(paths)["loader"]["late"] == {"tx": 2}
    text = paths.metrics_file.read_text()
    assert text == prometheus_text(read_status(paths) or {})
    for line in ('quiver_stream_up 1', 'quiver_stream_late_events_total{source="tx"} 2',
                 'quiver_stream_quarantined_total{source="tx",reason="null_key:v"} 4',
                 'quiver_stream_loaded_files_total 3', 'quiver_stream_fed_lines_total 12',
                 'quiver_stream_newest_event_timestamp_seconds{view="v"} 1.500000',
                 'quiver_stream_checkpoint_timestamp_seconds 10.500'):
        assert line in text.splitlines()
    assert effective_state(status) == "running"


def test_a_killed_job_reads_as_dead() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert effective_state({"state": "running", "pid": proc.pid}) == "dead"
    assert effective_state({"state": "finished", "pid": proc.pid}) == "finished"
    assert read_status(StreamPaths.at("/nonexistent/quiver")) is None
