"""The console's alerts: the home page's most severe open ones, the `/alerts` page and one alert's page
(`/alerts/{id}`: its history — opened, updated, escalated, resolved and why — with both clocks).

Each alert reads as a first sentence in plain words (the decision's it announces, else its kind's), then the
numbers (its recorded message); its data time is the one it judged — its own record's, else the decision's
it announces, else the training cutoff of the version a retrain made challenger — never passed off from the
wall clock it was raised at (that one is shown as such)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from quiver.catalog.errors import QuiverError
from quiver.registry import explain, rollouts
from quiver.registry.plain_words import alert_sentence
from quiver.registry.rollouts import Decision
from quiver.ui.data import Console, NotFound
from quiver.ui.html import badge, esc, facts, link, num, page, table, text_with_links, when

HOME_ALERTS = 10  # the home page's share of open alerts: the most severe, then the newest


@dataclass(frozen=True)
class AlertView:
    """One alert as the console shows it."""

    alert: Any  # quiver.monitoring.repository.AlertRecord
    sentence: str
    data_time: datetime
    data_time_source: str  # 'recorded', a decision's data time, a training cutoff, or the wall clock, said so
    decision_id: int | None
    rollout_id: int | None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def alert_views(console: Console, alerts: list[Any]) -> list[AlertView]:
    """Each alert with its sentence, its data time and the decision and rollout it links."""
    decisions: dict[int, Decision | None] = {}
    out = []
    for alert in alerts:
        detail = alert.detail or {}
        decision_id = _int(detail.get("decision_id"))
        decision = None
        if decision_id is not None:
            if decision_id not in decisions:
                try:
                    decisions[decision_id] = rollouts.get_decision(console.registry, decision_id)
                except QuiverError:  # a decision the registry no longer has: the alert still shows
                    decisions[decision_id] = None
            decision = decisions[decision_id]
        trained_until = _training_cutoff(console, alert) if decision is None else None
        moment, source = explain.alert_data_time(alert, decision, trained_until)
        rollout_id = _int(detail.get("rollout_id")) or (decision.rollout_id if decision is not None else None)
        out.append(AlertView(alert, alert_sentence(alert, decision), moment, source,
                             decision_id if decision is not None else None, rollout_id))
    return out


def _training_cutoff(console: Console, alert: Any) -> datetime | None:
    """A retrain alert's data time: the cutoff of the version it made challenger (what it was trained on)."""
    version = _int((alert.detail or {}).get("version"))
    if alert.kind != "retrain" or version is None:
        return None
    try:
        cutoff: datetime = console.models.get(alert.subject, version).cutoff
    except QuiverError:
        return None
    return cutoff


def by_severity(views: list[AlertView]) -> list[AlertView]:
    """Most severe first (critical, warning, info), then the newest data time, then the newest alert."""
    return sorted(views, key=lambda v: (explain.SEVERITY_ORDER.get(v.alert.severity, len(explain.SEVERITY_ORDER)),
                                        -v.data_time.timestamp(), -v.alert.id))


def alerts_table(views: list[AlertView], *, id_: str = "", empty: str = "no open alerts") -> str:
    rows = []
    for v in views:
        a = v.alert
        source = "" if v.data_time_source == "recorded" else f"<br><span class='muted'>({esc(v.data_time_source)})</span>"
        links = " · ".join(x for x in (
            link(f"/decisions/{v.decision_id}", f"decision #{v.decision_id}") if v.decision_id else "",
            link(f"/rollouts/{v.rollout_id}", f"rollout #{v.rollout_id}") if v.rollout_id else "") if x) or "–"
        rows.append([f"<span id='alert-{a.id}'>{link(f'/alerts/{a.id}', f'#{a.id}')}</span>", badge(a.severity),
                     f"<b>{esc(v.sentence)}</b><br><span class='muted'>{text_with_links(a.message[:400])}</span>",
                     esc(a.kind), esc(a.subject), when(v.data_time) + source, num(a.occurrences),
                     when(a.last_seen_at), links])
    return table(["alert", "severity", "what happened (then the numbers)", "kind", "subject", "data time",
                  "seen", "last seen (recorded)", "decision"], rows, numeric=(6,), empty=empty, id_=id_)


def home_alerts(console: Console) -> str:
    """The most severe open alerts, and how many more the alerts page lists."""
    from quiver.monitoring.repository import list_alerts

    views = by_severity(alert_views(console, list_alerts(console.registry, "open", limit=1000)))
    shown = views[:HOME_ALERTS]
    more = len(views) - len(shown)
    note = (f"<p id='more-alerts'>{len(shown)} of {len(views)} open alerts shown, the most severe first: "
            f"{link('/alerts', f'{more} more on the alerts page')}</p>" if more else
            f"<p>{link('/alerts', 'every alert, resolved ones too')}</p>")
    return alerts_table(shown, id_="open-alerts") + note


def alerts_page(console: Console) -> str:
    """Every open alert, the most severe first; then the newest resolved ones."""
    from quiver.monitoring.repository import list_alerts

    open_ = by_severity(alert_views(console, list_alerts(console.registry, "open", limit=1000)))
    resolved = alert_views(console, list_alerts(console.registry, "resolved", limit=100))
    body = (f"<p class='muted'>Each alert: what happened in plain words, then the numbers it was raised on. The "
            f"data time is the one the alert judged (its decision's, or a retrained version's training cutoff), "
            f"not when it was raised.</p><h2>Open ({len(open_)})</h2>"
            + alerts_table(open_, id_="open-alerts")
            + f"<h2>Resolved (newest {len(resolved)})</h2>"
            + alerts_table(resolved, id_="resolved-alerts", empty="no resolved alerts"))
    return page("Alerts", body, console.config.project)


def alert_page(console: Console, alert_id: int) -> str:
    """One alert: what happened, its numbers, and its history — every state change, why, the data time it
    was about and when it was recorded (the wall clock)."""
    from quiver.monitoring.repository import alert_history, get_alert

    try:
        alert = get_alert(console.registry, alert_id)
    except KeyError:
        raise NotFound(f"no alert #{alert_id}") from None
    if alert.project != console.config.project:
        raise NotFound(f"no alert #{alert_id}")
    [view] = alert_views(console, [alert])
    links = [link(f"/decisions/{view.decision_id}", f"decision #{view.decision_id}") if view.decision_id else "",
             link(f"/rollouts/{view.rollout_id}", f"rollout #{view.rollout_id}") if view.rollout_id else ""]
    source = "" if view.data_time_source == "recorded" else f" <span class='muted'>({esc(view.data_time_source)})</span>"
    top = facts([("what happened", f"<b id='sentence'>{esc(view.sentence)}</b>"),
                 ("the numbers", text_with_links(alert.message) or "–"), ("severity", badge(alert.severity)),
                 ("status", badge(alert.status)), ("kind", esc(alert.kind)), ("subject", esc(alert.subject)),
                 ("data time", when(view.data_time) + source), ("seen", f"{alert.occurrences:,}×"),
                 ("opened (recorded)", when(alert.created_at)), ("last seen (recorded)", when(alert.last_seen_at)),
                 ("resolved (recorded)", when(alert.resolved_at)),
                 ("reference judged against", esc((alert.detail or {}).get("reference") or "–")),
                 ("delivery", esc(", ".join(f"{k}: {v}" for k, v in sorted(alert.deliveries.items())) or "no sinks")),
                 ("links", " · ".join(x for x in links if x) or "–")])
    history = table(["event", "severity", "data time", "recorded", "why"],
                    [[badge(e.event), badge(e.severity), when(e.as_of), when(e.at), text_with_links(e.reason)]
                     for e in alert_history(console.registry, alert_id)], id_="alert-history",
                    empty="no history recorded (raised before alert events were kept)")
    body = (top + "<h2>History</h2><p class='muted'>Each state change: opened, updated while the condition "
            "holds (at most once a data day unless what drifted changed), escalated, resolved (cleared, the model "
            "changed, or by hand). Data time: what it was about; recorded: when it was written.</p>" + history
            + f"<p>{link('/alerts', 'every alert')}</p>")
    return page(f"Alert #{alert.id}: {alert.title}", body, console.config.project)
