"""`quiver drift`, `quiver drift-history`, `quiver quality` and `quiver alerts …`: thin entry points into the
top-level `monitoring` package, which is imported only when one of these commands runs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from quiver.catalog.errors import QuiverError
from quiver.cli.common import ConfigOption, console, option_time, user_errors
from quiver.config import CONFIG_FILE, NoProjectError, find_config, load_config, no_project_message

DEFAULT_SAMPLE_ROWS = 20_000  # = quiver.monitoring.evidently_ref.DEFAULT_SAMPLE_ROWS (not imported: keeps the CLI light)
_STATUS_STYLE = {"ok": "green", "warn": "yellow", "alert": "bold red", "insufficient_data": "dim",
                 "skipped": "dim"}


def _split(values: list[str] | None) -> list[str]:
    return [v.strip() for item in values or [] for v in item.split(",") if v.strip()]


def _project(config: Path | None, required: bool = True) -> tuple[Any, bool]:
    """(Config, whether a config file exists); `required=False` for drift of two files, which needs none."""
    cfg = load_config(config, require_project=required)
    return cfg, (cfg.root / CONFIG_FILE).exists()


def _alert_manager(cfg: Any, registry: Any) -> Any:
    from quiver.monitoring.alerts import AlertManager, sinks_from_config
    from quiver.monitoring.settings import load_settings

    try:
        sinks = sinks_from_config(load_settings(cfg).alert_sinks)
    except (TypeError, ValueError) as exc:
        raise QuiverError(f"bad alert sink settings: {exc}") from None
    return AlertManager(registry, sinks)


def drift(
    reference: Annotated[Path | None, typer.Option(help="reference Parquet file or folder (e.g. the training "
                                                        "set); or use --model")] = None,
    current: Annotated[Path | None, typer.Option(help="current Parquet file or folder; or use --model")] = None,
    model: Annotated[str | None, typer.Option(help="compare this model's training reference with the serving "
                                                   "logs of what it scored (instead of --reference/--current)")]
    = None,
    version: Annotated[str | None, typer.Option(help="with --model: version number or alias (default: the "
                                                     "version holding the --arm alias, else the champion)")] = None,
    arm: Annotated[str, typer.Option(help="with --model: champion, canary, shadow or paired")] = "champion",
    start: Annotated[str | None, typer.Option(help="with --model: serving logs from this ISO time")] = None,
    end: Annotated[str | None, typer.Option(help="with --model: serving logs until this ISO time")] = None,
    features: Annotated[list[str] | None, typer.Option(
        "--features", "-f", help="columns to compare (repeat or comma-separate); default: the catalog's features "
                                 "in both files — never join keys, timestamps or labels")] = None,
    service: Annotated[str | None, typer.Option(help="compare this feature service's features")] = None,
    report: Annotated[Path | None, typer.Option(help="write Evidently's HTML report here (+ a summary page)")] = None,
    sample_rows: Annotated[int, typer.Option(help="rows per side drawn for the HTML report's charts (verdicts "
                                                  "always use every row)")] = DEFAULT_SAMPLE_ROWS,
    name: Annotated[str, typer.Option(help="name of this check in the registry and alerts")] = "default",
    numerical: Annotated[str, typer.Option(help="methods for numerical features")] = "psi,ks",
    categorical: Annotated[str, typer.Option(help="methods for categorical features")] = "psi",
    engine: Annotated[str, typer.Option(help="fast (vectorised) or evidently (reference)")] = "fast",
    record: Annotated[bool | None, typer.Option(help="store results in the registry (default: with --model "
                                                     "never, a diagnosis of what was served; else when a "
                                                     "quiver.yaml is present)")] = None,
    alert: Annotated[bool, typer.Option(help="raise/resolve alerts (needs --record)")] = False,
    fail_on_drift: Annotated[bool, typer.Option(help="exit with code 1 when the dataset drifted")] = False,
    config: ConfigOption = None,
) -> None:
    """Compare feature distributions (PSI, KS, …) between a reference and a current dataset, or (--model)
    between a model's training reference and the serving logs of what it scored."""
    from datetime import UTC, datetime

    if model is not None:
        if reference is not None or current is not None:
            raise QuiverError("give either --model or --reference and --current, not both")
        if alert and arm != "champion":  # a canary's alerts would resolve the champion's as "the model changed"
            raise QuiverError(f"--alert works with --arm champion only: a model's drift alerts belong to its "
                              f"champion's reference (the {arm} arm is judged by its rollout or shadow evaluation)")
        _model_drift(model, version, arm, start, end, report=report, sample_rows=sample_rows, record=record,
                     alert=alert, fail_on_drift=fail_on_drift, engine=engine, config=config)
        return
    if reference is None or current is None:
        raise QuiverError("give --reference and --current (Parquet files or folders), or --model NAME")

    from quiver.monitoring.checks import (
        default_drift_columns,
        read_table,
        run_drift_check,
        table_schema,
        time_columns,
        time_window,
    )
    from quiver.monitoring.drift import DriftConfig
    from quiver.monitoring.settings import load_settings

    cfg, has_file = _project(config, required=False)
    if record and config is None and find_config() is None:  # a record belongs in a project's registry,
        raise NoProjectError(no_project_message())          # never in a new ./.quiver/ wherever this ran
    for path in (reference, current):
        if not path.exists():
            raise QuiverError(f"{path} does not exist")
    wanted = _split(features) or None
    started = datetime.now(UTC)
    try:
        drift_config = load_settings(cfg).drift_config(DriftConfig(
            numerical_methods=tuple(_split([numerical])), categorical_methods=tuple(_split([categorical]))))
        schemas = table_schema(reference), table_schema(current)
        if wanted is None:
            chosen = default_drift_columns(_catalog(cfg), schemas[0].names, schemas[1].names, service)
            wanted = chosen.features
            console.print(f"comparing {len(wanted)} columns: {chosen.origin}"
                          + (f"; left out {', '.join(f'{c} ({why})' for c, why in chosen.left_out.items())}"
                             if chosen.left_out else ""), highlight=False, soft_wrap=True)
        missing = [c for c in wanted if c not in schemas[0].names or c not in schemas[1].names]
        if missing:
            raise QuiverError(f"column(s) {', '.join(missing)} not in both {reference} and {current}")
        with _step(f"reading {reference} and {current}"):  # the compared columns and the event time only
            ref_table, cur_table = (read_table(path, list(dict.fromkeys([*wanted, *time_columns(schema)[:1]])))
                                    for path, schema in ((reference, schemas[0]), (current, schemas[1])))
    except (ValueError, KeyError) as exc:
        raise QuiverError(str(exc)) from None
    registry = None
    if record if record is not None else has_file:
        from quiver.registry import Registry

        registry = Registry(cfg.registry, project=cfg.project)
    alerts = _alert_manager(cfg, registry) if alert and registry is not None else None
    try:
        with _step(f"drift of {len(wanted)} features over {ref_table.num_rows:,} + {cur_table.num_rows:,} rows"):
            check = run_drift_check(ref_table, cur_table, name=name, features=wanted, config=drift_config,
                                    registry=registry, alerts=alerts, engine=engine,
                                    reference_label=str(reference), current_label=str(current))
    except ValueError as exc:
        raise QuiverError(str(exc)) from None
    result = check.report
    _print_report(result)
    if check.run_id is not None:
        console.print(f"recorded as drift run {check.run_id} in {cfg.registry}")
    for raised in check.alerts:
        console.print(f"alert #{raised.alert.id} {raised.outcome}: {raised.alert.title}")
    if report is not None:
        from quiver.monitoring.plots import write_drift_reports

        history = None
        if registry is not None:
            from quiver.monitoring.plots import history_from_rows
            from quiver.monitoring.repository import drift_history as feature_history

            rows = [r for f in result.features for r in feature_history(registry, f.feature, name, limit=200)]
            history = history_from_rows(rows)
        compared = [("reference", f"{reference} — {_window(time_window(ref_table), ref_table.num_rows)}"),
                    ("current", f"{current} — {_window(time_window(cur_table), cur_table.num_rows)}"),
                    ("checked at", f"{started:%Y-%m-%d %H:%M:%S} UTC"),
                    ("registry run", str(check.run_id) if check.run_id is not None else "not recorded"),
                    ("alerts", ", ".join(f"#{a.alert.id} ({a.alert.kind} {a.alert.subject})" for a in check.alerts)
                     or "none raised")]
        with _step(f"HTML reports (charts from at most {sample_rows:,} rows per side)"):
            evidently, summary = write_drift_reports(
                result, ref_table, cur_table, report, name=name, config=drift_config, compared=compared,
                alert_ids=[a.alert.id for a in check.alerts], history=history, max_rows=sample_rows,
                title=f"Drift check {name!r}: {current} vs reference {reference}")
        console.print(f"wrote {evidently.path} (Evidently, {len(evidently.drifted)} drifted — the same verdicts) "
                      f"and {summary} (summary)", highlight=False)
    if fail_on_drift and result.dataset_drift:
        raise typer.Exit(1)


def _model_drift(model: str, version: str | None, arm: str, start: str | None, end: str | None, *,
                 report: Path | None, sample_rows: int, record: bool | None, alert: bool, fail_on_drift: bool,
                 engine: str, config: Path | None) -> None:
    """`quiver drift --model`: the version's training reference vs the serving-log rows it scored on `arm`."""
    from quiver.monitoring.checks import run_drift_check
    from quiver.pipelines.loop_common import Project
    from quiver.pipelines.loop_drift import serving_drift_inputs, window_label

    cfg, _ = _project(config)
    project = Project(cfg)
    begin, until = option_time(start, "--start"), option_time(end, "--end")
    inputs = serving_drift_inputs(project, model, version=version, arm=arm, start=begin, end=until)
    label = inputs.version.label
    first, last = inputs.first_served, inputs.last_served
    assert first is not None and last is not None
    window = (begin or first, until or last)
    console.print(f"comparing {label}'s training reference ({inputs.reference.num_rows:,} rows) with the "
                  f"{inputs.current.num_rows:,} rows it scored on arm {arm!r}, served {first:%Y-%m-%d %H:%M} … "
                  f"{last:%Y-%m-%d %H:%M} UTC; {len(inputs.features)} columns incl. score", highlight=False,
                  soft_wrap=True)
    # Only with --record: the drift DAG records the runs the loop acts on; a diagnosis recorded too would show
    # in the console as a second run of the same window.
    if alert and not record:
        raise QuiverError("--alert needs --record (alerts are raised from recorded drift runs)")
    registry = project.registry if record else None
    alerts = project.alerts if alert and registry is not None else None
    try:
        from quiver.monitoring.settings import load_settings

        check = run_drift_check(inputs.reference, inputs.current, name=model, features=inputs.features,
                                config=load_settings(project.config).drift_config(),
                                registry=registry, alerts=alerts, engine=engine,
                                reference_label=f"{label} reference", current_label=window_label(*window))
    except ValueError as exc:
        raise QuiverError(str(exc)) from None
    _print_report(check.report)
    if check.run_id is not None:
        console.print(f"recorded as drift run {check.run_id}")
    if report is not None:
        from quiver.monitoring.plots import write_drift_reports

        compared = [("model", f"{label} on arm {arm}"),
                    ("reference", f"{label}'s training reference (its training window, hour by hour), {inputs.reference.num_rows:,} rows"),
                    ("current", f"serving logs [{window[0]:%Y-%m-%d %H:%M}, {window[1]:%Y-%m-%d %H:%M}) UTC, "
                                f"{inputs.current.num_rows:,} rows"),
                    ("registry run", str(check.run_id) if check.run_id is not None else "not recorded")]
        evidently, summary = write_drift_reports(
            check.report, inputs.reference, inputs.current, report, name=model, compared=compared,
            alert_ids=[a.alert.id for a in check.alerts], max_rows=sample_rows,
            title=f"Drift of {label} ({arm} arm): training reference vs serving logs "
                  f"[{window[0]:%Y-%m-%d %H:%M}, {window[1]:%Y-%m-%d %H:%M}) UTC")
        console.print(f"wrote {evidently.path} (Evidently) and {summary} (summary)", highlight=False)
    if fail_on_drift and check.report.dataset_drift:
        raise typer.Exit(1)


def _catalog(cfg: Any, directory: Path | None = None) -> Any:
    """The applied catalog version (the registry's), as every reader uses; disk only before a first apply."""
    from quiver.registry.repository import load_applied_catalog

    return load_applied_catalog(cfg, directory).catalog


def _window(bounds: tuple[Any, Any] | None, rows: int) -> str:
    if bounds is None:
        return f"{rows:,} rows (no timestamp column)"
    return f"{rows:,} rows, {bounds[0]:%Y-%m-%d %H:%M} → {bounds[1]:%Y-%m-%d %H:%M} UTC"


@contextmanager
def _step(what: str) -> Iterator[None]:
    """A spinner while a long step runs, then one line saying how long it took."""
    started = time.perf_counter()
    with console.status(f"{what} …"):
        yield
    console.print(f"[dim]{what}: {time.perf_counter() - started:.1f} s[/dim]", highlight=False)


def _print_report(report: Any) -> None:
    names = sorted({k for f in report.features for k in f.scores if k != "psi_bins"})
    table = Table("feature", "kind", "status", *names, "n ref", "n cur", "nulls", "why")
    for f in report.features:
        style = _STATUS_STYLE.get(f.status, "")
        table.add_row(f.feature, f.kind, f"[{style}]{f.status}[/]" if style else f.status,
                      *[(_pvalue if k.endswith("pvalue") else _fmt)(f.scores.get(k)) for k in names],
                      str(f.n_ref), str(f.n_cur),
                      f"{f.nulls_ref}/{f.nulls_cur}", "; ".join(f.reasons))
    console.print(table)
    verdict = "[bold red]dataset drift[/]" if report.dataset_drift else "[green]no dataset drift[/]"
    console.print(f"{verdict}: {len(report.drifted)} of {len(report.judged)} judged features drifted "
                  f"({report.rule}); {report.engine} engine, {report.elapsed_s:.2f} s")


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if value != 0 and abs(value) < 1e-3 else f"{value:.4f}"


def _pvalue(value: float | None) -> str:
    """A p-value readably: 4 decimals down to 1e-4, then scientific; one that underflowed to 0 as a bound."""
    if value is None:
        return "-"
    if value == 0:
        return "< 1e-300"
    return f"{value:.1e}" if value < 1e-4 else f"{value:.4f}"


def _data_side(current: str) -> str:
    """The data a drift run's current side covered: the serving-log window as `MM-DD HH:MM → MM-DD HH:MM`,
    else its label as recorded (a path, a dataset name)."""
    import re
    from datetime import datetime

    match = re.fullmatch(r"serving_logs\[([^,]+),([^)]+)\)", current)
    if match is None:
        return current or "-"
    start, end = (datetime.fromisoformat(t) for t in match.groups())
    return f"serving logs {start:%Y-%m-%d %H:%M} → {end:%Y-%m-%d %H:%M}"


def drift_history(feature: Annotated[str, typer.Argument(help="feature name")],
                  name: Annotated[str | None, typer.Option(help="only checks with this name")] = None,
                  png: Annotated[Path | None, typer.Option(help="also draw PSI over time into this PNG")] = None,
                  config: ConfigOption = None) -> None:
    """Show a feature's drift scores over time, from the registry."""
    from quiver.monitoring.repository import drift_history as history
    from quiver.registry import Registry

    cfg, _ = _project(config)
    rows = history(Registry(cfg.registry, project=cfg.project), feature, name)
    if not rows:
        raise QuiverError(f"no drift results for feature {feature!r} in project {cfg.project!r}")
    table = Table("data (current side)", "reference", "check", "status", "psi", "ks D", "ks p", "n ref", "n cur",
                  "computed at (wall)")
    for r in rows:
        table.add_row(_data_side(str(r.get("run_current") or "")), str(r.get("run_reference") or "-"), r["run_name"],
                      r["status"], _fmt(r["psi"]), _fmt(r["ks_statistic"]), _pvalue(r["ks_pvalue"]), f"{r['n_ref']:,}",
                      f"{r['n_cur']:,}", f"{r['computed_at']:%Y-%m-%d %H:%M:%S}")
    console.print(table)
    if png is not None:
        from quiver.monitoring.plots import history_from_rows, psi_history_png

        png.write_bytes(psi_history_png(history_from_rows(rows)))
        console.print(f"wrote {png}")


def estimates(model: Annotated[str, typer.Argument(help="model name")],
              metric: Annotated[str, typer.Option(help="roc_auc, log_loss, brier, precision, recall, f1, accuracy")]
              = "roc_auc",
              arm: Annotated[str | None, typer.Option(help="champion, shadow or canary (default: every arm)")] = None,
              config: ConfigOption = None) -> None:
    """A model's daily performance estimated without labels (CBPE), beside the realized value once labels came."""
    from quiver.monitoring.estimate_records import estimate_errors, estimates_of
    from quiver.monitoring.performance_estimation import METRICS
    from quiver.registry import Registry

    if metric not in METRICS:
        raise QuiverError(f"--metric {metric!r} is not estimated; choose one of {', '.join(METRICS)}")
    cfg, _ = _project(config)
    rows = estimates_of(Registry(cfg.registry, project=cfg.project), model, arm=arm, metric=metric)
    if not rows:
        raise QuiverError(f"no performance estimates of {model!r}" + (f" on the {arm} arm" if arm else "")
                          + ": the loop's daily drift check estimates each arm's day once it serves traffic")
    table = Table("data window (UTC)", "arm", "version", "rows", "estimate [95 % band]", "reference", "realized",
                  "labelled", "error", "in band", title=f"{model}: {metric} estimated without labels, and realized")
    for r in rows:
        band = (f"{r['estimate']:.4f} [{r['lower']:.4f}, {r['upper']:.4f}]" if r["estimate"] is not None
                else f"not estimated: {r['detail'].get('reason') or r['status']}")
        table.add_row(f"{r['window_start']:%m-%d %H:%M} → {r['window_end']:%m-%d %H:%M}", r["arm"], r["version"],
                      f"{r['rows']:,}", band, _fmt(r["reference"]), _fmt(r["realized"]),
                      f"{r['realized_rows']:,}" if r["realized_rows"] else "no labels yet",
                      f"{r['error']:+.4f}" if r["error"] is not None else "–",
                      {True: "yes", False: "NO", None: "–"}[r["within_band"]])
    console.print(table)
    for name, summary in estimate_errors(rows).items():
        if summary["windows"]:
            console.print(f"{name}: {summary['windows']} window(s) with labels, mean |estimate − realized| "
                          f"{summary['mean_abs_error']:.4f}, largest {summary['max_abs_error']:.4f}; the band held "
                          f"the realized value in {summary['within_band']:.0%} of them", highlight=False)


def quality(source: Annotated[str, typer.Argument(help="catalog source the batch belongs to")],
            batches: Annotated[list[Path], typer.Argument(help="Parquet file(s) to validate")],
            on_failure: Annotated[str | None, typer.Option(help="continue or stop (default: settings)")] = None,
            config: ConfigOption = None,
            catalog: Annotated[Path | None, typer.Option("--catalog", help="catalog directory")] = None) -> None:
    """Validate batches by hand with the source's Great Expectations suite: report, and write the bad rows of a
    failing batch to quarantine. The files stay where they are (only the pipeline's ingest gate,
    `QualityGate.gate`, moves a failing batch out of the offline path)."""
    from quiver.monitoring.quality import QualityGate, QualityGateError
    from quiver.monitoring.settings import load_settings
    from quiver.registry import Registry

    cfg, _ = _project(config)
    settings = load_settings(cfg)
    cat = _catalog(cfg, catalog)
    alerts = _alert_manager(cfg, Registry(cfg.registry, project=cfg.project))
    gate = QualityGate(cat, quarantine_dir=settings.quarantine_dir, expectations_dir=settings.expectations_dir,
                       on_failure=on_failure or settings.on_failure, alerts=alerts)
    failures = 0
    for batch in batches:
        if not batch.exists():
            raise QuiverError(f"{batch} does not exist")
        try:
            result = gate.check(batch, source)
        except QualityGateError as exc:
            console.print(f"[bold red]stopped[/]: {exc}")
            raise typer.Exit(1) from None
        if result.success and result.n_bad_rows:
            console.print(f"[green]passed[/] {batch} ({result.n_rows} rows, {result.elapsed_s:.2f} s): "
                          f"{result.n_bad_rows} row(s) fail a check, within the share the source tolerates "
                          f"({result.n_bad_rows / max(1, result.n_rows):.2%}); the backfill and the streaming job "
                          f"quarantine them", highlight=False, soft_wrap=True)
        elif result.success:
            console.print(f"[green]passed[/] {batch} ({result.n_rows} rows, {result.elapsed_s:.2f} s)")
        else:
            failures += 1
            failed = ", ".join(f"{f['type']}({f['column'] or ''})" for f in result.failed)
            console.print(f"[red]failed[/] {batch}: {result.n_bad_rows}/{result.n_rows} bad rows; {failed}; "
                          f"bad rows and validation page written to {result.quarantine_path}; {batch} left in "
                          f"place", highlight=False, soft_wrap=True)
    if failures:
        raise typer.Exit(1)


alerts_app = typer.Typer(help="List, show, resolve and redeliver monitoring alerts.", no_args_is_help=True)


@alerts_app.command("list")
@user_errors
def alerts_list(all_: Annotated[bool, typer.Option("--all", help="include resolved alerts")] = False,
                kind: Annotated[str | None, typer.Option(help="only this kind")] = None,
                config: ConfigOption = None) -> None:
    """List open (or all) alerts with their delivery status."""
    from quiver.monitoring.repository import list_alerts
    from quiver.registry import Registry

    cfg, _ = _project(config)
    # Both clocks: the data time the alert is about, and when it was last raised (wall clock).
    table = Table("id", "kind", "subject", "severity", "status", "seen", "delivery", "data time", "last seen",
                  "title")
    for a in list_alerts(Registry(cfg.registry, project=cfg.project), None if all_ else "open", kind):
        table.add_row(str(a.id), a.kind, a.subject, a.severity, a.status, str(a.occurrences), a.delivery_status,
                      f"{a.data_time:%Y-%m-%d %H:%M}", f"{a.last_seen_at:%Y-%m-%d %H:%M}", a.title)
    console.print(table)


@alerts_app.command("resolve")
@user_errors
def alerts_resolve(alert_id: Annotated[int, typer.Argument(help="alert id")], config: ConfigOption = None) -> None:
    """Resolve an open alert by id."""
    from quiver.monitoring.repository import resolve_alerts
    from quiver.registry import Registry

    cfg, _ = _project(config)
    if not resolve_alerts(Registry(cfg.registry, project=cfg.project), "", alert_id=alert_id,
                          reason="resolved by hand"):
        raise QuiverError(f"no open alert {alert_id}")
    console.print(f"resolved alert {alert_id}")


@alerts_app.command("show")
@user_errors
def alerts_show(alert_id: Annotated[int, typer.Argument(help="alert id")], config: ConfigOption = None) -> None:
    """One alert and its history: every state change, why, with the data time it was about and when."""
    from rich.markup import escape

    from quiver.monitoring.repository import alert_history, get_alert
    from quiver.registry import Registry

    cfg, _ = _project(config)
    registry = Registry(cfg.registry, project=cfg.project)
    try:
        alert = get_alert(registry, alert_id)
    except KeyError:
        raise QuiverError(f"no alert {alert_id}") from None
    console.print(escape(f"alert #{alert.id} [{alert.severity}] {alert.status}: {alert.title}"), highlight=False)
    console.print(f"{alert.kind} {alert.subject} · seen {alert.occurrences}× · data time "
                  f"{alert.data_time:%Y-%m-%d %H:%M} UTC · opened {alert.created_at:%Y-%m-%d %H:%M} UTC"
                  + (f" · resolved {alert.resolved_at:%Y-%m-%d %H:%M} UTC" if alert.resolved_at else ""),
                  highlight=False, soft_wrap=True)
    if alert.message:
        console.print(escape(alert.message), highlight=False, soft_wrap=True)
    table = Table("event", "severity", "data time", "recorded", "why", title="history (data time: what it was "
                  "about; recorded: wall clock, UTC)")
    for e in alert_history(registry, alert_id):
        table.add_row(e.event, e.severity, f"{e.as_of:%Y-%m-%d %H:%M}" if e.as_of else "–",
                      f"{e.at:%Y-%m-%d %H:%M:%S}", escape(e.reason))
    console.print(table if table.row_count else "no history recorded (raised before alert events were kept)")


@alerts_app.command("redeliver")
@user_errors
def alerts_redeliver(config: ConfigOption = None) -> None:
    """Retry deliveries that are pending or failed."""
    from quiver.registry import Registry

    cfg, _ = _project(config)
    manager = _alert_manager(cfg, Registry(cfg.registry, project=cfg.project))
    console.print(f"delivered {manager.redeliver()} pending alert deliveries")


def register(app: typer.Typer) -> None:
    """Add the monitoring commands to the `quiver` app."""
    app.command("drift")(user_errors(drift))
    app.command("drift-history")(user_errors(drift_history))
    app.command("estimates")(user_errors(estimates))
    app.command("quality")(user_errors(quality))
    app.add_typer(alerts_app, name="alerts")
