"""What the streaming job reports: `status.json` (read by `quiver stream-status`) and Prometheus metrics.

The running job rewrites `<state>/status.json` about once a second and `<state>/metrics.prom` in the
Prometheus text format (node_exporter's textfile collector reads it; no client library needed in the
streaming venv). Where `quiver.metrics` imports (the main venv), the same counts also go to its
counters, e.g. `quiver_late_events_total{source=…}`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from quiver.streaming.paths import StreamPaths


def write_status(paths: StreamPaths, status: Mapping[str, Any]) -> None:
    """Replace status.json and metrics.prom atomically."""
    paths.root.mkdir(parents=True, exist_ok=True)
    body = dict(status, updated_at=time.time())
    _atomic(paths.status_file, json.dumps(body, indent=2, sort_keys=True, default=str))
    _atomic(paths.metrics_file, prometheus_text(body))


def read_status(paths: StreamPaths) -> dict[str, Any] | None:
    """The last status written, or None when no job ever ran here."""
    try:
        data = json.loads(paths.status_file.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def effective_state(status: Mapping[str, Any]) -> str:
    """The recorded state, or 'dead' when a job that claims to run has no live process."""
    state = str(status.get("state", "unknown"))
    pid = status.get("pid")
    if state in ("starting", "running") and isinstance(pid, int) and not process_alive(pid):
        return "dead"
    return state


def _label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def prometheus_text(status: Mapping[str, Any]) -> str:
    """The status as Prometheus text-format metrics."""
    loader = status.get("loader", {}) or {}
    feeder = status.get("feeder", {}) or {}
    lines = [
        "# HELP quiver_stream_up 1 while the streaming job runs.",
        "# TYPE quiver_stream_up gauge",
        f"quiver_stream_up {1 if status.get('state') == 'running' else 0}",
        "# HELP quiver_stream_late_events_total Events behind the watermark by more than the allowed lateness.",
        "# TYPE quiver_stream_late_events_total counter",
    ]
    lines += [f'quiver_stream_late_events_total{{source="{_label(s)}"}} {n}'
              for s, n in sorted((loader.get("late") or {}).items())]
    lines += ["# HELP quiver_stream_quarantined_total Rows quarantined by the streaming job, by reason.",
              "# TYPE quiver_stream_quarantined_total counter"]
    for source, reasons in sorted((loader.get("quarantined") or {}).items()):
        lines += [f'quiver_stream_quarantined_total{{source="{_label(source)}",reason="{_label(r)}"}} {n}'
                  for r, n in sorted(reasons.items())]
    lines += ["# HELP quiver_stream_loaded_files_total Change files loaded into the online store.",
              "# TYPE quiver_stream_loaded_files_total counter",
              f"quiver_stream_loaded_files_total {loader.get('files', 0)}",
              "# HELP quiver_stream_fed_lines_total Stream lines handed to the Flink job.",
              "# TYPE quiver_stream_fed_lines_total counter",
              f"quiver_stream_fed_lines_total {feeder.get('lines', 0)}",
              "# HELP quiver_stream_newest_event_timestamp_seconds Newest event time loaded per view.",
              "# TYPE quiver_stream_newest_event_timestamp_seconds gauge"]
    lines += [f'quiver_stream_newest_event_timestamp_seconds{{view="{_label(v)}"}} {us / 1e6:.6f}'
              for v, us in sorted((loader.get("newest_event_us") or {}).items())]
    checkpoint_at = (status.get("checkpoint") or {}).get("at")
    if checkpoint_at:
        lines += ["# HELP quiver_stream_checkpoint_timestamp_seconds When the newest checkpoint completed.",
                  "# TYPE quiver_stream_checkpoint_timestamp_seconds gauge",
                  f"quiver_stream_checkpoint_timestamp_seconds {float(checkpoint_at):.3f}"]
    return "\n".join(lines) + "\n"


class MetricsPublisher:
    """Pushes count increases to `quiver.metrics` when it imports (no-op otherwise)."""

    def __init__(self) -> None:
        self._metrics: Any = None
        try:
            from quiver import metrics

            self._metrics = metrics
        except ImportError:  # the streaming venv has no prometheus_client
            pass
        self._late: dict[str, int] = {}

    @property
    def enabled(self) -> bool:
        return self._metrics is not None

    def publish(self, late: Mapping[str, int], newest_event_us: Mapping[str, int]) -> None:
        if self._metrics is None:
            return
        for source, total in late.items():
            delta = total - self._late.get(source, 0)
            if delta > 0:
                self._metrics.LATE_EVENTS.labels(source=source).inc(delta)
            self._late[source] = total
        for view, us in newest_event_us.items():
            self._metrics.set_freshness(view, us / 1e6)


def tree_cpu_s(pid: int | None = None) -> float | None:
    """CPU seconds (user + system) used so far by process `pid` (default: this one) and its live
    descendants, e.g. the Flink JVM; None where /proc is not readable. On a machine shared with other
    work, events per CPU second is steadier than events per wall second."""
    root = os.getpid() if pid is None else pid
    try:
        tick = os.sysconf("SC_CLK_TCK")
        children: dict[int, list[int]] = {}
        stats: dict[int, float] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry))
            stats[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    except (OSError, ValueError, IndexError):
        return None
    total, todo = 0.0, [root]
    while todo:
        current = todo.pop()
        total += stats.get(current, 0.0)
        todo += children.get(current, [])
    return total


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
