"""Log and wait on a real small project (the consistency job's world: events backfilled with DuckDB,
materialized into a real Redis, served by the real prediction service, which writes the serving logs): a
training set built from the logs holds exactly what serving saw, joined to the label store by request id,
with only a feature the model did not read backfilled; and a model trained from it equals one trained from
a full point-in-time backfill of the same rows."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.cli_runs import done, quiver
from tests.integration.test_consistency_job import CORRUPT_USER, USERS, World, _serve
from tests.integration.test_consistency_job import world as world  # the fixture

pytestmark = pytest.mark.integration

NEXT = "fraud_next"  # the served model's three inputs and one feature it never read
STORED = ["f0", "f1", "category"]
NEW = "f0_sum_1h"


def _label(world: World, arrived_after: timedelta, skip: set[str] | None = None, seed: int = 0) -> dict[str, float]:
    """A 0/1 label for every logged request but `skip`, arriving `arrived_after` t0 (the label store)."""
    from quiver.monitoring.labels import write_labels
    from quiver.serving.logs import read_serving_logs

    ids = [r for r in read_serving_logs(world.config.offline_dir)["request_id"].to_pylist() if r not in (skip or set())]
    labels = np.random.default_rng(seed).binomial(1, 0.3, len(ids)).astype(float)
    written = write_labels(world.config.offline_dir, ids, labels.tolist(), world.t0 + arrived_after)
    assert written.written == len(ids) and written.quarantined == 0
    return dict(zip(ids, labels.tolist(), strict=True))


def test_a_training_set_from_logs_is_what_serving_saw_with_only_the_new_feature_backfilled(world: World) -> None:
    from quiver.catalog.errors import QuiverError
    from quiver.monitoring.logged_features import get_logged_features
    from quiver.offline import layout
    from quiver.offline.pit import get_historical_features
    from quiver.online.redis_store import RedisOnlineStore

    _serve(world, range(1, 21), "a")
    # A value corrupted in Redis, then served: the logs keep what serving saw, a backfill does not.
    with RedisOnlineStore(world.config.redis_url, world.config.project) as online:
        last = pq.read_table(layout.view_dir(world.config.offline_dir, "stats", layout.LAST_VALUES)).to_pandas()
        row = last[last["user_id"] == CORRUPT_USER].sort_values("event_ts").tail(1).assign(f0=-1234.5)
        online.write_last_values(world.catalog.views["stats"],
                                 pa.Table.from_pandas(row[[*["user_id", "event_ts"], *STORED]], preserve_index=False))
    _serve(world, range(30, 35), "b")
    unlabelled = {f"a1-{u}" for u in range(USERS)}  # the first round's labels have not come yet
    labels = _label(world, timedelta(hours=2), skip=unlabelled)

    built = get_logged_features(NEXT, config=world.config, start=world.t0, end=world.t0 + timedelta(hours=1),
                                model="fraud")
    assert built.logged == ("stats:f0", "stats:f1", "stats:category")
    assert built.backfilled == (f"spend:{NEW}",) and built.mixed == {}
    assert built.rows == {"logged": 25 * USERS, "dropped": 0, "errored": 0, "duplicates": 0, "unlabelled": USERS,
                          "kept": 24 * USERS}
    frame = built.frame
    assert list(frame.columns) == ["request_id", "event_ts", "user_id", "label", "label_arrived_at", *STORED, NEW]
    assert frame["label"].tolist() == [labels[r] for r in frame["request_id"]]
    assert not set(frame["request_id"]) & unlabelled

    # The same rows through a full point-in-time backfill: equal wherever serving was fresh; the corrupted
    # rows differ in f0 only, and the log side holds the value the model was given.
    full = get_historical_features(frame[["user_id", "event_ts"]], NEXT, catalog=world.catalog, config=world.config)
    corrupted = (frame["user_id"] == CORRUPT_USER) & frame["request_id"].str.startswith("b")
    assert int(corrupted.sum()) == 5
    features = [*STORED, NEW]
    pd.testing.assert_frame_equal(frame.loc[~corrupted, features], full.loc[~corrupted, features])
    assert (frame.loc[corrupted, "f0"] == -1234.5).all() and (full.loc[corrupted, "f0"] != -1234.5).all()
    pd.testing.assert_frame_equal(frame[["f1", "category", NEW]], full[["f1", "category", NEW]])
    assert frame[NEW].notna().all() and frame[NEW].nunique() > 1  # the backfill is a real window, not a constant

    # Labels are read as of a moment (knowledge time); the lineage says where every feature came from.
    with pytest.raises(QuiverError, match="no labelled serving-log rows"):
        get_logged_features(NEXT, config=world.config, start=world.t0, end=world.t0 + timedelta(hours=1),
                            labels_as_of=world.t0 + timedelta(hours=1))  # before any label arrived
    # Labels given as a table are read as of a moment too; a label column named like a feature is refused.
    given = pa.table({"request_id": ["b30-0", "b30-1"], "label": [1.0, 0.0],
                      "arrived_at": pa.array([world.t0 + timedelta(minutes=40), world.t0 + timedelta(hours=3)],
                                             pa.timestamp("us", tz="UTC"))})
    few = get_logged_features(NEXT, config=world.config, start=world.t0, end=world.t0 + timedelta(hours=1),
                              labels=given, labels_as_of=world.t0 + timedelta(hours=1))
    assert few.frame["request_id"].tolist() == ["b30-0"] and few.rows["unlabelled"] == 25 * USERS - 1
    with pytest.raises(QuiverError, match="clash with the label-row columns"):
        get_logged_features(NEXT, config=world.config, start=world.t0, end=world.t0 + timedelta(hours=1),
                            label_column="f0")
    lineage = built.lineage()
    assert lineage["source"] == "serving_logs" and lineage["backfilled"] == [f"spend:{NEW}"]
    assert lineage["rows"]["unlabelled"] == USERS

    # The command writes the same set, and says what it left out.
    window = ["--start", world.t0.isoformat(), "--end", (world.t0 + timedelta(hours=1)).isoformat()]
    out = world.root / "from_logs.parquet"
    said = done(quiver("training-set", "--service", NEXT, "--from-logs", *window, "--model", "fraud", "--out",
                       str(out), cwd=world.root))
    assert f"{24 * USERS:,} labelled request(s) of {25 * USERS:,} logged rows ({USERS} without a label yet" in said
    assert f"backfilled: spend:{NEW}" in said
    pd.testing.assert_frame_equal(pd.read_parquet(out), frame, check_dtype=False)
    refused = quiver("training-set", "--service", NEXT, "--from-logs", "--out", str(out), cwd=world.root)
    assert refused.returncode != 0 and "--from-logs needs --start and --end" in refused.stdout + refused.stderr


def test_a_model_trained_from_logs_equals_one_trained_from_a_full_backfill(world: World, tmp_path: Path) -> None:
    from quiver.artifacts import ArtifactStore
    from quiver.models.train import TrainConfig
    from quiver.pipelines.training import run_training
    from quiver.registry import Registry
    from quiver.registry.models import ModelRegistry
    from quiver.serving.logs import read_serving_logs

    _serve(world, range(0, 60), "t")
    cutoff = world.t0 + timedelta(hours=1)
    labels = _label(world, timedelta(minutes=59), seed=4)
    common = {"window": "1h", "cutoff": cutoff, "device": "cpu", "seed": 0, "label_column": "is_fraud",
              "train_config": TrainConfig(epochs=3), "log": lambda line: None}
    from_logs = run_training(world.config, NEXT, model_name="from_logs", from_logs=True, logs_of="fraud", **common)

    # The full backfill's label rows, made independently of the log path: the logged requests and their labels.
    logged = read_serving_logs(world.config.offline_dir).to_pandas()
    rows = pd.DataFrame({"event_ts": logged["ts"], "user_id": logged["key.user_id"].astype("int64"),
                         "is_fraud": [labels[r] for r in logged["request_id"]],
                         "label_arrived_at": world.t0 + timedelta(minutes=59)})
    path = tmp_path / "labels.parquet"
    pq.write_table(pa.Table.from_pandas(rows, preserve_index=False), path)
    backfilled = run_training(world.config, NEXT, model_name="from_backfill", labels=path, **common)

    assert from_logs.rows == backfilled.rows and from_logs.rows["labels"] == 60 * USERS
    assert from_logs.metrics["roc_auc"] == backfilled.metrics["roc_auc"]
    assert from_logs.metrics["log_loss"] == backfilled.metrics["log_loss"]
    registry = Registry(world.config.registry, project=world.config.project)
    models = ModelRegistry(registry, ArtifactStore.from_config(world.config))
    a, b = models.load("from_logs", from_logs.version.version), models.load("from_backfill", backfilled.version.version)
    probe = pd.DataFrame({"f0": np.linspace(-2, 2, 9), "f1": np.linspace(1, -1, 9), "category": ["a", "b", "a"] * 3,
                          NEW: np.linspace(0, 3, 9)})
    np.testing.assert_array_equal(a.predict(probe), b.predict(probe))
    lineage = models.get("from_logs", from_logs.version.version).lineage
    assert lineage["features_from"]["logged"] == ["stats:f0", "stats:f1", "stats:category"]
    assert lineage["features_from"]["backfilled"] == [f"spend:{NEW}"]
    assert lineage["labels_origin"].startswith("serving_logs[")
    assert "features_from" not in models.get("from_backfill", backfilled.version.version).lineage
    registry.close()


def test_rows_a_version_did_not_log_are_backfilled_and_repeats_and_failed_calls_counted(world: World) -> None:
    from quiver.monitoring.logged_features import get_logged_features
    from quiver.offline.pit import get_historical_features
    from quiver.serving.logs import ServingLogger, log_schema

    _serve(world, range(1, 3), "a")  # the registered version: logs f0, f1 and category
    at = int((world.t0 + timedelta(minutes=5)).timestamp() * 1_000_000)
    users = np.arange(4)
    # A version the registry does not know, reading only f0 (its other columns are null), one request of it
    # logged twice (a retry), and a call that failed.
    with ServingLogger(world.config.offline_dir, schema=log_schema(world.catalog)) as logger:
        logger.log_batch(["x0", "x1", "x2", "x3"], {"user_id": users}, {"f0": np.array([9.0, 8.0, 7.0, np.nan])},
                         model_version="fraud:99", ts_us=at, predictions=np.full(4, 0.5))
        logger.log_batch(["x0"], {"user_id": users[:1]}, {"f0": np.array([9.0])}, model_version="fraud:99",
                         ts_us=at + 1, predictions=np.full(1, 0.5))
        logger.log_batch(["x9"], {"user_id": users[:1]}, {"f0": np.array([1.0])}, model_version="fraud:99",
                         ts_us=at, error="model failed: boom")
    _label(world, timedelta(hours=2))

    built = get_logged_features(NEXT, config=world.config, start=world.t0, end=world.t0 + timedelta(hours=1))
    assert built.rows == {"logged": 2 * USERS + 6, "dropped": 0, "errored": 1, "duplicates": 1, "unlabelled": 0,
                          "kept": 2 * USERS + 4}
    assert built.logged == ("stats:f0",) and built.backfilled == (f"spend:{NEW}",)
    assert built.mixed == {"stats:f1": 4, "stats:category": 4}
    frame = built.frame.set_index("request_id")
    # f0 as served, the null included (the model was given a missing value); f1 and category point-in-time.
    assert frame.loc[["x0", "x1", "x2"], "f0"].tolist() == [9.0, 8.0, 7.0] and np.isnan(frame.loc["x3", "f0"])
    full = get_historical_features(built.frame[["user_id", "event_ts"]], NEXT, catalog=world.catalog,
                                   config=world.config).set_index(built.frame["request_id"])
    new = [f"x{i}" for i in range(4)]
    pd.testing.assert_frame_equal(frame.loc[new, ["f1", "category", NEW]], full.loc[new, ["f1", "category", NEW]])
    assert frame.loc[new, "f1"].notna().all()


def test_a_window_whose_logger_dropped_rows_states_them_and_refuses_too_many(world: World) -> None:
    """Rows a serving logger dropped under pressure are not in the logs; their accounts are: a training set
    from logs says how many, and refuses a window that lost more than its limit."""
    from quiver.catalog.errors import QuiverError
    from quiver.monitoring.logged_features import get_logged_features
    from quiver.serving.logs import ServingLogger, log_schema

    _serve(world, range(1, 3), "a")
    at = int((world.t0 + timedelta(minutes=5)).timestamp() * 1_000_000)
    users = np.arange(USERS)
    # A replica under pressure: room for USERS rows, given 3 × USERS; the oldest 2 × USERS are dropped.
    with ServingLogger(world.config.offline_dir, schema=log_schema(world.catalog), max_buffer_rows=USERS,
                       flush_interval_s=3_600, replica="pressed") as logger:
        for k in range(3):
            logger.log_batch([f"p{k}-{u}" for u in users], {"user_id": users}, {"f0": np.ones(USERS)},
                             model_version="fraud:1", ts_us=at + k, predictions=np.full(USERS, 0.5))
    assert logger.dropped_by == {"buffer_full": 2 * USERS}
    _label(world, timedelta(hours=2))
    window = {"config": world.config, "start": world.t0, "end": world.t0 + timedelta(hours=1)}
    with pytest.raises(QuiverError, match=rf"dropped {2 * USERS} of the {5 * USERS} rows served .* "
                                          rf"\(40\.0%: {2 * USERS} buffer_full\)"):
        get_logged_features(NEXT, **window)
    built = get_logged_features(NEXT, **window, max_dropped_share=0.5)
    assert built.rows["dropped"] == 2 * USERS and built.rows["logged"] == 3 * USERS
