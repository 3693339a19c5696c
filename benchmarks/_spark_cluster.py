"""A Spark standalone cluster for benchmarks: one master and N workers started from the scripts bundled with
pyspark, each worker with its own work folder; plus samplers of its executors' processes and of a driver's
REST API (stages: task CPU time, shuffle bytes)."""

from __future__ import annotations

import contextlib
import json
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests.harness
from tests.harness import SparkStandalone, free_port

__all__ = ["Cluster", "Executors", "free_port", "settled_stage_totals"]


def _json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


class Cluster(SparkStandalone):
    """`with Cluster(folder, workers=2, cores=1, memory="2g") as c:` … `c.url` is the master (the tests'
    `SparkStandalone`, two workers by default)."""

    def __init__(self, folder: Path, workers: int = 2, cores: int = 1, memory: str = "2g") -> None:
        super().__init__(folder, workers=workers, cores=cores, memory=memory)


class Executors:
    """CPU seconds and peak RSS of this application's executor JVMs (found by the app id on their command
    line), sampled every 50 ms. JVM CPU includes GC and JIT threads, not only tasks."""

    def __init__(self, app_id: str) -> None:
        self.app_id, self.peak_rss = app_id, {}  # pid → bytes
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def processes(self) -> list[Any]:
        import psutil

        found = []
        for proc in psutil.process_iter(["cmdline"]):
            line = proc.info.get("cmdline") or []
            if "org.apache.spark.executor.CoarseGrainedExecutorBackend" in line and self.app_id in line:
                found.append(proc)
        return found

    def cpu_seconds(self) -> float:
        total = 0.0
        for proc in self.processes():
            try:
                times = proc.cpu_times()
                total += times.user + times.system + times.children_user + times.children_system
            except Exception:  # exited between listing and reading
                pass
        return total

    def _run(self) -> None:
        procs = self.processes()
        while not self._stop.is_set():
            for proc in procs:
                with contextlib.suppress(Exception):  # exited between listing and reading
                    self.peak_rss[proc.pid] = max(self.peak_rss.get(proc.pid, 0), proc.memory_info().rss)
            time.sleep(0.05)
            if len(procs) < 1:
                procs = self.processes()

    def stop(self) -> dict[int, int]:
        self._stop.set()
        self._thread.join()
        return dict(self.peak_rss)


def stage_totals(ui_port: int, app_id: str) -> dict[tuple[int, int], dict[str, int]]:
    """Completed stages of a running application (driver REST API): task CPU ns and shuffle bytes each."""
    stages = _json(f"http://127.0.0.1:{ui_port}/api/v1/applications/{app_id}/stages?status=complete")
    return {(s["stageId"], s["attemptId"]): {"cpu_ns": int(s.get("executorCpuTime", 0)),
                                             "shuffle_write": int(s.get("shuffleWriteBytes", 0)),
                                             "shuffle_read": int(s.get("shuffleReadBytes", 0)),
                                             "input": int(s.get("inputBytes", 0))} for s in stages}


def settled_stage_totals(ui_port: int, app_id: str) -> dict[tuple[int, int], dict[str, int]]:
    """Stage totals once the listener bus has caught up with the last job (two equal reads)."""
    previous = stage_totals(ui_port, app_id)
    for _ in range(20):
        time.sleep(0.5)
        current = stage_totals(ui_port, app_id)
        if current == previous:
            return current
        previous = current
    return previous
