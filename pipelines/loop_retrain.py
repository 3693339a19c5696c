"""Retraining on drift: a sliding-window training set ending where the drift was seen, and the challenger gate.

`plan_retrain` turns what triggered the run (drift Asset events, or the weekly calendar) into a window
[cutoff − N days, cutoff); `train_step` trains and registers through `quiver.pipelines.training.run_training` (a
retry finds the version it already registered for the same window instead of training twice); `gate_step`
sets alias `challenger` only when the new version is registered (not worse than its logistic baseline) *and*
is not worse than the champion on the same rows — both models scored on the new version's test window
(labels known by its cutoff, never used for early stopping or selection).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import numpy as np

from quiver.pipelines.loop_common import CHALLENGER, CHAMPION, Project, iso, utc

log = logging.getLogger("quiver.loop")
# "Not worse than the champion" on the new version's test window: AUC may trail by this much, log loss may
# exceed by this much (absolute).
AUC_TOLERANCE = 0.005
LOG_LOSS_TOLERANCE = 0.002
_REPORTED = ("roc_auc", "pr_auc", "log_loss", "brier", "ece")


def plan_retrain(model: str, window_days: float, interval_end: datetime | str | None,
                 events: Sequence[Mapping[str, Any]] = (), conf: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The training window of this run: it ends at the drift window's end (else the run's interval end)."""
    conf = dict(conf or {})
    drift = [e for e in events if e.get("drift_run_id") is not None]
    latest = max(drift, key=lambda e: utc(e["window_end"])) if drift else None
    if conf.get("cutoff"):
        cutoff, trigger = utc(conf["cutoff"]), "manual"
    elif latest is not None:
        cutoff, trigger = utc(latest["window_end"]), "drift"
    elif interval_end is not None:
        cutoff, trigger = utc(interval_end), "schedule"
    else:
        raise ValueError("retraining needs a drift event, a conf cutoff or a data interval to end its window")
    days = float(conf.get("window_days") or window_days)
    return {"model": model, "trigger": trigger, "cutoff": iso(cutoff),
            "window_start": iso(cutoff - timedelta(days=days)), "window": f"{days:g}d",
            "drift_run_id": conf.get("drift_run_id", latest["drift_run_id"] if latest else None)}


def train_step(project: Project, plan: Mapping[str, Any], service: str, *, device: str = "auto",
               seed: int = 0) -> dict[str, Any]:
    """Train and register a version on the plan's window; an earlier attempt's version is returned as is."""
    model, cutoff, start = plan["model"], utc(plan["cutoff"]), utc(plan["window_start"])
    for version in reversed(project.models.versions(model)):
        if utc(version.cutoff) == cutoff and utc(version.window_start) == start \
                and version.lineage.get("service") == service:
            return _version_summary(version, reused=True)
    from quiver.pipelines.training import run_training

    result = run_training(project.config, service, plan["window"], cutoff, device=device, seed=seed,
                          model_name=model, log=log.info)
    return {**_version_summary(result.version, reused=False), "device": result.device,
            "samples_per_s": round(result.samples_per_s, 1)}


def _version_summary(version: Any, reused: bool) -> dict[str, Any]:
    metrics = version.metrics
    return {"version": version.version, "label": version.label, "status": version.status, "reused": reused,
            "metrics": {k: round(float(metrics[k]), 5) for k in _REPORTED if k in metrics},
            "baseline_roc_auc": round(float(metrics.get("baseline", {}).get("roc_auc", float("nan"))), 5),
            "window": [iso(version.window_start), iso(version.cutoff)]}


def rows_of_test_window(project: Project, version: Any) -> tuple[Any, np.ndarray]:
    """The new version's test window (the newest labels known by its cutoff, never selected on) as
    (feature frame, labels), rebuilt point-in-time from its lineage."""
    reference = project.reference(version)
    if version.label_column in reference.column_names:
        frame = reference.to_pandas()
        return frame, frame[version.label_column].to_numpy(np.float64)
    from quiver.offline.pit import get_historical_features
    from quiver.pipelines.training_sets import known_by, window_labels

    lineage = version.lineage
    boundary = utc(lineage["split"]["boundary"])
    # The label snapshot the version was trained on (artifact store, sha256-checked; already known by its
    # cutoff), so the gate needs no file of the machine that trained it.
    snapshot = project.artifacts.read_table(lineage["labels_source"], sha256=lineage.get("labels_sha256"))
    labels, _ = known_by(window_labels(snapshot, boundary, utc(version.cutoff), lineage["pit"]["timestamp_column"]),
                         utc(version.cutoff))
    labels = labels.filter(labels[version.label_column].is_valid())
    from quiver.catalog.loader import load_catalog

    catalog = load_catalog(project.config.catalog_dir, root=project.config.root)
    frame = get_historical_features(labels, lineage["service"], catalog=catalog, config=project.config,
                                    engine=lineage["pit"]["engine"],
                                    timestamp_column=lineage["pit"]["timestamp_column"])
    return frame, frame[version.label_column].to_numpy(np.float64)


def compare_on_test_window(project: Project, model: str, new: Any, champion: Any) -> dict[str, Any]:
    """Metrics of the new version and of the champion on the same rows: the new version's test window."""
    from quiver.models.metrics import classification_metrics

    frame, labels = rows_of_test_window(project, new)
    out: dict[str, Any] = {"rows": len(labels), "positives": int(labels.sum())}
    for role, version in (("challenger", new), ("champion", champion)):
        scores = project.models.load(model, version.version).predict(frame)
        metrics = classification_metrics(labels, scores)
        out[role] = {k: round(float(metrics[k]), 5) for k in _REPORTED}
    return out


def gate_step(project: Project, model: str, version: int) -> dict[str, Any]:
    """Make `version` the challenger when it is registered and not worse than the champion."""
    models = project.models
    new = models.get(model, version)
    champion = models.alias(model, CHAMPION)
    result: dict[str, Any] = {"model": model, "version": version, "champion": champion.label if champion else None}
    if new.status != "registered":
        from quiver.registry.models import derive_status

        return {**result, "decision": "rejected",
                "reason": f"{new.label} was rejected by the offline gate. {derive_status(new.metrics)[1]}"}
    if champion is not None and champion.version == version:
        return {**result, "decision": "is_champion", "reason": f"{new.label} is already the champion"}
    comparison = compare_on_test_window(project, model, new, champion) if champion is not None else None
    result["comparison"] = comparison
    if comparison is not None:
        ch, cu = comparison["challenger"], comparison["champion"]
        worse = []
        if ch["roc_auc"] < cu["roc_auc"] - AUC_TOLERANCE:
            worse.append(f"ROC-AUC {ch['roc_auc']:.4f} < champion {cu['roc_auc']:.4f} − {AUC_TOLERANCE}")
        if ch["log_loss"] > cu["log_loss"] + LOG_LOSS_TOLERANCE:
            worse.append(f"log loss {ch['log_loss']:.4f} > champion {cu['log_loss']:.4f} + {LOG_LOSS_TOLERANCE}")
        versus = (f"on the same rows of {new.label}'s test window, ROC-AUC {ch['roc_auc']:.4f} vs the champion's "
                  f"{cu['roc_auc']:.4f} ({ch['roc_auc'] - cu['roc_auc']:+.4f}; at most {AUC_TOLERANCE} below), log "
                  f"loss {ch['log_loss']:.4f} vs {cu['log_loss']:.4f} ({ch['log_loss'] - cu['log_loss']:+.4f}; at most "
                  f"{LOG_LOSS_TOLERANCE} above)")
        if worse:
            return {**result, "decision": "not_better",
                    "reason": f"{new.label} is worse than champion {champion.label}: " + "; ".join(worse)
                              + f". In full: {versus}"}
        better = ch["roc_auc"] > cu["roc_auc"] and ch["log_loss"] < cu["log_loss"]
        reason = (f"{new.label} is {'better than' if better else 'not worse, within the tolerance, than'} champion "
                  f"{champion.label} and not worse than its logistic baseline: {versus}")
    else:
        reason = f"{new.label} is not worse than its logistic baseline; there is no champion to compare with"
    current = models.aliases(model).get(CHALLENGER)
    if current != version:  # a retry finds the alias already moved and notifies nobody twice
        _make_challenger(project, model, version, current, reason,
                         {"version": version, "comparison": comparison, "as_of": new.cutoff.isoformat()})
    return {**result, "decision": "challenger", "reason": reason, "replaced_challenger": current}


def _make_challenger(project: Project, model: str, version: int, current: int | None, reason: str,
                     detail: Mapping[str, Any]) -> None:
    """Alias `challenger` ← `version` and its alert, in one transaction; the alert is delivered after."""
    from quiver.monitoring import faults
    from quiver.monitoring.repository import open_alert_in, resolve_alerts

    resolve_alerts(project.registry, "retrain", model)
    cutoff = project.models.get(model, version).cutoff  # the move's data time: what the version was trained on
    with project.registry._write() as connection:
        project.models.set_alias_in(connection, model, CHALLENGER, version, expected=current, reason=reason,
                                    by="quiver_retrain", as_of=cutoff)
        faults.point("gate.alias.challenger")
        record, outcome = open_alert_in(connection, project.registry.project, "retrain", model, "info",
                                        f"New challenger {model}:{version}", reason, dict(detail),
                                        list(project.alerts.sinks))
    faults.point("gate.after_commit")
    if outcome != "repeated":
        project.alerts.deliver(record.id)


def challenger_event_extra(gate: Mapping[str, Any], plan: Mapping[str, Any]) -> dict[str, Any]:
    """What the challenger Asset event carries (shadow evaluation starts from it)."""
    return {"model": gate["model"], "version": gate["version"], "champion": gate.get("champion"),
            "window_end": plan["cutoff"], "drift_run_id": plan.get("drift_run_id")}


def drift_began(project: Project, model: str, cutoff: datetime) -> datetime | None:
    """Where the drift that triggers a retrain began: the start of the earliest window in the unbroken run of
    drifted checks (of the same champion reference) ending at `cutoff`; None when the newest check up to
    `cutoff` did not drift."""
    from quiver.monitoring import repository

    reference, began = None, None
    for run in repository.list_drift_runs(project.registry, name=model, limit=200):  # newest first
        window = _window_of(run["current"])
        if window is None or window[1] > cutoff:
            continue
        if reference is None:
            reference = run["reference"]
        if run["reference"] != reference or not run["dataset_drift"]:
            break
        began = window[0]
    return began


def _window_of(label: str) -> tuple[datetime, datetime] | None:
    """The [start, end) a drift run read, from its `current` label (`loop_drift.window_label`)."""
    if not label.startswith("serving_logs[") or not label.endswith(")"):
        return None
    start, _, end = label.removeprefix("serving_logs[").removesuffix(")").partition(",")
    try:
        return utc(start), utc(end)
    except ValueError:
        return None


def waiting_for_labels(project: Project, plan: Mapping[str, Any], min_labelled: int) -> str | None:
    """Why a drift-triggered retrain should wait, or None. Under knowledge time a window ending where the
    drift was seen holds no label of the drifted traffic yet (labels arrive later), so a model trained
    on it learns the old world again and blocks the loop as a useless challenger. It waits until at least
    `min_labelled` labels of events since the drift began had arrived by the plan's cutoff; the next drift
    check (the drift persists) starts it again."""
    if plan.get("trigger") != "drift":
        return None
    cutoff = utc(plan["cutoff"])
    began = drift_began(project, plan["model"], cutoff)
    if began is None:
        return None
    from quiver.pipelines.training_sets import DEFAULT_LABELS, known_by, window_labels

    path = project.config.root / DEFAULT_LABELS
    if not path.exists():
        return None  # labels come from elsewhere: training says what it finds
    known, _ = known_by(window_labels(path, began, cutoff), cutoff)
    if known.num_rows >= min_labelled:
        return None
    return (f"waiting for labels of the drifted traffic: {known.num_rows} label(s) of events since the drift "
            f"began ({iso(began)}) had arrived by {iso(cutoff)}, {min_labelled} needed")


def busy_with(project: Project, model: str) -> str | None:
    """Why a new candidate would have to wait (one candidate at a time), or None when the loop is free."""
    from quiver.registry import rollouts

    aliases = project.models.aliases(model)
    for alias in (CHALLENGER, "shadow", "canary"):
        if alias in aliases:
            return f"{model}:{aliases[alias]} is still the {alias}"
    running = rollouts.active_rollout(project.registry, model) or rollouts.watching_rollout(project.registry, model)
    if running is not None:
        return f"rollout #{running.id} of {model}:{running.canary_version} is still {running.status}"
    return None
