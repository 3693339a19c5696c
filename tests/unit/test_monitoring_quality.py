"""Data-quality gate: suites from the catalog, tags and user files; quarantine keeps every bad row."""

from __future__ import annotations

import json
import re
import textwrap
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quiver.catalog.errors import QuiverError
from quiver.catalog.loader import load_catalog
from quiver.monitoring.alerts import AlertManager
from quiver.monitoring.quality import (
    QualityGate,
    QualityGateError,
    catalog_expectations,
    load_user_expectations,
    tag_expectations,
)
from quiver.registry import Registry

T0 = datetime(2026, 11, 2, tzinfo=UTC)
DEFS = '''
from quiver import Aggregation, Entity, FeatureView, Field, Float64, Int64, Source, String

user = Entity(name="user", join_keys=["user_id"], dtype=Int64)
transactions = Source(name="transactions", path="data/tx", timestamp_field="event_ts",
                      tags={"expect.amount.min": "0", "expect.category.in": "grocery,fuel,travel"})
user_spend = FeatureView(name="user_spend", entities=[user], source=transactions,
                         aggregations=[Aggregation("amount", "sum", "1h")],
                         tags={"expect.amount.max": "100000"})
user_last = FeatureView(name="user_last", entities=[user], source=transactions,
                        schema=[Field("category", String)], ttl="7d")
'''


def transactions(n: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    ts = np.int64(T0.timestamp() * 1e6) + np.sort(rng.integers(0, 86_400_000_000, n))
    return pa.table({"user_id": pa.array(rng.integers(1, 50, n), pa.int64()),
                     "amount": pa.array(rng.lognormal(3, 1, n)),
                     "category": pa.array(rng.choice(["grocery", "fuel", "travel"], n)),
                     "event_ts": pa.array(ts, pa.timestamp("us", tz="UTC"))})


def corrupt(table: pa.Table) -> tuple[pa.Table, set[int]]:
    frame = table.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)
    frame.loc[[3, 40], "user_id"] = pd.NA           # null key
    frame.loc[[7], "amount"] = -5.0                 # below the tag's min
    frame.loc[[11, 40], "category"] = "casino"      # outside the tag's set
    frame.loc[[15], "event_ts"] = pd.Timestamp("2100-01-01", tz="UTC")  # from the future
    return pa.Table.from_pandas(frame, preserve_index=False), {3, 7, 11, 15, 40}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "feature_defs").mkdir()
    (tmp_path / "feature_defs" / "quality_defs.py").write_text(textwrap.dedent(DEFS))
    (tmp_path / "data" / "tx").mkdir(parents=True)
    pq.write_table(transactions(100), tmp_path / "data" / "tx" / "part-0.parquet")
    return tmp_path


def test_catalog_and_tag_expectations(project: Path) -> None:
    catalog = load_catalog(project / "feature_defs", root=project)
    entries = catalog_expectations(catalog, "transactions", now=T0)
    kinds = {(e["type"], e["kwargs"].get("column")) for e in entries}
    assert ("expect_column_values_to_not_be_null", "user_id") in kinds
    assert ("expect_column_values_to_not_be_null", "event_ts") in kinds
    assert ("expect_column_values_to_be_in_type_list", "amount") in kinds
    assert ("expect_column_to_exist", "category") in kinds
    between = [e for e in entries if e["type"] == "expect_column_values_to_be_between"]
    assert {"column": "event_ts", "max_value": "2026-11-02T01:00:00"} in [e["kwargs"] for e in between]
    assert {"column": "amount", "min_value": 0.0, "max_value": 100000.0} in [e["kwargs"] for e in between]
    in_set = [e for e in entries if e["type"] == "expect_column_values_to_be_in_set"]
    assert in_set[0]["kwargs"]["value_set"] == ["grocery", "fuel", "travel"]
    with pytest.raises(QuiverError, match="unknown source"):
        catalog_expectations(catalog, "nope")


def test_tag_grammar() -> None:
    entries = tag_expectations({"expect.id.unique": "true", "expect.id.mostly": "0.9", "expect.code.regex": "^[A-Z]+$",
                                "expect.n.in": "1,2", "owner": "x"}, {"n": "int64"})
    by_type = {e["type"]: e["kwargs"] for e in entries}
    assert by_type["expect_column_values_to_be_unique"] == {"column": "id", "mostly": 0.9}
    assert by_type["expect_column_values_to_match_regex"]["regex"] == "^[A-Z]+$"
    assert by_type["expect_column_values_to_be_in_set"]["value_set"] == [1, 2]
    with pytest.raises(QuiverError, match=r"expect\.id\.bogus"):
        tag_expectations({"expect.id.bogus": "1"})


def test_user_suite_file(tmp_path: Path) -> None:
    (tmp_path / "transactions.json").write_text(json.dumps({"name": "tx", "expectations": [
        {"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 10}}]}))
    entries = load_user_expectations(tmp_path, "transactions")
    assert entries == [{"type": "expect_table_row_count_to_be_between", "kwargs": {"min_value": 10},
                        "meta": {"origin": "user:transactions.json"}}]
    assert load_user_expectations(tmp_path, "other") == []
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(QuiverError, match="not valid JSON"):
        load_user_expectations(tmp_path, "bad")


def test_clean_batch_passes_untouched(project: Path) -> None:
    gate = QualityGate(load_catalog(project / "feature_defs", root=project), quarantine_dir=project / "q")
    batch = project / "data" / "tx" / "part-0.parquet"
    result = gate.check(batch, "transactions")
    assert result.success and result.n_bad_rows == 0 and result.quarantine_path is None
    assert batch.exists() and not (project / "q").exists()


def test_failing_batch_is_quarantined_with_every_bad_row(project: Path, sqlite_url: str) -> None:
    catalog = load_catalog(project / "feature_defs", root=project)
    bad_table, bad_rows = corrupt(transactions(200, seed=1))
    batch = project / "incoming" / "2026-11-02.parquet"
    batch.parent.mkdir()
    pq.write_table(bad_table, batch)
    (project / "suites").mkdir()
    (project / "suites" / "transactions.json").write_text(json.dumps([
        {"type": "expect_column_values_to_be_between", "kwargs": {"column": "amount", "max_value": 1e9}}]))
    manager = AlertManager(Registry(sqlite_url, project="fraud"))
    gate = QualityGate(catalog, quarantine_dir=project / "q", expectations_dir=project / "suites", alerts=manager)
    result = gate.gate(batch, "transactions")  # the pipeline's gate: a failing file leaves the offline path
    assert not result.success and result.source_moved
    assert set(result.bad_rows.tolist()) == bad_rows and result.n_bad_rows == 5
    assert not batch.exists()  # moved aside, not copied
    target = result.quarantine_path
    assert target is not None and target.parent == project / "q" / "transactions"
    moved = pq.read_table(target / "batch" / batch.name)
    assert moved.equals(bad_table)  # nothing lost
    kept = pq.read_table(target / "bad_rows.parquet").to_pandas()
    assert sorted(kept["_row"]) == sorted(bad_rows)
    reasons = dict(zip(kept["_row"], kept["_failed_expectations"], strict=True))
    assert "expect_column_values_to_not_be_null(user_id)" in reasons[40]
    assert "expect_column_values_to_be_in_set(category)" in reasons[40]
    assert "expect_column_values_to_be_between(event_ts)" in reasons[15]
    summary = json.loads((target / "validation.json").read_text())
    assert summary["n_bad_rows"] == 5 and summary["origin"] == str(batch)
    assert {f["column"] for f in summary["failed"]} == {"user_id", "amount", "category", "event_ts"}
    assert "<html" in (target / "validation.html").read_text().lower()
    [alert] = manager.open_alerts("quality")
    assert alert.subject == "transactions" and alert.severity == "warning"
    assert alert.detail["bad_rows"] == 5 and alert.detail["source_moved"] is True
    assert "moved out of the offline path" in alert.message
    # a later clean batch resolves the alert
    assert gate.check(transactions(50, seed=2), "transactions").success
    assert manager.open_alerts("quality") == []


def test_stop_policy_raises_after_quarantine(project: Path) -> None:
    catalog = load_catalog(project / "feature_defs", root=project)
    gate = QualityGate(catalog, quarantine_dir=project / "q", on_failure="stop")
    bad_table, _ = corrupt(transactions(100, seed=3))
    with pytest.raises(QualityGateError) as info:
        gate.check(bad_table, "transactions", batch_id="b1")
    target = info.value.result.quarantine_path
    assert target == project / "q" / "transactions" / "b1"
    assert pq.read_table(target / "batch" / "batch.parquet").num_rows == 100


def test_table_level_failure_marks_every_row(project: Path) -> None:
    gate = QualityGate(load_catalog(project / "feature_defs", root=project), quarantine_dir=project / "q")
    table = transactions(30).drop_columns(["category"])
    result = gate.check(table, "transactions")
    assert not result.success and result.n_bad_rows == 30
    assert pq.read_table(result.quarantine_path / "bad_rows.parquet").num_rows == 30


def test_gate_needs_some_expectations(tmp_path: Path) -> None:
    with pytest.raises(QuiverError, match="no expectations"):
        QualityGate(quarantine_dir=tmp_path).check(pd.DataFrame({"a": [1]}), "anything")
    ok = QualityGate(quarantine_dir=tmp_path, extra={"s": [
        {"type": "expect_column_values_to_be_between", "kwargs": {"column": "a", "min_value": 0}}]})
    assert ok.check(pd.DataFrame({"a": [1, 2, 3]}), "s", batch_id="x").success
    assert timedelta(hours=1) == ok.future_skew


def test_a_check_by_hand_reports_and_leaves_the_input_in_place(project: Path) -> None:
    catalog = load_catalog(project / "feature_defs", root=project)
    bad_table, bad_rows = corrupt(transactions(120, seed=4))
    batch = project / "data" / "tx" / "part-1.parquet"
    pq.write_table(bad_table, batch)
    result = QualityGate(catalog, quarantine_dir=project / "q").check(batch, "transactions")
    assert not result.success and not result.source_moved
    assert pq.read_table(batch).equals(bad_table)  # the user's file is untouched, the partition intact
    target = result.quarantine_path
    assert target is not None and not (target / "batch").exists()
    kept = pq.read_table(target / "bad_rows.parquet").to_pandas()
    assert sorted(kept["_row"]) == sorted(bad_rows)
    summary = json.loads((target / "validation.json").read_text())
    assert summary["source_moved"] is False and summary["origin"] == str(batch)
    assert "left in place" in (target / "validation.html").read_text()


def test_validation_page_renders_offline_and_escapes_values(project: Path) -> None:
    catalog = load_catalog(project / "feature_defs", root=project)
    frame = transactions(60, seed=5).to_pandas()
    frame.loc[[2, 9], "category"] = "<script>alert('x')</script>"
    result = QualityGate(catalog, quarantine_dir=project / "q").check(frame, "transactions", batch_id="b<1>")
    page = (result.quarantine_path / "validation.html").read_text()
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "FAILED" in page and "expect_column_values_to_be_in_set" in page
    external = re.findall(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", page, flags=re.I)
    assert not external and "http://" not in page and "https://" not in page
