"""`quiver replay`: recorded requests through the prediction service on the simulated clock, so shadow and
canary can be tried on the demo's data without writing Python (registered by `register(app)`)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape

from quiver.catalog.errors import QuiverError
from quiver.cli.common import ConfigOption, console, option_time, user_errors
from quiver.config import load_config


def register(app: typer.Typer) -> None:
    """Add `quiver replay` to the `quiver` CLI."""

    @app.command("replay")
    @user_errors
    def replay_command(
        model: Annotated[str, typer.Argument(help="model name")],
        start: Annotated[str, typer.Option(help="first request time (ISO, inclusive)")],
        end: Annotated[str, typer.Option(help="last request time (ISO, exclusive)")],
        requests: Annotated[str, typer.Option(help="Parquet of recorded requests (transaction_id, user_id, "
                                                   "merchant_id, event_ts)")] = "data/labels/labels.parquet",
        config: ConfigOption = None,
    ) -> None:
        """Score the recorded requests of [start, end) through the prediction service as they happened: one
        call a simulated minute, the online store following the events (every event before a call is in it),
        every arm logged at its request time."""
        from quiver.composition import prediction_service
        from quiver.pipelines.replay import replay
        from quiver.registry import Registry
        from quiver.registry.models import ModelRegistry

        cfg = load_config(config)
        begin, until = option_time(start, "--start"), option_time(end, "--end")
        assert begin is not None and until is not None
        if until <= begin:
            raise QuiverError(f"--end {end} must be after --start {start}")
        if not (cfg.root / requests).exists():
            raise QuiverError(f"{requests} does not exist (run `make demo` or `quiver demo-data` first)")
        ModelRegistry(Registry(cfg.registry, project=cfg.project)).require(model)
        with prediction_service(cfg, model, poll_interval_s=3600) as service:
            console.print(f"replaying {model}: {escape(service.arms.describe())}", highlight=False, soft_wrap=True)
            report = replay(cfg, service, begin, until, path=requests)
        arms = ", ".join(f"{arm} {n:,}" for arm, n in sorted(report.arms.items()) if n)
        console.print(f"served {report.requests:,} requests of [{begin:%Y-%m-%d %H:%M}, {until:%Y-%m-%d %H:%M}) "
                      f"UTC: {arms or 'none'} rows logged ({report.seconds:.1f} s)", highlight=False)
