"""`quiver` command line: catalog commands here; batch and serving commands register from their modules.

User errors (QuiverError) print as one red line per problem and exit with code 2, never a traceback.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from quiver.catalog.errors import QuiverError, did_you_mean
from quiver.catalog.ir import Catalog
from quiver.catalog.types import duration_label, is_identifier
from quiver.cli.common import (
    PROMOTE_HINT,
    ROLLBACK_HINT,
    CatalogOption,
    ConfigOption,
    _error,
    catalog_label,
    hinted_group,
    open_applied,
    open_disk_project,
    open_registry,
    user_errors,
)
from quiver.cli.common import console as console  # the one console: the demo and the tests print through it
from quiver.cli.common import err_console as err_console
from quiver.config import CONFIG_FILE, DEFAULT_CONFIG_TEXT, Config, load_config

app = typer.Typer(help="Quiver: define features once; backfill, stream and serve them.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False,
                  context_settings={"help_option_names": ["-h", "--help"]},  # inherited by every command
                  cls=hinted_group({"promote": PROMOTE_HINT, "rollback": ROLLBACK_HINT}))


def _flags_without_metavars() -> None:
    # Typer's rich help prints a value type ("<bool>") beside flags such as --record/--no-record and --help,
    # which take no value; show nothing there instead.
    from typer.core import TyperOption

    original = getattr(TyperOption, "display_type_rich", None)
    if original is None or getattr(original, "_quiver_flags", False):
        return

    def display_type_rich(self: Any, ctx: Any) -> str | None:
        return None if getattr(self, "is_flag", False) else original(self, ctx)

    display_type_rich._quiver_flags = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_flags_without_metavars()


def _show_version(value: bool) -> None:
    if value:
        from quiver import __version__

        typer.echo(f"quiver {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", help="print the version and exit",
                                                 is_eager=True, callback=_show_version)] = False) -> None:
    """Quiver: define features once; backfill, stream and serve them."""


@app.command()
@user_errors
def init(directory: Annotated[Path, typer.Argument(help="project directory")] = Path("."),
         project: Annotated[str, typer.Option(help="project name")] = "default") -> None:
    """Create quiver.yaml and an empty feature_defs/ in DIRECTORY."""
    if not is_identifier(project):
        raise QuiverError(f"project name {project!r} must be a plain identifier (letters, digits, _)")
    directory.mkdir(parents=True, exist_ok=True)
    config_file = directory / CONFIG_FILE
    if config_file.exists():
        raise QuiverError(f"{config_file} already exists")
    config_file.write_text(DEFAULT_CONFIG_TEXT.format(project=project))
    (directory / "feature_defs").mkdir(exist_ok=True)
    console.print(f"created {config_file} and {directory / 'feature_defs'}/ — add definitions, then `quiver apply`")


@app.command()
@user_errors
def plan(config: ConfigOption = None, catalog: CatalogOption = None,
         allow_empty: Annotated[bool, typer.Option("--allow-empty", help="plan removing every definition")] = False,
         ) -> None:
    """Validate the catalog on disk and show what `apply` would change (and what needs a backfill)."""
    cfg, cat = open_disk_project(config, catalog)
    registry = open_registry(cfg)
    current = registry.latest()
    diff = registry.plan(cat)
    _print_diff(diff)
    _refuse_empty(cfg, cat, current, allow_empty)
    if not diff.is_empty:
        for view, why in _needs_backfill(current[2] if current else None, cat.to_dict()):
            console.print(f"needs a backfill: view {view} ({why})", highlight=False)
        console.print(f"`quiver apply` would store catalog version {(current[0] if current else 0) + 1} "
                      f"of project {cfg.project!r}", highlight=False)


def _refuse_empty(cfg: Config, cat: Catalog, current: Any, allow_empty: bool) -> None:
    # An empty folder (a wrong --catalog, a checkout in progress) would silently delete every definition.
    if allow_empty or any(cat.by_kind().values()):
        return
    held = sum(len(specs) for specs in current[2].values()) if current else 0
    raise QuiverError(f"{cfg.catalog_dir} holds no definitions: applying it would remove all {held} definitions "
                      f"of catalog version {current[0] if current else 0}; pass --allow-empty if that is meant")


_NOT_OFFLINE = {"description", "owner", "tags", "online"}  # changes that leave the stored values valid


def _needs_backfill(old: Any, new: dict[str, Any]) -> list[tuple[str, str]]:
    """(view, reason) for views whose offline values the change invalidates or that have none yet."""
    before = (old or {}).get("feature_view", {})
    out = []
    for name, spec in new.get("feature_view", {}).items():
        if name not in before:
            out.append((name, "new view"))
            continue
        changed = sorted(k for k in spec.keys() | before[name].keys()
                         if k not in _NOT_OFFLINE and spec.get(k) != before[name].get(k))
        if changed:
            out.append((name, "changed " + ", ".join(changed)))
    return out


@app.command()
@user_errors
def apply(config: ConfigOption = None, catalog: CatalogOption = None,
          author: Annotated[str | None, typer.Option(help="recorded with the version")] = None,
          allow_empty: Annotated[bool, typer.Option("--allow-empty",
                                                    help="allow applying a catalog with no definitions")] = False,
          ) -> None:
    """Validate the catalog on disk and store it as a new registry version when it changed."""
    cfg, cat = open_disk_project(config, catalog)
    registry = open_registry(cfg)
    _refuse_empty(cfg, cat, registry.latest(), allow_empty)
    result = registry.apply(cat, author=author)
    if result.created:
        _print_diff(result.diff)
        console.print(f"[green]applied[/green] catalog version {result.version} of project {cfg.project!r}")
    else:
        console.print(f"no changes; catalog version {result.version} is current")


@app.command("list")
@user_errors
def list_views(config: ConfigOption = None, catalog: CatalogOption = None) -> None:
    """List feature views and services of the applied catalog version."""
    _, applied = open_applied(config, catalog)
    cat = applied.catalog
    _say_version(applied, catalog)
    table = Table("view", "entities", "source", "kind", "features", "ttl / tile", "owner")
    for view in sorted(cat.views.values(), key=lambda v: v.name):
        timing = _micros_label(view.ttl_us) if view.kind == "last" else f"tile {_micros_label(view.tile_us)}"
        table.add_row(view.name, ", ".join(view.entities), view.source, view.kind,
                      str(len(view.feature_names)), timing, view.owner)
    console.print(table)
    for odfv in cat.on_demand.values():
        inputs = [*(f"{r}" for r in odfv.request_sources), *(f"{v}:{f}" for v, f in odfv.inputs)]
        console.print(f"on-demand view [bold]{odfv.name}[/bold]: {len(odfv.outputs)} features from "
                      f"{', '.join(inputs)} (computed at request time) {odfv.owner}", highlight=False)
    for service in cat.services.values():
        console.print(f"service [bold]{service.name}[/bold]: {len(service.features)} features")


_DESCRIBE_KINDS = {"view": "feature_view", "service": "feature_service", "entity": "entity", "source": "source",
                   "on_demand": "on_demand_view", "request": "request_source"}


@app.command()
@user_errors
def describe(name: Annotated[str, typer.Argument(help="a feature view, feature service, entity, source, on-demand "
                                                    "view or request source")],
             kind: Annotated[str | None, typer.Option(help="view, service, entity, source, on_demand or request "
                                                           "(when a name is used by two kinds)")] = None,
             config: ConfigOption = None, catalog: CatalogOption = None,
             as_json: Annotated[bool, typer.Option("--json", help="print the definition as JSON")] = False) -> None:
    """Show one definition: a view's features with types and windows, a service's features, an entity's keys,
    a source's columns and stream binding, and where it is defined."""
    from quiver.catalog.ir import spec_to_dict

    cfg, applied = open_applied(config, catalog)
    cat = applied.catalog
    if not as_json:
        _say_version(applied, catalog)
    if kind is not None and kind not in _DESCRIBE_KINDS:
        raise QuiverError(f"--kind must be one of {', '.join(_DESCRIBE_KINDS)}, got {kind!r}")
    by_kind = cat.by_kind()
    kinds = [kind] if kind else list(_DESCRIBE_KINDS)
    found = [(k, by_kind[_DESCRIBE_KINDS[k]][name]) for k in kinds if name in by_kind[_DESCRIBE_KINDS[k]]]
    if not found:
        found = _feature_of(cat, name, kinds, as_json)
    if not found:
        plural = {"view": "views", "service": "services", "entity": "entities", "source": "sources",
                  "on_demand": "on-demand views", "request": "request sources"}
        optional = ("on_demand", "request")  # listed only where the catalog has some
        known = "; ".join(f"{plural[k]}: {', '.join(sorted(by_kind[v])) or '-'}" for k, v in _DESCRIBE_KINDS.items()
                          if k in kinds and (by_kind[v] or kind == k or k not in optional))
        names = [n for k in kinds for n in by_kind[_DESCRIBE_KINDS[k]]]
        raise QuiverError(f"no {kind or 'definition'} named {name!r}{did_you_mean(name, names)} ({known})")
    if len(found) > 1:
        console.print(f"[dim]{name!r} names a {' and a '.join(k for k, _ in found)}; showing the {found[0][0]} "
                      f"(pick with --kind)[/dim]")
    what, spec = found[0]
    if as_json:
        console.print_json(json.dumps(spec_to_dict(spec)))
        return
    if what == "source":
        _describe_source(cat, spec, cfg.kafka_bootstrap)
        return
    {"view": _describe_view, "service": _describe_service, "entity": _describe_entity,
     "on_demand": _describe_on_demand, "request": _describe_request}[what](cat, spec)


def _feature_of(cat: Catalog, name: str, kinds: list[str], as_json: bool) -> list[tuple[str, Any]]:
    """A feature's name (`amount_mean_24h`, or `user_spend:amount_mean_24h`) given to `describe`: the one view
    that defines it, said on a first line; an error naming the views when it is ambiguous or --json asks for a
    definition. [] when `name` is no feature either."""
    view_part, _, feature = name.rpartition(":")
    holders = [(k, v) for k, v in cat.views_with_feature(feature or name) if k in kinds
               and (not view_part or v == view_part)]
    if not holders:
        return []
    what = {"view": "feature view", "on_demand": "on-demand view"}
    places = ", ".join(f"{what[k]} {v}" for k, v in holders)
    if len(holders) > 1:
        raise QuiverError(f"{name!r} is a feature, not a definition: it is defined by {places}; describe one, "
                          f"e.g. `quiver describe {holders[0][1]}`")
    kind, view = holders[0]
    if as_json:
        raise QuiverError(f"{name!r} is a feature of {places}, not a definition: `quiver describe {view} --json`")
    console.print(f"{feature or name!r} is a feature of {places}; showing the view "
                  f"(`quiver describe {view}`)", highlight=False)
    return [(kind, cat.by_kind()[_DESCRIBE_KINDS[kind]][view])]


def _describe_on_demand(cat: Catalog, spec: Any) -> None:
    console.print(f"[bold]{spec.name}[/bold]  on-demand feature view ({spec.location})\n{spec.description}")
    console.print(f"computed by {spec.udf_name}() ({spec.mode} mode) at request time, offline on the label rows",
                  highlight=False)
    table = Table("input", "from", "dtype")
    for name, dtype in spec.request_fields:
        table.add_row(name, "request field", dtype)
    for (view, feature), dtype in zip(spec.inputs, spec.input_dtypes, strict=True):
        table.add_row(feature, f"{view}:{feature}", dtype)
    table.add_row("request_ts", "the request's time", "timestamp")
    console.print(table)
    outputs = Table("feature", "dtype", "description")
    for f in spec.outputs:
        outputs.add_row(f.name, f.dtype, f.description)
    console.print(outputs)


def _describe_request(cat: Catalog, spec: Any) -> None:
    console.print(f"[bold]{spec.name}[/bold]  request source ({spec.location})\n{spec.description}")
    console.print("fields (sent in /predict `fields`; offline, label-row columns): "
                  + ", ".join(f"{n} {t}" for n, t in spec.columns), highlight=False)
    users = sorted(v.name for v in cat.on_demand.values() if spec.name in v.request_sources)
    console.print(f"read by: {', '.join(users) or '-'}")
    _print_contract(spec.contract)


def _print_contract(contract: Any) -> None:
    from quiver.catalog.contracts import describe_contract

    if contract is not None:
        console.print("contract (a row failing it is refused, quarantined and counted on every path):\n  "
                      + "\n  ".join(describe_contract(contract)), highlight=False)


def _describe_view(cat: Catalog, spec: Any) -> None:
    console.print(f"[bold]{spec.name}[/bold]  feature view ({spec.location})\n{spec.description}")
    console.print(f"entities: {', '.join(spec.entities)}   keys: "
                  + ", ".join(f"{k} {t}" for k, t in spec.keys) + f"   source: {spec.source}")
    table = Table("feature", "dtype", "definition")
    for f in spec.fields:
        table.add_row(f.name, f.dtype, f"last {f.column}, ttl {_micros_label(spec.ttl_us)}")
    for a in spec.aggregations:
        table.add_row(a.name, spec.feature_dtype(a.name),
                      f"{a.fn}({a.column}) over {_micros_label(a.window_us)}, tile {_micros_label(spec.tile_us)}")
    console.print(table)


def _describe_service(cat: Catalog, spec: Any) -> None:
    console.print(f"[bold]{spec.name}[/bold]  feature service ({spec.location})\n{spec.description}")
    table = Table("feature", "view", "dtype", "entities")
    keys: dict[str, None] = {}
    fields: dict[str, str] = {}
    for ref in spec.features:
        view_name, _, feature = ref.partition(":")
        view = cat.views.get(view_name)
        if view is None:  # an on-demand view: computed from request fields and stored inputs
            odfv = cat.on_demand[view_name]
            table.add_row(feature, view_name, odfv.feature_dtype(feature), "(request time)")
            fields.update(dict(odfv.request_fields))
            for input_view, _ in odfv.inputs:
                keys.update(dict.fromkeys(cat.views[input_view].key_names))
            continue
        table.add_row(feature, view_name, view.feature_dtype(feature), ", ".join(view.entities))
        keys.update(dict.fromkeys(view.key_names))
    console.print(table)
    console.print(f"{len(spec.features)} features; requests need the join keys: {', '.join(keys)}"
                  + (f" and the fields: {', '.join(f'{n} {t}' for n, t in fields.items())}" if fields else ""),
                  highlight=False)


def _describe_entity(cat: Catalog, spec: Any) -> None:
    console.print(f"[bold]{spec.name}[/bold]  entity ({spec.location})\n{spec.description}")
    console.print("join keys: " + ", ".join(f"{k} {t}" for k, t in spec.keys))
    views = sorted(v.name for v in cat.views.values() if spec.name in v.entities)
    console.print(f"feature views keyed by it: {', '.join(views) or '-'}")


def _describe_source(cat: Catalog, spec: Any, bootstrap: str = "") -> None:
    console.print(f"[bold]{spec.name}[/bold]  source ({spec.location})\n{spec.description}")
    console.print(f"path: {spec.path}   event time: {spec.timestamp_field}")
    table = Table("column", "dtype")
    for column, dtype in spec.columns:
        table.add_row(column, dtype)
    console.print(table)
    stream = spec.stream
    if stream is not None and stream.reads_kafka(bootstrap):  # what `quiver stream` reads (StreamSpec.reads_kafka)
        console.print(f"stream: Kafka topic {stream.kafka_topic} at {stream.brokers(bootstrap)}"
                      + (f" (files at {stream.path} when no brokers are set)" if stream.path else ""))
    elif stream is not None:
        console.print(f"stream: {stream.format} files at {stream.path}"
                      + (f" (Kafka topic {stream.kafka_topic} once kafka_bootstrap is set)" if stream.kafka_topic
                         else ""))
    views = sorted(v.name for v in cat.views.values() if v.source == spec.name)
    console.print(f"feature views reading it: {', '.join(views) or '-'}")
    _print_contract(spec.contract)


@app.command()
@user_errors
def versions(config: ConfigOption = None) -> None:
    """List the catalog versions stored in the registry, each with its diff from the version before."""
    from quiver.registry.diff import Change

    cfg = load_config(config)
    table = Table("version", "created", "author", "hash", "changes from the previous version")
    for info in open_registry(cfg).versions():
        changes = "\n".join(str(Change(c["kind"], c["name"], c["action"], list(c.get("details") or [])))
                            for c in info.diff) or "-"
        table.add_row(str(info.version), info.created_at.strftime("%Y-%m-%d %H:%M:%S"), info.author,
                      info.content_hash[:12], changes)
    console.print(table)


@app.command("demo-data")
@user_errors
def demo_data(out: Annotated[Path, typer.Option(help="output directory")] = Path("data"),
              days: Annotated[int, typer.Option(help="number of days of events, from 2026-11-01")] = 7,
              seed: Annotated[int, typer.Option(help="random seed (same seed, same data)")] = 7,
              users: Annotated[int, typer.Option(help="number of distinct users")] = 2_000,
              transactions_per_day: Annotated[int, typer.Option(help="transactions generated per day")] = 20_000,
              drift_from_day: Annotated[int | None, typer.Option(help="shift distributions from this day on "
                                                                      "(0 = the first day)")] = None,
              late_fraction: Annotated[float, typer.Option(help="share of events (0-1) written into the next "
                                                               "day's file, i.e. arriving late")] = 0.0,
              malformed_fraction: Annotated[float, typer.Option(help="share of rows (0-1) made malformed: null "
                                                                    "user_id, NaN or negative amount, unknown "
                                                                    "category, future time")] = 0.0) -> None:
    """Write synthetic fraud-domain events and labels (Parquet) for N days."""
    from quiver.pipelines.demo_data import generate

    summary = generate(out, days=days, seed=seed, users=users, transactions_per_day=transactions_per_day,
                       drift_from_day=drift_from_day, late_fraction=late_fraction,
                       malformed_fraction=malformed_fraction)
    console.print(summary)


def _say_version(applied: Any, catalog_dir: Path | None) -> None:
    console.print(catalog_label(applied, catalog_dir), highlight=False)


def _print_diff(diff: Any) -> None:
    if diff.is_empty:
        console.print("no changes")
        return
    colors = {"added": "green", "removed": "red", "changed": "yellow"}
    for change in diff.changes:
        console.print(f"[{colors[change.action]}]{escape(str(change))}[/]", highlight=False, soft_wrap=True)


def _micros_label(value: int | None) -> str:
    from datetime import timedelta

    return duration_label(timedelta(microseconds=value)) if value else "-"


def _register_optional_commands() -> None:
    # Every command group, named here once. Registered on start rather than at import: `quiver --version`
    # and the commands above stay fast, and the modules below import this one for its helpers.
    from quiver.cli import (
        consistency,
        decisions,
        embedded_kafka,
        embedded_redis,
        labels,
        models,
        monitoring,
        offline,
        online,
        predict,
        replay,
        serving_logs,
        streaming,
        training,
        ui,
    )

    for module in (offline, online, monitoring, training, streaming, models, predict, embedded_redis, embedded_kafka,
                   decisions, labels, ui, replay, consistency, serving_logs):
        module.register(app)


def main() -> None:
    """Console-script entry point."""
    _register_optional_commands()
    try:
        app(prog_name="quiver")
    finally:
        _export_metrics()


def _export_metrics() -> None:
    # Batch commands are short-lived, so no scraper would ever see their metrics: QUIVER_METRICS_EXPORT
    # (a .prom textfile path or a Pushgateway URL) hands them over when the command ends.
    destination = os.environ.get("QUIVER_METRICS_EXPORT")
    if not destination:
        return
    from quiver.serving.runtime import export_metrics

    command = next((a for a in sys.argv[1:] if not a.startswith("-")), "cli")
    try:
        export_metrics(destination, job=f"quiver_{command.replace('-', '_')}")
    except (OSError, ValueError) as exc:
        _error(f"could not export metrics to {destination}: {exc}")

