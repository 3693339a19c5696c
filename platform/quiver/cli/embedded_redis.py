"""`quiver redis status|stop`: the project's embedded Redis (started on demand when `redis_url` is empty), and
what `status` says of a configured Redis Cluster (its nodes, slots, keys and memory).

The embedded server is a daemon that outlives the command that started it, so every later command sees the
same online store; `quiver redis stop` shuts it down (it saves a snapshot first), and `make reset` calls it
before deleting `.quiver/`.
"""

from __future__ import annotations

import typer

from quiver.cli.common import ConfigOption, console, user_errors
from quiver.config import load_config

redis_app = typer.Typer(help="The project's embedded Redis (status, stop), or its Redis Cluster (status).",
                        no_args_is_help=True)


@redis_app.command("status")
@user_errors
def redis_status(config: ConfigOption = None) -> None:
    """Say whether the embedded Redis is running (or which external Redis is configured); for a Redis Cluster,
    every node: role, slots, keys, memory."""
    from quiver.online.cluster_wire import is_cluster_url
    from quiver.online.embedded import embedded_dir, running_pid

    cfg = load_config(config)
    if is_cluster_url(cfg.redis_url):
        _cluster_status(cfg.redis_url, cfg.project, cfg.redis_timeout_s)
        return
    if cfg.redis_url:
        console.print("redis_url is set: Quiver uses that server and runs no embedded Redis", highlight=False)
        return
    pid = running_pid(cfg)
    if pid is None:
        console.print(f"no embedded Redis running for project {cfg.project!r}", highlight=False)
    else:
        console.print(f"embedded Redis running (pid {pid}), data in {embedded_dir(cfg)}", highlight=False)


@redis_app.command("stop")
@user_errors
def redis_stop(config: ConfigOption = None) -> None:
    """Stop the project's embedded Redis (a snapshot is saved; the next command that needs it restarts it)."""
    from quiver.online.embedded import embedded_dir, stop_embedded

    cfg = load_config(config)
    if cfg.redis_url:
        console.print("redis_url is set: there is no embedded Redis to stop", highlight=False)
        return
    if stop_embedded(cfg):
        console.print("stopped the embedded Redis", highlight=False)
    else:  # a pidfile naming another project's server (a copied project) is no reason to stop it
        console.print(f"no embedded Redis was running for project {cfg.project!r} (none answers on its socket "
                      f"in {embedded_dir(cfg)})", highlight=False)


def _cluster_status(url: str, project: str, timeout_s: float) -> None:
    from rich.table import Table

    from quiver.online.redis_cluster import RedisClusterOnlineStore
    from quiver.online.redis_store import redact_url

    store = RedisClusterOnlineStore(url, project, timeout_s=max(timeout_s, 1.0))
    try:
        nodes = store.cluster_nodes()
    finally:
        store.close()
    table = Table("node", "role", "slots", "keys", "memory", title=f"Redis Cluster {redact_url(url)}")
    for node in nodes:
        memory = "-" if node["used_memory"] is None else f"{node['used_memory'] / 2**20:.1f} MiB"
        table.add_row(node["address"], node["role"] + (" (failed)" if node["failed"] else ""),
                      str(node["slots"]), "-" if node["keys"] is None else str(node["keys"]), memory)
    console.print(table)
    masters = [n for n in nodes if n["role"] == "master" and not n["failed"]]
    console.print(f"{len(masters)} masters serve {sum(n['slots'] for n in masters)} of 16384 slots", highlight=False)


def register(app: typer.Typer) -> None:
    """Add `quiver redis …` to the `quiver` app."""
    app.add_typer(redis_app, name="redis")
