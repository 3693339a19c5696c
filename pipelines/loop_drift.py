"""Drift on what the model actually received: the champion's training reference vs recent serving logs.

The reference is stored with the champion's model version (`reference_path`: its training window hour by
hour, features plus `score`; see `quiver.models.reference`); the current side is the champion arm's
serving-log rows of the run's window (features plus `prediction`, compared as `score`). The run is recorded
in the registry (one per model × window × champion: a retry returns the recorded run), per-feature and
dataset alerts go to the project's sinks, and the caller (the drift DAG) emits the `quiver://drift/<model>`
Asset when `dataset_drift` is true.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa

from quiver.monitoring.checks import report_name
from quiver.pipelines.loop_common import CHAMPION, Project, iso

SCORE = "score"


def window_label(start: datetime, end: datetime) -> str:
    """How a drift run names its current side: the serving-log window it read."""
    return f"serving_logs[{iso(start)},{iso(end)})"


def align_current(logged: pa.Table, features: Sequence[str]) -> pa.Table:
    """Serving-log rows as a table with the reference's column names (features, then `score`).

    Logged feature names may carry their view (`user_spend:amount_mean_24h`) where the training set has the
    bare name; a reference feature with no logged column is left out (the drift report lists it as missing).
    """
    from quiver.serving.logs import feature_frame

    frame = feature_frame(logged)
    # Logs carry every catalog feature, null where the serving model did not read it: a bare name maps to
    # the logged column of that name holding values (two views may share a feature name).
    by_bare = {name.rsplit(":", 1)[-1]: name for name in frame.column_names
               if frame[name].null_count < frame.num_rows}
    columns: dict[str, pa.ChunkedArray] = {}
    for feature in features:
        source = feature if feature in frame.column_names else by_bare.get(feature)
        if source is not None:
            columns[feature] = frame[source]
    if "prediction" in logged.column_names:
        columns[SCORE] = logged["prediction"]
    return pa.table(columns) if columns else pa.table({SCORE: pa.array([], pa.float64())})


ARMS = ("champion", "canary", "shadow", "paired")


@dataclass(frozen=True)
class ServingDriftInputs:
    """One model version's training reference and the serving-log rows it scored on one arm, aligned."""

    version: Any  # ModelVersion
    arm: str
    features: list[str]
    reference: pa.Table
    current: pa.Table
    first_served: datetime | None
    last_served: datetime | None


def serving_drift_inputs(project: Project, model: str, *, version: str | int | None = None, arm: str = CHAMPION,
                         start: datetime | None = None, end: datetime | None = None) -> ServingDriftInputs:
    """The reference of `model`'s version (default: the one holding alias `arm`, else the champion) and the
    rows that version scored on `arm` in [start, end), with the reference's column names (score included)."""
    import pyarrow.compute as pc

    from quiver.catalog.errors import NoRowsError, QuiverError, did_you_mean
    from quiver.serving.logs import read_serving_logs
    from quiver.serving.logs.read import span_hint

    if arm not in ARMS:
        raise QuiverError(f"unknown arm {arm!r}{did_you_mean(arm, ARMS)} (arms: {', '.join(ARMS)})")
    if start is not None and end is not None and end <= start:
        raise QuiverError(f"the window is empty: --end {iso(end)} is not after --start {iso(start)}")
    project.models.require(model)
    aliases = project.models.aliases(model)
    ref = version if version is not None else (arm if arm in aliases else CHAMPION)
    chosen = project.models.resolve(model, ref)
    reference = project.reference(chosen)  # through the artifact store
    features = [f for f in [*chosen.features, SCORE] if f in reference.column_names]
    logged = read_serving_logs(project.serving_log_root, start, end, arm=arm)
    if logged.num_rows:
        logged = logged.filter(pc.equal(logged["model_version"], chosen.label))
    if logged.num_rows == 0:
        window = f"[{iso(start) if start else 'first log'}, {iso(end) if end else 'last log'})"
        raise NoRowsError(f"no rows compared: no serving-log rows of {chosen.label} on arm {arm!r} in {window}; "
                          f"{span_hint(project.serving_log_root)}; aliases of {model}: "
                          + (", ".join(f"{a} → {v}" for a, v in sorted(aliases.items())) or "none"))
    bounds = pc.min_max(logged["ts"]).as_py()
    return ServingDriftInputs(chosen, arm, features, reference.select(features), align_current(logged, features),
                              bounds["min"], bounds["max"])


def check_serving_drift(project: Project, model: str, start: datetime, end: datetime, *,
                        report_html: bool = True, run: str = "") -> dict[str, Any]:
    """Compare the champion's reference with the champion arm's serving logs of [start, end). `run` names
    the caller's run (Airflow's run id): finding the window judged already by the *same* run is a retry of a
    crashed attempt (`repeated` False: its Asset may never have gone out), by another run a repeat."""
    from quiver.monitoring import repository
    from quiver.monitoring.checks import run_drift_check
    from quiver.monitoring.settings import load_settings
    from quiver.serving.logs import read_serving_logs

    champion = project.models.alias(model, CHAMPION)
    base: dict[str, Any] = {"model": model, "window_start": iso(start), "window_end": iso(end)}
    if champion is None:
        return {**base, "status": "no_champion", "dataset_drift": False, "run_id": None}
    reference_label, current_label = f"{champion.label} reference", window_label(start, end)
    base.update(champion=champion.label)
    for recorded in repository.list_drift_runs(project.registry, name=model, limit=200):
        if recorded["reference"] == reference_label and recorded["current"] == current_label:
            drifted = [r["feature"] for r in repository.drift_results_of(project.registry, recorded["id"])
                       if r["drifted"]]
            by = json.loads(recorded.get("detail_json") or "{}").get("run", "")
            return {**base, "status": "recorded", "run_id": recorded["id"],
                    "dataset_drift": bool(recorded["dataset_drift"]), "drift_share": recorded["drift_share"],
                    "drifted": drifted, "repeated": not (run and by == run)}
    reference = project.reference(champion)  # through the artifact store: any worker can read it
    features = [f for f in [*champion.features, SCORE] if f in reference.column_names]
    logged = read_serving_logs(project.serving_log_root, start, end, arm=CHAMPION)
    current = align_current(logged, features)
    if logged.num_rows == 0:
        return {**base, "status": "no_traffic", "dataset_drift": False, "run_id": None, "rows": 0}
    check = run_drift_check(reference.select(features), current, name=model, features=features,
                            config=load_settings(project.config).drift_config(), registry=project.registry,
                            alerts=project.alerts, reference_label=reference_label,
                            current_label=current_label,  # the window: the run's data time (registry 0007)
                            detail={"run": run, "window": {"start": iso(start), "end": iso(end)}})
    report = check.report
    html: Path | None = None
    if report_html and report.dataset_drift:  # the page the alert points at; calm days need none
        from quiver.monitoring.plots import summary_page

        html = summary_page(report, reference.select(features).to_pandas(), current.to_pandas(),
                            project.reports_dir / f"{report_name(model, champion.version, CHAMPION, start, end)}.html",
                            title=f"Drift of {champion.label} (champion arm): training reference vs serving "
                                  f"traffic [{start:%Y-%m-%d %H:%M}, {end:%Y-%m-%d %H:%M}) UTC")
    return {**base, "status": "computed", "run_id": check.run_id, "dataset_drift": report.dataset_drift,
            "drift_share": round(report.drift_share, 4), "drifted": [f.feature for f in report.drifted],
            "rows": logged.num_rows, "alerts": [a.alert.id for a in check.alerts],
            "report": str(html) if html else None}
