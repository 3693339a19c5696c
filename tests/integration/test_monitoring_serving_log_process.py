"""Serving logs across a real process exit: a clean exit flushes everything (atexit); a crash loses at most
the rows logged since the last flush."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from quiver.serving.logs import read_serving_logs

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent('''
    import os, signal, sys, time
    from quiver.serving.logs import ServingLogger

    root, mode = sys.argv[1], sys.argv[2]
    logger = ServingLogger(root, flush_rows=1_000_000, flush_interval_s=0.2)
    for i in range(5_000):
        logger.log(f"a{i}", {"user_id": i}, {"amount": i * 1.5}, model_version="v1", latency_ms=0.3)
    if mode == "exit":
        sys.exit(0)  # no close(): atexit must flush
    deadline = time.monotonic() + 30
    while logger.written < 5_000 and time.monotonic() < deadline:
        time.sleep(0.01)
    for i in range(700):
        logger.log(f"b{i}", {"user_id": i}, {"amount": 0.0})
    os.kill(os.getpid(), signal.SIGKILL)
''')


def run_child(root: Path, mode: str) -> int:
    result = subprocess.run([sys.executable, "-c", CHILD, str(root), mode], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    return result.returncode


def test_clean_exit_flushes_everything(tmp_path: Path) -> None:
    assert run_child(tmp_path, "exit") == 0
    table = read_serving_logs(tmp_path)
    assert table.num_rows == 5_000
    assert table["request_id"].to_pylist() == [f"a{i}" for i in range(5_000)]


def test_crash_loses_at_most_the_unflushed_rows(tmp_path: Path) -> None:
    assert run_child(tmp_path, "kill") == -9
    ids = read_serving_logs(tmp_path)["request_id"].to_pylist()
    assert ids[:5_000] == [f"a{i}" for i in range(5_000)]  # everything flushed before the crash survived
    assert len(ids) <= 5_700  # only rows logged after the last flush can be missing
