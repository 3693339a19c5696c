"""`quiver kafka status|start|stop`: the project's embedded Kafka broker (`quiver.streaming.embedded_kafka`).

The demo starts it to stream through Kafka; like the embedded Redis it outlives the command that started it,
`quiver kafka stop` shuts it down, and `make reset` calls that before deleting `.quiver/`. A stream job reads
it when told its address: `QUIVER_KAFKA_BOOTSTRAP=<bootstrap> quiver stream` (docs/streaming.md).
"""

from __future__ import annotations

import typer

from quiver.cli.common import ConfigOption, console, user_errors
from quiver.config import load_config

kafka_app = typer.Typer(help="The project's embedded Kafka broker: status, start and stop.", no_args_is_help=True)


@kafka_app.command("status")
@user_errors
def kafka_status(config: ConfigOption = None) -> None:
    """Say whether the project's embedded broker is running, and at which address."""
    from quiver.streaming.embedded_kafka import broker_dir, running_broker

    cfg = load_config(config)
    running = running_broker(cfg)
    if running is None:
        console.print(f"no embedded Kafka broker running for project {cfg.project!r}", highlight=False)
    else:
        console.print(f"embedded Kafka broker running (pid {running[0]}) at {running[1]}, data in {broker_dir(cfg)}",
                      highlight=False)


@kafka_app.command("start")
@user_errors
def kafka_start(config: ConfigOption = None) -> None:
    """Start the project's embedded broker (or find it running) and print its bootstrap address."""
    from quiver.streaming.embedded_kafka import start_broker

    bootstrap = start_broker(load_config(config))  # a BrokerError says why not, in one line
    console.print(f"embedded Kafka broker at {bootstrap}; stream through it with "
                  f"QUIVER_KAFKA_BOOTSTRAP={bootstrap}", highlight=False)


@kafka_app.command("stop")
@user_errors
def kafka_stop(config: ConfigOption = None) -> None:
    """Stop the project's embedded broker (its topics stay on disk until `.quiver/` is deleted)."""
    from quiver.streaming.embedded_kafka import stop_embedded_broker

    cfg = load_config(config)
    if stop_embedded_broker(cfg):
        console.print("stopped the embedded Kafka broker", highlight=False)
    else:
        console.print(f"no embedded Kafka broker was running for project {cfg.project!r}", highlight=False)


def register(app: typer.Typer) -> None:
    """Add `quiver kafka …` to the `quiver` app."""
    app.add_typer(kafka_app, name="kafka")
