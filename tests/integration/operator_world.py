"""A small demo-like project an operator looks at: built through the real parts (catalog applied twice from
definitions on disk, last values in a real Redis, real model artifacts, the real prediction service writing
serving logs, delayed labels, the real judge and drift check), so the console and the CLI have something
true to show.

Story: `fraud_model:1` is champion; `:2` was rejected by the offline gate; `:3` (the same weights as `:1`,
so exactly as good) is shadowed (a shadow verdict), then canaried at share 0.5: the first look holds (no
traffic), the second holds (too few labels), the third promotes it; the post-promotion watch takes a look,
and the new champion serves some traffic.
A drift check compares the champion's training reference with its serving traffic (the served categories
include one the reference never saw), and a source-level check is recorded for the `transactions` source.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from quiver.config import Config, load_config
from tests.cli_runs import done, quiver

MODEL = "fraud_model"
USERS = 400
ROWS_PER_CALL = 4

DEFINITIONS = '''"""The console test's catalog: one source, one entity, one view, one service."""

from quiver import Entity, FeatureService, FeatureView, Field, Float64, Int64, Source, String

user = Entity(name="user", join_keys=["user_id"], dtype=Int64, description="A card holder.")
transactions = Source(name="transactions", path="data/events/transactions", timestamp_field="event_ts",
                      description="Card transactions.", owner="payments-data@example.com")
stats = FeatureView(name="stats", entities=[user], source=transactions, ttl="30d",
                    schema=[Field("f0", Float64), Field("f1", Float64), Field("category", String)],
                    owner="{owner}", description="Per-user transaction statistics.")
fraud_model = FeatureService(name="fraud_model", features=[stats], owner="fraud-team@example.com",
                             description="Inputs of the fraud classifier.")
'''


@dataclass
class World:
    root: Path
    config: Config
    decisions: dict[str, int]  # story step → decision id
    rollout_id: int
    promoted_version: int


def _write_source(root: Path, now: datetime) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"user_id": np.arange(USERS, dtype=np.int64), "f0": rng.normal(size=USERS),
                          "f1": rng.normal(size=USERS), "category": rng.choice(["a", "b", "c"], USERS)})
    events = frame.assign(event_ts=pd.Timestamp(now - timedelta(hours=1)).floor("s"))
    folder = root / "data" / "events" / "transactions" / f"date={now:%Y-%m-%d}"
    folder.mkdir(parents=True)
    pq.write_table(pa.Table.from_pandas(events, preserve_index=False), folder / "part-00000.parquet")
    return frame


def _register(models: Any, root: Path, seed: int, *, beats_baseline: bool = True, auc: float = 0.72) -> int:
    """A real artifact; its metrics make the registry give it `registered`, or `rejected` (it decides)."""
    from tests.integration.test_prediction_service import T0, save_model

    folder, sha = save_model(root, seed, reference_rows=1500)  # enough rows for drift to be judged
    metrics = {"roc_auc": auc, "log_loss": 0.41 if beats_baseline else 0.47, "brier": 0.12,
               "baseline": {"roc_auc": 0.68, "log_loss": 0.44, "brier": 0.13}}
    return int(models.register(MODEL, artifact_path=str(folder), sha256=sha, metrics=metrics,
                               window_start=T0 - timedelta(days=7), cutoff=T0, features=["f0", "f1", "category"],
                               catalog_version=2, label_column="label", lineage={"seed": seed, "service": MODEL},
                               reference_path=str(folder / "reference.parquet")).version)


def _serve(config: Config, models: Any, batches: int, seed: int, truth: np.ndarray, tag: str) -> datetime:
    """Every user `batches` times through the real service, 4 rows a call; labels drawn from `truth`
    arrive at once. Returns a moment after everything was logged."""
    from quiver.monitoring.labels import write_labels
    from quiver.serving.logs import ServingLogger, log_schema
    from quiver.serving.prediction import PredictionService
    from quiver.serving.store import FeatureStore

    rng = np.random.default_rng(seed)
    ids: list[str] = []
    with FeatureStore(config=config) as store, ServingLogger(config.offline_dir, schema=log_schema(store.catalog)) as logger, \
            PredictionService(store, MODEL, models=models, logger=logger) as service:
        for b in range(batches):
            for start in range(0, USERS, ROWS_PER_CALL):
                chunk = [{"request_id": f"{tag}{b}-{start}-{u}", "entities": {"user_id": u}}
                         for u in range(start, min(start + ROWS_PER_CALL, USERS))]
                ids += [p.request_id for p in service.predict(chunk)]
        assert service.drain(30)
    labels = [float(rng.random() < truth[int(i.rsplit("-", 1)[1])]) for i in ids]
    write_labels(config.offline_dir, ids, labels)
    return datetime.now(UTC) + timedelta(seconds=1)


def build_world(root: Path, redis_url: str) -> World:
    from quiver.monitoring.canary_judge import judge_step, start_canary, watch_step
    from quiver.monitoring.canary_stats import JudgeSettings
    from quiver.monitoring.checks import run_drift_check
    from quiver.monitoring.consistency_job import run_consistency
    from quiver.monitoring.evaluation import ShadowSettings, evaluate_shadow
    from quiver.offline.backfill import backfill
    from quiver.online.redis_store import RedisOnlineStore
    from quiver.pipelines.loop_common import Project
    from quiver.pipelines.loop_drift import check_serving_drift
    from quiver.registry.repository import load_applied_catalog

    now = datetime.now(UTC).replace(microsecond=0)
    root.mkdir(parents=True, exist_ok=True)
    (root / "quiver.yaml").write_text(f"project: fraud\nregistry_url: sqlite:///{root}/registry.db\n"
                                      f"redis_url: {redis_url}\noffline_root: data/offline\n")
    frame = _write_source(root, now)
    (root / "feature_defs").mkdir()
    defs = root / "feature_defs" / "definitions.py"
    defs.write_text(DEFINITIONS.replace("{owner}", "risk@example.com"))
    done(quiver("apply", "--author", "alice", cwd=root))
    defs.write_text(DEFINITIONS.replace("{owner}", "fraud-team@example.com"))
    done(quiver("apply", "--author", "bob", cwd=root))  # catalog version 2: the view changed owners
    config = load_config(root / "quiver.yaml")
    project = Project(config)
    catalog = load_applied_catalog(config).catalog
    online = RedisOnlineStore(redis_url, config.project, timeout_s=2.0)
    from quiver.offline.layout import last_values_schema

    schema = last_values_schema(catalog.views["stats"])
    table = pa.Table.from_pandas(frame.assign(event_ts=pd.Timestamp(now - timedelta(hours=1))), preserve_index=False)
    online.write_last_values(catalog.views["stats"], table.select(schema.names).cast(schema))
    online.close()

    models = project.models
    models_dir = root / ".quiver" / "models"
    v1 = _register(models, models_dir, seed=1)
    models.set_alias(MODEL, "champion", v1, expected=None, reason="first champion, trained on the first week")
    _register(models, models_dir, seed=2, beats_baseline=False, auc=0.61)
    v3 = _register(models, models_dir, seed=1, auc=0.73)  # the same weights as :1: exactly as good
    models.set_alias(MODEL, "challenger", v3, expected=None, reason="not worse than its baseline nor than the champion")
    models.set_alias(MODEL, "shadow", v3, expected=None, reason=f"shadow {MODEL}:{v3}")
    truth = models.load(MODEL, v1).predict(frame)
    decisions: dict[str, int] = {}
    moment = _serve(config, models, batches=3, seed=1, truth=truth, tag="shadow")
    shadow = evaluate_shadow(config, MODEL, as_of=moment, settings=ShadowSettings(min_pairs=200))
    assert shadow.decision_id is not None
    decisions["shadow"] = shadow.decision_id

    settings = JudgeSettings(steps=(0.5, 1.0), min_rows=300, min_labels=300, log_loss_floor=0.08, brier_floor=0.03,
                             error_rate_floor=0.05, latency_exceedance_floor=0.5, max_canary_calls=50_000,
                             watch_hours=12)
    rollout = start_canary(config, MODEL, v3, settings=settings, reason=f"shadow verdict {shadow.verdict} "
                                                                      f"(decision #{shadow.decision_id})")
    first = judge_step(config, MODEL)
    assert first.verdict.outcome == "hold" and first.decision is not None
    decisions["hold_no_traffic"] = first.decision.id
    moment = _serve(config, models, batches=2, seed=2, truth=truth, tag="early")
    early = judge_step(config, MODEL, as_of=moment)
    assert early.verdict.outcome == "hold" and early.decision is not None, early.verdict.reason
    decisions["hold_waiting"] = early.decision.id
    moment = _serve(config, models, batches=12, seed=3, truth=truth, tag="late")
    promoted = judge_step(config, MODEL, as_of=moment)
    assert promoted.verdict.outcome == "promote" and promoted.decision is not None, promoted.verdict.reason
    decisions["promote"] = promoted.decision.id
    watched = watch_step(config, MODEL, as_of=moment)
    decisions["watch"] = int(watched["decision_id"])
    _serve(config, models, batches=2, seed=4, truth=truth, tag="after")  # the new champion serves

    served = check_serving_drift(project, MODEL, now - timedelta(hours=2), now + timedelta(hours=2))
    assert served["status"] == "computed", served
    rng = np.random.default_rng(5)
    reference = pd.DataFrame({"f0": rng.normal(size=2000), "f1": rng.normal(size=2000),
                              "category": rng.choice(["a", "b"], 2000)})
    for day, shift in ((13, 0.0), (14, 0.05), (15, 0.6)):  # the source drifts on the 15th
        current = pd.DataFrame({"f0": rng.normal(shift, size=2000), "f1": rng.normal(size=2000),
                                "category": rng.choice(["a", "b"], 2000)})
        run_drift_check(reference, current, name="transactions", features=["f0", "f1", "category"],
                        registry=project.registry, alerts=project.alerts,
                        reference_label="data/events/transactions/date=2026-11-03",
                        current_label=f"data/events/transactions/date=2026-11-{day}")
    # The consistency job over the served window: the offline store from the same events the online store holds.
    backfill(config, catalog, (now - timedelta(hours=1)).date(), now.date())
    consistent = run_consistency(config, model=MODEL, start=now - timedelta(hours=2), end=now + timedelta(hours=2),
                                 registry=project.registry)
    assert consistent.run_id is not None and not consistent.report.inconsistent, consistent.report.to_dict()
    return World(root, config, decisions, rollout.id, v3)
