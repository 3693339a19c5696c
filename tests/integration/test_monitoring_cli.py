"""`quiver drift / drift-history / quality / alerts` as a user runs them (in process), on the example catalog
and the synthetic demo data (drift injected from day 2, 3% malformed rows: above the contract's 1 %)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from quiver.pipelines.demo_data import generate
from tests.cli_runs import done, quiver

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TX = "data/events/transactions/date={}/part-00000.parquet"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("monitoring_cli")
    shutil.copytree(REPO / "feature_defs", root / "feature_defs", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "quiver.yaml", root / "quiver.yaml")
    generate(root / "data", days=4, seed=3, users=500, transactions_per_day=6_000, drift_from_day=2,
             malformed_fraction=0.03)
    (root / "feature_defs" / "expectations").mkdir(exist_ok=True)
    (root / "feature_defs" / "expectations" / "transactions.json").write_text(json.dumps({"expectations": [
        {"type": "expect_column_values_to_be_between", "kwargs": {"column": "amount", "min_value": 0}},
        {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "category", "value_set": [
            "grocery", "restaurants", "fuel", "fashion", "electronics", "travel", "digital_goods", "gambling"]}},
    ]}))
    (root / "monitoring.yaml").write_text(
        "alert_sinks:\n  - {type: log}\n  - {type: airflow_asset, trigger_dir: data/triggers, kinds: [dataset_drift]}\n")
    return root


def test_drift_command_reports_records_and_alerts(project: Path) -> None:
    out = done(quiver("drift", "--reference", TX.format("2026-11-01"), "--current", TX.format("2026-11-04"),
                      "-f", "amount,category,is_online,merchant_id", "--name", "fraud_model",
                      "--report", "reports/drift.html", "--alert", cwd=project))
    assert "amount" in out and "category" in out and "recorded as drift run" in out
    assert "alert" in out  # the injected drift shows up as an alerting feature
    assert (project / "reports" / "drift.html").stat().st_size > 50_000
    assert "data:image/png" in (project / "reports" / "drift.summary.html").read_text()
    history = done(quiver("drift-history", "amount", "--png", "reports/amount.png", cwd=project))
    assert "fraud_model" in history and (project / "reports" / "amount.png").exists()
    listed = done(quiver("alerts", "list", cwd=project))
    assert "fraud_model:amount" in listed


def test_drift_defaults_to_catalog_columns_with_progress(project: Path) -> None:
    out = done(quiver("drift", "--reference", TX.format("2026-11-01"), "--current", TX.format("2026-11-04"),
                      "--no-record", "--report", "reports/default.html", "--sample-rows", "2000", cwd=project))
    assert "comparing 3 columns: the source columns the catalog's views read" in out
    assert "user_id (join key)" in out and "merchant_id (join key)" in out and "event_ts (timestamp)" in out
    rows = [line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│")]
    assert sorted(rows) == ["amount", "category", "is_online"]  # no ids, keys or times
    assert "transaction_id (not a catalog feature)" in out
    assert "drift of 3 features over" in out and "HTML reports (charts from at most 2,000 rows per side)" in out
    summary = (project / "reports" / "default.summary.html").read_text()
    assert "random sample of 2,000 of" in summary and "2026-11-01" in summary and "2026-11-04" in summary


def test_drift_fail_on_drift_and_user_errors(project: Path) -> None:
    same = done(quiver("drift", "--reference", TX.format("2026-11-01"), "--current", TX.format("2026-11-02"),
                       "-f", "is_online", "--no-record", "--fail-on-drift", cwd=project))
    assert "no dataset drift" in same
    done(quiver("drift", "--reference", TX.format("2026-11-01"), "--current", TX.format("2026-11-04"),
                "-f", "amount", "--no-record", "--fail-on-drift", cwd=project), code=1)
    missing = quiver("drift", "--reference", "nope.parquet", "--current", TX.format("2026-11-04"), cwd=project)
    assert missing.returncode == 2 and missing.stderr.startswith("error: ")
    bad_feature = quiver("drift", "--reference", TX.format("2026-11-01"), "--current", TX.format("2026-11-04"),
                         "-f", "no_such_column", cwd=project)
    assert bad_feature.returncode == 2 and "Traceback" not in bad_feature.stderr


def test_quality_command_quarantines_malformed_batches(project: Path) -> None:
    batch = project / TX.format("2026-11-02")
    rows = pq.read_table(batch).num_rows
    before = batch.read_bytes()
    out = done(quiver("quality", "transactions", str(batch), cwd=project), code=1)
    assert "failed" in out and "bad rows and validation page written to" in out and "left in place" in out
    assert batch.read_bytes() == before  # a check by hand never takes the user's file away
    [target] = (project / "data" / "offline" / "_quarantine" / "batches" / "transactions").iterdir()
    assert not (target / "batch").exists() and pq.read_table(batch).num_rows == rows
    summary = json.loads((target / "validation.json").read_text())
    failed = {(f["type"], f["column"]) for f in summary["failed"]}
    assert ("expect_column_values_to_be_in_set", "__refused") in failed  # the contract: > 1 % of rows refused
    assert ("expect_column_values_to_be_between", "amount") in failed  # the user's own suite, strict
    assert ("expect_column_values_to_be_in_set", "category") in failed
    bad = pq.read_table(target / "bad_rows.parquet")
    assert bad.num_rows == summary["n_bad_rows"] > 0
    reasons = set(bad.column("contract_reason").to_pylist()) - {None}
    assert reasons == {"not_null:user_id", "finite:amount", "min:amount", "one_of:category", "future:event_ts"}
    listed = done(quiver("alerts", "list", "--kind", "quality", cwd=project))
    assert "transactions" in listed
    alert_id = listed.split("│")[1].strip() if "│" in listed else None
    assert alert_id and alert_id.isdigit()
    done(quiver("alerts", "resolve", alert_id, cwd=project))
    assert "transactions" not in done(quiver("alerts", "list", "--kind", "quality", cwd=project))


def test_dataset_drift_writes_the_retrain_trigger(project: Path) -> None:
    # The sink is told to treat dataset drift as a retraining signal (`kinds: [dataset_drift]`); by default it
    # only passes on the loop's `retrain_needed` (drift alone warns).
    out = done(quiver("drift", "--reference", TX.format("2026-11-01"), "--current", TX.format("2026-11-04"),
                      "-f", "amount,category,is_online", "--name", "retrain_check", "--alert", cwd=project))
    assert "dataset drift" in out
    trigger = project / "data" / "triggers" / "monitoring_drift.json"
    event = json.loads(trigger.read_text())
    assert event["extra"]["kind"] == "dataset_drift" and event["extra"]["subject"] == "retrain_check"
