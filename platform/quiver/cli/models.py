"""`quiver train` and `quiver models list | describe | history | alias set | alias rollback`."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from quiver.catalog.errors import QuiverError
from quiver.cli.common import (
    PROMOTE_HINT,
    ROLLBACK_HINT,
    ConfigOption,
    console,
    hinted_group,
    open_registry,
    user_errors,
)
from quiver.cli.decisions import short
from quiver.config import load_config

# What a user types for a move the CLI spells otherwise: the "No such command" error names the real command.
MODELS_HINTS = {"promote": PROMOTE_HINT, "rollback": ROLLBACK_HINT, "demote": ROLLBACK_HINT,
                "show": "Did you mean `quiver models describe MODEL [VERSION]`?",
                "set-alias": "Did you mean `quiver models alias set MODEL ALIAS VERSION --expected … --reason …`?"}


def register(app: typer.Typer) -> None:
    """Add `train` and the `models` command group to the `quiver` CLI."""
    models_app = typer.Typer(help="Model versions, aliases and their history.", no_args_is_help=True,
                             cls=hinted_group(MODELS_HINTS))
    alias_app = typer.Typer(help="Move aliases (compare-and-set) and roll back.", no_args_is_help=True)
    models_app.add_typer(alias_app, name="alias")
    app.add_typer(models_app, name="models")

    @app.command("train")
    @user_errors
    def train_command(
        service: Annotated[str, typer.Option(help="feature service the model reads")] = "fraud_model",
        window: Annotated[str, typer.Option(help="training window before the cutoff, e.g. 14d")] = "14d",
        cutoff: Annotated[str, typer.Option(help="end of the window (exclusive), YYYY-MM-DD or ISO time")] = "",
        device: Annotated[str, typer.Option(help="auto (CUDA when present), cpu or cuda")] = "auto",
        seed: Annotated[int, typer.Option(help="random seed (same data + seed → same weights on CPU)")] = 0,
        name: Annotated[str | None, typer.Option(help="model name (default: the service)")] = None,
        labels: Annotated[str | None, typer.Option(help="labels Parquet (default: data/labels/labels.parquet)")] = None,
        label_column: Annotated[str, typer.Option(help="0/1 label column")] = "is_fraud",
        epochs: Annotated[int | None, typer.Option(help="maximum epochs (default: 30, early stopping)")] = None,
        alias: Annotated[str | None, typer.Option(help="give this alias to the new version if it beats the "
                                                       "baseline: challenger (starts the loop's gates), any "
                                                       "name of your own, or champion for a model's first "
                                                       "version")] = None,
        from_logs: Annotated[bool, typer.Option("--from-logs", help="train on the requests served in the window "
                                                                    "as serving saw them, with the labels that "
                                                                    "arrived by the cutoff (quiver labels); only "
                                                                    "features the logs lack are backfilled")] = False,
        logs_of: Annotated[str | None, typer.Option(help="with --from-logs: only this model's served rows "
                                                         "(default: every model's)")] = None,
        config: ConfigOption = None,
    ) -> None:
        """Train on the labels of [cutoff − window, cutoff), compare with the baseline, register the version."""
        from dataclasses import replace

        from quiver.models.train import TrainConfig
        from quiver.pipelines.training import metrics_table, run_training

        if not cutoff:
            raise QuiverError("give --cutoff YYYY-MM-DD (the end of the training window, exclusive)")
        if from_logs and labels:
            raise QuiverError("--from-logs reads the label store (quiver labels); drop --labels")
        if logs_of and not from_logs:
            raise QuiverError("--logs-of needs --from-logs")
        if epochs is not None and epochs < 1:
            raise QuiverError(f"--epochs must be at least 1, got {epochs}")
        cfg = load_config(config)
        train_config = replace(TrainConfig(), epochs=epochs) if epochs else None
        result = run_training(cfg, service, window, cutoff, device=device, seed=seed, model_name=name,
                              labels=labels, label_column=label_column, train_config=train_config, alias=alias,
                              from_logs=from_logs, logs_of=logs_of,
                              log=lambda line: console.print(escape(line), highlight=False))
        # Both are measured on the test window (the newest rows of the training window, which neither fit nor
        # early stopping saw), not on the validation rows early stopping selected on.
        table = Table("test-window metric", result.version.label, "baseline (logistic regression)")
        for row in metrics_table(result):
            table.add_row(*row)
        console.print(table)
        color = "green" if result.status == "registered" else "red"
        console.print(f"[{color}]{result.version.label} {result.status}[/{color}] "
                      f"({result.device}, {result.samples_per_s:,.0f} samples/s)")
        if alias and result.alias_move is None:
            raise QuiverError(f"{result.version.label} is {result.status}: alias {alias!r} was not set")

    @models_app.command("list")
    @user_errors
    def list_command(name: Annotated[str | None, typer.Argument(help="one model (default: all)")] = None,
                     config: ConfigOption = None) -> None:
        """Versions with where each stands (champion, challenger, rolled back by decision N, …), ROC-AUC on
        the version's test window (the newest rows of its training window, which no training step selected
        on) beside its logistic baseline's on the same rows, window and aliases."""
        registry = _models(config)
        if name is not None:
            registry.require(name)
        table = Table("model", "version", "status", "stands", "test ROC-AUC", "baseline's", "window", "aliases",
                      "created")
        standings: dict[str, dict[int, str]] = {}
        for v in registry.versions(name):
            if v.name not in standings:
                standings[v.name] = standing(registry, v.name)
            held = sorted(a for a, n in registry.aliases(v.name).items() if n == v.version)
            stands = standings[v.name].get(v.version, "-") if v.status == "registered" else "-"
            table.add_row(v.name, str(v.version), v.status, stands, metric_text("roc_auc", v.metrics.get("roc_auc")),
                          metric_text("roc_auc", v.metrics.get("baseline", {}).get("roc_auc")),
                          f"{v.window_start:%Y-%m-%d} … {v.cutoff:%Y-%m-%d}", ", ".join(held) or "-",
                          f"{v.created_at:%Y-%m-%d %H:%M}")
        console.print(table)
        console.print("[dim]ROC-AUC on each version's test window; `quiver models describe MODEL VERSION` for "
                      "every metric[/dim]", highlight=False)

    @models_app.command("describe")
    @user_errors
    def describe_command(name: Annotated[str, typer.Argument(help="model name")],
                         ref: Annotated[str, typer.Argument(help="version number or alias")] = "champion",
                         as_json: Annotated[bool, typer.Option("--json", help="print everything as JSON")] = False,
                         config: ConfigOption = None) -> None:
        """One version: status and why, aliases, the decisions about it, artifact, window, features, metrics,
        lineage."""
        from quiver.registry import explain, rollouts

        models = _models(config)
        v = models.resolve(name, ref)
        aliases = models.aliases(name)
        history = models.history(name)
        every = rollouts.list_decisions(models.registry, name, limit=1000)
        about = rollouts.timeline(d for d in every if v.label in (d.candidate_version, d.champion_version))
        by_id = {d.id: d for d in every}
        reason = explain.status_reason(v, aliases, history, by_id)
        held = sorted(a for a, n in aliases.items() if n == v.version)
        record = {"reason": reason, "aliases": held, "model_aliases": aliases,
                  "decisions": [{"id": d.id, "kind": d.kind, "outcome": d.outcome, "role": "candidate" if
                                 d.candidate_version == v.label else "champion", "decided_at": d.decided_at.isoformat(),
                                 "as_of": d.data_time.isoformat(),
                                 "recorded_at": d.recorded_at.isoformat() if d.recorded_at else None,
                                 "headline": explain.headline(d)} for d in about],
                  "name": v.name, "version": v.version, "status": v.status, "artifact_path": v.artifact_path,
                  "sha256": v.sha256, "window_start": v.window_start.isoformat(), "cutoff": v.cutoff.isoformat(),
                  "features": v.features, "catalog_version": v.catalog_version, "label_column": v.label_column,
                  "reference_path": v.reference_path, "created_at": v.created_at.isoformat(),
                  "created_by": v.created_by, "metrics": v.metrics,
                  "gate": gate_reason(v), "lineage": {k: x for k, x in v.lineage.items() if k != "history"}}
        if as_json:
            console.print_json(json.dumps(record, default=str))
            return
        _print_version(v, reason, held, aliases)
        # Sorted by the data time each judged (newest first); the wall time it was recorded beside it.
        decisions = Table("decision", "kind", "role", "outcome", "data time ↓", "recorded", "why")
        for d in about:
            role = "candidate" if d.candidate_version == v.label else "champion"
            decisions.add_row(f"#{d.id}", explain.KIND_LABELS.get(d.kind, d.kind), role, d.outcome,
                              _when(d.data_time), _when(d.recorded_at),
                              escape(short(d.statistics.get("reason", ""), 120)))
        if about:
            console.print(decisions)
            console.print(f"[dim]details: quiver decisions show {about[0].id}[/dim]", highlight=False)
        else:
            console.print("no decisions about this version yet")

    @models_app.command("history")
    @user_errors
    def history_command(name: Annotated[str, typer.Argument(help="model name")],
                        alias: Annotated[str | None, typer.Option(help="only this alias")] = None,
                        config: ConfigOption = None) -> None:
        """Every alias move, oldest first by the data time it acted on: from → to, reason, by, both clocks."""
        models = _models(config)
        models.require(name)
        table = Table("#", "alias", "from", "to", "reason", "by", "decision", "data time ↑", "recorded")
        for m in sorted(models.history(name, alias), key=lambda m: (m.data_time, m.id)):
            table.add_row(str(m.id), m.alias, _version(m.from_version), _version(m.to_version), m.reason, m.by,
                          str(m.decision_id or "-"), _when(m.data_time), _when(m.moved_at))
        console.print(table)

    @alias_app.command("set")
    @user_errors
    def alias_set(name: Annotated[str, typer.Argument(help="model name")],
                  alias: Annotated[str, typer.Argument(help="alias, e.g. champion, shadow, canary")],
                  version: Annotated[str, typer.Argument(help="version number, or 'none' to remove the alias")],
                  expected: Annotated[str, typer.Option(help="version the alias points at now ('none' if unset); "
                                                             "the move fails if it moved meanwhile")],
                  reason: Annotated[str, typer.Option(help="why (kept in the history)")],
                  by: Annotated[str, typer.Option(help="who (default: the login name)")] = "",
                  config: ConfigOption = None) -> None:
        """Point ALIAS at VERSION if it still points at --expected (compare-and-set)."""
        move = _models(config).set_alias(name, alias, _optional_int(version, "VERSION"),
                                         expected=_optional_int(expected, "--expected"), reason=reason, by=by)
        console.print(f"{name} {alias}: {_version(move.from_version)} → {_version(move.to_version)}")

    @alias_app.command("rollback")
    @user_errors
    def alias_rollback(name: Annotated[str, typer.Argument(help="model name")],
                       reason: Annotated[str, typer.Option(help="why (kept in the history)")],
                       expected: Annotated[int | None, typer.Option(
                           help="the champion version you are rolling back from; refused if it moved meanwhile "
                                "(so two people answering one incident cannot bring the bad model back)")] = None,
                       yes: Annotated[bool, typer.Option("--yes", help="without --expected: do it anyway")] = False,
                       by: Annotated[str, typer.Option(help="who (default: the login name)")] = "",
                       config: ConfigOption = None) -> None:
        """Move champion back to previous (and previous to the old champion), compare-and-set."""
        models = _models(config)
        if expected is None:
            aliases = models.aliases(name)
            if aliases.get("previous") is None:
                raise QuiverError(f"model {name!r} has no 'previous' version to roll back to "
                                  f"(champion: {_version(aliases.get('champion'))})")
            plan = f"{name} champion: {_version(aliases.get('champion'))} → {_version(aliases.get('previous'))}"
            if not yes:
                raise QuiverError(f"would move {plan}; confirm with --expected {aliases.get('champion')} "
                                  f"(or --yes)")
            expected = aliases.get("champion")
        move = models.rollback(name, reason=reason, by=by, expected=expected)
        console.print(f"{name} champion: {_version(move.from_version)} → {_version(move.to_version)} (rolled back)")


_ROLES = ("champion", "canary", "challenger", "shadow", "previous")  # the first a version holds names it


def standing(models: Any, name: str) -> dict[int, str]:
    """Where each registered version of model `name` stands, for `models list`: the alias it holds (champion
    first), else how its last candidacy or championship ended ("rolled back by decision #N", "halted by
    decision #N", "rolled back (alias move #M)"). Versions absent from the result stand nowhere ("-")."""
    from quiver.registry import rollouts

    aliases = models.aliases(name)
    out: dict[int, str] = {}
    decisions = rollouts.list_decisions(models.registry, name, limit=10_000)
    for version, rollout in rollouts.ended_candidacies(models.registry, name).items():
        ended = next((d for d in decisions if d.rollout_id == rollout.id and d.outcome in ("rollback", "halt")), None)
        verb = "rolled back" if rollout.status == rollouts.ROLLED_BACK else "halted"
        out[version] = f"{verb} by decision #{ended.id}" if ended else f"{verb} (rollout #{rollout.id})"
    for move in models.history(name, "champion"):  # oldest first: the newest rollback of a version wins
        if move.reason.startswith("rollback:") and move.from_version is not None and \
                move.from_version not in out:
            out[move.from_version] = (f"rolled back by decision #{move.decision_id}" if move.decision_id
                                      else f"rolled back (alias move #{move.id})")
    for role in reversed(_ROLES):  # an alias held now says more than how an earlier candidacy ended, except
        version = aliases.get(role)  # `previous`: what a rolled-back champion is given
        if version is not None and not (role == "previous" and version in out):
            out[version] = role
    return out


def _models(config: Any) -> Any:
    from quiver.artifacts import ArtifactStore
    from quiver.registry.models import ModelRegistry

    cfg = load_config(config)
    return ModelRegistry(open_registry(cfg), ArtifactStore.from_config(cfg))


def _optional_int(text: str, what: str) -> int | None:
    if text.strip().lower() in ("none", "-", ""):
        return None
    digits = text[1:] if text[:1] in ("v", "V") else text
    if not digits.isdigit():
        raise QuiverError(f"{what} must be a version number or 'none', got {text!r}")
    return int(digits)


def _version(value: int | None) -> str:
    return "-" if value is None else str(value)


# Scores and rates keep 4 decimals even when round (an AUC of 1.0000); any other whole number is a count
# (epochs, rows) and prints as one.
_SCORES = frozenset({"roc_auc", "pr_auc", "log_loss", "brier", "ece", "val_loss", "positive_rate"})
# Measured on the test window, for the model and its baseline alike; every other metric is the training run's.
_TEST_WINDOW = ("roc_auc", "pr_auc", "log_loss", "brier", "ece", "positive_rate", "rows")
_LINEAGE_FIRST = ("rows", "split", "knowledge_time", "positive_rate", "labels_origin", "labels_source", "service",
                  "pit", "device", "precision", "network", "train_config", "reference")


def metric_text(key: str, value: Any) -> str:
    """One metric as printed: "-" when absent, 4 decimals for scores, whole numbers as integers."""
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if key in _SCORES:
        return f"{value:.4f}"
    if float(value).is_integer():
        return f"{int(value):,}"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def gate_reason(version: Any) -> str:
    """The offline gate's reason for the version's status, in words (the registry's `derive_status`), or the
    override that let it serve anyway."""
    from quiver.registry.models import derive_status

    override = (version.lineage or {}).get("override")
    if isinstance(override, dict):
        return (f"{version.status} by override ({override.get('reason')}, by {override.get('by')}); the metrics "
                f"alone said {override.get('status_from_metrics')}: {override.get('why')}")
    status, why = derive_status(version.metrics or {})
    if status != version.status:  # decided by an earlier rule or set by hand
        return f"{version.status} (the gate's rule today would say {status}: {why})"
    return f"{status}: {why}"


def _say(text: str) -> None:
    """One line of `models describe` (markup for the headings; the values are escaped where they come from)."""
    console.print(text, highlight=False)


def _print_version(v: Any, reason: str, held: list[str], aliases: dict[str, int]) -> None:
    """`models describe` for people: the status and why first, then short sections of `key: value` lines."""
    _say(f"[bold]{v.label}[/bold]  {v.status}  created {v.created_at:%Y-%m-%d %H:%M} by {escape(v.created_by)}")
    _say(f"[bold]why:[/bold] {escape(reason)}")
    _say(f"[bold]offline gate:[/bold] {escape(gate_reason(v))}")
    _say(f"aliases of this version: {', '.join(held) or '-'}   all aliases of {v.name}: "
        + (", ".join(f"{a} → {n}" for a, n in sorted(aliases.items())) or "-"))
    _say("\n[bold]artifact[/bold]")
    _say(f"  path: {escape(v.artifact_path)}\n  sha256: {v.sha256}\n  drift reference: {escape(v.reference_path)}")
    _say("[bold]training data[/bold]")
    _say(f"  window: {v.window_start:%Y-%m-%d %H:%M} … {v.cutoff:%Y-%m-%d %H:%M} UTC (cutoff exclusive)")
    _say(f"  catalog version: {v.catalog_version if v.catalog_version is not None else '-'}   label column: "
        f"{escape(v.label_column)}")
    refs = (v.lineage or {}).get("feature_refs") or []
    by_view: dict[str, list[str]] = {}
    for ref in refs:
        view, _, feature = str(ref).rpartition(":")
        by_view.setdefault(view, []).append(feature)
    _say(f"  features ({len(v.features)}): " + escape("; ".join(f"{view}: {', '.join(names)}" if view else
                                                              ", ".join(names) for view, names in by_view.items())
                                                    if by_view else ", ".join(v.features)))
    _print_metrics(v)
    lineage = {k: x for k, x in (v.lineage or {}).items() if k not in ("history", "override", "feature_refs")}
    if lineage:
        _say("[bold]lineage[/bold]")
        for key in [k for k in _LINEAGE_FIRST if k in lineage] + sorted(k for k in lineage if k not in _LINEAGE_FIRST):
            value = lineage[key]
            if isinstance(value, dict) and value:
                _say(f"  {key}:")
                for inner, item in value.items():
                    _say(f"    {inner}: {escape(_plain(item))}")
            else:
                _say(f"  {key}: {escape(_plain(value))}")


_RUN_LABELS = {"epochs": "epochs run", "best_epoch": "best epoch (-1: none improved on the starting weights)",
               "val_loss": "validation loss at the best epoch", "samples_per_s": "training speed (samples/s)"}


def _print_metrics(v: Any) -> None:
    """The test window's metrics beside the baseline's, then the training run's own numbers."""
    split = (v.lineage or {}).get("split") or {}
    on = split.get("metrics_on", "test")
    since = _plain(split.get(f"{on}_boundary")) if split.get(f"{on}_boundary") else ""
    _say(f"[bold]metrics on the {on} window[/bold]" + (f" (rows from {since} to the cutoff)" if since else "")
        + ", which neither model selected on:")
    table = Table("metric", v.label, "baseline (logistic regression)")
    baseline = v.metrics.get("baseline") or {}
    shown = [k for k in _TEST_WINDOW if k in v.metrics or k in baseline]
    shown += sorted(k for k in baseline if k not in shown)
    for key in shown:
        table.add_row(key, metric_text(key, v.metrics.get(key)), metric_text(key, baseline.get(key)))
    console.print(table)
    run = {k: x for k, x in v.metrics.items() if k not in shown and k != "baseline"}
    if not run:
        return
    _say("[bold]training run[/bold]")
    latency = sorted((int(k.rsplit("_", 1)[1]), x) for k, x in run.items()
                     if k.startswith("latency_ms_batch_") and k.rsplit("_", 1)[1].isdigit())
    ordered = [k for k in _RUN_LABELS if k in run] + sorted(k for k in run if k not in _RUN_LABELS)
    for key in ordered:
        if not key.startswith("latency_ms_batch_"):
            _say(f"  {_RUN_LABELS.get(key, key)}: {metric_text(key, run[key])}")
    if latency:
        _say("  scoring latency (median ms): " + ", ".join(f"batch of {n:,}: {metric_text('', x)}" for n, x in latency))


def _plain(value: Any) -> str:
    """A lineage value on one line: mappings as `key value` pairs, lists comma-separated, counts with commas,
    ISO times to the second."""
    if isinstance(value, dict):
        return "; ".join(f"{k} {_plain(x)}" for k, x in value.items()) or "-"
    if isinstance(value, list | tuple):
        return ", ".join(_plain(x) for x in value) or "-"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, str) and len(value) >= 19 and value[4] == "-" and value[10] == "T":
        try:
            return f"{datetime.fromisoformat(value):%Y-%m-%d %H:%M:%S}"
        except ValueError:
            pass
    return "-" if value is None else str(value)


def _when(moment: Any) -> str:
    """A moment of either clock, to the minute, in UTC ("-" when the record never kept it)."""
    return "-" if moment is None else f"{moment:%Y-%m-%d %H:%M}"
