"""Prometheus gauges over every live serving logger of the process, computed at scrape time."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable
from typing import Any

LIVE: weakref.WeakSet[Any] = weakref.WeakSet()  # every ServingLogger not yet collected


class _BufferCollector:
    """Gauges over every live ServingLogger in the process, computed at scrape time."""

    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import GaugeMetricFamily

        loggers = list(LIVE)
        yield GaugeMetricFamily("quiver_serving_log_buffered_rows", "Serving-log rows waiting to be written",
                                value=sum(x.buffered for x in loggers))
        yield GaugeMetricFamily("quiver_serving_log_buffered_bytes",
                                "Estimated memory of the serving-log rows waiting", value=sum(x.buffered_bytes
                                                                                             for x in loggers))
        yield GaugeMetricFamily("quiver_serving_log_spooled_rows",
                                "Serving-log rows in the local spool, waiting for the store",
                                value=sum(x.spool.rows for x in loggers if x.spool is not None))
        yield GaugeMetricFamily("quiver_serving_log_writable",
                                "0 while a serving log's last write failed or rows wait for a retry",
                                value=0 if any(not x.writable for x in loggers if not x._closed) else 1)


def _register_collector() -> None:
    from prometheus_client import REGISTRY

    with contextlib.suppress(ValueError):  # already registered (a reload of this module)
        REGISTRY.register(_BufferCollector())  # type: ignore[arg-type]


_register_collector()
