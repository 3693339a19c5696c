"""`quiver decisions list | show N`: the registry's decisions (shadow verdicts, canary steps, watches, manual
rollbacks) with the evidence each was made on."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Column, Table

from quiver.cli.common import ConfigOption, console, open_registry, user_errors
from quiver.config import load_config

WHY_WIDTH = 80  # `decisions list` shows the start of a recorded why; `decisions show N` has it whole


def fmt(value: float | None, digits: int = 4) -> str:
    """A number for a table: '-' when absent, small values in scientific notation."""
    if value is None:
        return "-"
    return f"{value:.3g}" if value != 0 and abs(value) < 10 ** -digits else f"{value:.{digits}f}"


def short(text: object, width: int = 100) -> str:
    """`text` on one line, at most `width` characters: cut at a word boundary and ended with "…" when longer
    (a cut mid-word reads as another word; `decisions show N` has the whole text)."""
    flat = " ".join(str(text).split())
    if len(flat) <= width:
        return flat
    cut = flat[:width]
    space = cut.rfind(" ")
    if space > width // 2 and flat[width] != " ":
        cut = cut[:space]
    return cut.rstrip(" ,;:") + " …"


def interval(lower: float | None, upper: float | None) -> str:
    return "-" if lower is None or upper is None else f"[{fmt(lower)}, {fmt(upper)}]"


def register(app: typer.Typer) -> None:
    """Add the `decisions` command group to the `quiver` CLI."""
    decisions_app = typer.Typer(help="Decisions recorded by the loop and by operators, with their evidence.",
                                no_args_is_help=True)
    app.add_typer(decisions_app, name="decisions")

    @decisions_app.command("list")
    @user_errors
    def list_command(model: Annotated[str | None, typer.Argument(help="one model (default: all)")] = None,
                     kind: Annotated[str | None, typer.Option(help="canary_step, watch, manual_rollback or "
                                                                   "shadow_evaluation")] = None,
                     limit: Annotated[int, typer.Option(help="newest N")] = 50,
                     config: ConfigOption = None) -> None:
        """Decisions, newest data time first: kind, outcome, versions, share, data time and wall time, why."""
        from quiver.catalog.errors import QuiverError
        from quiver.registry import explain, rollouts
        from quiver.registry.models import ModelRegistry

        registry = open_registry(load_config(config))
        if model is not None:
            ModelRegistry(registry).require(model)
        if kind is not None and kind not in explain.KIND_LABELS:
            raise QuiverError(f"--kind must be one of {', '.join(explain.KIND_LABELS)}, got {kind!r}")
        # Sorted by the data time each judged (newest first), with the wall time it was recorded beneath it.
        # Versions never wrap or shrink (a cut label names another version); what happened, in plain words,
        # and the start of the recorded why (the numbers: `show N` has them whole) share the rest.
        table = Table("#", Column("kind", max_width=14), "outcome", Column("candidate\nvs champion", no_wrap=True),
                      "share", "rollout", Column("data time ↓\n(recorded)", no_wrap=True), "applied",
                      Column("what happened", ratio=3, min_width=24), Column("why (the numbers)", ratio=2,
                                                                             min_width=16))
        for d in rollouts.timeline(rollouts.list_decisions(registry, model, kind=kind, limit=limit)):
            versions = d.candidate_version + (f"\nvs {d.champion_version}" if d.champion_version else "")
            recorded = f"\n({d.recorded_at:%Y-%m-%d %H:%M})" if d.recorded_at else ""
            table.add_row(f"#{d.id}", explain.KIND_LABELS.get(d.kind, d.kind), d.outcome, escape(versions),
                          "-" if d.fraction is None else f"{d.fraction:g}",
                          f"#{d.rollout_id}" if d.rollout_id else "-", f"{d.data_time:%Y-%m-%d %H:%M}{recorded}",
                          "yes" if d.applied_at else "-", escape(explain.decision_sentence(d)),
                          escape(short(d.statistics.get("reason", ""), WHY_WIDTH)))
        console.print(table)

    @decisions_app.command("show")
    @user_errors
    def show_command(which: Annotated[str, typer.Argument(help="decision number (9 or #9), or 'last'")],
                     model: Annotated[str | None, typer.Option(help="with 'last': the newest of this model")] = None,
                     as_json: Annotated[bool, typer.Option("--json", help="everything as JSON")] = False,
                     config: ConfigOption = None) -> None:
        """One decision: what was decided and why, the guardrail table (estimate, confidence sequence, floor,
        verdict) or the shadow verdict's intervals, what carrying it out did."""
        from quiver.catalog.errors import QuiverError
        from quiver.registry import explain, rollouts
        from quiver.registry.models import ModelRegistry

        registry = open_registry(load_config(config))
        if model is not None:
            ModelRegistry(registry).require(model)
        newest = rollouts.list_decisions(registry, model, limit=1)
        if which.strip().lower() == "last":
            if not newest:
                raise QuiverError("no decisions recorded yet" + (f" for model {model!r}" if model else ""))
            decision = newest[0]
        else:
            digits = which.strip().lstrip("#")
            if not digits.isdigit():
                raise QuiverError(f"give a decision number (e.g. 9 or #9) or 'last', got {which!r}")
            try:
                decision = rollouts.get_decision(registry, int(digits))
            except QuiverError:
                known = rollouts.list_decisions(registry, limit=1)
                raise QuiverError(f"no decision #{digits} in project {registry.project!r} (decisions: "
                                  + (f"#1 … #{known[0].id}" if known else "none yet") + ")") from None
        rollout = rollouts.get_rollout(registry, decision.rollout_id) if decision.rollout_id else None
        context = _Context.of(registry, decision, rollout)
        if as_json:
            record = explain.decision_record(decision)
            record["non_default_settings"] = [{"name": c.name, "used": c.used, "default": c.default}
                                              for c in context.changes]
            record["latency_cutoff_ms"] = context.cutoff.ms if context.cutoff else None
            console.print_json(json.dumps(record, default=str))
            return
        _print(decision, context)


@dataclass(frozen=True)
class _Context:
    """What a decision is read with beyond its own record: the settings it was judged on that are not the
    defaults, the defaults, and the one latency cut-off it names (the console's decision page shows the same)."""

    changes: list[Any]
    defaults: dict[str, Any]
    cutoff: Any

    @classmethod
    def of(cls, registry: Any, decision: Any, rollout: Any) -> _Context:
        from quiver.registry import explain, rollouts
        from quiver.ui.defaults import default_settings, settings_changes

        changes = settings_changes(decision, rollout.settings if rollout is not None else None)
        cutoff = None
        if any(r.name == "latency_p99" for r in explain.guardrail_rows(decision)):
            siblings = (rollouts.list_decisions(registry, rollout_id=decision.rollout_id, limit=1000)
                        if decision.rollout_id else [decision])
            cutoff = explain.latency_cutoff(siblings, rollout.reference if rollout else None, upto=decision.id)
        return cls(changes, default_settings(decision.kind), cutoff)


def _print(decision: Any, context: _Context) -> None:
    from quiver.registry import explain

    stats = decision.statistics
    console.print(f"[bold]decision #{decision.id}[/bold]  {explain.KIND_LABELS.get(decision.kind, decision.kind)} "
                  f"of {decision.model}: [bold]{decision.outcome}[/bold]", highlight=False)
    console.print(f"[bold]{escape(explain.decision_sentence(decision))}[/bold]", highlight=False, soft_wrap=True)
    console.print(f"candidate {decision.candidate_version or '-'}  champion {decision.champion_version or '-'}  "
                  + (f"canary share {decision.fraction:g}  " if decision.fraction is not None else "")
                  + (f"rollout #{decision.rollout_id} step {(decision.step or 0) + 1}  " if decision.rollout_id else "")
                  + f"by {decision.decided_by}", highlight=False)
    recorded = f"{decision.recorded_at:%Y-%m-%d %H:%M:%S} UTC" if decision.recorded_at else "- (before 0007)"
    console.print(f"judged data up to {decision.data_time:%Y-%m-%d %H:%M:%S} UTC (data time); recorded {recorded} "
                  "(wall clock)", highlight=False)
    console.print(f"why (the numbers): {escape(str(stats.get('reason', '')))}", highlight=False, soft_wrap=True)
    if context.changes:
        console.print(f"[yellow]{escape(explain.settings_note(context.changes))}[/yellow]", highlight=False,
                      soft_wrap=True)
    if context.cutoff is not None:
        console.print(f"latency cut-off {context.cutoff.value} ({escape(context.cutoff.source)})", highlight=False,
                      soft_wrap=True)
    window = stats.get("window")
    if window:
        console.print("data: " + ", ".join(f"{k} {v}" for k, v in window.items() if v), highlight=False)
    rows = explain.guardrail_rows(decision)
    if rows:
        table = Table("guardrail", "verdict", "estimate (canary − champion)", "confidence sequence", "floor",
                      "fails above", "test", "why")
        for row in rows:
            color = {"pass": "green", "fail": "red"}.get(row.status, "yellow")
            change = explain.floor_change(row, context.defaults)
            floor = fmt(row.floor) + (f"\n[yellow]non-default: {change.way} than {change.default:g}[/yellow]"
                                      if change else "")
            table.add_row(row.name, f"[{color}]{row.status}[/{color}]", fmt(row.estimate),
                          interval(row.lower, row.upper), floor, fmt(row.fail_above), escape(row.test),
                          escape(row.reason))
        console.print(table)
    srm = stats.get("srm") or {}
    if srm:
        console.print(f"sample ratio: canary share of routing units {srm.get('observed_fraction', 0):.4f} vs "
                      f"{srm.get('expected_fraction', 0):g} expected; mismatch: {srm.get('significant')}",
                      highlight=False)
    pairing = explain.pairing_line(decision)
    if pairing:
        console.print(escape(pairing), highlight=False, soft_wrap=True)
    intervals = explain.shadow_rows(decision)
    if intervals:
        table = Table("metric", f"champion {decision.champion_version}", f"shadow {decision.candidate_version}",
                      "shadow − champion", "interval (AUC: paired bootstrap)")
        for r in intervals:
            table.add_row(r.metric, fmt(r.champion), fmt(r.candidate), fmt(r.difference), interval(r.lower, r.upper))
        console.print(table)
        console.print(f"{stats.get('labeled_pairs', 0):,} labelled pairs of {stats.get('pairs', 0):,} requests "
                      f"scored by both", highlight=False)
    if decision.applied_at is not None:
        console.print(f"applied {decision.applied_at:%Y-%m-%d %H:%M:%S} UTC: "
                      + ("; ".join(decision.actions) or "nothing to change"), highlight=False, soft_wrap=True)
    elif decision.kind in ("canary_step", "watch", "manual_rollback"):
        console.print("not applied (yet)")
