"""Source contracts: validated at apply with the definition's line, versioned, one meaning in both forms
(Arrow, DuckDB SQL) row by row, and enforced by the feeder, the request path and the quality gate with the
same reasons. (Spark, the backfill and the stream end to end: tests/integration/test_contracts.py.)"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from quiver import Check, Contract, Entity, FeatureView, Field, Float64, Source
from quiver.catalog.errors import CatalogError, RequestFieldError
from quiver.catalog.ir import CheckSpec, ContractSpec
from quiver.catalog.loader import catalog_from_dict
from quiver.catalog.validate import build_catalog
from quiver.compile.contracts import reason_sql, reason_strings, violations
from quiver.compile.duckdb import DUCKDB
from quiver.compile.on_demand import check_request_contracts

COLUMNS = {"user_id": "int64", "amount": "float64", "qty": "int64", "cat": "string", "flag": "bool",
           "ts": "timestamp", "seen": "timestamp"}
NOW_US = int(datetime(2026, 11, 3, 12, tzinfo=UTC).timestamp() * 1_000_000)
CONTRACT = ContractSpec((
    CheckSpec("user_id", "int64", "not_null"),
    CheckSpec("amount", "float64", "finite"),
    CheckSpec("amount", "float64", "min", 0.0),
    CheckSpec("amount", "float64", "max", 1e6),
    CheckSpec("qty", "int64", "min", -3),
    CheckSpec("qty", "int64", "max", 5),
    CheckSpec("cat", "string", "one_of", ("a", "it's", "back\\slash")),
    CheckSpec("flag", "bool", "one_of", (True,)),
    CheckSpec("seen", "timestamp", "min", NOW_US - 86_400_000_000),
    CheckSpec("ts", "timestamp", "future", 300_000_000),
    CheckSpec("ratio", "float64", "min", -0.0),  # no `finite` before it: NaN must fail the range itself
    CheckSpec("ratio", "float64", "max", 1.0),
), 0.1)


def source_catalog(contract: object) -> Any:
    user = Entity("user", ["user_id"])
    source = Source("tx", "unused", timestamp_field="ts", contract=contract)  # type: ignore[arg-type]
    view = FeatureView("v", [user], source, schema=[Field("amount", Float64)], ttl="1d")
    return build_catalog([user, source, view], schema_reader=lambda s: dict(COLUMNS))


# ---- the catalog ----


def test_a_contract_is_validated_into_rules_in_reason_order() -> None:
    contract = Contract({"amount": Check(max=10, finite=True, not_null=True),
                         "ts": Check(max_future="5m", min="2026-01-01T00:00:00+01:00"),
                         "cat": Check(one_of=["a", "b", "a"])}, max_invalid_share=0.02)
    spec = source_catalog(contract).sources["tx"].contract
    assert spec.reasons == ["not_null:amount", "finite:amount", "max:amount", "min:ts", "future:ts", "one_of:cat"]
    assert spec.checks[3].value == int(datetime(2025, 12, 31, 23, tzinfo=UTC).timestamp() * 1_000_000)
    assert spec.checks[4].value == 300_000_000 and spec.checks[5].value == ("a", "b")
    assert spec.max_invalid_share == 0.02 and spec.uses_clock


@pytest.mark.parametrize(("checks", "message"), [
    ({"nope": Check(not_null=True)}, "'nope' is not a column"),
    ({"qty": Check(finite=True)}, "finite applies to float64 columns, not int64"),
    ({"amount": Check(min=5, max=1)}, "min 5 is above max 1"),
    ({"cat": Check(min=1)}, "min applies to numbers and timestamps, not string"),
    ({"qty": Check(min=1.5)}, "min 1.5 is not an integer"),
    ({"amount": Check(max=math.inf)}, "max must be a finite number"),
    ({"ts": Check(min="2026-01-01T00:00:00")}, "must be a datetime with a UTC offset"),
    ({"qty": Check(one_of=["1"])}, "one_of must list int64 values; got '1'"),
    ({"qty": Check(one_of=[True])}, "one_of must list int64 values; got True"),
    ({"amount": Check(one_of=[1.0])}, "one_of applies to string, int64 and bool columns"),
    ({"amount": Check(max_future="5m")}, "max_future applies to timestamp columns"),
    ({"ts": Check(max_future="soon")}, "max_future:"),
    ({"amount": Check()}, "the Check declares no rule"),
])
def test_a_wrong_check_names_the_column_the_rule_and_the_line(checks: dict[str, Check], message: str) -> None:
    contract = Contract(checks)
    with pytest.raises(CatalogError) as caught:
        source_catalog(contract)
    text = str(caught.value)
    assert message in text and f"test_contracts.py:{contract.location.line}" in text, text


def test_a_share_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(CatalogError, match=r"max_invalid_share must be a share in \[0, 1\], got 1.5"):
        source_catalog(Contract({"amount": Check(finite=True)}, max_invalid_share=1.5))


def test_the_contract_is_part_of_the_version_and_survives_the_registry_round_trip() -> None:
    plain = source_catalog(None)
    checked = source_catalog(Contract({"cat": Check(one_of=["a"])}))
    assert "contract" not in plain.to_dict()["source"]["tx"]  # catalogs from before contracts keep their hash
    assert plain.content_hash != checked.content_hash
    back = catalog_from_dict(json.loads(json.dumps(checked.to_dict())))
    assert back.sources["tx"].contract == checked.sources["tx"].contract == back.views["v"].contract
    assert back.content_hash == checked.content_hash


# ---- one meaning, two forms ----


def awkward_rows(n: int = 3000, seed: int = 0) -> pa.Table:
    """Every edge the rules have: null, NaN, ±inf, -0.0, exact bounds, quotes and backslashes, ns times."""
    rng = np.random.default_rng(seed)
    amounts = np.array([math.nan, math.inf, -math.inf, -0.0, 0.0, -1e-300, 1e6, 1e6 + 0.125, 5.5, None],
                       dtype=object)
    cats = np.array(["a", "it's", "back\\slash", "b", "", None, "A"], dtype=object)
    ns = NOW_US * 1000 + rng.integers(-2 * 86_400, 2 * 86_400, n) * 10**9 // 1 + rng.integers(0, 1000, n)
    seen = NOW_US - rng.integers(0, 2 * 86_400_000_000, n)
    seen[:3] = [NOW_US - 86_400_000_000, NOW_US - 86_400_000_001, NOW_US]  # the bound, one µs under, far in
    return pa.table({
        "user_id": pa.array([None if m else int(v) for v, m in zip(rng.integers(0, 9, n), rng.random(n) < 0.05,
                                                                      strict=True)], pa.int64()),
        "amount": pa.array(list(rng.choice(amounts, n)), pa.float64()),
        "ratio": pa.array(list(rng.choice(np.array([math.nan, -0.0, 0.0, 1.0, 1.5, -math.inf, 0.5, None],
                                                   dtype=object), n)), pa.float64()),
        "qty": pa.array([None if v == 9 else int(v) for v in rng.integers(-5, 10, n)], pa.int64()),
        "cat": pa.array(list(rng.choice(cats, n)), pa.string()),
        "flag": pa.array([None if v == 2 else bool(v) for v in rng.integers(0, 3, n)], pa.bool_()),
        "ts": pa.array(ns, pa.timestamp("ns", tz="UTC")),
        "seen": pa.array(seen, pa.timestamp("us", tz="UTC")),
    })


def brute_reason(row: dict[str, Any]) -> str | None:
    """The rules read off the module docstring, one Python row at a time."""
    def us(t: Any) -> int:
        return int(pd.Timestamp(t).value // 1000) if not isinstance(t, int) else t

    for check in CONTRACT.checks:
        v = row[check.column]
        if check.rule == "not_null":
            bad = v is None
        elif v is None:
            bad = False
        elif check.rule == "finite":
            bad = not math.isfinite(v)
        elif check.rule == "one_of":
            bad = v not in check.value
        elif check.rule == "future":
            bad = us(v) > NOW_US + check.value
        else:
            x = us(v) if check.dtype == "timestamp" else v
            bad = (isinstance(x, float) and math.isnan(x)) or (x < check.value if check.rule == "min"
                                                                 else x > check.value)
        if bad:
            return check.reason
    return None


def test_arrow_and_duckdb_give_every_row_the_reason_the_rules_say() -> None:
    table = awkward_rows()
    arrow = reason_strings(violations(table, CONTRACT, NOW_US), CONTRACT)
    con = duckdb.connect()
    con.register("rows", table)
    sql = f"SELECT {reason_sql(DUCKDB, CONTRACT, '$now_us')} AS reason FROM rows"
    on_duckdb = con.sql(sql, params={"now_us": NOW_US}).to_arrow_table()["reason"].to_pylist()
    brute = [brute_reason(r) for r in table.to_pylist()]
    assert arrow == brute and on_duckdb == brute
    assert set(brute) == {None, *CONTRACT.reasons}  # every rule fires somewhere, and some rows pass


# ---- enforced: feeder, request, gate ----


def test_the_feeder_refuses_failing_lines_with_their_reason_and_never_feeds_them(tmp_path: Path) -> None:
    from quiver.streaming.feeder import BATCH_PREFIX, Feeder, SourceFeed
    from quiver.streaming.paths import StreamPaths

    contract = ContractSpec((CheckSpec("user_id", "int64", "not_null"), CheckSpec("amount", "float64", "finite"),
                             CheckSpec("amount", "float64", "min", 0.0), CheckSpec("ts", "timestamp", "future", 0)))
    feed = SourceFeed("tx", (("user_id", "int64"), ("amount", "float64")), (("spend", ("user_id",)),), "ts",
                      watermark_delay_us=0, allowed_lateness_us=0, contract=contract)
    now = 1_000.0  # s
    lines = ['{"ts_us": 1000, "user_id": 1, "amount": 2.5}', '{"ts_us": 2000, "amount": 1.0}',
             '{"ts_us": 3000, "user_id": 2, "amount": NaN}', '{"ts_us": 4000, "user_id": 2, "amount": -1}',
             '{"ts_us": 999000000000, "user_id": 3, "amount": 1}', '{"ts_us": 5000, "user_id": 4, "amount": 0}']
    stream, paths = tmp_path / "stream", StreamPaths.at(tmp_path / "state")
    stream.mkdir()
    (stream / "0001.jsonl").write_text("\n".join(lines) + "\n")
    feeder = Feeder({"tx": stream}, paths, {"tx": feed}, tmp_path / "late", clock=lambda: now)
    feeder.feed()
    [batch] = sorted(paths.inbox("tx").glob(BATCH_PREFIX + "*"))
    fed = [json.loads(x) for x in batch.read_text().splitlines()[:-1]]
    assert [r["ts_us"] for r in fed] == [1000, 5000]
    refused = [json.loads(x) for p in paths.sink("quarantine", "tx").iterdir() for x in p.read_text().splitlines()]
    assert sorted((json.loads(q["line"])["ts_us"], q["reason"]) for q in refused) == [
        (2000, "not_null:user_id"), (3000, "finite:amount"), (4000, "min:amount"), (999000000000, "future:ts")]
    assert feeder.totals["tx"]["refused:finite:amount"] == 1 and feeder.totals["tx"]["future"] == 0
    assert feeder._watermark["tx"] == 5000  # the far-future refused row did not move it


def test_request_fields_failing_their_contract_are_refused_and_counted() -> None:
    contract = ContractSpec((CheckSpec("amount", "float64", "finite"), CheckSpec("amount", "float64", "min", 0.0)))
    fields = {"amount": [1.0, math.nan, -2.0, None, -3.0]}
    refusal = check_request_contracts(fields, {"amount": "float64"}, [("order", contract)])
    assert refusal.counts == {("order", "finite:amount"): 1, ("order", "min:amount"): 2}
    assert refusal.first.startswith("rows[1].fields.amount: refused by the contract of 'order' (finite:amount")
    assert check_request_contracts({"amount": [0.0, None]}, {"amount": "float64"}, [("order", contract)]).counts == {}
    with pytest.raises(RequestFieldError, match="do not have their declared types"):
        check_request_contracts({"amount": ["x"]}, {"amount": "float64"}, [("order", contract)])


@pytest.mark.parametrize(("refused", "passes"), [(0, True), (10, True), (11, False), (40, False)])
def test_the_gate_fails_exactly_above_the_contracts_share(refused: int, passes: bool) -> None:
    """100 rows, max_invalid_share 0.1: the gate's verdict is the row filter's count against the share."""
    from quiver.monitoring.quality import QualityGate, read_batch

    catalog = source_catalog(Contract({"amount": Check(finite=True, min=0.0), "cat": Check(one_of=["a"])},
                                      max_invalid_share=0.1))
    rng = np.random.default_rng(refused)
    amount = rng.uniform(1, 5, 100)
    bad = rng.choice(100, refused, replace=False)
    amount[bad[: refused // 2]] = -1.0
    cat = np.array(["a"] * 100, dtype=object)
    cat[bad[refused // 2:]] = "zzz"
    base = datetime(2026, 1, 1, tzinfo=UTC)
    frame = read_batch(pa.table({"user_id": pa.array(range(100), pa.int64()), "amount": amount, "qty": [1] * 100,
                                 "cat": cat, "flag": [True] * 100, "ts": pa.array([base] * 100),
                                 "seen": pa.array([base] * 100)}))
    gate = QualityGate(catalog, quarantine_dir=Path("/nonexistent"))
    success, validation = gate.validate(frame, "tx")
    assert success is passes
    prepared = gate.prepare(frame, "tx")
    assert int(prepared["__refused"].sum()) == refused
    by_check = {r["expectation_config"]["meta"]["check"]: r["result"]["unexpected_count"]
                for r in validation["results"] if r["expectation_config"]["meta"].get("origin") == "contract"}
    assert by_check == {"any": refused, "min:amount": refused // 2, "one_of:cat": refused - refused // 2,
                        "finite:amount": 0}


def test_the_gate_tells_a_null_from_nan_when_it_has_the_batch_as_arrow() -> None:
    """pandas holds both as NaN; the gate reads the rules off the Arrow batch, as the backfill does."""
    from quiver.monitoring.quality import contract_columns, read_batch

    contract = ContractSpec((CheckSpec("amount", "float64", "not_null"), CheckSpec("amount", "float64", "finite")))
    table = pa.table({"amount": pa.array([1.0, None, math.nan], pa.float64())})
    frame = read_batch(table)
    assert contract_columns(frame, contract, table=table)["contract_reason"].tolist() == [
        None, "not_null:amount", "finite:amount"]
    # From a DataFrame alone both are NaN, and NaN is what a float NaN is.
    assert contract_columns(frame, contract)["contract_reason"].tolist() == [None, "finite:amount", "finite:amount"]
