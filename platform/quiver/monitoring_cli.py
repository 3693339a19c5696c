"""`quiver drift`, `quiver drift-history`, `quiver quality` and `quiver alerts …`: thin entry points into the
top-level `monitoring` package, which is imported only when one of these commands runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from quiver.catalog.errors import QuiverError
from quiver.cli import ConfigOption, console, user_errors
from quiver.config import CONFIG_FILE, load_config

_STATUS_STYLE = {"ok": "green", "warn": "yellow", "alert": "bold red", "insufficient_data": "dim",
                 "skipped": "dim"}


def _split(values: list[str] | None) -> list[str]:
    return [v.strip() for item in values or [] for v in item.split(",") if v.strip()]


def _project(config: Path | None) -> tuple[Any, bool]:
    """(Config, whether a config file exists)."""
    cfg = load_config(config)
    return cfg, (cfg.root / CONFIG_FILE).exists()


def _alert_manager(cfg: Any, registry: Any) -> Any:
    from monitoring.alerts import AlertManager, sinks_from_config
    from monitoring.settings import load_settings

    try:
        sinks = sinks_from_config(load_settings(cfg).alert_sinks)
    except (TypeError, ValueError) as exc:
        raise QuiverError(f"bad alert sink settings: {exc}") from None
    return AlertManager(registry, sinks)


def drift(
    reference: Annotated[Path, typer.Option(help="reference Parquet file or folder (e.g. the training set)")],
    current: Annotated[Path, typer.Option(help="current Parquet file or folder (e.g. recent serving logs)")],
    features: Annotated[list[str] | None, typer.Option("--features", "-f",
                                                        help="features to compare (repeat or comma-separate)")] = None,
    report: Annotated[Path | None, typer.Option(help="write Evidently's HTML report here (+ a summary page)")] = None,
    name: Annotated[str, typer.Option(help="name of this check in the registry and alerts")] = "default",
    numerical: Annotated[str, typer.Option(help="methods for numerical features")] = "psi,ks",
    categorical: Annotated[str, typer.Option(help="methods for categorical features")] = "psi",
    engine: Annotated[str, typer.Option(help="fast (vectorised) or evidently (reference)")] = "fast",
    record: Annotated[bool | None, typer.Option(help="store results in the registry "
                                                     "(default: when a quiver.yaml is present)")] = None,
    alert: Annotated[bool, typer.Option(help="raise/resolve alerts (needs --record)")] = False,
    fail_on_drift: Annotated[bool, typer.Option(help="exit with code 1 when the dataset drifted")] = False,
    config: ConfigOption = None,
) -> None:
    """Compare feature distributions (PSI, KS, …) between a reference and a current dataset."""
    from monitoring.checks import read_table, run_drift_check
    from monitoring.drift import DriftConfig

    cfg, has_file = _project(config)
    for path in (reference, current):
        if not path.exists():
            raise QuiverError(f"{path} does not exist")
    wanted = _split(features) or None
    try:
        drift_config = DriftConfig(numerical_methods=tuple(_split([numerical])),
                                   categorical_methods=tuple(_split([categorical])))
        ref_table, cur_table = read_table(reference, wanted), read_table(current, wanted)
    except (ValueError, KeyError) as exc:
        raise QuiverError(str(exc)) from None
    registry = None
    if record if record is not None else has_file:
        from quiver.registry import Registry

        registry = Registry(cfg.registry, project=cfg.project)
    alerts = _alert_manager(cfg, registry) if alert and registry is not None else None
    try:
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
        from monitoring.evidently_ref import evidently_html
        from monitoring.plots import summary_page

        history = None
        if registry is not None:
            from monitoring.plots import history_from_rows
            from monitoring.repository import drift_history as feature_history

            rows = [r for f in result.features for r in feature_history(registry, f.feature, name, limit=200)]
            history = history_from_rows(rows)
        evidently_html(ref_table, cur_table, [f.feature for f in result.features], report, drift_config)
        summary = summary_page(result, ref_table, cur_table, report.with_name(f"{report.stem}.summary.html"),
                               title=f"Drift: {name}", evidently_report=report.name, history=history)
        console.print(f"wrote {report} (Evidently) and {summary} (summary)")
    if fail_on_drift and result.dataset_drift:
        raise typer.Exit(1)


def _print_report(report: Any) -> None:
    names = sorted({k for f in report.features for k in f.scores if k != "psi_bins"})
    table = Table("feature", "kind", "status", *names, "n ref", "n cur", "nulls", "why")
    for f in report.features:
        style = _STATUS_STYLE.get(f.status, "")
        table.add_row(f.feature, f.kind, f"[{style}]{f.status}[/]" if style else f.status,
                      *[_fmt(f.scores.get(k)) for k in names], str(f.n_ref), str(f.n_cur),
                      f"{f.nulls_ref}/{f.nulls_cur}", "; ".join(f.reasons))
    console.print(table)
    verdict = "[bold red]dataset drift[/]" if report.dataset_drift else "[green]no dataset drift[/]"
    console.print(f"{verdict}: {len(report.drifted)} of {len(report.judged)} judged features drifted "
                  f"(share {report.drift_share:.0%}, threshold {report.drift_share_threshold:.0%}); "
                  f"{report.engine} engine, {report.elapsed_s:.2f} s")


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if value != 0 and abs(value) < 1e-3 else f"{value:.4f}"


def drift_history(feature: Annotated[str, typer.Argument(help="feature name")],
                  name: Annotated[str | None, typer.Option(help="only checks with this name")] = None,
                  png: Annotated[Path | None, typer.Option(help="also draw PSI over time into this PNG")] = None,
                  config: ConfigOption = None) -> None:
    """Show a feature's drift scores over time, from the registry."""
    from monitoring.repository import drift_history as history
    from quiver.registry import Registry

    cfg, _ = _project(config)
    rows = history(Registry(cfg.registry, project=cfg.project), feature, name)
    if not rows:
        raise QuiverError(f"no drift results for feature {feature!r} in project {cfg.project!r}")
    table = Table("computed at", "check", "status", "psi", "ks D", "ks p", "n ref", "n cur")
    for r in rows:
        table.add_row(f"{r['computed_at']:%Y-%m-%d %H:%M:%S}", r["run_name"], r["status"], _fmt(r["psi"]),
                      _fmt(r["ks_statistic"]), _fmt(r["ks_pvalue"]), str(r["n_ref"]), str(r["n_cur"]))
    console.print(table)
    if png is not None:
        from monitoring.plots import history_from_rows, psi_history_png

        png.write_bytes(psi_history_png(history_from_rows(rows)))
        console.print(f"wrote {png}")


def quality(source: Annotated[str, typer.Argument(help="catalog source the batch belongs to")],
            batches: Annotated[list[Path], typer.Argument(help="Parquet file(s) to validate")],
            on_failure: Annotated[str | None, typer.Option(help="continue or stop (default: settings)")] = None,
            config: ConfigOption = None,
            catalog: Annotated[Path | None, typer.Option("--catalog", help="catalog directory")] = None) -> None:
    """Validate batches with the source's Great Expectations suite; quarantine the ones that fail."""
    from monitoring.quality import QualityGate, QualityGateError
    from monitoring.settings import load_settings
    from quiver.catalog.loader import load_catalog
    from quiver.registry import Registry

    cfg, _ = _project(config)
    settings = load_settings(cfg)
    cat = load_catalog(catalog or cfg.catalog_dir, root=cfg.root)
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
        if result.success:
            console.print(f"[green]passed[/] {batch} ({result.n_rows} rows, {result.elapsed_s:.2f} s)")
        else:
            failures += 1
            failed = ", ".join(f"{f['type']}({f['column'] or ''})" for f in result.failed)
            console.print(f"[red]failed[/] {batch}: {result.n_bad_rows}/{result.n_rows} bad rows; {failed}; "
                          f"quarantined at {result.quarantine_path}")
    if failures:
        raise typer.Exit(1)


alerts_app = typer.Typer(help="List, resolve and redeliver monitoring alerts.", no_args_is_help=True)


@alerts_app.command("list")
@user_errors
def alerts_list(all_: Annotated[bool, typer.Option("--all", help="include resolved alerts")] = False,
                kind: Annotated[str | None, typer.Option(help="only this kind")] = None,
                config: ConfigOption = None) -> None:
    """List open (or all) alerts with their delivery status."""
    from monitoring.repository import list_alerts
    from quiver.registry import Registry

    cfg, _ = _project(config)
    table = Table("id", "kind", "subject", "severity", "status", "seen", "delivery", "last seen", "title")
    for a in list_alerts(Registry(cfg.registry, project=cfg.project), None if all_ else "open", kind):
        table.add_row(str(a.id), a.kind, a.subject, a.severity, a.status, str(a.occurrences), a.delivery_status,
                      f"{a.last_seen_at:%Y-%m-%d %H:%M}", a.title)
    console.print(table)


@alerts_app.command("resolve")
@user_errors
def alerts_resolve(alert_id: Annotated[int, typer.Argument(help="alert id")], config: ConfigOption = None) -> None:
    """Resolve an open alert by id."""
    from monitoring.repository import resolve_alerts
    from quiver.registry import Registry

    cfg, _ = _project(config)
    if not resolve_alerts(Registry(cfg.registry, project=cfg.project), "", alert_id=alert_id):
        raise QuiverError(f"no open alert {alert_id}")
    console.print(f"resolved alert {alert_id}")


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
    app.command("quality")(user_errors(quality))
    app.add_typer(alerts_app, name="alerts")
