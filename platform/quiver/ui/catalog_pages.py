"""Console pages of the feature half and monitoring: catalog (definitions, versions with diffs, freshness,
lineage) and drift and quality (runs over data time, per-feature PSI/KS, online/offline consistency, reports,
open alerts)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from quiver.catalog.freshness import freshness
from quiver.catalog.types import duration_label
from quiver.ui.charts import series_chart
from quiver.ui.consistency_pages import consistency_section
from quiver.ui.data import Console, data_window, drift_subject, lineage_rows, report_files
from quiver.ui.html import badge, esc, link, num, page, pvalue, table, when


def _micros(value: int | None) -> str:
    return duration_label(timedelta(microseconds=value)) if value else "–"


# Lineage input kind → the prefix of its row's id on the catalog page (view names and on-demand view
# names never clash: the catalog refuses a name used twice).
_PREFIX = {"source": "source", "request source": "request", "view": "view"}


def _anchor(prefix: str, name: str, label: str = "") -> str:
    """A link to a definition's row on the catalog page (`label` shown before the name)."""
    return link(f"#{prefix}-{name}", f"{label} {name}" if label else name)


def catalog_page(console: Console) -> str:
    """Views with features, types and windows; sources; services; entities; owners; catalog versions with
    their diffs; live freshness per view; lineage source → view → service → model version."""
    from quiver.registry.diff import Change

    applied = console.applied()
    cat = applied.catalog
    online = sorted(v.name for v in cat.views.values() if v.online)
    newest, trouble = console.freshness(online)
    fresh_of = freshness(newest)  # against the store's data time, never the wall clock alone
    view_rows = []
    for view in sorted(cat.views.values(), key=lambda v: v.name):
        features = [f"{esc(f.name)} <span class='muted'>{esc(f.dtype)}, last {esc(f.column)}</span>"
                    for f in view.fields]
        features += [f"{esc(a.name)} <span class='muted'>{esc(view.feature_dtype(a.name))}, {esc(a.fn)}"
                     f"({esc(a.column)}) over {esc(_micros(a.window_us))}</span>" for a in view.aggregations]
        timing = f"ttl {_micros(view.ttl_us)}" if view.kind == "last" else f"tile {_micros(view.tile_us)}"
        fresh = (esc(fresh_of.labels[view.name]) if view.name in newest
                 else "offline only" if not view.online else "–")
        view_rows.append([f"<b id='view-{esc(view.name)}'>{esc(view.name)}</b>", esc(", ".join(view.entities)),
                          _anchor("source", view.source), esc(view.kind), "<br>".join(features), esc(timing), esc(view.owner),
                          fresh])
    on_demand_rows = [[f"<b id='view-{esc(v.name)}'>{esc(v.name)}</b>",
                       ", ".join(_anchor("request", r) for r in v.request_sources) or "–",
                       "<br>".join(f"{_anchor('view', view)}:{esc(feature)}" for view, feature in v.inputs) or "–",
                       "<br>".join(f"{esc(f.name)} <span class='muted'>{esc(f.dtype)}</span>" for f in v.outputs),
                       f"<code>{esc(v.udf_name)}</code> <span class='muted'>{esc(v.mode)}</span>", esc(v.owner or "–")]
                      for v in sorted(cat.on_demand.values(), key=lambda v: v.name)]
    request_rows = [[f"<b id='request-{esc(r.name)}'>{esc(r.name)}</b>",
                     esc(", ".join(f"{c} {t}" for c, t in r.columns)),
                     esc(", ".join(f"{c.column} {c.rule}" + ("" if c.value is None else f" {c.value}")
                                   for c in r.contract.checks) if r.contract else "–"),
                     esc(r.description or "–"), esc(r.owner or "–")]
                    for r in sorted(cat.request_sources.values(), key=lambda r: r.name)]
    source_rows = [[f"<span id='source-{esc(s.name)}'>{esc(s.name)}</span>", esc(s.path), esc(s.timestamp_field),
                    esc(", ".join(f"{c} {t}" for c, t in s.columns)),
                    esc(f"{s.stream.format} at {s.stream.path}" if s.stream else "–"), esc(s.owner or "–")]
                   for s in sorted(cat.sources.values(), key=lambda s: s.name)]
    service_rows = [[esc(s.name), esc(", ".join(s.features)), esc(getattr(s, "owner", "") or "–")]
                    for s in sorted(cat.services.values(), key=lambda s: s.name)]
    entity_rows = [[esc(e.name), esc(", ".join(f"{k} {t}" for k, t in e.keys)), esc(e.owner or "–")]
                   for e in sorted(cat.entities.values(), key=lambda e: e.name)]
    versions = console.registry.versions()
    version_rows = [[num(v.version), when(v.created_at), esc(v.author), esc(v.content_hash[:12]),
                     "<br>".join(esc(str(Change(c["kind"], c["name"], c["action"], list(c.get("details") or []))))
                                 for c in v.diff) or "–"] for v in reversed(versions)]
    model_versions = console.models.versions()
    lineage = [["<br>".join(_anchor(_PREFIX[kind], name, kind) for kind, name in row.inputs) or "–",
                (_anchor("view", row.view) if row.kind != "unknown" else esc(row.view))
                + ("" if row.kind == "view" else f" <span class='muted'>({esc(row.kind)})</span>"),
                esc(row.service or "–"),
                ", ".join(link(f"/models/{label.partition(':')[0]}#v{label.rpartition(':')[2]}", label)
                          for label in row.models) or "–"] for row in lineage_rows(cat, model_versions)]
    label = f"catalog version {applied.version}" if applied.version else "definitions on disk (nothing applied)"
    body = (f"<p>{esc(label)}" + (" — the definitions on disk differ (see <code>quiver plan</code>)"
                                  if applied.disk_differs else "") + "</p>"
            + (f"<p class='fail'>{esc(trouble)}</p>" if trouble else "")
            + "<h2>Feature views</h2>" + table(["view", "entities", "source", "kind", "features (type, definition)",
                                                "ttl / tile", "owner", "online freshness (newest event held)"],
                                               view_rows, id_="views")
            + (f"<p class='muted'>{esc(fresh_of.summary)}</p>" if fresh_of.summary else "")
            + "<h2>On-demand views (computed per request)</h2>"
            + table(["view", "request sources", "stored features in", "features out (type)", "function", "owner"],
                    on_demand_rows, empty="none", id_="on-demand")
            + "<h2>Lineage: source → view → service → model version</h2>"
            + table(["reads (sources, request sources, views)", "view", "service", "model versions trained on it"],
                    lineage, id_="lineage")
            + "<h2>Feature services</h2>" + table(["service", "features", "owner"], service_rows)
            + "<h2>Sources</h2>" + table(["source", "path", "event time", "columns", "stream", "owner"], source_rows)
            + "<h2>Request sources (fields a request brings)</h2>"
            + table(["request source", "fields", "contract", "description", "owner"], request_rows, empty="none",
                    id_="request-sources")
            + "<h2>Entities</h2>" + table(["entity", "join keys", "owner"], entity_rows)
            + "<h2>Catalog versions</h2>" + table(["version", "applied", "author", "hash", "changes from the version "
                                                   "before"], version_rows, id_="catalog-versions"))
    return page("Catalog", body, console.config.project)


DATA_ALERTS = ("drift", "dataset_drift", "quality", "consistency")  # the alerts about data, not models


def drift_page(console: Console) -> str:
    """Drift runs over data time per model and per source, per-feature PSI/KS, reports, open alerts."""
    from quiver.monitoring import repository

    runs = repository.list_drift_runs(console.registry, limit=200)
    names = console.models.names()
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault(drift_subject(run, names), []).append(run)
    sections = []
    for (kind, name), group in sorted(groups.items()):
        ordered = sorted(group, key=lambda r: (data_window(r)[1] or r["started_at"], r["id"]))
        share = {"drift share": [(w, float(r["drift_share"])) for r in ordered
                                 if (w := data_window(r)[1]) is not None]}
        latest = ordered[-1]
        results = repository.drift_results_of(console.registry, latest["id"])
        psi: dict[str, list[tuple[datetime, float]]] = {}
        effects: dict[str, list[tuple[datetime, float]]] = {}  # the bounded decision's lower bounds
        min_effects: set[float] = set()
        for run in ordered[-30:]:
            end = data_window(run)[1]
            if end is None:
                continue
            for result in repository.drift_results_of(console.registry, run["id"]):
                if result.get("psi") is not None:
                    psi.setdefault(result["feature"], []).append((end, float(result["psi"])))
                if bound := _bounded(result):
                    effects.setdefault(result["feature"], []).append((end, float(bound["lower"])))
                    min_effects.add(float(bound["min_effect"]))
        decided = json.loads(latest.get("detail_json") or "{}")  # how the newest run decided, in words
        bounded_rule, rule = decided.get("decision") == "bounded", decided.get("rule")
        rows = []
        for run in reversed(ordered):
            start, end, source = data_window(run)
            span = (f"{start:%Y-%m-%d}" if source == "date partition" and start else
                    f"{start:%Y-%m-%d %H:%M} → {end:%Y-%m-%d %H:%M}" if start and end else "–")
            rows.append([num(run["id"]), esc(span) + f" <span class='muted'>({esc(source)})</span>",
                         esc(run["reference"]), badge("alert" if run["dataset_drift"] else "ok"),
                         num(float(run["drift_share"]), 2), f"{run['n_drifted']}/{run['n_judged']}",
                         when(run["started_at"]), _report_link(console, kind, name, run)])
        title = link(f"/models/{name}", name) if kind == "model" else esc(name)
        sections.append(
            f"<h2 id='drift-{esc(kind)}-{esc(name)}'>{esc(kind)} {title}</h2>"
            + table(["run", "data window (current side)", "reference", "dataset", "drift share", "drifted",
                     "computed at", "report"], rows)
            + "<div class='grid'>" + series_chart(f"{name}: drift share over data time", share,
                                                  [] if bounded_rule else [(0.5, "dataset drift")])
            + (series_chart(f"{name}: effect shown per feature (lower confidence bound) over data time", effects,
                            [(m, f"min effect {m:g}") for m in sorted(min_effects)],
                            y_label="Kolmogorov distance / total variation (0–1)") if effects else "")
            + series_chart(f"{name}: PSI per feature over data time", psi, [(0.1, "warn 0.1"), (0.2, "alert 0.2")],
                           y_label="PSI")
            + "</div>" + f"<h3>Run #{latest['id']}, per feature</h3>"
            + (f"<p class='muted'>{esc(rule)}</p>" if rule else "")
            + table(["feature", "kind", "status", "effect", "lower bound", "min effect", "detectable", "PSI", "KS D",
                     "KS p", "n ref", "n cur", "nulls ref/cur"],
                    [[esc(r["feature"]), esc(r["kind"]), badge(r["status"]), *_effect_cells(r), num(r.get("psi")),
                      num(r.get("ks_statistic")), pvalue(r.get("ks_pvalue")), num(r.get("n_ref")),
                      num(r.get("n_cur")), f"{r.get('nulls_ref', 0)}/{r.get('nulls_cur', 0)}"] for r in results],
                    numeric=(3, 4, 5, 6, 7, 8, 9, 10, 11)))
    reports = report_files(console.reports_dir)
    report_rows = [[link(f"/reports/{p.name}", p.name), when(datetime.fromtimestamp(p.stat().st_mtime, UTC))]
                   for p in reports]
    from quiver.monitoring.repository import list_alerts
    from quiver.ui.alert_pages import alert_views, alerts_table, by_severity

    alerts = [a for a in list_alerts(console.registry, "open", limit=1000) if a.kind in DATA_ALERTS]
    body = ("".join(sections) or "<p class='muted'>no drift runs recorded yet (quiver drift … --record, or the drift "
                                 "DAG)</p>")
    body += consistency_section(console)
    body += "<h2>Reports</h2>" + table(["report", "written"], report_rows, empty="no HTML reports under data/reports")
    body += ("<h2 id='alerts'>Open drift, quality and consistency alerts</h2>"
             + alerts_table(by_severity(alert_views(console, alerts)))
             + f"<p>{link('/alerts', 'every alert')}</p>")
    return page("Drift and quality", body, console.config.project)


def _bounded(result: dict[str, Any]) -> dict[str, Any] | None:
    """The bounded decision's evidence stored with a feature's drift result (effect, lower bound, minimum
    effect, detectable effect), or None for a run judged by the thresholds rule."""
    bound = json.loads(result.get("detail_json") or "{}").get("bounded")
    return bound if isinstance(bound, dict) else None


def _effect_cells(result: dict[str, Any]) -> list[str]:
    bound = _bounded(result) or {}
    return [num(bound.get(key)) for key in ("effect", "lower", "min_effect", "detectable")]


def _report_link(console: Console, kind: str, name: str, run: dict[str, Any]) -> str:
    if kind != "model":
        return "–"
    from quiver.monitoring.checks import report_name

    start, end, _ = data_window(run)
    reference = str(run.get("reference", ""))
    version = reference.split(" ")[0].rpartition(":")[2]
    if start is None or end is None or not version.isdigit():
        return "–"
    file = f"{report_name(name, int(version), 'champion', start, end)}.html"
    return link(f"/reports/{file}", "summary") if (console.reports_dir / file).exists() else "–"
