"""Console pages of the model half: home, models, one model, one decision, rollouts, one rollout."""

from __future__ import annotations

import math
from typing import Any

from quiver.catalog.errors import QuiverError
from quiver.registry import explain, rollouts
from quiver.registry.rollouts import Decision, Rollout
from quiver.ui.charts import guardrail_chart
from quiver.ui.data import Console, NotFound
from quiver.ui.html import badge, esc, facts, link, moments, num, page, table, text_with_links, when


def _decision_link(decision_id: int | None) -> str:
    return link(f"/decisions/{decision_id}", f"decision #{decision_id}") if decision_id else "–"


def _version_link(model: str, label: str) -> str:
    return link(f"/models/{model}#v{label.rpartition(':')[2]}", label) if label else "–"


def home(console: Console) -> str:
    """Each model with its champion and the decision that made it; rollouts running; catalog; open alerts."""
    from quiver.monitoring.repository import list_alerts

    models = console.models
    cards = []
    for name in models.names():
        aliases = models.aliases(name)
        champion = aliases.get("champion")
        moves = [m for m in models.history(name, "champion") if m.to_version == champion]
        cause = moves[-1] if moves else None
        others = ", ".join(f"{esc(a)} → {link(f'/models/{name}#v{v}', f'{name}:{v}')}"
                           for a, v in sorted(aliases.items()) if a != "champion") or "–"
        why = (f"{esc(cause.reason)} ({_decision_link(cause.decision_id)})" if cause and cause.decision_id
               else esc(cause.reason) if cause else "no champion yet")
        cards.append(f"<div class='card'><h3>{link(f'/models/{name}', name)}</h3>"
                     f"<p>champion <b>{link(f'/models/{name}#v{champion}', f'{name}:{champion}')}</b></p>"
                     f"<p class='muted'>why: {why}</p><p>other aliases: {others}</p></div>" if champion else
                     f"<div class='card'><h3>{link(f'/models/{name}', name)}</h3><p>no champion yet</p></div>")
    running = [r for r in rollouts.list_rollouts(console.registry) if r.status in (rollouts.RUNNING,
                                                                                    rollouts.WATCHING)]
    applied = console.applied()
    catalog = applied.catalog
    alerts = list_alerts(console.registry, "open")
    body = ("<h2>Models</h2><div class='grid'>" + ("".join(cards) or "<p class='muted'>no model registered yet "
                                                   "(quiver train)</p>") + "</div>"
            "<h2>Rollouts running or watched</h2>"
            + table(["rollout", "model", "canary", "champion", "status", "where"],
                    [[link(f"/rollouts/{r.id}", f"#{r.id}"), link(f"/models/{r.model}", r.model),
                      esc(r.canary_version), esc(r.champion_version), badge(r.status), esc(explain.step_label(r))]
                     for r in running], empty="none") +
            f"<h2>Catalog</h2><p>{link('/catalog', f'catalog version {applied.version or chr(8211)}')}: "
            f"{len(catalog.views)} views, {len(catalog.services)} services, {len(catalog.sources)} sources, "
            f"{len(catalog.entities)} entities</p>"
            f"<h2>Open alerts</h2>" + _alerts_table(alerts[:10]) +
            f"<p>{link('/drift', 'drift and quality')} · {link('/rollouts', 'every rollout')}</p>")
    return page("Quiver console", body, console.config.project)


def _alerts_table(alerts: list[Any]) -> str:
    return table(["alert", "kind", "subject", "severity", "seen", "data time", "last seen (recorded)", "title"],
                 [[f"#{a.id}", esc(a.kind), esc(a.subject), badge(a.severity), num(a.occurrences),
                   when(a.data_time), when(a.last_seen_at), esc(a.title)] for a in alerts],
                 empty="no open alerts")


def models_index(console: Console) -> str:
    rows = []
    for name in console.models.names():
        aliases = console.models.aliases(name)
        versions = console.models.versions(name)
        rows.append([link(f"/models/{name}", name), num(len(versions)),
                     esc(", ".join(f"{a} → {v}" for a, v in sorted(aliases.items())) or "–")])
    return page("Models", table(["model", "versions", "aliases"], rows, empty="no models"), console.config.project)


def model_page(console: Console, name: str) -> str:
    """Versions (metrics beside baseline and the champion on the same rows), status and why, aliases, alias
    history with reasons, every decision, rollouts."""
    models = console.models
    try:
        models.require(name)
    except QuiverError as exc:  # the only thing it refuses: a name the project has no model of
        raise NotFound(str(exc)) from None
    aliases = models.aliases(name)
    history = models.history(name)
    decisions = rollouts.list_decisions(console.registry, name, limit=500)
    by_id = {d.id: d for d in decisions}
    same_rows = _champion_on_same_rows(decisions)
    version_rows = []
    for v in reversed(models.versions(name)):
        m, base = v.metrics, (v.metrics.get("baseline") or {})
        held = sorted(a for a, n in aliases.items() if n == v.version)
        versus = same_rows.get(v.label)
        version_rows.append([
            f"<span id='v{v.version}'>{esc(v.label)}</span>", badge(v.status), esc(", ".join(held) or "–"),
            num(m.get("roc_auc")), num(base.get("roc_auc")),
            (f"{num(versus[0])} vs {num(versus[1])} ({_decision_link(versus[2])})" if versus else "–"),
            num(m.get("log_loss")), num(base.get("log_loss")), esc(f"{v.window_start:%Y-%m-%d} … {v.cutoff:%Y-%m-%d}"),
            text_with_links(explain.status_reason(v, aliases, history, by_id))])
    champion = aliases.get("champion")
    summary = ""
    if champion is not None:
        serving = models.get(name, champion)
        summary = (f"<div class='card' id='why-serving'><b>Why {esc(serving.label)} serves:</b> "
                   f"{text_with_links(explain.status_reason(serving, aliases, history, by_id))}</div>")
    body = (summary + "<p>aliases now: " + (", ".join(f"<b>{esc(a)}</b> → {link(f'#v{n}', f'{name}:{n}')}"
                                           for a, n in sorted(aliases.items())) or "none") + "</p>"
            "<h2>Versions</h2>" + table(
                ["version", "status", "aliases", "ROC-AUC", "baseline ROC-AUC",
                 "AUC vs champion on the same requests", "log loss", "baseline log loss", "training window",
                 "status and why"], version_rows, numeric=(3, 4, 6, 7), id_="versions")
            + "<h2>Alias history</h2>" + table(
                ["#", "alias", "from", "to", "reason", "by", "decision", "data time ↓", "recorded"],
                [[num(m.id), esc(m.alias), esc(m.from_version if m.from_version is not None else "–"),
                  esc(m.to_version if m.to_version is not None else "–"), text_with_links(m.reason), esc(m.by),
                  _decision_link(m.decision_id), when(m.data_time), when(m.moved_at)]
                 for m in sorted(history, key=lambda m: (m.data_time, m.id), reverse=True)], id_="alias-history")
            + "<h2>Decisions</h2>" + _decisions_table(decisions)
            + "<h2>Rollouts</h2>" + _rollouts_table(rollouts.list_rollouts(console.registry, name)))
    return page(f"Model {name}", body, console.config.project)


def _champion_on_same_rows(decisions: list[Decision]) -> dict[str, tuple[Any, Any, int]]:
    """candidate label → (its AUC, the champion's AUC, decision id) from its newest shadow verdict."""
    out: dict[str, tuple[Any, Any, int]] = {}
    for d in sorted(decisions, key=lambda d: d.id):
        auc = d.statistics.get("auc") or {}
        if d.kind == "shadow_evaluation" and isinstance(auc.get("shadow"), float):
            out[d.candidate_version] = (auc["shadow"], auc.get("champion"), d.id)
    return out


def _decisions_table(decisions: list[Decision]) -> str:
    # One clock to sort by, the data time judged (newest first); the wall time recorded beside it.
    return table(["decision", "kind", "outcome", "candidate", "champion", "share", "rollout", "data time ↓",
                  "recorded", "why"],
                 [[link(f"/decisions/{d.id}", f"#{d.id}"), esc(explain.KIND_LABELS.get(d.kind, d.kind)),
                   badge(d.outcome), esc(d.candidate_version), esc(d.champion_version),
                   num(d.fraction, 2) if d.fraction is not None else "–",
                   link(f"/rollouts/{d.rollout_id}", f"#{d.rollout_id}") if d.rollout_id else "–", when(d.data_time),
                   when(d.recorded_at), text_with_links(str(d.statistics.get("reason", ""))[:160])]
                  for d in rollouts.timeline(decisions)], id_="decisions")


def _rollouts_table(found: list[Rollout]) -> str:
    return table(["rollout", "model", "champion", "canary", "status", "where (shares are fractions)", "started",
                  "ended"],
                 [[link(f"/rollouts/{r.id}", f"#{r.id}"), link(f"/models/{r.model}", r.model),
                   esc(r.champion_version), esc(r.canary_version), badge(r.status), esc(explain.step_label(r)),
                   when(r.started_at), when(r.finished_at)] for r in found], empty="no rollouts")


def rollouts_index(console: Console) -> str:
    return page("Rollouts", _rollouts_table(rollouts.list_rollouts(console.registry)), console.config.project)


def decision_page(console: Console, decision_id: int) -> str:
    """One decision and its evidence: guardrail table (estimate, confidence sequence, floor, verdict) or the
    shadow verdict's intervals; what applying it did; the rollout's confidence sequences over looks."""
    try:
        d = rollouts.get_decision(console.registry, decision_id)
    except QuiverError:
        raise NotFound(f"no decision #{decision_id}") from None
    stats = d.statistics
    window = stats.get("window") or {}
    top = facts([
        ("model", link(f"/models/{d.model}", d.model)), ("kind", esc(explain.KIND_LABELS.get(d.kind, d.kind))),
        ("outcome", badge(d.outcome)), ("candidate", _version_link(d.model, d.candidate_version)),
        ("champion", _version_link(d.model, d.champion_version)),
        ("canary share", num(d.fraction, 2) if d.fraction is not None else "–"),
        ("rollout", link(f"/rollouts/{d.rollout_id}", f"#{d.rollout_id} (step {(d.step or 0) + 1})")
         if d.rollout_id else "–"),
        ("why", esc(stats.get("reason", ""))), ("decided by", esc(d.decided_by)),
        ("data time", f"{when(d.data_time)} (the data judged: labels and logs up to it)"),
        ("recorded", f"{when(d.recorded_at)} (wall clock)" if d.recorded_at else "– (before the registry kept it)"),
        ("data", moments(window)),
        ("applied", (f"{when(d.applied_at)}: " + esc("; ".join(d.actions) or "nothing to change")) if d.applied_at
         else "– (a verdict: it moves nothing itself; the loop's canary starts from it)"
         if d.kind == "shadow_evaluation" else "not applied (yet)")])
    body = top
    rows = explain.guardrail_rows(d)
    if rows:
        body += "<h2>Guardrails</h2>" + guardrail_table(rows)
        srm = stats.get("srm") or {}
        if srm:
            body += (f"<p>sample ratio: canary share of routing units {num(srm.get('observed_fraction'))} vs "
                     f"{num(srm.get('expected_fraction'), 2)} expected; mismatch: {esc(srm.get('significant'))}</p>")
        pairing = explain.pairing_line(d)
        if pairing:
            body += f"<p id='pairing'>{esc(pairing)}</p>"
        body += _logging_line(stats.get("serving_log"))
        body += _arms(stats)
    intervals = explain.shadow_rows(d)
    if intervals:
        body += "<h2>Shadow verdict: the same requests scored by both</h2>" + table(
            ["metric", f"champion {d.champion_version}", f"shadow {d.candidate_version}", "shadow − champion",
             "interval (log loss, Brier: confidence sequence; AUC: paired bootstrap, information only)"],
            [[esc(r.metric), num(r.champion), num(r.candidate), num(r.difference), _interval(r.lower, r.upper)]
             for r in intervals], numeric=(1, 2, 3), id_="intervals")
        settings = stats.get("settings") or {}
        body += (f"<p>{num(stats.get('labeled_pairs'))} labelled pairs of {num(stats.get('pairs'))} requests; "
                 f"margin {num(settings.get('margin'))} on {esc(settings.get('metric'))}, α {num(settings.get('alpha'))}"
                 f"</p>")
    if d.rollout_id:
        body += f"<h2>Rollout #{d.rollout_id}: each guardrail over its looks</h2>" + _charts(console, d.rollout_id)
    return page(f"Decision #{d.id}: {d.outcome}", body, console.config.project)


def _logging_line(accounts: dict[str, Any] | None) -> str:
    """What the serving loggers of every replica did with the step's rows (their accounts), in one line."""
    if not accounts:
        return ""
    dropped = accounts.get("dropped_by_reason") or {}
    lost = ", ".join(f"{num(n)} {esc(why)}" for why, n in dropped.items()) or "none"
    return (f"<p id='serving-log'>serving log of the step's hours: {num(accounts.get('served'))} rows served by "
            f"{esc(', '.join(accounts.get('replicas') or []) or 'no replica with accounts')}, "
            f"{num(accounts.get('written'))} written, dropped: {lost} "
            f"({num(100 * float(accounts.get('answering_dropped_share') or 0.0), 2)} % of the answering rows)</p>")


def guardrail_table(rows: list[explain.GuardrailRow]) -> str:
    """The guardrails of one look, and a line on why the fail line sits below the floor."""
    ratios = {round(r.fail_above / r.floor, 6) for r in rows if r.fail_above is not None and r.floor}
    share = ("½" if ratios == {0.5} else f"{ratios.pop():g}") if len(ratios) == 1 else "a share of the"
    return table(
        ["guardrail", "verdict", "estimate (canary − champion)", "confidence sequence", "floor",
         f"fails above = {share} × floor", "test", "why"],
        [[esc(r.name), badge(r.status), num(r.estimate), _interval(r.lower, r.upper), num(r.floor),
          num(r.fail_above), esc(r.test), esc(r.reason)] for r in rows], numeric=(2, 4, 5), id_="guardrails") + (
        f"<p class='muted'>A guardrail passes when its whole confidence sequence lies below the floor. It fails "
        f"sooner: once the whole sequence lies above {share} × floor the canary is surely worse by that much, so "
        f"it is rolled back without waiting to prove it worse by the full floor. In between it waits.</p>")


def _interval(lower: float | None, upper: float | None) -> str:
    return "–" if lower is None or upper is None else f"[{num(lower)}, {num(upper)}]"


def _arms(stats: dict[str, Any]) -> str:
    rows = []
    for arm in ("champion", "canary"):
        a = stats.get(arm) or {}
        if a:
            rows.append([esc(arm), num(a.get("rows")), num(a.get("calls")), num(a.get("labeled")),
                         num(a.get("paired")), num(a.get("entities")), num(a.get("errors"))])
    return table(["arm", "rows", "calls", "labelled", "paired", "entities", "failed calls"], rows,
                 numeric=(1, 2, 3, 4, 5, 6)) if rows else ""


def _charts(console: Console, rollout_id: int, rollout: Rollout | None = None) -> str:
    """Per guardrail, its confidence sequence over the rollout's canary looks; then the post-promotion
    watch's looks (new champion − previous), drawn apart: they compare other things. The latency axis names
    the rollout's threshold; a chart without estimates says why (the judge's latest reason)."""
    if rollout is None:
        try:
            rollout = rollouts.get_rollout(console.registry, rollout_id)
        except QuiverError:
            rollout = None
    threshold = (rollout.reference if rollout else {}).get("latency_threshold_ms")
    threshold = float(threshold) if isinstance(threshold, int | float) and math.isfinite(threshold) else None
    decisions = sorted(rollouts.list_decisions(console.registry, rollout_id=rollout_id, limit=1000),
                       key=lambda d: d.id)
    out = ""
    for kind, what, heading in (("canary_step", "canary − champion", ""),
                                ("watch", "new champion − previous", "<h3>Post-promotion watch</h3>")):
        per_guardrail = explain.looks(decisions, kind)
        reasons = {r.name: r.reason for d in decisions if d.kind == kind for r in explain.guardrail_rows(d)}
        if per_guardrail:
            out += heading + "<div class='grid'>" + "".join(
                guardrail_chart(name, points, what, kind, threshold_ms=threshold, reason=reasons.get(name, ""))
                for name, points in per_guardrail.items()) + "</div>"
    return out or "<p class='muted'>no judged looks yet</p>"


def rollout_page(console: Console, rollout_id: int) -> str:
    """The step timeline (every look: share, outcome, why) and each guardrail's confidence sequence over
    looks with its floor."""
    try:
        r = rollouts.get_rollout(console.registry, rollout_id)
    except QuiverError:
        raise NotFound(f"no rollout #{rollout_id}") from None
    decisions = sorted(rollouts.list_decisions(console.registry, rollout_id=rollout_id, limit=1000),
                       key=lambda d: d.id)
    steps = ", ".join(f"{s:g}" for s in (r.settings or {}).get("steps", []))
    top = facts([("model", link(f"/models/{r.model}", r.model)), ("canary", _version_link(r.model, f"{r.model}:"
                                                                                          f"{r.canary_version}")),
                 ("champion", _version_link(r.model, f"{r.model}:{r.champion_version}")), ("status", badge(r.status)),
                 ("where", esc(explain.step_label(r))), ("steps (canary shares)", esc(steps)),
                 ("started", f"{when(r.started_at)} by {esc(r.started_by)}"), ("ended", when(r.finished_at)),
                 ("watch until", when(r.watch_until)),
                 ("latency reference", esc(r.reference.get("latency_source", "–")) + (
                     f" → threshold {num(r.reference.get('latency_threshold_ms'), 2)} ms"
                     if r.reference.get("latency_threshold_ms") is not None else ""))])
    timeline = table(["look", "kind", "step", "share", "outcome", "data time ↑", "recorded", "applied", "why"],
                     [[link(f"/decisions/{d.id}", f"#{d.id}"), esc(explain.KIND_LABELS.get(d.kind, d.kind)),
                       num((d.step or 0) + 1), num(d.fraction, 2) if d.fraction is not None else "–", badge(d.outcome),
                       when(d.data_time), when(d.recorded_at), esc("; ".join(d.actions)) if d.applied_at else "–",
                       text_with_links(str(d.statistics.get("reason", ""))[:200])]
                      for d in rollouts.timeline(decisions, newest_first=False)],
                     id_="timeline")
    body = (top + "<h2>Step timeline</h2>" + timeline
            + "<h2>Each guardrail's confidence sequence over looks</h2><p class='muted'>A look passes a guardrail "
              "when its whole bar lies below the dashed floor, fails it when the whole bar lies above the dotted "
              "line, and waits (hold) otherwise.</p>" + _charts(console, rollout_id, r))
    return page(f"Rollout #{r.id}: {r.model}:{r.canary_version}", body, console.config.project)
