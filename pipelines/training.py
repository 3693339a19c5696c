"""The sliding-window training job: labels of [cutoff − window, cutoff) → point-in-time training set →
time split → tensors → train (CPU or CUDA) → metrics beside a logistic-regression baseline → artifact →
model registry (``rejected`` when it is worse than the baseline).

A plain command (``quiver train …`` or ``python -m quiver.pipelines.training …``), so an Airflow task on a ``gpu``
queue or a Kubernetes pod requesting ``nvidia.com/gpu`` runs it unchanged.
"""

from __future__ import annotations

import argparse
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from quiver.artifacts import MODELS
from quiver.catalog.errors import QuiverError
from quiver.catalog.ir import Catalog
from quiver.catalog.types import duration_label, parse_duration
from quiver.config import Config
from quiver.pipelines.training_sets import arrival_column, from_label_rows, from_serving_logs
from quiver.registry.models import AliasMove, ModelRegistry, ModelVersion

# Aliases that route live traffic or record the loop's state: only the loop's gated steps move them.
LOOP_ALIASES = ("canary", "shadow", "previous")
# Fewer positive labels than this in the training split: the network starts as the fitted logistic baseline
# (a 2-day window of 4,000 transactions a day, about 100 positives, lost to it by more than the gate allows;
# the demo's first champion window, 327 positives, beat it by +0.011 to +0.014 ROC-AUC).
FEW_POSITIVES = 200


@dataclass(frozen=True)
class TrainingResult:
    """What a training run produced and where it went."""

    version: ModelVersion
    metrics: dict[str, float]
    baseline: dict[str, float]
    status: str  # registered | rejected
    device: str
    samples_per_s: float
    rows: dict[str, int]
    alias_move: AliasMove | None = None
    log: list[str] = field(default_factory=list)

    @property
    def beat_baseline(self) -> bool:
        """The registry's rule (`quiver.registry.models.derive_status`)."""
        return self.status == "registered"


def parse_cutoff(value: date | datetime | str) -> datetime:
    """A cutoff as an aware UTC datetime: a date means its midnight (UTC)."""
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day, tzinfo=UTC)
    try:
        return parse_cutoff(datetime.fromisoformat(value))
    except ValueError:
        raise QuiverError(f"cutoff {value!r} is not a date (YYYY-MM-DD) or an ISO timestamp") from None


def run_training(config: Config, service: str = "fraud_model", window: str | timedelta = "14d",
                 cutoff: date | datetime | str | None = None, *, device: str = "auto", seed: int = 0,
                 model_name: str | None = None, labels: str | Path | pd.DataFrame | None = None,
                 label_column: str = "is_fraud", timestamp_column: str = "event_ts",
                 validation_fraction: float = 0.2, test_fraction: float = 0.2, train_config: Any = None,
                 alias: str | None = None, missing_policy: Any = None,
                 catalog: Catalog | None = None, engine: str | None = None, from_logs: bool = False,
                 logs_of: str | None = None, log: Callable[[str], None] = print) -> TrainingResult:
    """Train `model_name` (default: the service name) on the labels of [cutoff − window, cutoff) and register
    it. Knowledge time: a label counts only if it had arrived by the cutoff (`label_arrived_at` or
    `arrived_at` of the label rows). The window splits by time into train, validation (early stopping) and
    test (the newest `test_fraction`: the baseline gate and the registry's status, never selected on). With
    `alias`, a version registered (not worse than the baseline) also gets that alias (compare-and-set against the
    alias's current version). `champion` only for a model that has none yet (the first one: no champion to
    gate against); later versions reach it through challenger → shadow → canary, so `canary`, `shadow`,
    `previous` and an existing `champion` are refused before any work is done."""
    from quiver.artifacts import ArtifactStore
    from quiver.catalog.references import resolve_features
    from quiver.models import artifact, data, metrics, train
    from quiver.models import reference as drift_reference
    from quiver.models.network import NetworkConfig, embedding_dim
    from quiver.registry import Registry
    from quiver.registry.repository import load_applied_catalog

    lines: list[str] = []

    def say(message: str) -> None:
        lines.append(message)
        log(message)

    train.pick_device(device)  # a missing GPU is a user error now, not after the training set is built
    try:
        span = parse_duration(window)
    except ValueError as exc:
        raise QuiverError(f"window: {exc}") from None
    if span <= timedelta(0):
        raise QuiverError(f"window must be positive, got {window!r}")
    end = parse_cutoff(cutoff if cutoff is not None else datetime.now(UTC).date())
    start = end - span
    name = model_name or service
    registry = Registry(config.registry, project=config.project)
    if alias:
        check_training_alias(ModelRegistry(registry), model_name or service, alias)
    store = ArtifactStore.from_config(config)
    if catalog is None:
        # The applied catalog version is what serving reads, so it is what a model is trained on.
        applied = load_applied_catalog(config)
        catalog, catalog_version = applied.catalog, applied.version
        if applied.disk_differs:
            say(f"note: definitions on disk differ from applied catalog version {applied.version}; training on "
                f"the applied version")
    else:
        latest = registry.latest()
        catalog_version = latest[0] if latest and latest[1] == catalog.content_hash else None
    if catalog_version is None:
        say("warning: the catalog is not an applied registry version; the model records no catalog version "
            "(run `quiver apply` first)")
    cfg = replace(train_config or train.TrainConfig(), seed=seed)
    refs = resolve_features(catalog, service, full_feature_names=False)
    features = [r.column for r in refs]

    # ----- the training set: labels of the window × features as of each label's time (or as served) -----
    started = time.perf_counter()
    if from_logs:
        built = from_serving_logs(config, catalog, service, start, end, logs_of, label_column, timestamp_column,
                                   engine, say)
    else:
        built = from_label_rows(config, catalog, service, labels, start, end, label_column, timestamp_column,
                                 engine, say)
    frame, table, window_times = built.frame, built.labels, built.window_times
    unknown_yet, unlabelled, refused = built.not_arrived, built.null_labels, built.refused
    say(f"training set: {len(frame):,} labels in [{start:%Y-%m-%d}, {end:%Y-%m-%d}) × {len(features)} features "
        f"({time.perf_counter() - started:.1f} s)")

    # ----- split by time: train | validation (early stopping) | test (gates); preprocessing fit on train -----
    held = data.time_split(frame, timestamp_column, test_fraction)
    split = data.time_split(held.train, timestamp_column, validation_fraction / (1.0 - test_fraction))
    numeric, categorical = data.infer_kinds(frame, features)
    prep = data.fit_preprocessor(split.train, numeric, categorical)
    train_t = data.to_tensors(split.train, prep, label_column)
    valid_t = data.to_tensors(split.valid, prep, label_column)
    test_t = data.to_tensors(held.valid, prep, label_column)
    say(f"split at {split.boundary:%Y-%m-%d %H:%M} and {held.boundary:%Y-%m-%d %H:%M}: {len(train_t):,} train / "
        f"{len(valid_t):,} validation / {len(test_t):,} test rows; {len(numeric)} numeric, {len(categorical)} "
        f"categorical ({', '.join(categorical) or '-'})")
    label_rates = {"train": float(train_t.label.mean()), "validation": float(valid_t.label.mean()),
                   "test": float(test_t.label.mean())}
    say(f"positive rate: train {label_rates['train']:.2%}, validation {label_rates['validation']:.2%}, test "
        f"{label_rates['test']:.2%}")
    if label_rates["test"] < 0.5 * label_rates["train"]:
        # Knowledge time keeps only labels known at the cutoff; when positives arrive later than negatives the
        # newest rows are positive-poor, and the test window (the newest) judges the model on that.
        say("warning: the test window's positive rate is under half the training window's: its labels look "
            "immature (positives arrive later). An earlier cutoff or a longer window gives the gate a fair test.")
    network = NetworkConfig(n_numeric=len(numeric), cardinalities=prep.cardinalities, hidden=cfg.hidden,
                            dropout=cfg.dropout, wide=cfg.wide, members=cfg.members,
                            embedding_dims=tuple(embedding_dim(c, cfg.embedding_max) for c in prep.cardinalities))

    # ----- train (resumes from the checkpoint of an identical killed run) -----
    run_key = f"{end:%Y%m%dT%H%M}-{duration_label(span)}-s{seed}"
    # A shared artifact root lets a retry on another worker resume; an object store keeps them on this host.
    checkpoints = store.checkpoint_dir(name, run_key) or config.root / ".quiver" / "checkpoints" / name / run_key
    # The baseline is fitted first: it is judged beside the network on test (and may be its starting point).
    baseline = metrics.fit_baseline(train_t.numeric.numpy(), train_t.categorical.numpy(), prep.cardinalities,
                                    train_t.label.numpy(), seed=seed)
    linear = metrics.baseline_weights(baseline, train_t.numeric.shape[1]) if cfg.wide else None
    # Started from the base rate; the baseline's own weights stay a candidate chosen on validation (epoch -1).
    # Below FEW_POSITIVES the network starts *as* the baseline: a few dozen positives cannot teach it what
    # the logistic regression does not know, and its validation win over it is then noise the test undoes.
    positives = int(train_t.label.sum())
    from_baseline = cfg.start_from_baseline or positives < FEW_POSITIVES
    if from_baseline and not cfg.start_from_baseline:
        say(f"{positives} positive training label(s), under {FEW_POSITIVES}: the network starts as its baseline")
    outcome = train.train(train_t, valid_t, network, cfg, device=device, checkpoint_dir=checkpoints, log=say,
                          linear_start=linear if from_baseline else None,
                          linear_candidate=None if from_baseline else linear)

    # ----- metrics of the model and of the baseline, on the test window neither selected on -----
    scorer_columns = held.valid[features]
    test_y = test_t.label.numpy()
    scores = _score(outcome.model, test_t)
    model_metrics = metrics.classification_metrics(test_y, scores)
    baseline_metrics = metrics.classification_metrics(
        test_y, metrics.baseline_scores(baseline, test_t.numeric.numpy(), test_t.categorical.numpy()))

    # ----- artifact (with the drift reference: the window's traffic hour by hour, scored by the model) -----
    sampled = drift_reference.sample_reference(frame, timestamp_column, start, end,
                                               window_timestamps=window_times.to_pandas(), seed=seed)
    reference = sampled.frame[[timestamp_column, *features]].copy()
    reference["score"] = _score_frame(outcome.model, prep, reference)
    coverage = sampled.coverage
    say(f"drift reference: {coverage.rows:,} rows of {len(coverage.days)} day(s) "
        f"({', '.join(coverage.days)}), hours {drift_reference.hour_ranges(coverage.hours) or '-'} UTC"
        + (f"; thinned by knowledge time: {', '.join(f'{d} ({why})' for d, why in coverage.thinned.items())}"
           if coverage.thinned else ""))
    for problem in coverage.problems:
        say(f"warning: the drift reference does not represent the traffic the model was trained for: {problem}. "
            f"Drift checks against it may alert falsely; a window whose labels have arrived fixes it")
    with store.staging() as staging:
        folder, sha = artifact.save_artifact(
            staging / "models", name, outcome.model, prep, feature_refs=[f"{r.view}:{r.feature}" for r in refs],
            features=features, catalog_version=catalog_version, catalog_hash=catalog.content_hash,
            label_column=label_column, reference=reference,
            extra={"service": service, "window": duration_label(span), "cutoff": end.isoformat(),
                   "train_config": cfg.to_dict(),
                   "missing_policy": (missing_policy or artifact.MissingPolicy()).to_dict()})
        scorer = artifact.load_model(folder, catalog, expected_sha256=sha)
        if not np.allclose(scorer.predict(scorer_columns), scores, rtol=0, atol=1e-6):
            raise RuntimeError(f"artifact {folder} does not reproduce the trained model's scores")
        artifact_key = store.publish_dir(folder, f"{MODELS}/{name}/{folder.name}")
    model_metrics.update(metrics.score_latency_ms(scorer.predict, scorer_columns, len(scorer_columns)))
    # The label rows of the window, as trained on: any worker (the retrain gate) can rebuild the split.
    labels_key, labels_sha = store.snapshot_table(table, name)
    model_metrics.update({"samples_per_s": outcome.samples_per_s, "epochs": float(outcome.epochs_run),
                          "best_epoch": float(outcome.best_epoch), "val_loss": outcome.best_val_loss})
    rows = {"labels": int(table.num_rows), "train": len(train_t), "validation": len(valid_t), "test": len(test_t),
            "quarantined_null_label": int(unlabelled), "not_arrived_by_cutoff": int(unknown_yet),
            "refused_by_request_contract": int(sum(refused.values()))}
    lineage_rates = {k: round(v, 6) for k, v in label_rates.items()}
    lineage = {
        "labels_source": labels_key, "labels_sha256": labels_sha, "labels_origin": built.origin,
        "rows": rows, "positive_rate": lineage_rates, "service": service,
        "feature_refs": [f"{r.view}:{r.feature}" for r in refs],
        "pit": {"engine": engine or config.engine, "timestamp_column": timestamp_column,
                "as_of_rule": "features use only events with event_ts < label time",
                "offline_root": config.offline_root},
        **({"features_from": built.features_from} if built.features_from else {}),
        "split": {"kind": "time", "validation_fraction": validation_fraction, "test_fraction": test_fraction,
                  "boundary": held.boundary.isoformat(), "validation_boundary": split.boundary.isoformat(),
                  "test_boundary": held.boundary.isoformat(), "metrics_on": "test"},
        "knowledge_time": {"cutoff": end.isoformat(), "arrival_column": arrival_column(table),
                           "left_out_not_arrived": int(unknown_yet)},
        "catalog_hash": catalog.content_hash, "train_config": cfg.to_dict(), "network": network.to_dict(),
        "device": outcome.device, "precision": outcome.precision, "resumed_from_epoch": outcome.resumed_from_epoch,
        "history": outcome.history,
        "reference": {"kind": "the training window's rows stratified by hour of day in the traffic's shares, "
                              f"{drift_reference.ROWS_PER_DAY:,} rows per day of traffic, scored by the model",
                      "seed": seed, **coverage.to_dict()},
    }
    models = ModelRegistry(registry, store)
    version = models.register(name, artifact_path=artifact_key, sha256=sha,
                              metrics={**model_metrics, "baseline": baseline_metrics}, window_start=start,
                              cutoff=end, features=features, catalog_version=catalog_version,
                              label_column=label_column, lineage=lineage,
                              reference_path=f"{artifact_key}/{artifact.REFERENCE_FILE}")
    status = version.status  # the registry decides, from the recorded metrics
    shutil.rmtree(checkpoints, ignore_errors=True)  # the run is recorded; checkpoints only serve a crash
    say(f"{version.label} {status}: ROC-AUC {model_metrics['roc_auc']:.4f} vs baseline "
        f"{baseline_metrics['roc_auc']:.4f}; artifact {store.location(artifact_key)}")
    move = None
    if alias and status == "registered":
        current = models.aliases(name).get(alias)
        move = models.set_alias(name, alias, version.version, expected=current, as_of=end,  # data time: cutoff
                                reason=f"trained on [{start:%Y-%m-%d}, {end:%Y-%m-%d}), not worse than the baseline")
        say(f"alias {alias}: {current or '-'} → {version.version}")
    registry.close()
    return TrainingResult(version, model_metrics, baseline_metrics, status, outcome.device, outcome.samples_per_s,
                          rows, move, lines)


def check_training_alias(models: ModelRegistry, name: str, alias: str) -> None:
    """Refuse an alias a training run must not hand out (see `run_training`)."""
    if alias in LOOP_ALIASES:
        raise QuiverError(f"--alias {alias}: that alias is moved only by the loop's gated steps (shadow, canary, "
                          f"promotion); train with --alias challenger to start them")
    champion = models.aliases(name).get("champion")
    if alias == "champion" and champion is not None:
        raise QuiverError(f"--alias champion: {name}:{champion} is the champion; a new version replaces it only "
                          f"through challenger → shadow → canary (train with --alias challenger)")


def _score(model: Any, tensors: Any) -> np.ndarray:
    import torch

    with torch.inference_mode():
        return torch.sigmoid(model(tensors.numeric, tensors.categorical).double()).numpy()


def _score_frame(model: Any, preprocessor: Any, frame: pd.DataFrame) -> np.ndarray:
    """The model's probabilities for the rows of a feature frame (no label needed)."""
    import torch

    numeric, categorical = preprocessor.transform(frame)
    with torch.inference_mode():
        return torch.sigmoid(model(torch.from_numpy(numeric), torch.from_numpy(categorical)).double()).numpy()


def metrics_table(result: TrainingResult) -> list[tuple[str, str, str]]:
    """(metric, model, baseline) rows for printing."""
    names = ("roc_auc", "pr_auc", "log_loss", "brier", "ece")
    return [(n, f"{result.metrics[n]:.4f}", f"{result.baseline[n]:.4f}") for n in names]


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m quiver.pipelines.training --service fraud_model --window 14d --cutoff 2026-11-10``."""
    from quiver.config import load_config

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--service", default="fraud_model")
    parser.add_argument("--window", default="14d")
    parser.add_argument("--cutoff", required=True)
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default=None)
    parser.add_argument("--alias", default=None)
    parser.add_argument("--config", default=None)
    args = parser.parse_args(argv)
    result = run_training(load_config(args.config), args.service, args.window, args.cutoff, device=args.device,
                          seed=args.seed, model_name=args.name, alias=args.alias)
    for metric, model, base in metrics_table(result):
        print(f"{metric:<10}{model:>10}{base:>10}")


if __name__ == "__main__":
    main()
