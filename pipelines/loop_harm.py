"""Retraining by expected harm: the drift check's day estimated without labels, and whether it calls for a retrain.

Every daily drift check also estimates, per arm serving that day (champion, shadow, canary), what the day's
labels will show (`monitoring.performance_estimation`, CBPE: calibrated scores say how often they will be
right), records it beside the version's held-out reference, and fills in the realized value of earlier days
whose labels have arrived since (`monitoring.estimate_records`). The retrain decision then reads:

* **expected harm**: the champion's ROC-AUC estimate lies below its reference by more than
  `loop_harm_auc_tolerance`, its whole band included: a retrain, the day the traffic is served, before any
  label of it arrived;
* **persistent drift**: dataset drift held for `loop_drift_persist_days` consecutive daily checks: a retrain
  whatever the estimate says (CBPE cannot see a change in how inputs relate to outcomes);
* otherwise drift only warns (its `dataset_drift` alert is a warning), and no retrain starts.

A retrain is announced by a `retrain_needed` alert (critical, one open per model, resolved when neither reason
holds or the champion changes) and by the drift DAG's Asset event. The held-out rows a version is calibrated
on are its test window, scored once and kept in the artifact store beside the model.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pyarrow as pa

from quiver.catalog.errors import QuiverError
from quiver.pipelines.loop_common import CHAMPION, Project, iso

log = logging.getLogger("quiver.loop")
ARMS = ("champion", "shadow", "canary")
HELD_OUT = "held_out"  # artifact-store folder of versions' scored test windows
MIN_REALIZED = 200  # labelled rows before a day's realized value is recorded
REALIZE_DAYS = 30  # how far back windows still wait for labels (some never arrive)
_CALIBRATIONS: dict[str, Any] = {}  # by version label + artifact sha: a version's check never changes


def held_out(project: Project, version: Any) -> tuple[np.ndarray, np.ndarray]:
    """A version's test-window scores and labels: rebuilt point-in-time and scored the first time (its
    artifact sha names the file, so every host reads the same rows), read back afterwards."""
    key = f"{HELD_OUT}/{version.name}/{version.version}/{version.sha256[:16]}.parquet"
    if project.artifacts.exists(key):
        table = project.artifacts.read_table(key)
    else:
        import pyarrow.parquet as pq

        from quiver.pipelines.loop_retrain import rows_of_test_window

        frame, labels = rows_of_test_window(project, version)
        scores = project.models.load(version.name, version.version).predict(frame)
        table = pa.table({"score": np.asarray(scores, np.float64), "label": np.asarray(labels, np.float64)})
        with project.artifacts.staging() as folder:
            pq.write_table(table, folder / "held_out.parquet")
            project.artifacts.publish_file(folder / "held_out.parquet", key)
    return table["score"].to_numpy(), table["label"].to_numpy()


def calibration_of(project: Project, version: Any) -> Any:
    """The version's calibration check on its held-out rows (recalibrated by an isotonic map when that passes)."""
    from quiver.monitoring.performance_estimation import check_calibration

    cache_key = f"{version.label}@{version.sha256}"
    if cache_key not in _CALIBRATIONS:
        scores, labels = held_out(project, version)
        _CALIBRATIONS[cache_key] = check_calibration(scores, labels, source=f"test window of {version.label}",
                                                     recalibrate=True)
    return _CALIBRATIONS[cache_key]


def estimate_window(project: Project, model: str, start: datetime, end: datetime) -> dict[str, dict[str, Any]]:
    """Estimate and record [start, end) per arm and version served; returns {arm: summary} (the ROC-AUC
    estimate, band, reference and drop, or why nothing was estimated)."""
    from quiver.monitoring.estimate_records import record_estimate
    from quiver.monitoring.performance_estimation import estimate_performance
    from quiver.serving.logs import read_serving_logs

    out: dict[str, dict[str, Any]] = {}
    for arm in ARMS:
        logged = _scored(read_serving_logs(project.serving_log_root, start, end, arm=arm), model)
        for label, scores in logged.items():
            version = project.models.resolve(model, label.rsplit(":", 1)[1])
            try:
                calibration = calibration_of(project, version)
            except Exception as exc:  # no held-out rows to be had (no lineage, an unreadable artifact)
                why = f"no held-out rows to calibrate on ({type(exc).__name__}: {exc})"
            else:
                try:
                    estimate = estimate_performance(scores, calibration)
                    why = ""
                except QuiverError as exc:  # scores that say nothing (all 0)
                    why = str(exc)
            if why:  # said, and never the end of the drift check
                log.warning("no performance estimate of %s: %s", label, why)
                out.setdefault(arm, {"version": label, "status": "not_estimated", "rows": int(scores.size),
                                     "reason": why})
                continue
            record_estimate(project.registry, model, label, arm, start, end, estimate)
            auc = estimate.metrics.get("roc_auc")
            if arm in out and out[arm]["rows"] >= estimate.rows:
                continue  # two versions in one arm (a promotion that day): the day's summary is the bigger one's
            out[arm] = {"version": label, "status": estimate.status, "rows": estimate.rows,
                        "reason": estimate.reason, **({"roc_auc": auc.to_dict()} if auc is not None else {})}
    return out


def realize_estimates(project: Project, model: str, as_of: datetime) -> int:
    """Record the realized metrics of earlier windows whose labels arrived by `as_of` (again while more
    arrive); returns how many (window, arm) were updated."""
    from quiver.monitoring.estimate_records import estimates_of, record_realized
    from quiver.monitoring.evaluation import join_labels
    from quiver.monitoring.labels import read_labels
    from quiver.serving.logs import read_serving_logs

    oldest = as_of - timedelta(days=REALIZE_DAYS)
    pending = {(r["version"], r["arm"], r["window_start"], r["window_end"]): r
               for r in estimates_of(project.registry, model, metric="roc_auc")
               if oldest <= r["window_end"] <= as_of and (r["realized_rows"] or 0) < r["rows"]}
    if not pending:
        return 0
    labels = read_labels(project.serving_log_root, as_of)
    updated = 0
    for (label, arm, start, end), row in sorted(pending.items(), key=lambda item: item[0][2]):
        logs = read_serving_logs(project.serving_log_root, start, end, arm=arm)
        joined = join_labels(logs, labels)
        joined = joined[(joined["model_version"] == label) & (joined["error"] == "") & joined["label"].notna()]
        if len(joined) < MIN_REALIZED or len(joined) == (row["realized_rows"] or 0) or joined["label"].nunique() < 2:
            continue  # too few yet, nothing new, or one class so far: the next day's check tries again
        record_realized(project.registry, model, label, arm, start, end, joined["prediction"].to_numpy(np.float64),
                        joined["label"].to_numpy(np.float64), realized_at=None)
        updated += 1
    return updated


def retrain_decision(champion: Mapping[str, Any] | None, drift: Mapping[str, Any], persisted_days: float, *,
                     auc_tolerance: float, persist_days: float) -> dict[str, Any]:
    """Whether the day calls for a retrain, and why in words: `champion` is `estimate_window`'s champion summary,
    `drift` the drift check's result, `persisted_days` how long dataset drift has held (0 without drift)."""
    auc = (champion or {}).get("roc_auc")
    estimated = ""
    if auc and auc.get("reference") is not None and auc.get("upper") is not None:
        least_drop = auc["reference"] - auc["upper"]
        estimated = (f"ROC-AUC estimated {auc['estimate']:.3f} [{auc['lower']:.3f}, {auc['upper']:.3f}] without labels "
                     f"vs {auc['reference']:.3f} on its test window")
        if least_drop > auc_tolerance:
            return {"retrain": True, "trigger": "expected_harm",
                    "reason": f"expected harm: {estimated}, a drop of at least {least_drop:.3f} > {auc_tolerance:g}"}
    elif champion is not None:
        estimated = f"no estimate ({champion.get('reason') or champion.get('status')})"
    drifted = bool(drift.get("dataset_drift"))
    if drifted and persisted_days >= persist_days:
        return {"retrain": True, "trigger": "persistent_drift",
                "reason": f"drift held {persisted_days:g} day(s) ≥ {persist_days:g}"
                          + (f"; {estimated}" if estimated else "")}
    if drifted:
        return {"retrain": False, "trigger": None,
                "reason": f"drift without expected harm (day {persisted_days:g} of {persist_days:g}): " +
                          (estimated or "no estimate") + f", drop within {auc_tolerance:g}"}
    return {"retrain": False, "trigger": None, "reason": "no drift" + (f"; {estimated}" if estimated else "")}


def judge_harm(project: Project, model: str, start: datetime, end: datetime, drift: Mapping[str, Any]) -> dict[str, Any]:
    """The drift step's second half: estimate the day, realize earlier days, decide, raise or resolve the
    `retrain_needed` alert. Returns what it adds to the drift step's result."""
    from quiver.pipelines.loop_retrain import drift_began

    estimates = estimate_window(project, model, start, end)
    realized = realize_estimates(project, model, end)
    began = drift_began(project, model, end) if drift.get("dataset_drift") else None
    persisted = round((end - began).total_seconds() / 86_400, 2) if began is not None else 0.0
    config = project.config
    decision = retrain_decision(estimates.get(CHAMPION), drift, persisted, auc_tolerance=config.loop_harm_auc_tolerance,
                                persist_days=config.loop_drift_persist_days)
    champion = drift.get("champion")
    if decision["retrain"]:
        detail = {"as_of": iso(end), "reference": f"{champion} reference", "trigger": decision["trigger"],
                  "drift_run_id": drift.get("run_id")}
        project.alerts.raise_alert("retrain_needed", model, "critical", f"Retrain {model}: {decision['trigger']}",
                                   decision["reason"], detail)
    else:
        project.alerts.resolve("retrain_needed", model, reason=f"no longer needed on {end:%Y-%m-%d %H:%M} UTC: "
                                                               f"{decision['reason']}")
    return {"estimates": estimates, "realized_windows": realized, "drift_days": persisted, **decision}


def _scored(logged: pa.Table, model: str) -> dict[str, np.ndarray]:
    """The served scores of `model`'s versions in `logged` (rows that failed have none), by version label."""
    if logged.num_rows == 0:
        return {}
    frame = logged.select([c for c in ("model_version", "prediction", "error") if c in logged.column_names]).to_pandas()
    if "error" in frame:
        frame = frame[frame["error"].fillna("") == ""]
    frame = frame[frame["model_version"].astype(str).str.startswith(f"{model}:") & frame["prediction"].notna()]
    return {str(label): group["prediction"].to_numpy(np.float64) for label, group in frame.groupby("model_version")}
