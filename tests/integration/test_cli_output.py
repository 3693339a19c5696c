"""What the CLI prints, read as a user reads it (issue 55): metrics named for the window they were measured on,
`models describe` in sections of `key: value` lines with integers as integers and the gate's reason in
words, `stream-status` reporting the route a run read, errors naming CLI flags, a feature name given to
`describe` answered with its view, and `models promote` pointing at the command that promotes."""

from __future__ import annotations

import json
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest

from quiver.registry import Registry
from quiver.registry.models import ModelRegistry, derive_status
from quiver.streaming.paths import StreamPaths
from quiver.streaming.status import write_status
from tests.cli_runs import COLUMNS, done, quiver
from tests.unit.catalogs.builders import transactions, write_catalog, write_parquet

pytestmark = pytest.mark.integration

ENTITIES = 'from quiver import Entity\nuser = Entity("user", ["user_id"])\n'
VIEWS = '''\
from entities import user
from quiver import Aggregation, FeatureService, FeatureView, Field, Float64, Source, String

tx = Source("tx", "data/tx", description="card transactions")
user_last = FeatureView("user_last", [user], tx, schema=[Field("amount", Float64), Field("category", String)],
                        ttl="1d")
user_spend = FeatureView("user_spend", [user], tx, aggregations=[Aggregation("amount", "sum", "1h"),
                                                                 Aggregation("amount", "count", "24h")])
fraud = FeatureService("fraud", [user_last, user_spend])
'''

# What a training run records (the demo's fraud_model:1, trimmed): test-window metrics beside the baseline's,
# the run's own numbers (counts stored as floats), and a lineage that printed as one 3,000-character line.
METRICS = {"roc_auc": 0.866972, "pr_auc": 0.154909, "log_loss": 0.046593, "brier": 0.009793, "ece": 0.002405,
           "positive_rate": 0.010599, "rows": 8020.0, "epochs": 8.0, "best_epoch": -1.0, "val_loss": 0.0622976,
           "samples_per_s": 125025.28, "latency_ms_batch_1": 0.8755, "latency_ms_batch_1000": 1.9005,
           "baseline": {"roc_auc": 0.866972, "pr_auc": 0.154909, "log_loss": 0.046593, "brier": 0.009793,
                        "ece": 0.002405, "positive_rate": 0.010599, "rows": 8020.0}}
LINEAGE = {
    "rows": {"labels": 40098, "train": 24058, "validation": 8020, "test": 8020, "not_arrived_by_cutoff": 7902},
    "split": {"kind": "time", "metrics_on": "test", "test_boundary": "2026-11-06T13:03:19.650315+00:00",
              "validation_boundary": "2026-11-05T01:01:01.853133+00:00", "test_fraction": 0.2},
    "feature_refs": [f"user_spend:amount_{fn}_{w}" for fn in ("count", "sum", "mean", "max") for w in ("1h", "24h")]
    + [f"user_profile:{name}" for name in ("account_age_days", "credit_limit", "country")],
    "network": {"cardinalities": [202, 10, 12, 10], "embedding_dims": [16, 6, 6, 6], "hidden": [32], "wide": True},
    "train_config": {"batch_size": 512, "dropout": 0.3, "epochs": 30, "learning_rate": 0.003, "patience": 8,
                     "weight_decay": 0.0001, "warmup_fraction": 0.05, "min_lr_fraction": 0.05, "seed": 0},
    "reference": {"days": [f"2026-11-0{d}" for d in range(1, 8)], "hours": list(range(24)), "rows": 16000,
                  "kind": "the training window's rows stratified by hour of day in the traffic's shares"},
    "labels_sha256": "3b529bd50d5d8bdfda0f980c2cc5e1ea4fcdbccd89d8e2f58baae61e471c72fe",
    "history": [{"epoch": e, "train_loss": 0.05, "val_loss": 0.06} for e in range(8)],
}


def failed(result: subprocess.CompletedProcess[str]) -> str:
    """The stderr of a run refused as a user error or a usage error (exit 2), on one line, no traceback."""
    assert result.returncode == 2, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr
    return " ".join(result.stderr.replace("│", " ").split())


@pytest.fixture
def catalog_project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    done(quiver("init", str(root), "--project", "demo", cwd=tmp_path))
    write_parquet(root / "data/tx/part-0.parquet", transactions())
    write_catalog(root / "feature_defs", {"entities.py": ENTITIES, "views.py": VIEWS})
    done(quiver("apply", cwd=root))
    return root


@pytest.fixture
def model_project(tmp_path: Path) -> Path:
    (tmp_path / "quiver.yaml").write_text(f"project: fraud\nregistry_url: sqlite:///{tmp_path}/registry.db\n")
    models = ModelRegistry(Registry(f"sqlite:///{tmp_path}/registry.db", project="fraud"), verify_artifacts=False)
    models.register("fraud_model", artifact_path="models/fraud_model/3ec3a52b", sha256="3ec3" * 16, metrics=METRICS,
                    window_start=datetime(2026, 11, 1, tzinfo=UTC), cutoff=datetime(2026, 11, 9, tzinfo=UTC),
                    features=[r.split(":")[1] for r in LINEAGE["feature_refs"]],  # type: ignore[attr-defined]
                    catalog_version=1, label_column="is_fraud", lineage=LINEAGE,
                    reference_path="models/fraud_model/3ec3a52b/reference.parquet")
    return tmp_path


def test_models_describe_is_sections_of_short_lines_with_integers_and_the_gate_in_words(model_project: Path) -> None:
    """Before: the lineage as one JSON line of thousands of characters; epochs `8.0000`, rows `8020.0000`; the
    gate's reason nowhere."""
    text = done(quiver("models", "describe", "fraud_model", "1", cwd=model_project))
    assert max(len(line) for line in text.splitlines()) <= int(COLUMNS), text
    assert "lineage: {" not in text and '"train_config"' not in text
    lines = [line.strip() for line in text.splitlines()]
    assert "epochs run: 8" in lines and "rows: 8,020" not in lines  # a count, as an integer (rows: in the table)
    assert "8.0000" not in text and "8020.0000" not in text and "-1.0000" not in text
    assert any(line.startswith("best epoch") and line.endswith(": -1") for line in lines)
    assert "│ rows          │ 8,020" in text  # the test window's size, beside the baseline's
    assert "metrics on the test window (rows from 2026-11-06 13:03:19 to the cutoff)" in text
    _, why = derive_status(METRICS)
    assert f"offline gate: registered: {why}" in " ".join(text.split()), text  # the registry's reason, in words
    assert "train_config:" in lines and "batch_size: 512" in lines and "learning_rate: 0.003" in lines
    assert "features (11): user_spend: amount_count_1h" in text
    record = json.loads(done(quiver("models", "describe", "fraud_model", "1", "--json", cwd=model_project)))
    assert record["metrics"]["epochs"] == 8.0 and record["gate"] == f"registered: {why}"  # --json keeps every number


def test_models_list_names_the_test_window_not_validation(model_project: Path) -> None:
    """Before: `models list -h` said "validation AUC" of metrics measured on the test window."""
    helped = " ".join(done(quiver("models", "list", "-h", cwd=model_project)).replace("│", " ").split())
    assert "validation" not in helped and "test window" in helped
    listed = done(quiver("models", "list", cwd=model_project))
    assert "test ROC-AUC" in listed and "0.8670" in listed


def test_models_promote_points_at_the_commands_that_promote(tmp_path: Path) -> None:
    """Before: "No such command 'promote'." and nothing else."""
    for args in (("models", "promote", "fraud_model", "3"), ("promote",)):
        said = failed(quiver(*args, cwd=tmp_path))
        assert "No such command 'promote'" in said
        assert "quiver models alias set MODEL champion VERSION" in said and "quiver canary start" in said
    assert "quiver models alias rollback MODEL" in failed(quiver("models", "rollback", cwd=tmp_path))
    assert "Did you mean 'list'?" in failed(quiver("models", "lst", cwd=tmp_path))  # Typer's typo hint stays


def test_describe_a_feature_shows_the_view_that_holds_it(catalog_project: Path) -> None:
    """Before: "no definition named 'amount_sum_1h'" and a list of views, none marked as its holder."""
    for name in ("amount_sum_1h", "user_spend:amount_sum_1h"):
        text = done(quiver("describe", name, cwd=catalog_project))
        assert "'amount_sum_1h' is a feature of feature view user_spend" in text
        assert "`quiver describe user_spend`" in text and "sum(amount) over 1h" in text  # the view, shown
    said = failed(quiver("describe", "amount_sum_1h", "--json", cwd=catalog_project))
    assert "feature view user_spend" in said and "quiver describe user_spend --json" in said
    assert "no definition named 'nope'" in failed(quiver("describe", "nope", cwd=catalog_project))


def test_training_set_errors_name_the_cli_flags(catalog_project: Path) -> None:
    """Before: "…several datetime columns (…); pass timestamp_column=…", the Python argument."""
    labels = pd.DataFrame({"user_id": [0, 1], "seen_at": pd.to_datetime(["2026-11-01", "2026-11-02"], utc=True),
                           "paid_at": pd.to_datetime(["2026-11-01", "2026-11-02"], utc=True)})
    labels.to_parquet(catalog_project / "labels.parquet", index=False)
    said = failed(quiver("training-set", "labels.parquet", "--service", "fraud", "--out", "out.parquet",
                         cwd=catalog_project))
    assert "several datetime columns (seen_at, paid_at)" in said and "pass --timestamp-column NAME" in said
    assert "timestamp_column=" not in said
    # No time column at all (the issue's case), checked once the views' offline data is found.
    done(quiver("backfill", "--start", "2026-11-01", "--end", "2026-11-01", cwd=catalog_project))
    labels[["user_id"]].to_parquet(catalog_project / "labels.parquet", index=False)
    said = failed(quiver("training-set", "labels.parquet", "--service", "fraud", "--out", "out.parquet",
                         cwd=catalog_project))
    assert "timestamp column 'event_ts' (choose another with --timestamp-column NAME)" in said, said
    assert "timestamp_column=" not in said


KAFKA_RUN = {"state": "finished", "mode": "bounded", "parallelism": 1, "pid": 1, "sources": ["transactions"],
             "sink": "redis (JVM sink)", "kafka_goal": {"transactions": 775},
             "kafka": {"transactions": {"topic": "transactions", "end": 775, "committed": 775, "lag": 0}},
             "feeder": {"files": 0, "lines": 0, "backlog": 0}, "loader": {"files": 0, "rows": 0}}


def test_stream_status_reports_what_the_kafka_route_read(tmp_path: Path) -> None:
    """Before: "fed 0 lines from 0 files" (the file route's counters) after a 775-record Kafka run."""
    (tmp_path / "quiver.yaml").write_text("project: s\n")
    write_status(StreamPaths.at(tmp_path / ".quiver/stream"), KAFKA_RUN)
    text = " ".join(done(quiver("stream-status", cwd=tmp_path)).split())
    assert "kafka transactions: topic transactions, read 775 of 775 records (offsets committed by the job), lag 0" \
        in text
    assert "fed 0 lines" not in text and "0 change files" not in text
    files_run = {**KAFKA_RUN, "kafka_goal": {}, "kafka": {}, "sink": "change files + loader",
                 "feeder": {"files": 3, "lines": 12, "backlog": 0}, "loader": {"files": 2, "rows": 9}}
    write_status(StreamPaths.at(tmp_path / ".quiver/stream"), files_run)
    text = " ".join(done(quiver("stream-status", cwd=tmp_path)).split())
    assert "stream files of transactions: fed 12 lines from 3 files" in text and "loaded 2 change files, 9 rows" in text
    assert "kafka" not in text
