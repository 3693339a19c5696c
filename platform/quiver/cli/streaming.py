"""Streaming commands: `quiver stream` (run the Flink job) and `quiver stream-status` (what it did).

PyFlink lives in its own virtualenv (docs/architecture.md, "Two virtualenvs"), so `quiver stream` runs `quiver.streaming.runner`
with that interpreter: `$QUIVER_STREAM_PYTHON`, else `.venv-stream/bin/python` beside the project or
beside this checkout. SIGINT/SIGTERM are passed on, so Ctrl-C stops the job cleanly (checkpoint kept).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from quiver.catalog.errors import QuiverError
from quiver.cli.common import CatalogOption, ConfigOption, ViewsOption, console, split_names, user_errors
from quiver.config import Config, load_config

_LOG_LEVELS = ("debug", "info", "warning", "error")


StateDirOption = Annotated[Path | None, typer.Option("--state-dir", help="default: <project>/.quiver/stream")]
CheckpointOption = Annotated[Path | None, typer.Option("--checkpoint-dir", help="default: <state-dir>/checkpoints")]


def stream_python(config: Config) -> str:
    """The interpreter that has PyFlink (see the module docstring)."""
    explicit = os.environ.get("QUIVER_STREAM_PYTHON")
    if explicit:
        return explicit
    here = Path(__file__).resolve().parents[3]  # the checkout: platform/quiver/cli/streaming.py
    for base in (Path(config.root), here):
        candidate = base / ".venv-stream" / "bin" / "python"
        if candidate.exists():
            return str(candidate)
    raise QuiverError("no streaming virtualenv found: run `make setup` (builds .venv-stream) or set "
                      "QUIVER_STREAM_PYTHON to a Python with apache-flink installed")


def _has_pyflink() -> bool:
    import importlib.util

    return importlib.util.find_spec("pyflink") is not None


def _run_forwarding_signals(cmd: list[str]) -> int:
    proc = subprocess.Popen(cmd)

    def forward(signum: int, frame: Any) -> None:
        proc.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def print_flink_job(config_path: Path | None, catalog_dir: Path | None, view: str | None, plain: bool) -> None:
    """`quiver compile --target flink`: the streaming job's Flink SQL for the project's state directory."""
    from rich.syntax import Syntax

    from quiver.cli.common import open_project
    from quiver.compile.flink import FlinkTarget, compile_flink, streamed_views
    from quiver.streaming.options import kafka_target
    from quiver.streaming.paths import StreamPaths

    cfg, cat = open_project(config_path, catalog_dir)
    views = [view] if view else [v.name for v in streamed_views(cat)]
    paths = StreamPaths.at(Path(cfg.root) / ".quiver" / "stream")
    sources = {cat.views[v].source for v in views if v in cat.views}
    # The job `quiver stream` would run: Kafka topics when every binding reads one (StreamSpec.reads_kafka).
    bindings = [cat.sources[s].stream for s in sources]
    kafka = bool(bindings) and all(b is not None and b.reads_kafka(cfg.kafka_bootstrap) for b in bindings)
    target = FlinkTarget(inbox={s: paths.inbox(s).as_uri() for s in sources}, sink_root=paths.sinks.as_uri(),
                         kafka=kafka, **kafka_target(cfg, sorted(sources), redact=True))
    script = compile_flink(cat, target, views).script()
    # Shown paths are relative to the project (the runner passes absolute file URIs to Flink itself).
    root_uri = Path(cfg.root).resolve().as_uri().rstrip("/") + "/"
    script = ("-- paths below are relative to the project root; `quiver stream` runs them as absolute URIs\n"
              + script.replace(root_uri, "").replace(str(Path(cfg.root).resolve()) + "/", ""))
    if plain:
        typer.echo(script)
    else:
        console.print(Syntax(script, "sql", theme="ansi_dark", word_wrap=True))


def register(app: typer.Typer) -> None:
    """Add `stream` and `stream-status` to the `quiver` app."""

    @app.command("stream")
    @user_errors
    def stream_command(
        bounded: Annotated[bool, typer.Option(help="read the stream files present, then finish")] = False,
        checkpoint_dir: CheckpointOption = None,
        parallelism: Annotated[int, typer.Option(help="Flink parallelism")] = 1,
        state_dir: StateDirOption = None,
        views: ViewsOption = None,
        fresh: Annotated[bool, typer.Option(help="ignore checkpoints; replay the stream directory")] = False,
        checkpoint_interval_ms: Annotated[int, typer.Option(help="checkpoint (and Redis load) interval")] = 1000,
        state_backend: Annotated[str, typer.Option(help="rocksdb or hashmap")] = "rocksdb",
        mini_batch_ms: Annotated[int, typer.Option(help="mini-batch aggregation latency (0: off)")] = 0,
        max_future_ms: Annotated[int | None, typer.Option(help="events dated later than arrival + this take the "
                                                               "batch route (default: each source's max_future, "
                                                               "5 minutes unless set)")] = None,
        startup: Annotated[str, typer.Option(help="Kafka, a job with no checkpoint to restore: earliest, latest, "
                                                  "group-offsets or timestamp:<epoch ms or ISO-8601>")] = "earliest",
        stream_retention_s: Annotated[float | None, typer.Option(help="delete fed and committed stream files "
                                                                       "older than this")] = None,
        jobmanager: Annotated[str | None, typer.Option(help="HOST:PORT of a Flink session cluster's REST "
                                                             "endpoint (default: flink_jobmanager in quiver.yaml, "
                                                             "else the embedded mini-cluster)")] = None,
        log_level: Annotated[str, typer.Option(help="the job's log lines: debug, info, warning (only problems) "
                                                    "or error")] = "info",
        config: ConfigOption = None, catalog: CatalogOption = None,
    ) -> None:
        """Run the Flink job that keeps the online store fresh from the sources' stream bindings."""
        if parallelism < 1:
            raise QuiverError("--parallelism must be >= 1")
        if log_level.lower() not in _LOG_LEVELS:
            raise QuiverError(f"--log-level must be one of {', '.join(_LOG_LEVELS)}, got {log_level!r}")
        if state_backend not in ("rocksdb", "hashmap"):
            raise QuiverError(f"--state-backend must be rocksdb or hashmap, got {state_backend!r}")
        cfg = load_config(config)
        args = ["--parallelism", str(parallelism), "--checkpoint-interval-ms", str(checkpoint_interval_ms),
                "--state-backend", state_backend, "--mini-batch-ms", str(mini_batch_ms),
                "--startup", startup, "--log-level", log_level.upper()]
        if max_future_ms is not None:
            args += ["--max-future-ms", str(max_future_ms)]
        if stream_retention_s is not None:
            args += ["--stream-retention-s", str(stream_retention_s)]
        if config:
            args += ["--config", str(config.resolve())]
        else:
            args += ["--config", str(Path(cfg.root) / "quiver.yaml")]
        for flag, value in (("--catalog", catalog), ("--state-dir", state_dir), ("--checkpoint-dir", checkpoint_dir)):
            if value is not None:
                args += [flag, str(Path(value).resolve())]
        if split_names(views):
            args += ["--views", ",".join(split_names(views) or [])]
        if jobmanager is not None:
            args += ["--jobmanager", jobmanager]
        if bounded:
            args.append("--bounded")
        if fresh:
            args.append("--fresh")
        if _has_pyflink():
            from quiver.streaming.runner import main

            for library in ("apache_beam", "pyflink"):  # their start-up INFO lines are no news to a user
                logging.getLogger(library).setLevel(max(logging.WARNING, logging.getLevelName(log_level.upper())))
            code = main(args)
        else:
            code = _run_forwarding_signals([stream_python(cfg), "-m", "quiver.streaming.runner", *args])
        if code:
            raise typer.Exit(code)

    @app.command("stream-status")
    @user_errors
    def stream_status_command(
        state_dir: StateDirOption = None, checkpoint_dir: CheckpointOption = None,
        as_json: Annotated[bool, typer.Option("--json", help="print the status as JSON")] = False,
        config: ConfigOption = None,
    ) -> None:
        """Show the streaming job's state, checkpoint, load counts, late and quarantined events."""
        from quiver.streaming.paths import StreamPaths
        from quiver.streaming.status import effective_state, read_status

        cfg = load_config(config)
        paths = StreamPaths.at(state_dir or Path(cfg.root) / ".quiver" / "stream", checkpoint_dir)
        status = read_status(paths)
        if status is None:
            raise QuiverError(f"no streaming job has run with state directory {paths.root}")
        status["state"] = effective_state(status)
        if as_json:
            typer.echo(json.dumps(status, indent=2, sort_keys=True))
            return
        _print_status(status)


def route_lines(status: dict[str, Any]) -> list[str]:
    """What the job read, per route: a Kafka source's records and committed offsets (never "fed 0 lines from 0
    files", the file route's counters, which a Kafka run leaves at zero), the stream files' lines otherwise."""
    kafka = status.get("kafka") or {}
    goal = status.get("kafka_goal") or {}
    lines = []
    for source in sorted(kafka.keys() | goal.keys()):
        topic = kafka.get(source)
        if topic is None:  # the job marked the topic's end but never reported its offsets
            lines.append(f"kafka {source}: {goal[source]:,} records at the topic's end when the job started; "
                         f"no committed offsets reported yet")
            continue
        lines.append(f"kafka {source}: topic {topic.get('topic')}, read {topic.get('committed', 0):,} of "
                     f"{topic.get('end', 0):,} records (offsets committed by the job), lag {topic.get('lag', 0):,}")
    from_files = [s for s in status.get("sources", []) if s not in kafka and s not in goal]
    if from_files or not lines:
        feeder = status.get("feeder") or {}
        lines.append(f"stream files{' of ' + ', '.join(from_files) if from_files else ''}: fed "
                     f"{feeder.get('lines', 0):,} lines from {feeder.get('files', 0):,} files "
                     f"(backlog {feeder.get('backlog', 0)})")
    return lines


def _print_status(status: dict[str, Any]) -> None:
    age = time.time() - float(status.get("updated_at", 0))
    console.print(f"[bold]{status.get('state')}[/bold] ({status.get('mode')}, parallelism "
                  f"{status.get('parallelism')}), job {status.get('job_id') or '-'}, pid {status.get('pid')}, "
                  f"updated {age:.1f} s ago")
    checkpoint = status.get("checkpoint") or {}
    if checkpoint:
        console.print(f"latest checkpoint: {checkpoint.get('path')} "
                      f"({time.time() - float(checkpoint.get('at', 0)):.1f} s ago)")
    if status.get("restored_from"):
        console.print(f"restored from: {status['restored_from']}")
    if status.get("error"):
        console.print(f"[red]error:[/red] {status['error']}")
    if status.get("sink"):
        console.print(f"tiles and last values written by: {status['sink']}")
    loader = status.get("loader") or {}
    for line in route_lines(status):
        console.print(line, highlight=False)
    # With the JVM sink the job writes Redis itself (the line above says so): no change files to count.
    if not str(status.get("sink", "")).startswith("redis") or loader.get("files"):
        console.print(f"loaded {loader.get('files', 0):,} change files, {loader.get('rows', 0):,} rows",
                      highlight=False)
    table = Table("source", "late events", "quarantined", "by reason")
    for source in status.get("sources", []):
        reasons = (loader.get("quarantined") or {}).get(source, {})
        table.add_row(source, f"{(loader.get('late') or {}).get(source, 0):,}", f"{sum(reasons.values()):,}",
                      ", ".join(f"{r} {n}" for r, n in sorted(reasons.items())) or "-")
    console.print(table)
    newest = loader.get("newest_event_us") or {}
    if newest:
        views = Table("view", "newest event loaded (UTC)")
        for view, us in sorted(newest.items()):
            views.add_row(view, time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(us / 1e6)))
        console.print(views)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use `quiver stream`")
