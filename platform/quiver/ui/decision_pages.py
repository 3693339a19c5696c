"""The console's decision page: its first sentence in plain words, then the numbers (guardrails or the shadow
verdict's intervals), the settings it was judged on where they are not the defaults, the one latency cut-off
it recorded, and its rollout's confidence sequences over looks."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quiver.catalog.errors import QuiverError
from quiver.registry import explain, rollouts
from quiver.registry.rollouts import Decision, Rollout
from quiver.ui.charts import guardrail_chart
from quiver.ui.data import Console, NotFound
from quiver.ui.defaults import default_settings, settings_changes
from quiver.ui.html import badge, esc, facts, link, moments, num, page, table, when


def version_link(model: str, label: str) -> str:
    return link(f"/models/{model}#v{label.rpartition(':')[2]}", label) if label else "–"


def _rollout_of(console: Console, rollout_id: int | None) -> Rollout | None:
    if not rollout_id:
        return None
    try:
        return rollouts.get_rollout(console.registry, rollout_id)
    except QuiverError:
        return None


def decision_page(console: Console, decision_id: int) -> str:
    """One decision and its evidence: the plain sentence, guardrail table (estimate, confidence sequence, floor,
    verdict) or the shadow verdict's intervals; what applying it did; the rollout's confidence sequences."""
    try:
        d = rollouts.get_decision(console.registry, decision_id)
    except QuiverError:
        raise NotFound(f"no decision #{decision_id}") from None
    stats = d.statistics
    window = stats.get("window") or {}
    rollout = _rollout_of(console, d.rollout_id)
    changes = settings_changes(d, rollout.settings if rollout is not None else None)
    siblings = (rollouts.list_decisions(console.registry, rollout_id=d.rollout_id, limit=1000) if d.rollout_id
                else [d])
    # The one cut-off this decision names, on the page and on its latency chart alike.
    cutoff = (explain.latency_cutoff(siblings, rollout.reference if rollout else None, upto=d.id)
              if any(r.name == "latency_p99" for r in explain.guardrail_rows(d)) else None)
    items = [
        ("model", link(f"/models/{d.model}", d.model)), ("kind", esc(explain.KIND_LABELS.get(d.kind, d.kind))),
        ("outcome", badge(d.outcome)), ("candidate", version_link(d.model, d.candidate_version)),
        ("champion", version_link(d.model, d.champion_version)),
        ("canary share", num(d.fraction, 2) if d.fraction is not None else "–"),
        ("rollout", link(f"/rollouts/{d.rollout_id}", f"#{d.rollout_id} (step {(d.step or 0) + 1})")
         if d.rollout_id else "–"),
        ("why (the numbers)", esc(stats.get("reason", ""))), ("decided by", esc(d.decided_by)),
        ("data time", f"{when(d.data_time)} (the data judged: labels and logs up to it)"),
        ("recorded", f"{when(d.recorded_at)} (wall clock)" if d.recorded_at else "– (before the registry kept it)"),
        ("data", moments(window)),
        ("applied", (f"{when(d.applied_at)}: " + esc("; ".join(d.actions) or "nothing to change")) if d.applied_at
         else "– (a verdict: it moves nothing itself; the loop's canary starts from it)"
         if d.kind == "shadow_evaluation" else "not applied (yet)")]
    if cutoff is not None:
        items.append(("latency cut-off", f"<span id='latency-cutoff'>{esc(cutoff.value)}</span> "
                                         f"<span class='muted'>({esc(cutoff.source)})</span>"))
    body = f"<p id='sentence' class='card'><b>{esc(explain.decision_sentence(d))}</b></p>"
    if changes:
        body += (f"<p id='non-default-settings' class='card warn'>{esc(explain.settings_note(changes))}</p>")
    body += facts(items)
    rows = explain.guardrail_rows(d)
    if rows:
        defaults = default_settings(d.kind)
        body += "<h2>Guardrails</h2>" + guardrail_table(rows, defaults)
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
        body += (f"<h2>Rollout #{d.rollout_id}: each guardrail over its looks</h2>"
                 + charts(siblings, rollout, upto=d.id))
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


def _floor_cell(row: explain.GuardrailRow, defaults: Mapping[str, Any]) -> str:
    """The floor, marked when it is not the default one (a looser floor lets a worse canary pass)."""
    change = explain.floor_change(row, defaults)
    if change is None:
        return num(row.floor)
    return f"{num(row.floor)}<br><span class='warn'>non-default: {change.way} than {change.default:g}</span>"


def guardrail_table(rows: list[explain.GuardrailRow], defaults: Mapping[str, Any] | None = None) -> str:
    """The guardrails of one look, and a line on why the fail line sits below the floor."""
    ratios = {round(r.fail_above / r.floor, 6) for r in rows if r.fail_above is not None and r.floor}
    share = ("½" if ratios == {0.5} else f"{ratios.pop():g}") if len(ratios) == 1 else "a share of the"
    return table(
        ["guardrail", "verdict", "estimate (canary − champion)", "confidence sequence", "floor",
         f"fails above = {share} × floor", "test", "why"],
        [[esc(r.name), badge(r.status), num(r.estimate), _interval(r.lower, r.upper), _floor_cell(r, defaults or {}),
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


def charts(decisions: list[Decision], rollout: Rollout | None, upto: int | None = None) -> str:
    """Per guardrail, its confidence sequence over the rollout's canary looks; then the post-promotion
    watch's looks (new champion − previous), drawn apart: they compare other things. The latency axis names
    one recorded cut-off (that of decision `upto`, or the newest look's) and says whose; a chart without
    estimates says why (the judge's latest reason)."""
    decisions = sorted(decisions, key=lambda d: d.id)
    cutoff = explain.latency_cutoff(decisions, rollout.reference if rollout else None, upto=upto)
    out = ""
    for kind, what, heading in (("canary_step", "canary − champion", ""),
                                ("watch", "new champion − previous", "<h3>Post-promotion watch</h3>")):
        per_guardrail = explain.looks(decisions, kind)
        reasons = {r.name: r.reason for d in decisions if d.kind == kind for r in explain.guardrail_rows(d)}
        if per_guardrail:
            out += heading + "<div class='grid'>" + "".join(
                guardrail_chart(name, points, what, kind, cutoff=cutoff, reason=reasons.get(name, ""))
                for name, points in per_guardrail.items()) + "</div>"
    return out or "<p class='muted'>no judged looks yet</p>"


def rollout_charts(console: Console, rollout_id: int, rollout: Rollout | None) -> str:
    decisions = rollouts.list_decisions(console.registry, rollout_id=rollout_id, limit=1000)
    return charts(decisions, rollout)
