"""A Spark standalone cluster for benchmarks: one master and N workers started from the scripts bundled with
pyspark, each worker with its own work folder; plus samplers of its executors' processes and of a driver's
REST API (stages: task CPU time, shuffle bytes), the driver's peak RSS apart, and an S3 server's CPU."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository: tests.harness
from tests.harness import SparkStandalone, free_port

__all__ = ["Cluster", "DriverRss", "Executors", "driver_high_water_mb", "free_port", "settled_stage_totals", "stage_figures",
           "with_server_cpu"]


def _json(url: str, tries: int = 4) -> Any:
    """A driver's REST answer; a busy machine can keep a fresh driver's UI from answering in time: try again."""
    for attempt in range(tries):
        try:
            with urllib.request.urlopen(url, timeout=30) as response:
                return json.load(response)
        except (TimeoutError, OSError):
            if attempt == tries - 1:
                raise
            time.sleep(2)
    return None


class Cluster(SparkStandalone):
    """`with Cluster(folder, workers=2, cores=1, memory="2g") as c:` … `c.url` is the master (the tests'
    `SparkStandalone`, two workers by default)."""

    def __init__(self, folder: Path, workers: int = 2, cores: int = 1, memory: str = "2g") -> None:
        super().__init__(folder, workers=workers, cores=cores, memory=memory)


class Executors:
    """CPU seconds and peak RSS of this application's executors (found by the app id on their command line),
    each executor counted with its process tree: the JVM and the Python workers it starts (pyspark.daemon and
    its forks, which run `mapInArrow` functions). Sampled every 50 ms; the tree is listed again every second,
    so executors and workers that start late are counted. JVM CPU includes GC and JIT threads, not only tasks."""

    def __init__(self, app_id: str) -> None:
        self.app_id, self.peak_rss = app_id, {}  # executor pid → bytes (its whole tree)
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

    @staticmethod
    def _tree(executor: Any) -> list[Any]:
        try:
            return [executor, *executor.children(recursive=True)]
        except Exception:  # exited
            return []

    def cpu_seconds(self) -> float:
        """User + system CPU of every executor's tree, with the reaped children of each process (a Python
        worker that ended is billed to the daemon that waited for it)."""
        total = 0.0
        for executor in self.processes():
            for proc in self._tree(executor):
                try:
                    times = proc.cpu_times()
                    total += times.user + times.system + times.children_user + times.children_system
                except Exception:  # exited between listing and reading
                    pass
        return total

    def _run(self) -> None:
        trees: dict[int, list[Any]] = {}
        listed = 0.0
        while not self._stop.is_set():
            if time.monotonic() - listed > 1.0:
                trees = {e.pid: self._tree(e) for e in self.processes()}
                listed = time.monotonic()
            for pid, tree in trees.items():
                rss = 0
                for proc in tree:
                    with contextlib.suppress(Exception):  # exited between listing and reading
                        rss += proc.memory_info().rss
                self.peak_rss[pid] = max(self.peak_rss.get(pid, 0), rss)
            time.sleep(0.05)

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


def stage_figures(before: dict[Any, Any], after: dict[Any, Any]) -> dict[str, float]:
    """Task CPU, shuffle and input of the stages in `after` (settled_stage_totals) that `before` lacks."""
    new = [v for k, v in after.items() if k not in before]
    return {"task_cpu_s": sum(s["cpu_ns"] for s in new) / 1e9,
            "shuffle_write_bytes": sum(s["shuffle_write"] for s in new),
            "shuffle_read_bytes": sum(s["shuffle_read"] for s in new), "input_bytes": sum(s["input"] for s in new)}


def driver_high_water_mb() -> tuple[float, float]:
    """The kernel's peak RSS (VmHWM) of this Python process and of its children (the driver JVM), apart."""
    import psutil

    def hwm(pid: int) -> float:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        return 0.0

    return hwm(os.getpid()), sum(hwm(c.pid) for c in psutil.Process().children(recursive=True))


def with_server_cpu(s3: Any, work: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`work()`'s result with the S3 server's CPU seconds during it (s3 mode)."""
    if s3 is None:
        return work()
    import psutil

    server = psutil.Process(s3.proc.pid)
    before = sum(server.cpu_times()[:2])
    result = work()
    result["s3_server_cpu_s"] = sum(server.cpu_times()[:2]) - before
    return result


class DriverRss:
    """Peak resident memory of this process and its children (the driver JVM), sampled every 20 ms, with the
    processes that made the peak (pid, name, MB): a short-lived child shows there, not in a high-water mark."""

    def __init__(self) -> None:
        import psutil

        self._proc, self.peak, self.at_peak = psutil.Process(), 0, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                sizes = [(p.pid, p.name(), p.memory_info().rss)
                         for p in [self._proc, *self._proc.children(recursive=True)]]
            except Exception:  # a child exited between listing and reading: sample again
                sizes = []
            if sum(s[2] for s in sizes) > self.peak:
                self.peak = sum(s[2] for s in sizes)
                self.at_peak = [[pid, name, round(rss / 2**20)] for pid, name, rss in sizes]
            time.sleep(0.02)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak
