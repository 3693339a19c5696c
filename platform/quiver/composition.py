"""Composition roots of the server processes: each builds what its process needs (registry, feature store,
serving logger, alert sinks, settings) from the project's configuration, in one place, and hands it down.
The packages below never build those themselves: serving receives its logger and alert sinks, and so does
not import monitoring (which reads serving's logs and routing, and so sits above it).

    prediction_service(config, model)   a PredictionService for SDK users, replays and tests
    serve_model(model, config_path)     the `quiver serve-model` process
"""

from __future__ import annotations

import logging
from typing import Any

from quiver.catalog.errors import QuiverError
from quiver.config import Config
from quiver.serving.predict_server import create_app, print_swaps
from quiver.serving.prediction import PredictionService
from quiver.serving.runtime import ServerLimits, run_uvicorn
from quiver.serving.store import FeatureStore

log = logging.getLogger("quiver.serving.predict_server")


def alert_manager(config: Config, registry: Any) -> Any:
    """The project's alert manager: its registry and the sinks monitoring.yaml (and the environment) name."""
    from quiver.monitoring.alerts import AlertManager, sinks_from_config
    from quiver.monitoring.settings import load_settings

    return AlertManager(registry, sinks_from_config(load_settings(config).alert_sinks))


def prediction_service(config: Config, model_name: str, *, log: bool = True, store: FeatureStore | None = None,
                       **kwargs: Any) -> PredictionService:
    """A service over `config`'s online store and registry, logging under its store root (closed, and so
    flushed, by `close()`), alerting to the project's alert sinks. Not started: call `start()` for the
    poller and the shadow worker, or `refresh()` to pick up alias moves by hand."""
    from quiver.registry import Registry
    from quiver.registry.models import ModelRegistry
    from quiver.serving.logs import log_schema, logger_for

    registry = Registry(config.registry, project=config.project)
    kwargs.setdefault("alerts", alert_manager(config, registry))
    store = store or FeatureStore(config=config)
    logger = logger_for(config, log_schema(store.catalog)) if log else None
    service = PredictionService(store, model_name, models=ModelRegistry(registry), logger=logger, **kwargs)
    service._owns_logger = log
    return service


def serve_model(model_name: str, config_path: str | None = None, host: str = "127.0.0.1", port: int = 8001, *,
                api_key: str | None = None, poll_interval_s: float = 2.0, shadow_queue_size: int = 256,
                torch_threads: int = 1, micro_batch: bool = False, log_level: str = "warning",
                limits: ServerLimits | None = None, log_flush_interval_s: float = 5.0, say: Any = None,
                off_path: str = "process", off_path_idle: bool = True, pair_canary: bool = True) -> None:
    """Run the prediction server with uvicorn until SIGTERM or SIGINT (serving logs under the store root),
    with the feature server's connection limits (`limits`, default ServerLimits()). A stop finishes the
    requests in flight, then scores the queued shadow work and writes every buffered serving-log row. `say`
    (a print function) hears what it serves at start and every swap of models or routing afterwards. The
    shadow's and the paired scores run in a process of their own (`off_path`, see PredictionService), in
    Linux's idle scheduling class unless `off_path_idle` is False (then at nice 10). `pair_canary` False:
    the champion does not score the canary's rows here; the canary judge replays them from the logs."""
    from quiver.serving.logs import log_schema, logger_for

    if torch_threads > 0:
        import torch

        # Many small concurrent requests: one intra-op thread each beats threads fighting over 2 cores.
        torch.set_num_threads(torch_threads)
    from quiver.registry import Registry
    from quiver.registry.models import ModelRegistry

    store = FeatureStore(config_path)
    registry = Registry(store.config.registry, project=store.config.project)
    alerts = alert_manager(store.config, registry)
    logger = logger_for(store.config, log_schema(store.catalog), flush_interval_s=log_flush_interval_s)
    try:
        service = PredictionService(store, model_name, models=ModelRegistry(registry), alerts=alerts,
                                    poll_interval_s=poll_interval_s, shadow_queue_size=shadow_queue_size,
                                    micro_batch=micro_batch, logger=logger, off_path=off_path,
                                    off_path_idle=off_path_idle, pair_canary=pair_canary)
        app = create_app(service, api_key, limits=limits)
        if not app.state.api_key_required and host not in ("127.0.0.1", "localhost", "::1"):
            raise QuiverError(f"refusing to serve on {host} without an API key: set QUIVER_API_KEY")
        with service:  # on exit: the shadow queue is drained, its rows logged
            if say is not None:
                say(f"serving {model_name} of project {store.config.project!r} on http://{host}:{port}/predict "
                    f"({'X-API-Key required' if app.state.api_key_required else 'no API key'}): "
                    f"{service.arms.describe()}; polling the registry every {poll_interval_s:g} s")
                print_swaps(say)
            stopped_by = run_uvicorn(app, host, port, log_level, limits)
        app.state.gate.close()
    finally:
        logger.close()  # after the service, so the shadow rows it logged while stopping are written too
    if stopped_by is not None:
        child = service.off_path_health().get("serving_log") or {}
        log.warning("stopped by %s: %d serving-log rows written, %d dropped, %d quarantined (and %d shadow and "
                    "paired rows written by the off-path process, %d dropped, %d quarantined)", stopped_by.name,
                    logger.written, logger.dropped, logger.quarantined, child.get("written_rows", 0),
                    child.get("dropped_rows", 0), child.get("quarantined_rows", 0))


