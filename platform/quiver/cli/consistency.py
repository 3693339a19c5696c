"""`quiver consistency`: did training data equal what serving saw? A thin entry point into
`quiver.monitoring.consistency_job`, imported only when the command runs."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from quiver.catalog.errors import QuiverError
from quiver.cli.common import ConfigOption, console, option_time, user_errors

_STYLE = {"ok": "green", "alert": "bold red", "no_rows": "dim"}


def consistency(
    model: Annotated[str | None, typer.Option(help="check the features this model was served (its rows on the "
                                                   "champion and canary arms)")] = None,
    service: Annotated[str | None, typer.Option(help="check this feature service's features (with --model: "
                                                     "only that model's rows)")] = None,
    start: Annotated[str | None, typer.Option(help="serving logs from this ISO time (default: --end minus a day)")]
    = None,
    end: Annotated[str | None, typer.Option(help="serving logs until this ISO time (default: now)")] = None,
    threshold: Annotated[float | None, typer.Option(help="share of compared rows a feature may get wrong "
                                                         "(default: monitoring.yaml, else 0.001)")] = None,
    sample_rows: Annotated[int, typer.Option(help="compare at most this many rows (a fixed-seed sample)")]
    = 100_000,
    max_lag: Annotated[float, typer.Option(help="seconds of stream lag tried as a cause")] = 900.0,
    ttl_margin: Annotated[float, typer.Option(help="seconds around a TTL edge counted as a TTL-boundary cause")]
    = 60.0,
    engine: Annotated[str, typer.Option(help="point-in-time engine: duckdb or spark")] = "duckdb",
    record: Annotated[bool, typer.Option(help="store the run in the registry and raise / resolve alerts")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="print the report as JSON")] = False,
    config: ConfigOption = None,
) -> None:
    """Replay the serving logs of a window through the point-in-time engine and compare, feature by feature,
    what serving returned with what a training set of the same requests holds; exit 1 when a feature gets
    more than its threshold wrong (late events are reported, never counted)."""
    from quiver.config import load_config
    from quiver.monitoring.consistency_job import ConsistencySettings, run_consistency
    from quiver.offline.pit import ENGINES
    from quiver.pipelines.loop_common import Project

    if engine not in ENGINES:
        raise QuiverError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    cfg = load_config(config)
    until = option_time(end, "--end") or datetime.now(UTC)
    since = option_time(start, "--start") or until - timedelta(days=1)
    settings = ConsistencySettings.of_project(cfg, threshold, max_lag_s=max_lag, ttl_margin_s=ttl_margin,
                                              sample_rows=sample_rows, engine=engine)
    project = Project(cfg)  # the registry also says which model version read which feature
    check = run_consistency(cfg, model=model, service=service, start=since, end=until, settings=settings,
                            registry=project.registry, alerts=project.alerts if record else None, record=record)
    report = check.report
    if as_json:
        typer.echo(json.dumps({**report.to_dict(), "run_id": check.run_id}, default=str, indent=2))
    else:
        _print(report)
        if check.run_id is not None:
            console.print(f"recorded as consistency run {check.run_id}")
        for raised in check.alerts:
            console.print(f"alert #{raised.alert.id} {raised.outcome}: {escape(raised.alert.title)}")
    if report.inconsistent:
        raise typer.Exit(1)


def _print(report: Any) -> None:
    console.print(f"{report.subject}: serving logs [{report.window[0]}, {report.window[1]}), "
                  f"{report.rows_compared:,} of {report.rows_logged:,} rows compared "
                  f"(floats equal within a relative {report.rtol:g})", highlight=False, soft_wrap=True)
    table = Table("feature", "status", "compared", "equal", "mismatched", "missing online", "missing offline",
                  "late", "stream lag", "ttl edge", "mat. gap", "unexplained", "wrong", "smape",
                  "lag p99 / objective")
    for f in report.features:
        style = _STYLE.get(f.status, "")
        table.add_row(f.feature, f"[{style}]{f.status}[/]", str(f.compared), str(f.equal), str(f.mismatched),
                      str(f.missing_online), str(f.missing_offline), str(f.late), str(f.causes["stream_lag"]),
                      str(f.causes["ttl_boundary"]), str(f.causes["materialization_gap"]),
                      str(f.causes["unexplained"]), f"{f.wrong} ({f.wrong_rate:.3%})",
                      "-" if f.smape is None else f"{f.smape:.1%}", _freshness(f))
    console.print(table)
    for note in report.notes:
        console.print(f"[dim]{escape(note)}[/dim]", soft_wrap=True)
    bad = report.inconsistent
    stale = [f.feature for f in bad if f.freshness_status == "over"]
    if stale:
        console.print(f"over their freshness objective (p99 lag): {', '.join(stale)}", highlight=False)
    unjudged = [f.feature for f in report.features if f.status == "no_rows"]
    verdict = (f"[bold red]inconsistent[/]: {', '.join(f.feature for f in bad)} over threshold" if bad
               else f"[green]consistent[/]: {len(report.features) - len(unjudged)} feature(s) within their "
                    f"thresholds")
    if unjudged:
        verdict += f"; no rows compared for {', '.join(unjudged)} (not judged)"
    console.print(f"{verdict} ({report.elapsed_s:.1f} s)")


def _freshness(feature: Any) -> str:
    """`12 s / 60 s ok`: the measured p99 lag beside the view's objective ("-" without either)."""
    lag = "-" if feature.lag_p99_s is None else f"{feature.lag_p99_s:g} s"
    if feature.objective_s is None:
        return lag
    return f"{lag} / {feature.objective_s:g} s {feature.freshness_status or ''}".strip()


def register(app: typer.Typer) -> None:
    """Add `quiver consistency` to the `quiver` app."""
    app.command("consistency")(user_errors(consistency))
