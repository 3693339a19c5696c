"""The console's online/offline consistency: the `/consistency` page (every run, newest first, then each
subject's section) and the section the drift and quality page shows too: the consistency job's runs per
subject over data time, each feature's wrong share against its threshold, and the newest run's per-feature
counts with the causes of its differences."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from quiver.ui.charts import series_chart
from quiver.ui.data import Console
from quiver.ui.html import badge, esc, link, num, page, table, when

_CAUSES = {"late_event": "late event", "ttl_boundary": "TTL edge", "stream_lag": "stream lag",
           "materialization_gap": "materialization gap", "unexplained": "unexplained"}


def consistency_section(console: Console) -> str:
    """Consistency runs grouped by subject (model or service), newest first, with charts and the newest run's
    per-feature table."""
    from quiver.monitoring.consistency_records import consistency_results_of, consistency_runs_of

    runs = consistency_runs_of(console.registry, limit=200)
    body = "<h2 id='consistency'>Online/offline consistency</h2>"
    if not runs:
        return body + ("<p class='muted'>no consistency runs recorded yet (quiver consistency --model NAME, or the "
                       "drift DAG's check_consistency task)</p>")
    body += ("<p class='muted'>served feature values replayed through the point-in-time engine: rows compared, "
             "and the share that differ for any reason but a late event (what serving got wrong)</p>")
    groups: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault(str(run["subject"]), []).append(run)
    for subject, group in sorted(groups.items()):
        newest = group[0]
        results_of = {run["id"]: consistency_results_of(console.registry, run["id"]) for run in group[:30]}
        results = results_of[newest["id"]]
        wrong: dict[str, list[tuple[datetime, float]]] = {}
        for run in reversed(group[:30]):
            end = _utc(run["window_end"])
            for result in results_of[run["id"]]:
                wrong.setdefault(result["feature"], []).append((end, float(result["wrong_rate"] or 0.0)))
        thresholds = sorted({float(r["threshold"]) for r in results})
        anchor = _anchor(subject)
        body += f"<h3 id='{esc(anchor)}'>{esc(subject or 'all served features')}</h3>"
        body += table(["run", "data window", "rows logged", "compared", "features", "inconsistent", "status",
                       "computed at"],
                      [[num(r["id"]), f"{_utc(r['window_start']):%Y-%m-%d %H:%M} → {_utc(r['window_end']):%Y-%m-%d %H:%M}",
                        num(r["rows_logged"]), num(r["rows_compared"]), num(r["n_features"]),
                        num(r["n_inconsistent"]), badge(r["status"]), when(r["finished_at"])] for r in group[:30]],
                      numeric=(2, 3, 4, 5))
        body += "<div class='grid'>" + series_chart(
            f"{subject}: wrong share per feature over data time", wrong,
            [(t, f"threshold {t:g}") for t in thresholds[:2]], y_label="wrong share") + "</div>"
        body += f"<h4>Run #{newest['id']}, per feature</h4>" + table(
            ["feature", "status", "compared", "equal", "mismatched", "missing online", "missing offline", "late",
             "wrong share", "threshold", "SMAPE", "lag p99 / freshness objective", "causes of differences"],
            [[esc(r["feature"]), badge(r["status"]), num(r["compared"]), num(r["equal"]), num(r["mismatched"]),
              num(r["missing_online"]), num(r["missing_offline"]), num(r["late"]), num(r["wrong_rate"]),
              num(r["threshold"]), num(r.get("smape")), esc(_freshness(r.get("freshness") or {})),
              esc(_causes(r.get("causes") or {}))] for r in results],
            numeric=tuple(range(2, 11)))
    return body


def consistency_page(console: Console) -> str:
    """Every consistency run (newest first, linked to its subject's section), then each subject's section."""
    from quiver.monitoring.consistency_records import consistency_runs_of

    runs = consistency_runs_of(console.registry, limit=200)
    rows = [[num(r["id"]), link(f"#{_anchor(str(r['subject']))}", r["subject"] or "all served features"),
             f"{_utc(r['window_start']):%Y-%m-%d %H:%M} → {_utc(r['window_end']):%Y-%m-%d %H:%M}",
             num(r["rows_compared"]), num(r["n_inconsistent"]), badge(r["status"]), when(r["finished_at"])]
            for r in runs]
    body = ("<p class='muted'>Served feature values replayed through the point-in-time engine, per run: the data "
            "window it checked, the rows compared and the features whose served values differ from the offline "
            "store's beyond their threshold.</p><h2>Every run, newest first</h2>"
            + table(["run", "subject", "data window", "compared", "inconsistent features", "status", "computed at"],
                    rows, numeric=(3, 4), id_="consistency-runs",
                    empty="no consistency runs recorded yet (quiver consistency --model NAME, or the drift DAG's "
                          "check_consistency task)")
            + (consistency_section(console) if runs else ""))
    return page("Online/offline consistency", body, console.config.project)


def _anchor(subject: str) -> str:
    return "consistency-" + "".join(c if c.isalnum() else "-" for c in subject)


def _freshness(freshness: dict[str, Any]) -> str:
    """The measured p99 lag beside the view's objective: "12 s / 60 s (ok)", "12 s", or "–"."""
    lag, objective = freshness.get("lag_p99_s"), freshness.get("objective_s")
    shown = "–" if lag is None else f"{float(lag):g} s"
    return shown if objective is None else f"{shown} / {float(objective):g} s ({freshness.get('status') or 'no lag'})"


def _causes(causes: dict[str, Any]) -> str:
    named = [f"{_CAUSES.get(k, k)} {int(v):,}" for k, v in causes.items() if v]
    return ", ".join(named) or "–"


def _utc(value: Any) -> datetime:
    moment = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
