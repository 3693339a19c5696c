"""Console pages of the model half: home, models, one model, rollouts, one rollout (one decision:
`quiver.ui.decision_pages`, alerts: `quiver.ui.alert_pages`)."""

from __future__ import annotations

from typing import Any

from quiver.catalog.errors import QuiverError
from quiver.registry import explain, rollouts
from quiver.registry.rollouts import Decision, Rollout
from quiver.ui.alert_pages import home_alerts
from quiver.ui.data import Console, NotFound
from quiver.ui.decision_pages import decision_page, rollout_charts
from quiver.ui.decision_pages import version_link as _version_link
from quiver.ui.defaults import default_settings
from quiver.ui.estimate_pages import performance_section
from quiver.ui.html import badge, esc, facts, link, num, page, table, text_with_links, when

__all__ = ["decision_page", "home", "model_page", "models_index", "rollout_page", "rollouts_index"]


def _decision_link(decision_id: int | None) -> str:
    return link(f"/decisions/{decision_id}", f"decision #{decision_id}") if decision_id else "–"


def _champion_why(console: Console, reason: str, decision_id: int) -> str:
    """The decision's plain sentence (then the move's reason) behind a champion, linked to the decision."""
    try:
        sentence = esc(explain.decision_sentence(rollouts.get_decision(console.registry, decision_id))) + "<br>"
    except QuiverError:
        sentence = ""
    return f"{sentence}{esc(reason)} ({_decision_link(decision_id)})"


def home(console: Console) -> str:
    """Each model with its champion and the decision that made it; rollouts running; catalog; the most severe
    open alerts."""
    models = console.models
    cards = []
    for name in models.names():
        aliases = models.aliases(name)
        champion = aliases.get("champion")
        moves = [m for m in models.history(name, "champion") if m.to_version == champion]
        cause = moves[-1] if moves else None
        others = ", ".join(f"{esc(a)} → {link(f'/models/{name}#v{v}', f'{name}:{v}')}"
                           for a, v in sorted(aliases.items()) if a != "champion") or "–"
        why = (_champion_why(console, cause.reason, cause.decision_id) if cause and cause.decision_id
               else esc(cause.reason) if cause else "no champion yet")
        cards.append(f"<div class='card'><h3>{link(f'/models/{name}', name)}</h3>"
                     f"<p>champion <b>{link(f'/models/{name}#v{champion}', f'{name}:{champion}')}</b></p>"
                     f"<p class='muted'>why: {why}</p><p>other aliases: {others}</p></div>" if champion else
                     f"<div class='card'><h3>{link(f'/models/{name}', name)}</h3><p>no champion yet</p></div>")
    running = [r for r in rollouts.list_rollouts(console.registry) if r.status in (rollouts.RUNNING,
                                                                                    rollouts.WATCHING)]
    applied = console.applied()
    catalog = applied.catalog
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
            "<h2 id='alerts'>Open alerts</h2>" + home_alerts(console) +
            f"<p>{link('/drift', 'drift and quality')} · {link('/rollouts', 'every rollout')}</p>")
    return page("Quiver console", body, console.config.project)


def models_index(console: Console) -> str:
    rows = []
    for name in console.models.names():
        aliases = console.models.aliases(name)
        versions = console.models.versions(name)
        rows.append([link(f"/models/{name}", name), num(len(versions)),
                     esc(", ".join(f"{a} → {v}" for a, v in sorted(aliases.items())) or "–")])
    return page("Models", table(["model", "versions", "aliases"], rows, empty="no models"), console.config.project)


def model_page(console: Console, name: str) -> str:
    """Versions (metrics beside baseline and the champion on the same rows), status and why, aliases, estimated
    vs realized performance over data time, alias history with reasons, every decision, rollouts."""
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
            + "<h2 id='performance'>Estimated vs realized performance</h2>"
            + performance_section(console.registry, name)
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
                   when(d.recorded_at), _why(d, 160)] for d in rollouts.timeline(decisions)], id_="decisions")


def _why(decision: Decision, width: int) -> str:
    """A decision's plain sentence, then the start of its recorded reason (the numbers)."""
    return (f"{esc(explain.decision_sentence(decision))}<br><span class='muted'>"
            f"{text_with_links(str(decision.statistics.get('reason', ''))[:width])}</span>")


def _cutoff_text(decisions: list[Decision], rollout: Rollout) -> str:
    """The newest look's recorded latency cut-off, and where each step's cut-off starts from."""
    cutoff = explain.latency_cutoff(decisions, rollout.reference)
    start = explain.latency_cutoff([], rollout.reference)
    if cutoff is None:
        return "– (none recorded yet)"
    text = f"{esc(cutoff.value)} <span class='muted'>({esc(cutoff.source)})</span>"
    if start is not None and cutoff.decision_id is not None:
        text += (f"<br><span class='muted'>each step starts from {esc(start.value)}: "
                 f"{esc(explain.latency_source_text(rollout.reference) or start.source)}</span>")
    return text


def _rollouts_table(found: list[Rollout]) -> str:
    return table(["rollout", "model", "champion", "canary", "status", "where (shares are fractions)", "started",
                  "ended"],
                 [[link(f"/rollouts/{r.id}", f"#{r.id}"), link(f"/models/{r.model}", r.model),
                   esc(r.champion_version), esc(r.canary_version), badge(r.status), esc(explain.step_label(r)),
                   when(r.started_at), when(r.finished_at)] for r in found], empty="no rollouts")


def rollouts_index(console: Console) -> str:
    return page("Rollouts", _rollouts_table(rollouts.list_rollouts(console.registry)), console.config.project)


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
                 ("latency cut-off", _cutoff_text(decisions, r)),
                 ("settings", esc(explain.settings_note(explain.non_default_settings(
                     r.settings or {}, default_settings("canary_step"))) or "the defaults"))])
    timeline = table(["look", "kind", "step", "share", "outcome", "data time ↑", "recorded", "applied", "why"],
                     [[link(f"/decisions/{d.id}", f"#{d.id}"), esc(explain.KIND_LABELS.get(d.kind, d.kind)),
                       num((d.step or 0) + 1), num(d.fraction, 2) if d.fraction is not None else "–", badge(d.outcome),
                       when(d.data_time), when(d.recorded_at), esc("; ".join(d.actions)) if d.applied_at else "–",
                       _why(d, 200)] for d in rollouts.timeline(decisions, newest_first=False)],
                     id_="timeline")
    body = (top + "<h2>Step timeline</h2>" + timeline
            + "<h2>Each guardrail's confidence sequence over looks</h2><p class='muted'>A look passes a guardrail "
              "when its whole bar lies below the dashed floor, fails it when the whole bar lies above the dotted "
              "line, and waits (hold) otherwise.</p>" + rollout_charts(console, rollout_id, r))
    return page(f"Rollout #{r.id}: {r.model}:{r.canary_version}", body, console.config.project)
