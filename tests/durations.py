"""Where a test run's time goes: seconds by resource, by module and by xdist worker, printed after every run.

Each test is charged to one resource, the first of RESOURCE_ORDER its markers name (conftest.py gives the
markers), so the rows add up to the run's total. A test's seconds are its setup + call + teardown, module
fixtures included where they are built, as `--durations` counts them. Under xdist the controller sees every
worker's reports, so the per-worker sums show how evenly the workers were kept busy. The whole breakdown
is also kept in pytest's cache (`.pytest_cache/v/quiver/durations`) for a note or a comparison.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import pytest

# The most expensive first: a Spark test that also trains is charged to Spark.
RESOURCE_ORDER = ("flink", "kafka", "spark", "airflow", "training", "browser", "postgres", "integration")


@dataclass
class _Tally:
    seconds: dict[str, float] = field(default_factory=lambda: defaultdict(float))  # nodeid → s
    resource: dict[str, str] = field(default_factory=dict)  # nodeid → resource
    worker: dict[str, str] = field(default_factory=dict)  # nodeid → xdist worker ("main" without xdist)


_TALLY = _Tally()


def tag_resource(item: pytest.Item) -> None:
    """Record the item's resource from its markers (not its keywords, which hold parameter ids such as
    "flink" too) where its reports carry it to the controller."""
    markers = {mark.name for mark in item.iter_markers()}
    item.user_properties.append(("resource", next((r for r in RESOURCE_ORDER if r in markers), "unit")))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _TALLY.seconds[report.nodeid] += report.duration
    _TALLY.resource.setdefault(report.nodeid, dict(report.user_properties).get("resource", "unit"))
    node = getattr(report, "node", None)  # set by xdist's controller
    _TALLY.worker.setdefault(report.nodeid, node.gateway.id if node is not None else "main")


def _sums(key: dict[str, str]) -> list[tuple[str, int, float]]:
    count: dict[str, int] = defaultdict(int)
    total: dict[str, float] = defaultdict(float)
    for nodeid, seconds in _TALLY.seconds.items():
        count[key[nodeid]] += 1
        total[key[nodeid]] += seconds
    return sorted(((k, count[k], total[k]) for k in total), key=lambda row: -row[2])


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    if not _TALLY.seconds:
        return
    modules = {nodeid: nodeid.split("::", 1)[0] for nodeid in _TALLY.seconds}
    by_resource, by_worker, by_module = _sums(_TALLY.resource), _sums(_TALLY.worker), _sums(modules)
    write = terminalreporter.write_line
    terminalreporter.section("seconds by resource (setup + call + teardown)")
    for name, n, seconds in by_resource:
        write(f"{name:<12} {n:>5} tests {seconds:>8.1f} s")
    write("by worker: " + ", ".join(f"{name} {seconds:.0f} s ({n} tests)" for name, n, seconds in by_worker))
    write("longest modules: " + ", ".join(f"{m.rsplit('/', 1)[-1]} {s:.0f} s" for m, _, s in by_module[:8]))
    cache = getattr(config, "cache", None)  # absent under `-p no:cacheprovider`
    if cache is not None:
        cache.set("quiver/durations", {"resource": by_resource, "worker": by_worker, "module": by_module})
