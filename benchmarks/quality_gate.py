"""How fast is the Great Expectations gate? Times `QualityGate.validate` on transaction-like batches.

    python benchmarks/quality_gate.py [--quick] [--rows 1000000] [--bad 0.0,0.01,0.1]

For each bad-row share it prints GE's wall time (median of 3), rows/s, and the time of the same checks
written directly in pandas/numpy (a floor), so GE's own overhead is visible; both must flag the same rows.
Not Quiver against a peer (GE is the chosen suite engine): a measurement to size batches by.
Last line: RESULT quality_gate ratio=<GE / floor at the largest bad share> ge=<s> floor=<s>
"""

from __future__ import annotations

import argparse
import time
from datetime import UTC, datetime

import numpy as np
import pandas as pd

from quiver.monitoring.quality import QualityGate, read_batch

CATEGORIES = ["grocery", "restaurants", "fuel", "fashion", "electronics", "travel", "digital_goods", "gambling"]
SUITE = [
    {"type": "expect_column_to_exist", "kwargs": {"column": c}} for c in ("user_id", "amount", "category", "event_ts")
] + [
    {"type": "expect_column_values_to_be_in_type_list", "kwargs": {"column": "user_id", "type_list": ["Int64Dtype"]}},
    {"type": "expect_column_values_to_be_in_type_list", "kwargs": {"column": "amount", "type_list": ["float64"]}},
    {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "user_id"}},
    {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "event_ts"}},
    {"type": "expect_column_values_to_be_between", "kwargs": {"column": "amount", "min_value": 0}},
    {"type": "expect_column_values_to_be_in_set", "kwargs": {"column": "category", "value_set": CATEGORIES}},
    {"type": "expect_column_values_to_be_between",
     "kwargs": {"column": "event_ts", "max_value": "2027-01-01T00:00:00"}},
]


def batch(rows: int, bad: float, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    start = int(datetime(2026, 11, 1, tzinfo=UTC).timestamp() * 1e6)
    frame = pd.DataFrame({
        "user_id": pd.array(rng.integers(1, 50_000, rows), dtype="Int64"),
        "amount": rng.lognormal(3.5, 1.0, rows),
        "category": rng.choice(CATEGORIES, rows),
        "event_ts": pd.to_datetime(start + np.sort(rng.integers(0, 86_400_000_000, rows)), unit="us", utc=True),
    })
    hit = np.flatnonzero(rng.random(rows) < bad)
    parts = np.array_split(hit, 3)
    frame.loc[parts[0], "user_id"] = pd.NA
    frame.loc[parts[1], "amount"] = -1.0
    frame.loc[parts[2], "category"] = "unmapped"
    return read_batch(frame)


def floor(frame: pd.DataFrame) -> int:
    """The same row checks in plain pandas: the cost of the arithmetic itself."""
    bad = frame["user_id"].isna().to_numpy() | frame["event_ts"].isna().to_numpy()
    bad |= (frame["amount"] < 0).to_numpy() | ~frame["category"].isin(CATEGORIES).to_numpy()
    bad |= (frame["event_ts"] > pd.Timestamp("2027-01-01")).to_numpy()
    return int(bad.sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=None, help="rows per batch (default 1,000,000; --quick 100,000)")
    parser.add_argument("--bad", default="0.0,0.01,0.1")
    parser.add_argument("--quick", action="store_true", help="100,000 rows")
    args = parser.parse_args()
    args.rows = args.rows or (100_000 if args.quick else 1_000_000)
    gate = QualityGate(quarantine_dir="/nonexistent", extra={"tx": SUITE})
    gate.validate(batch(1_000, 0.0), "tx")  # import + context warm-up
    for share in (float(s) for s in args.bad.split(",")):
        frame = batch(args.rows, share)
        ge_times, floor_times = [], []
        for _ in range(3):
            started = time.perf_counter()
            ok, result = gate.validate(frame, "tx")
            ge_times.append(time.perf_counter() - started)
            started = time.perf_counter()
            expected_bad = floor(frame)
            floor_times.append(time.perf_counter() - started)
        flagged = {i for r in result["results"] for i in (r.get("result") or {}).get("unexpected_index_list") or []}
        assert len(flagged) == expected_bad, (len(flagged), expected_bad)
        ge, base = float(np.median(ge_times)), float(np.median(floor_times))
        print(f"rows {args.rows:>10,}  bad {share:>5.1%}  GE {ge:6.2f} s ({args.rows / ge:>11,.0f} rows/s)  "
              f"pandas floor {base:5.2f} s  GE/floor {ge / base:5.1f}×  passed={ok}  bad rows={len(flagged):,}")
    print(f"RESULT quality_gate ratio={ge / base:.1f} ge={ge:.3f}s floor={base:.3f}s")


if __name__ == "__main__":
    main()
