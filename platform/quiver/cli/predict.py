"""`quiver serve-model`, `quiver shadow start|evaluate`, `quiver canary start|status|step|rollback`,
`quiver evaluate` — registered on the main CLI by `register(app)`."""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from quiver.catalog.errors import QuiverError
from quiver.cli.common import ConfigOption, console, open_registry, option_time, user_errors
from quiver.config import load_config

ModelArg = Annotated[str, typer.Argument(help="model name")]
AsOf = Annotated[str | None, typer.Option("--as-of", help="judge with the logs and labels known at this ISO "
                                                          "time (default: now); replaying gives the same result")]
JsonFlag = Annotated[bool, typer.Option("--json", help="print the full result as JSON")]


def _steps(text: str) -> tuple[float, ...]:
    """Traffic shares are fractions of traffic (0–1) everywhere in Quiver: config, CLI, output, errors."""
    try:
        values = tuple(float(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise QuiverError(f"--steps must be traffic shares (fractions 0–1) separated by commas (e.g. "
                          f"0.05,0.25,0.5,1), got {text!r}") from None
    if any(v > 1 for v in values):
        hint = ",".join(f"{v / 100:g}" for v in values)
        raise QuiverError(f"--steps are traffic shares as fractions of 1, not percentages: did you mean {hint}? "
                          f"(got {text!r})")
    return values


def register(app: typer.Typer) -> None:
    """Add the prediction-service commands to the `quiver` CLI."""
    shadow_app = typer.Typer(help="Score every request with a shadow model, compare it on delayed labels.",
                             no_args_is_help=True)
    canary_app = typer.Typer(help="Route a share of traffic to a canary; a judge promotes or rolls it back.",
                             no_args_is_help=True)
    app.add_typer(shadow_app, name="shadow")
    app.add_typer(canary_app, name="canary")

    @app.command("serve-model")
    @user_errors
    def serve_model(model: ModelArg,
                    host: Annotated[str, typer.Option(help="interface to bind")] = "127.0.0.1",
                    port: Annotated[int, typer.Option(help="TCP port")] = 8001, config: ConfigOption = None,
                    poll_interval: Annotated[float, typer.Option(help="seconds between registry polls")] = 2.0,
                    shadow_queue: Annotated[int, typer.Option(help="shadow batches waiting at most")] = 256,
                    torch_threads: Annotated[int, typer.Option(help="torch intra-op threads (0: torch's "
                                                                    "default)")] = 1,
                    micro_batch: Annotated[bool, typer.Option(help="score concurrent requests together (measured: no clear "
                                                                       "gain here, off by default)")] = False,
                    log_level: Annotated[str, typer.Option(help="uvicorn log level (debug, info, warning, "
                                                                "error)")] = "warning",
                    log_flush_interval: Annotated[float, typer.Option(help="seconds between serving-log "
                                                                           "flushes")] = 5.0,
                    per_client: Annotated[int, typer.Option(help="requests of one client in flight at most "
                                                                 "(more: 429)")] = 8,
                    off_path: Annotated[str, typer.Option(help="where shadow and paired scores are computed: "
                                                               "process (its own, off the request loop's GIL) or "
                                                               "thread")] = "process",
                    off_path_priority: Annotated[str, typer.Option(
                        envvar="QUIVER_OFF_PATH_PRIORITY",
                        help="CPU priority of that process: idle (only CPU the server leaves; a saturated "
                             "machine drops shadow rows, counted) or low (nice 10)")] = "idle",
                    pair_canary: Annotated[bool, typer.Option(
                        help="the champion also scores the canary's rows after the response (the judge's "
                             "paired comparison); off, the judge replays them from the logged inputs")] = True,
                    ) -> None:
        """Serve POST /predict for MODEL: champion scores, canary routing, shadow after the response.
        SIGTERM or SIGINT stops it gracefully: requests in flight finish, the shadow queue is scored and
        every buffered serving-log row is written."""
        from quiver.composition import serve_model as run
        from quiver.serving.prediction import OFF_PATH_MODES
        from quiver.serving.runtime import ServerLimits

        if off_path not in OFF_PATH_MODES or off_path_priority not in ("idle", "low"):
            raise QuiverError(f"--off-path is {' or '.join(OFF_PATH_MODES)} (got {off_path!r}); "
                              f"--off-path-priority is idle or low (got {off_path_priority!r})")
        if poll_interval <= 0 or shadow_queue < 1 or log_flush_interval <= 0 or per_client < 1:
            raise QuiverError("--poll-interval and --log-flush-interval must be positive, --shadow-queue and "
                              "--per-client at least 1")
        from quiver.registry.models import ModelRegistry

        ModelRegistry(open_registry(load_config(config))).require(model)  # a typo: the closest name, at once
        run(model, str(config) if config else None, host, port, poll_interval_s=poll_interval,
            shadow_queue_size=shadow_queue, torch_threads=torch_threads, micro_batch=micro_batch,
            log_level=log_level, log_flush_interval_s=log_flush_interval,
            limits=ServerLimits(per_client_concurrency=per_client), off_path=off_path,
            off_path_idle=off_path_priority == "idle", pair_canary=pair_canary,
            say=lambda line: console.print(escape(line), highlight=False, soft_wrap=True))

    @shadow_app.command("start")
    @user_errors
    def shadow_start(model: ModelArg, version: Annotated[int, typer.Option(help="version to shadow")],
                     config: ConfigOption = None) -> None:
        """Point alias `shadow` at VERSION (a running `serve-model` picks it up at its next poll)."""
        from quiver.artifacts import ArtifactStore
        from quiver.registry.models import ModelRegistry

        cfg = load_config(config)
        models = ModelRegistry(open_registry(cfg), ArtifactStore.from_config(cfg))
        current = models.aliases(model).get("shadow")
        if current != version:
            models.set_alias(model, "shadow", version, expected=current, reason=f"shadow {model}:{version}")
        console.print(f"shadow of {model!r} → {model}:{version}")

    @shadow_app.command("evaluate")
    @user_errors
    def shadow_evaluate(model: ModelArg, as_of: AsOf = None,
                        start: Annotated[str | None, typer.Option(help="only requests from this time")] = None,
                        metric: Annotated[str, typer.Option(help="log_loss or brier")] = "log_loss",
                        margin: Annotated[float, typer.Option(help="non-inferiority margin")] = 0.01,
                        min_pairs: Annotated[int, typer.Option(help="labelled pairs needed for a verdict")] = 200,
                        as_json: JsonFlag = False, config: ConfigOption = None) -> None:
        """Champion vs shadow on the same requests (paired), recorded in the registry as a decision."""
        from quiver.monitoring.evaluation import ShadowSettings, evaluate_shadow

        try:
            settings = ShadowSettings(metric=metric, margin=margin, min_pairs=min_pairs)
        except ValueError as exc:
            raise QuiverError(str(exc)) from None
        result = evaluate_shadow(load_config(config), model, start=option_time(start, "--start"),
                                 as_of=option_time(as_of, "--as-of"), settings=settings)
        if as_json:
            console.print_json(json.dumps({**result.to_dict(), "decision_id": result.decision_id}))
            return
        table = Table("", result.champion_version + " (champion)", result.shadow_version + " (shadow)",
                      "shadow − champion [95 % CI]")
        for name, diff in (("log loss", result.log_loss), ("Brier", result.brier)):
            table.add_row(name, f"{diff.champion:.5f}", f"{diff.shadow:.5f}",
                          f"{diff.difference:+.5f} [{diff.lower:+.5f}, {diff.upper:+.5f}]")
        a = result.auc
        table.add_row("AUC", f"{a['champion']:.4f}", f"{a['shadow']:.4f}",
                      f"{a['difference']:+.4f} [{a['lower']:+.4f}, {a['upper']:+.4f}]")
        console.print(table)
        console.print(f"{result.labeled_pairs:,} labelled pairs of {result.pairs:,}; verdict "
                      f"[bold]{result.verdict}[/bold] ({escape(result.reason)}); decision #{result.decision_id}")

    @canary_app.command("start")
    @user_errors
    def canary_start(model: ModelArg, version: Annotated[int, typer.Option(help="canary version")],
                     steps: Annotated[str, typer.Option(help="canary traffic shares per step, fractions "
                                                             "ending at 1")] = "0.05,0.25,0.5,1",
                     min_rows: Annotated[int, typer.Option(help="rows per arm and step before a pass")] = 500,
                     min_labels: Annotated[int, typer.Option(help="labelled rows per arm and step")] = 200,
                     again: Annotated[bool, typer.Option("--again", help="canary a version whose earlier rollout "
                                                                         "was rolled back or halted")] = False,
                     at: Annotated[str | None, typer.Option("--at", help="start at this ISO time (default now; "
                                                                         "for replays of recorded traffic)")] = None,
                     config: ConfigOption = None) -> None:
        """Point alias `canary` at VERSION and start a rollout at the first step."""
        from quiver.monitoring.canary_judge import start_canary
        from quiver.monitoring.canary_stats import JudgeSettings

        try:
            settings = JudgeSettings(steps=_steps(steps), min_rows=min_rows, min_labels=min_labels)
        except ValueError as exc:
            raise QuiverError(str(exc)) from None
        rollout = start_canary(load_config(config), model, version, settings=settings, again=again,
                               by="quiver canary start", at=option_time(at, "--at"))
        console.print(f"rollout #{rollout.id}: {model}:{rollout.canary_version} gets canary share "
                      f"{rollout.fraction:g} of traffic against champion {model}:{rollout.champion_version} "
                      f"(steps {', '.join(f'{s:g}' for s in settings.steps)})")

    @canary_app.command("status")
    @user_errors
    def canary_status(model: Annotated[str | None, typer.Argument(help="one model (default: every model)")] = None,
                      as_json: JsonFlag = False, config: ConfigOption = None) -> None:
        """Every rollout (newest first) with where it stands, and the latest decisions of each that still
        runs or is watched."""
        from quiver.registry import explain, rollouts
        from quiver.registry.models import ModelRegistry

        registry = open_registry(load_config(config))
        if model is not None:
            ModelRegistry(registry).require(model)
        found = rollouts.list_rollouts(registry, model)
        open_ones = [r for r in found if r.status in (rollouts.RUNNING, rollouts.WATCHING)]
        latest = {r.id: rollouts.list_decisions(registry, r.model, rollout_id=r.id, limit=5) for r in open_ones}
        if as_json:
            console.print_json(json.dumps({"rollouts": [{**_rollout_dict(r), "where": explain.step_label(r)}
                                                        for r in found],
                                           "decisions": {str(k): [_decision_dict(d) for d in v]
                                                         for k, v in latest.items()}}, default=str))
            return
        if not found:
            console.print(("model " + repr(model) if model else "no model") + " has rollouts yet; start one with "
                          "`quiver canary start MODEL --version N`")
            return
        table = Table("rollout", "model", "champion", "canary", "status", "where (shares are fractions)",
                      "started", "ended", "last decision")
        for r in found:
            last = rollouts.list_decisions(registry, r.model, rollout_id=r.id, limit=1)
            table.add_row(f"#{r.id}", r.model, str(r.champion_version), str(r.canary_version), r.status,
                          explain.step_label(r), f"{r.started_at:%Y-%m-%d %H:%M}",
                          f"{r.finished_at:%Y-%m-%d %H:%M}" if r.finished_at else "-",
                          f"#{last[0].id} {last[0].outcome}" if last else "-")
        console.print(table)
        for rollout_id, decisions in latest.items():
            for d in decisions:
                console.print(f"rollout #{rollout_id} decision #{d.id} data time {d.data_time:%Y-%m-%d %H:%M:%S} "
                              f"share {d.fraction:g} [bold]{d.outcome}[/bold]: "
                              f"{escape(str(d.statistics.get('reason', '')))}", highlight=False)

    @canary_app.command("step")
    @user_errors
    def canary_step(model: ModelArg, as_of: AsOf = None, as_json: JsonFlag = False,
                    dry_run: Annotated[bool, typer.Option("--dry-run", help="judge and print; record and "
                                                                            "change nothing")] = False,
                    config: ConfigOption = None) -> None:
        """Judge the current step once: advance, hold, promote, roll back or halt (recorded, idempotent)."""
        from quiver.monitoring.canary_judge import judge_step

        outcome = judge_step(load_config(config), model, as_of=option_time(as_of, "--as-of"), by="quiver canary step",
                             dry_run=dry_run)
        if as_json:
            console.print_json(json.dumps({"verdict": outcome.verdict.to_dict(),
                                           "pairing": outcome.pairing.to_dict() if outcome.pairing else None,
                                           "decision": _decision_dict(outcome.decision) if outcome.decision else None,
                                           "actions": list(outcome.actions), "dry_run": dry_run,
                                           "rollout": _rollout_dict(outcome.rollout)}, default=str))
            return
        v = outcome.verdict
        table = Table("guardrail", "status", "why")
        for g in v.guardrails:
            color = {"pass": "green", "fail": "red"}.get(g.status, "yellow")
            table.add_row(g.name, f"[{color}]{g.status}[/{color}]", escape(g.reason))
        console.print(table)
        if outcome.pairing is not None:
            from quiver.registry.explain import pairing_text

            console.print(escape(pairing_text(outcome.pairing.to_dict())), highlight=False, soft_wrap=True)
        if outcome.decision is None:
            console.print(f"step {outcome.rollout.step + 1} at canary share {v.fraction:g}: [bold]{v.outcome}"
                          f"[/bold] — {escape(v.reason)} (dry run: nothing recorded)", highlight=False)
            return
        repeat = "" if outcome.decision.created else " (same data as before: nothing new recorded)"
        console.print(f"step {(outcome.decision.step or 0) + 1} at canary share {v.fraction:g}: [bold]{v.outcome}"
                      f"[/bold] — {escape(v.reason)}; decision #{outcome.decision.id}{repeat}", highlight=False)
        for action in outcome.actions:
            console.print(f"  {escape(action)}", highlight=False)

    @canary_app.command("rollback")
    @user_errors
    def canary_rollback(model: ModelArg, reason: Annotated[str, typer.Option(help="kept in the history")],
                        config: ConfigOption = None) -> None:
        """End the running rollout (all traffic to the champion; the version is not canaried again unless
        asked) or revert a promotion still under watch. Refused when there is neither."""
        from quiver.monitoring.canary_judge import rollback

        decision, actions = rollback(load_config(config), model, reason=reason, by="quiver canary rollback")
        console.print(f"decision #{decision.id}: " + ("; ".join(actions) or "nothing left to roll back"))

    @app.command("evaluate")
    @user_errors
    def evaluate(model: Annotated[str | None, typer.Argument(help="model name (default: every model)")] = None,
                 start: Annotated[str | None, typer.Option(help="from this ISO time")] = None,
                 end: Annotated[str | None, typer.Option(help="until this ISO time")] = None,
                 as_of: AsOf = None, as_json: JsonFlag = False, config: ConfigOption = None) -> None:
        """Serving logs ⋈ delayed labels, per arm and model version, with 95 % intervals (per call and entity,
        the units that were randomised) and the window the numbers cover."""
        from quiver.monitoring.evaluation_window import evaluate_window

        result = evaluate_window(load_config(config), model, start=option_time(start, "--start"), end=option_time(end, "--end"),
                                 as_of=option_time(as_of, "--as-of"))
        if as_json:
            console.print_json(json.dumps(result.to_dict(), default=str).replace("NaN", "null"))
            return
        asked = f"[{result.start or 'first log'}, {result.end or 'last log'})"
        if not result.arms:
            console.print(f"no serving-log rows{' of ' + repr(model) if model else ''} in {asked}")
            return
        console.print(f"window asked {asked}; rows served {result.first_served} … {result.last_served}; labels "
                      f"known {'at ' + result.labels_as_of if result.labels_as_of else 'by now'}", highlight=False)
        table = Table("arm", "version", "rows", "calls", "labelled", "failed calls [95 %]", "log loss [95 %]",
                      "Brier [95 %]", "AUC [95 %]", "ECE", "p50 ms", "p99 ms")
        for a in result.arms:
            m, ci = a.metrics, a.intervals
            table.add_row(m.arm, m.model_version, f"{m.rows:,}", f"{a.calls:,}", f"{m.labeled:,}",
                          _with_ci(a.call_error_rate, ci["error_rate_calls"], ".2%"), _with_ci(m.log_loss, ci["log_loss"]),
                          _with_ci(m.brier, ci["brier"]), _with_ci(m.auc, ci["auc"]), _number(m.ece),
                          _number(m.latency_p50_ms, ".2f"), _number(m.latency_p99_ms, ".2f"))
        console.print(table)
        console.print("[dim]intervals: 95 %, over model calls (failures) and entities × calls (losses, AUC). "
                      "'paired' rows are the champion's scores of canary rows, off the request path.[/dim]")


def _number(value: float, spec: str = ".4f") -> str:
    """A figure, or "-" where there is none (an arm without labelled rows has no ECE: never "nan")."""
    import math

    return f"{value:{spec}}" if math.isfinite(value) else "-"


def _with_ci(value: float, bounds: tuple[float, float], spec: str = ".4f") -> str:
    import math

    if not math.isfinite(value):
        return "-"
    lower, upper = bounds
    if not (math.isfinite(lower) and math.isfinite(upper)):
        return f"{value:{spec}}"
    return f"{value:{spec}} [{lower:{spec}}, {upper:{spec}}]"


def _rollout_dict(rollout: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(rollout)


def _decision_dict(decision: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(decision)
