"""Tests for the synthetic fraud-domain generator (quiver.pipelines.demo_data)."""

from __future__ import annotations

import json
import math
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quiver.pipelines.demo_data import (
    CATEGORIES,
    MALFORMED_KINDS,
    GenerationSummary,
    generate,
    main,
)
from quiver.pipelines.stream_producer import produce

SMALL: dict[str, Any] = {"days": 4, "users": 300, "merchants": 40, "transactions_per_day": 5_000, "seed": 11}
TS = pa.timestamp("us", tz="UTC")
SCHEMAS = {
    "transactions": pa.schema([("transaction_id", pa.string()), ("user_id", pa.int64()),
                               ("merchant_id", pa.int64()), ("amount", pa.float64()),
                               ("category", pa.string()), ("is_online", pa.bool_()), ("event_ts", TS)]),
    "user_profiles": pa.schema([("user_id", pa.int64()), ("account_age_days", pa.int64()),
                                ("credit_limit", pa.float64()), ("country", pa.string()), ("event_ts", TS)]),
    "merchant_risk": pa.schema([("merchant_id", pa.int64()), ("risk_score", pa.float64()),
                                ("merchant_category", pa.string()), ("event_ts", TS)]),
    "labels": pa.schema([("transaction_id", pa.string()), ("user_id", pa.int64()), ("merchant_id", pa.int64()),
                         ("event_ts", TS), ("amount", pa.float64()), ("is_online", pa.bool_()),
                         ("is_fraud", pa.int64()), ("label_arrived_at", TS)]),
}


def _day_start(d: date) -> datetime:
    return datetime(d.year, d.month, d.day, tzinfo=UTC)


def _read_all(summary: GenerationSummary, table: str) -> pa.Table:
    return pa.concat_tables(pq.read_table(p) for p in summary.paths[table])


def _all_files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> GenerationSummary:
    return generate(tmp_path_factory.mktemp("clean"), **SMALL)


@pytest.fixture(scope="module")
def dirty(tmp_path_factory: pytest.TempPathFactory) -> GenerationSummary:
    return generate(tmp_path_factory.mktemp("dirty"), late_fraction=0.02, malformed_fraction=0.01, **SMALL)


@pytest.fixture(scope="module")
def drifted(tmp_path_factory: pytest.TempPathFactory) -> GenerationSummary:
    return generate(tmp_path_factory.mktemp("drift"), **{**SMALL, "days": 6}, drift_from_day=3)


def test_same_seed_is_byte_identical_rerun_replaces_and_other_seed_differs(tmp_path: Path) -> None:
    args: dict[str, Any] = {**SMALL, "days": 2, "late_fraction": 0.01, "malformed_fraction": 0.01}
    generate(tmp_path / "a", **args)
    generate(tmp_path / "b", **args)
    first = _all_files(tmp_path / "a")
    assert len(first) == 2 * 3 + 1
    assert first == _all_files(tmp_path / "b")
    generate(tmp_path / "a", **args)  # rerun into the same directory replaces the same files
    assert _all_files(tmp_path / "a") == first
    generate(tmp_path / "c", **{**args, "seed": 12})
    other = _all_files(tmp_path / "c")
    assert other.keys() == first.keys()
    assert all(other[k] != first[k] for k in first)


def test_schemas_are_exact(clean: GenerationSummary) -> None:
    for table, expected in SCHEMAS.items():
        for path in clean.paths[table]:
            assert pq.read_schema(path).remove_metadata() == expected, (table, path)


def test_layout_and_row_counts(clean: GenerationSummary) -> None:
    days = [date(2026, 11, 1) + timedelta(days=i) for i in range(4)]
    for table in ("transactions", "user_profiles", "merchant_risk"):
        expected = [clean.out_dir / "events" / table / f"date={d:%Y-%m-%d}" / "part-00000.parquet" for d in days]
        assert list(clean.paths[table]) == expected
        assert clean.rows[table] == sum(pq.read_metadata(p).num_rows for p in expected)
    assert clean.paths["labels"] == (clean.out_dir / "labels" / "labels.parquet",)
    assert clean.rows["transactions"] == clean.rows["labels"] == 4 * 5_000
    assert all(pq.read_metadata(p).num_rows == 5_000 for p in clean.paths["transactions"])

    tx = _read_all(clean, "transactions")
    ids = tx.column("transaction_id").to_pylist()
    assert len(set(ids)) == len(ids)
    labels = pq.read_table(clean.paths["labels"][0])
    assert sorted(labels.column("transaction_id").to_pylist()) == sorted(ids)

    start = _day_start(days[0])
    profiles = pq.read_table(clean.paths["user_profiles"][0]).to_pandas()
    snapshot = profiles[profiles.event_ts == start]
    assert sorted(snapshot.user_id) == list(range(1, 301))  # every user exactly once at the start
    assert 0 < clean.rows["user_profiles"] - 300 < 0.05 * 300 * 4  # plus sparse daily updates
    risk = pq.read_table(clean.paths["merchant_risk"][0]).to_pandas()
    assert sorted(risk[risk.event_ts == start].merchant_id) == list(range(1, 41))
    all_risk = _read_all(clean, "merchant_risk").to_pandas()
    assert all_risk.risk_score.between(0.0, 1.0).all()
    assert set(all_risk.merchant_category) <= set(CATEGORIES)
    # Daily-ish: most merchants update on each later day.
    assert all(pq.read_metadata(p).num_rows > 20 for p in clean.paths["merchant_risk"][1:])


def test_files_sorted_within_their_day_with_seasonality_and_heavy_users(clean: GenerationSummary) -> None:
    for table in ("transactions", "user_profiles", "merchant_risk"):
        for i, path in enumerate(clean.paths[table]):
            ts = pq.read_table(path, columns=["event_ts"]).column("event_ts").to_numpy()
            assert (np.diff(ts.astype(np.int64)) >= 0).all(), path
            day = np.datetime64(date(2026, 11, 1) + timedelta(days=i), "us")
            assert (ts >= day).all() and (ts < day + np.timedelta64(1, "D")).all(), path
    tx = _read_all(clean, "transactions").to_pandas()
    hourly = tx.event_ts.dt.hour.value_counts()
    assert hourly.loc[list(range(0, 6))].mean() < 0.3 * hourly.loc[list(range(12, 21))].mean()
    per_user = tx.user_id.value_counts()
    assert per_user.iloc[:30].sum() > 0.25 * len(tx)  # top 10% of users carry a large share
    assert per_user.iloc[0] > 10 * per_user.median()


def test_late_rows_land_in_next_day_file_and_are_counted(dirty: GenerationSummary) -> None:
    per_day = round(0.02 * 5_000)
    assert dirty.late_rows == per_day * 3  # the last day has no next file, so it contributes none
    labels = pq.read_table(dirty.paths["labels"][0]).to_pandas().set_index("transaction_id")
    seen = 0
    for i, path in enumerate(dirty.paths["transactions"]):
        tx = pq.read_table(path).to_pandas()
        start = _day_start(date(2026, 11, 1) + timedelta(days=i))
        late = (tx.event_ts < start).to_numpy()
        n_late = int(late.sum())
        assert n_late == (0 if i == 0 else per_day)
        assert not late[: len(tx) - n_late].any() and late[len(tx) - n_late :].all()  # appended at the end
        tail, head = tx[late], tx[~late]
        assert tail.event_ts.is_monotonic_increasing and head.event_ts.is_monotonic_increasing
        if n_late:
            prev = start - timedelta(days=1)
            assert (tail.event_ts >= prev).all()
            assert tail.transaction_id.str.startswith(f"tx-{prev:%Y%m%d}-").all()
            assert (labels.loc[tail.transaction_id, "event_ts"].to_numpy() == tail.event_ts.to_numpy()).all()
        assert len(tx) == 5_000 - (per_day if i < 3 else 0) + n_late
        seen += n_late
    assert seen == dirty.late_rows


def test_malformed_counts_match_an_independent_recount(dirty: GenerationSummary, clean: GenerationSummary) -> None:
    tx = _read_all(dirty, "transactions").to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)
    recount = {
        "null_user_id": int(tx.user_id.isna().sum()),
        "nan_amount": int(tx.amount.isna().sum()),
        "negative_amount": int((tx.amount < 0).sum()),
        "unknown_category": int((~tx.category.isin(CATEGORIES)).sum()),
        "future_event_ts": int((tx.event_ts.dt.year >= 2100).sum()),
    }
    assert recount == dirty.malformed
    assert set(dirty.malformed) == set(MALFORMED_KINDS) and all(v > 0 for v in dirty.malformed.values())
    assert dirty.malformed_rows == round(0.01 * 5_000) * 4
    assert all(v == 0 for v in clean.malformed.values())
    # Defects touch exactly the counted rows, one defect each, and nothing else differs from the clean run.
    ref = _read_all(clean, "transactions").to_pandas().set_index("transaction_id")
    got = tx.set_index("transaction_id").loc[ref.index]
    changed = got.user_id.fillna(0).to_numpy(np.int64) != ref.user_id.to_numpy()  # ids start at 1
    changed |= ~(got.amount.to_numpy() == ref.amount.to_numpy())  # NaN compares unequal
    for col in ("merchant_id", "category", "is_online", "event_ts"):
        changed |= (got[col] != ref[col]).to_numpy()
    assert int(changed.sum()) == dirty.malformed_rows


def test_drift_shifts_amount_online_category_and_risk(drifted: GenerationSummary, clean: GenerationSummary) -> None:
    tx = _read_all(drifted, "transactions").to_pandas()
    after = (tx.event_ts >= _day_start(date(2026, 11, 4))).to_numpy()
    assert drifted.drift_date == date(2026, 11, 4)
    assert tx.amount[after].mean() > 1.5 * tx.amount[~after].mean()
    assert tx.amount[after].quantile(0.99) > 1.8 * tx.amount[~after].quantile(0.99)  # heavier tail
    assert tx.is_online[after].mean() > tx.is_online[~after].mean() + 0.1
    mix_before = tx.category[~after].value_counts(normalize=True)
    mix_after = tx.category[after].value_counts(normalize=True).reindex(mix_before.index)
    assert 0.5 * (mix_after - mix_before).abs().sum() > 0.1
    risk = _read_all(drifted, "merchant_risk").to_pandas()
    late_risk = risk.event_ts >= _day_start(date(2026, 11, 4))
    assert risk.risk_score[late_risk].mean() > risk.risk_score[~late_risk].mean() + 0.02
    # Days before the drift are untouched: identical to the undrifted run.
    for mine, ref in zip(drifted.paths["transactions"][:3], clean.paths["transactions"][:3], strict=True):
        assert mine.read_bytes() == ref.read_bytes()


def test_labels_carry_the_transaction_and_arrive_a_day_or_more_later(clean: GenerationSummary) -> None:
    labels = pq.read_table(clean.paths["labels"][0]).to_pandas()
    tx = _read_all(clean, "transactions").to_pandas().set_index("transaction_id")
    joined = labels.set_index("transaction_id").join(tx[["amount", "is_online"]], rsuffix="_tx", how="inner")
    clean_rows = joined[joined.amount_tx.notna() & (joined.amount_tx > 0)]
    assert (clean_rows.amount == clean_rows.amount_tx).all() and (clean_rows.is_online == clean_rows.is_online_tx).all()
    delay = labels.label_arrived_at - labels.event_ts
    assert delay.min() >= pd.Timedelta(days=1)
    assert delay[labels.is_fraud == 1].median() > delay[labels.is_fraud == 0].median()  # chargebacks come late


def test_fraud_rate_in_range_and_learnable_from_amount_ratio(clean: GenerationSummary) -> None:
    labels = pq.read_table(clean.paths["labels"][0]).to_pandas()
    assert 0.01 <= labels.is_fraud.mean() <= 0.03
    assert set(labels.is_fraud.unique()) == {0, 1}
    tx = _read_all(clean, "transactions").to_pandas().merge(labels[["transaction_id", "is_fraud"]])
    ratio = tx.amount / tx.groupby("user_id").amount.transform("median")
    low, high = ratio <= ratio.quantile(0.25), ratio >= ratio.quantile(0.75)
    assert tx.is_fraud[high].mean() > 4 * tx.is_fraud[low].mean()
    assert tx.is_fraud[tx.is_online].mean() > 1.5 * tx.is_fraud[~tx.is_online].mean()


def test_stream_files_are_time_ordered_atomic_and_complete(dirty: GenerationSummary, tmp_path: Path) -> None:
    events = pq.read_table(dirty.paths["transactions"][1])  # holds out-of-order late rows and malformed rows
    files = produce(events, tmp_path / "stream", rows_per_file=700)
    assert len(files) == math.ceil(events.num_rows / 700)
    assert [p.name for p in files] == sorted(p.name for p in (tmp_path / "stream").iterdir())
    assert not any(p.name.startswith(".") for p in (tmp_path / "stream").iterdir())
    records = []
    for path in files:
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        records += rows
    event_times = [r["ts_us"] for r in records]  # epoch µs: the catalog's resolution, nothing cut
    assert event_times == sorted(event_times) and len(records) == events.num_rows
    assert set(records[0]) == {"ts_us", *events.column_names} - {"event_ts"}
    assert sorted(events.column("event_ts").cast(pa.int64()).to_pylist()) == event_times
    users = [r["user_id"] for r in records]
    assert users.count(None) == events.column("user_id").null_count > 0
    assert all(u is None or isinstance(u, int) for u in users)
    with pytest.raises(ValueError):
        produce(events, tmp_path / "x", rows_per_file=0)


def test_no_temp_files_left_and_stale_partitions_pruned(tmp_path: Path) -> None:
    generate(tmp_path, **SMALL)
    generate(tmp_path, **{**SMALL, "days": 2})
    assert not [p for p in tmp_path.rglob("*") if p.name.startswith(".")]
    assert sorted(p.name for p in (tmp_path / "events" / "transactions").iterdir()) == [
        "date=2026-11-01", "date=2026-11-02"]
    assert pq.read_metadata(tmp_path / "labels" / "labels.parquet").num_rows == 2 * 5_000


def test_cli_prints_summary_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["--out", str(tmp_path), "--days", "2", "--users", "100", "--transactions-per-day", "1000",
               "--late-fraction", "0.01", "--malformed-fraction", "0.01", "--drift-from-day", "1"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "transactions" in out and "2,000" in out and "late rows: 10" in out and "2026-11-02" in out
    assert (tmp_path / "events" / "transactions" / "date=2026-11-02" / "part-00000.parquet").exists()
    summary = generate(tmp_path, days=2, users=100, transactions_per_day=1000, late_fraction=0.01,
                       malformed_fraction=0.01, drift_from_day=1)
    assert str(summary) == summary.format_table() and summary.format_table() in out  # same run, same table


@pytest.mark.parametrize("kwargs", [{"late_fraction": -0.1}, {"late_fraction": 0.6, "malformed_fraction": 0.6},
                                    {"days": 0}, {"transactions_per_day": 0}])
def test_invalid_arguments_are_rejected(tmp_path: Path, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        generate(tmp_path, **{**SMALL, **kwargs})
    assert not (tmp_path / "events").exists()
