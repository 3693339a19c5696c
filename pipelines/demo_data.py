"""Seeded, vectorised synthetic fraud-domain events written as date-partitioned Parquet.

Layout under ``out_dir``::

    events/transactions/date=YYYY-MM-DD/part-00000.parquet
    events/user_profiles/date=YYYY-MM-DD/part-00000.parquet
    events/merchant_risk/date=YYYY-MM-DD/part-00000.parquet
    labels/labels.parquet

Every day draws from its own ``(seed, day)`` random stream and late/malformed defects from a separate one,
so the clean data of a day does not depend on ``days``, ``late_fraction`` or ``malformed_fraction``.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

US_PER_HOUR = 3_600_000_000
US_PER_DAY = 24 * US_PER_HOUR
TS_TYPE = pa.timestamp("us", tz="UTC")
PART_NAME = "part-00000.parquet"

CATEGORIES = ("grocery", "restaurants", "fuel", "fashion", "electronics", "travel", "digital_goods", "gambling")
UNKNOWN_CATEGORY = "unmapped_category"
COUNTRIES = ("US", "GB", "DE", "FR", "NL", "ES", "IT", "CA", "BR", "IN")
MALFORMED_KINDS = ("null_user_id", "nan_amount", "negative_amount", "unknown_category", "future_event_ts")
FUTURE_DAY_US = (date(2100, 1, 1) - date(1970, 1, 1)).days * US_PER_DAY

_CAT_MIX = np.array([0.25, 0.20, 0.12, 0.12, 0.08, 0.05, 0.13, 0.05])
_CAT_MIX_DRIFT = np.array([0.16, 0.14, 0.08, 0.12, 0.14, 0.06, 0.20, 0.10])
_CAT_LOG_AMOUNT = np.array([-0.2, -0.4, -0.1, 0.3, 0.8, 1.0, -0.3, 0.2])
_CAT_ONLINE = np.array([0.08, 0.10, 0.02, 0.45, 0.55, 0.70, 0.95, 0.80])
_CAT_RISK = np.array([0.08, 0.10, 0.08, 0.15, 0.22, 0.20, 0.30, 0.40])
_COUNTRY_P = np.array([0.30, 0.12, 0.12, 0.10, 0.06, 0.07, 0.06, 0.07, 0.05, 0.05])
# UTC hour weights: a quiet night (00-05) and an evening peak give the daily seasonality.
_HOUR_W = np.array([0.6, 0.4, 0.3, 0.25, 0.3, 0.5, 1.0, 1.8, 2.6, 3.2, 3.6, 4.0,
                    4.4, 4.3, 4.1, 4.0, 4.2, 4.6, 5.0, 5.2, 4.8, 3.8, 2.6, 1.4])
_HOUR_P = _HOUR_W / _HOUR_W.sum()
# A label row is what the scoring request carried (ids, time, the transaction's amount and channel) and,
# later, what became known: the label and when it arrived (chargebacks come later than clean labels).
_LABEL_SCHEMA = pa.schema([("transaction_id", pa.string()), ("user_id", pa.int64()), ("merchant_id", pa.int64()),
                           ("event_ts", TS_TYPE), ("amount", pa.float64()), ("is_online", pa.bool_()),
                           ("is_fraud", pa.int64()), ("label_arrived_at", TS_TYPE)])
LABEL_DELAY_US = 24 * US_PER_HOUR  # the earliest a label is known: a day after the transaction
# Mean extra wait for a chargeback (exponential). Later than a clean label, so the newest labels of a window
# are fraud-poor at its cutoff (knowledge time); scaled to the demo's windows of days, not months.
_FRAUD_EXTRA_DELAY_US = 12 * US_PER_HOUR
_CLEAN_EXTRA_DELAY_US = 6 * US_PER_HOUR

_BURST_SHARE = 0.04  # follow-up transactions minutes after an earlier one by the same user
_BURST_WINDOW_US = 10 * 60 * 1_000_000
_DRIFT_LOG_SCALE = float(np.log(1.6))
_DRIFT_SIGMA = 0.25
_DRIFT_ONLINE = 0.15
_DRIFT_RISK_LOGIT = 0.3
# Fraud logit; the bias is calibrated so the base (undrifted) positive rate is ~2%.
_FRAUD_BIAS, _W_RATIO, _W_RISK, _W_ONLINE, _W_NIGHT, _W_BURST = -6.4, 1.5, 3.0, 0.8, 1.0, 0.45
# Interactions a linear model on the raw inputs cannot draw: a large online purchase at night, and card
# testing (tiny amounts in a burst).
_W_ONLINE_NIGHT_LARGE, _W_TESTING = 1.6, 1.8


@dataclass(frozen=True)
class GenerationSummary:
    """What :func:`generate` wrote. ``late_rows`` moved to the next day's file; ``malformed`` counts by kind."""

    out_dir: Path
    start: date
    days: int
    seed: int
    paths: dict[str, tuple[Path, ...]]
    rows: dict[str, int]
    late_rows: int
    malformed: dict[str, int]
    drift_from_day: int | None

    @property
    def malformed_rows(self) -> int:
        return sum(self.malformed.values())

    @property
    def drift_date(self) -> date | None:
        return None if self.drift_from_day is None else self.start + timedelta(days=self.drift_from_day)

    def __str__(self) -> str:
        return self.format_table()

    def __rich__(self) -> str:  # rich (the quiver CLI) would otherwise pretty-print the dataclass fields
        return self.format_table()

    def format_table(self) -> str:
        lines = [f"{'table':<16}{'files':>7}{'rows':>13}"]
        lines += [f"{t:<16}{len(self.paths[t]):>7}{n:>13,}" for t, n in self.rows.items()]
        lines.append(f"late rows: {self.late_rows:,}   malformed rows: {self.malformed_rows:,}")
        lines += [f"  {k}: {v:,}" for k, v in self.malformed.items() if v]
        lines.append(f"drift from: {self.drift_date or '-'}   out: {self.out_dir}")
        return "\n".join(lines)


@dataclass(frozen=True)
class _World:
    """Static entities; per-user amount scale is what 'usual amount' means for the fraud label."""

    user_p: np.ndarray
    user_mu: np.ndarray
    user_sigma: np.ndarray
    age0: np.ndarray
    credit0: np.ndarray
    country0: np.ndarray
    merchant_cat: np.ndarray
    risk_logit0: np.ndarray


def _make_world(rng: np.random.Generator, users: int, merchants: int) -> _World:
    # Zipf-ish activity on a shuffled rank, so heavy users are not simply the lowest ids.
    weight = 1.0 / (rng.permutation(users) + 10.0)
    user_mu = rng.normal(np.log(40.0), 0.7, users)
    user_sigma = rng.uniform(0.5, 0.9, users)
    age0 = rng.gamma(1.5, 400.0, users).astype(np.int64) + 1
    credit0 = np.maximum(np.round(np.exp(user_mu) * rng.uniform(20, 60, users), -2), 500.0)
    country0 = rng.choice(len(COUNTRIES), users, p=_COUNTRY_P)
    # Round-robin before shuffling guarantees every category has merchants once merchants >= 8.
    merchant_cat = rng.permutation(np.arange(merchants) % len(CATEGORIES))
    base = _CAT_RISK[merchant_cat]
    risk_logit0 = np.log(base / (1 - base)) + rng.normal(0.0, 0.6, merchants)
    return _World(weight / weight.sum(), user_mu, user_sigma, age0, credit0, country0, merchant_cat,
                  risk_logit0)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return np.asarray(1.0 / (1.0 + np.exp(-x)))


def _ts(values: np.ndarray) -> pa.Array:
    return pa.array(values, type=TS_TYPE)


def _lookup(names: Sequence[str], idx: np.ndarray) -> pa.Array:
    return pc.take(pa.array(names, pa.string()), pa.array(idx))


def _recent_counts(user: np.ndarray, ts: np.ndarray, prev_user: np.ndarray, prev_ts: np.ndarray,
                   day_us: int) -> np.ndarray:
    """Per row, the same user's transactions in the preceding window (including yesterday's tail)."""
    base = day_us - _BURST_WINDOW_US
    span = US_PER_DAY + 2 * _BURST_WINDOW_US  # keeps users' key ranges disjoint
    keys = np.concatenate([prev_user, user]) * span + (np.concatenate([prev_ts, ts]) - base)
    order = np.argsort(keys)
    ks = keys[order]  # sorted queries make searchsorted much faster
    counts = np.empty_like(keys)
    counts[order] = np.searchsorted(ks, ks) - np.searchsorted(ks, ks - _BURST_WINDOW_US)
    return np.asarray(counts[len(prev_user):])


def _atomic_parquet(table: pa.Table, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _merchant_day(rng: np.random.Generator, world: _World, logit: np.ndarray, published: np.ndarray,
                  day_us: int, first: bool, drifted: bool) -> tuple[pa.Table, np.ndarray, np.ndarray]:
    """Random-walk risk updates for ~75% of merchants (advances ``logit`` in place).

    Returns the day's rows, each merchant's update time (int64 max if none) and its risk after the update.
    """
    m = len(logit)
    step = rng.normal(0.0, 0.12, m)
    updated = rng.random(m) < 0.75
    upd_ts = np.where(updated, day_us + rng.integers(1, US_PER_DAY, m), np.iinfo(np.int64).max)
    logit += np.where(updated, step, 0.0)
    new = np.where(updated, _sigmoid(logit + (_DRIFT_RISK_LOGIT if drifted else 0.0)), published)
    ids = np.flatnonzero(updated)
    if first:  # day 0 opens with a snapshot of every merchant at midnight
        ids = np.concatenate([np.arange(m), ids])
        ts = np.concatenate([np.full(m, day_us), upd_ts[updated]])
        risk = np.concatenate([published, new[updated]])
    else:
        ts, risk = upd_ts[updated], new[updated]
    o = np.argsort(ts, kind="stable")
    table = pa.table({"merchant_id": pa.array(ids[o] + 1, pa.int64()), "risk_score": pa.array(risk[o]),
                      "merchant_category": _lookup(CATEGORIES, world.merchant_cat[ids[o]]),
                      "event_ts": _ts(ts[o])})
    return table, upd_ts, new


def _profiles_day(rng: np.random.Generator, world: _World, credit: np.ndarray, country: np.ndarray,
                  day_us: int, day_index: int) -> pa.Table:
    """Sparse (~1%/day) credit-limit and country changes, applied to the state arrays in place.

    Day 0 opens with a snapshot of every user at midnight.
    """
    users = len(credit)
    who = np.flatnonzero(rng.random(users) < 0.01)
    factor = rng.choice(np.array([0.8, 1.25, 1.5]), len(who), p=[0.2, 0.5, 0.3])
    moves = rng.random(len(who)) < 0.05
    new_country = rng.choice(len(COUNTRIES), len(who), p=_COUNTRY_P)
    upd_ts = day_us + rng.integers(1, US_PER_DAY, len(who))
    parts = []
    if day_index == 0:
        parts.append((np.arange(users), world.age0, credit.copy(), country.copy(), np.full(users, day_us)))
    credit[who] = np.maximum(np.round(credit[who] * factor, -2), 500.0)
    country[who[moves]] = new_country[moves]
    parts.append((who, world.age0[who] + day_index, credit[who], country[who], upd_ts))
    ids, age, lim, ctry, ts = (np.concatenate(col) for col in zip(*parts, strict=True))
    o = np.argsort(ts, kind="stable")
    return pa.table({"user_id": pa.array(ids[o] + 1, pa.int64()), "account_age_days": pa.array(age[o], pa.int64()),
                     "credit_limit": pa.array(lim[o], pa.float64()), "country": _lookup(COUNTRIES, ctry[o]),
                     "event_ts": _ts(ts[o])})


def _transactions_day(rng: np.random.Generator, world: _World, n: int, day_us: int, drifted: bool,
                      risk_before: np.ndarray, upd_ts: np.ndarray, risk_after: np.ndarray,
                      tail: tuple[np.ndarray, np.ndarray]) -> dict[str, np.ndarray]:
    """One day of transactions, sorted by event time, with the fraud label (columns as numpy arrays)."""
    n_burst = int(n * _BURST_SHARE)
    n_base = n - n_burst
    user = rng.choice(len(world.user_p), n_base, p=world.user_p)
    ts = day_us + rng.choice(24, n_base, p=_HOUR_P) * US_PER_HOUR + rng.integers(0, US_PER_HOUR, n_base)
    src = rng.integers(0, n_base, n_burst)
    gap = (rng.exponential(90.0, n_burst) * 1e6).astype(np.int64) + 1
    user = np.concatenate([user, user[src]])
    ts = np.concatenate([ts, np.minimum(ts[src] + gap, day_us + US_PER_DAY - 1)])
    o = np.argsort(ts, kind="stable")
    user, ts = user[o], ts[o]

    counts = np.bincount(world.merchant_cat, minlength=len(CATEGORIES))
    mix = (_CAT_MIX_DRIFT if drifted else _CAT_MIX) / np.maximum(counts, 1)
    merchant_p = mix[world.merchant_cat]
    merchant = rng.choice(len(merchant_p), n, p=merchant_p / merchant_p.sum())
    cat = world.merchant_cat[merchant]
    usual = world.user_mu[user] + (_DRIFT_LOG_SCALE if drifted else 0.0)
    mu = usual + _CAT_LOG_AMOUNT[cat]
    sigma = world.user_sigma[user] + (_DRIFT_SIGMA if drifted else 0.0)
    amount = np.maximum(np.round(np.exp(mu + sigma * rng.standard_normal(n)), 2), 0.01)
    online = rng.random(n) < np.clip(_CAT_ONLINE[cat] + (_DRIFT_ONLINE if drifted else 0.0), 0.0, 0.98)

    # The label sees merchant risk as of the transaction time, like a point-in-time feature join would.
    risk = np.where(ts >= upd_ts[merchant], risk_after[merchant], risk_before[merchant])
    # Relative to the user's current usual spend, so a global price shift alone does not create fraud.
    ratio = np.clip(np.log(amount) - usual, -3.0, 3.0)
    night = ((ts - day_us) // US_PER_HOUR) < 6
    burst = np.minimum(_recent_counts(user, ts, *tail, day_us), 4)
    logit = (_FRAUD_BIAS + _W_RATIO * ratio + _W_RISK * risk + _W_ONLINE * online + _W_NIGHT * night
             + _W_BURST * burst + _W_ONLINE_NIGHT_LARGE * online * night * np.maximum(ratio, 0.0)
             + _W_TESTING * (ratio < -1.5) * (burst >= 2))
    fraud = (rng.random(n) < _sigmoid(logit)).astype(np.int64)
    return {"user": user, "merchant": merchant, "cat": cat, "amount": amount, "online": online, "ts": ts,
            "fraud": fraud}


def _validate(days: int, users: int, merchants: int, tpd: int, late: float, malformed: float) -> None:
    if min(days, users, merchants, tpd) < 1:
        raise ValueError("days, users, merchants and transactions_per_day must be >= 1")
    if not (0.0 <= late <= 1.0 and 0.0 <= malformed <= 1.0 and late + malformed <= 1.0):
        raise ValueError("late_fraction and malformed_fraction must be in [0, 1] and sum to <= 1")


def generate(out_dir: str | Path, *, days: int = 7, start: date = date(2026, 11, 1), users: int = 2_000,
             merchants: int = 200, transactions_per_day: int = 20_000, seed: int = 7,
             drift_from_day: int | None = None, late_fraction: float = 0.0,
             malformed_fraction: float = 0.0) -> GenerationSummary:
    """Generate and write ``days`` days of events one day at a time (memory is bounded by one day).

    Late rows are taken from every day but the last (there is no next file for those) and appended,
    time-sorted, to the next day's file. Partition files of earlier runs that this run does not produce
    are removed, so the tree always reflects exactly one run.
    """
    _validate(days, users, merchants, transactions_per_day, late_fraction, malformed_fraction)
    out = Path(out_dir)
    world = _make_world(np.random.default_rng([seed, 0]), users, merchants)
    start_us = (start - date(1970, 1, 1)).days * US_PER_DAY
    logit, published = world.risk_logit0.copy(), _sigmoid(world.risk_logit0)
    credit, country = world.credit0.copy(), world.country0.copy()
    tail = (np.empty(0, np.int64), np.empty(0, np.int64))
    pending_late: pa.Table | None = None
    paths: dict[str, list[Path]] = {"transactions": [], "user_profiles": [], "merchant_risk": []}
    rows = dict.fromkeys([*paths, "labels"], 0)
    malformed = dict.fromkeys(MALFORMED_KINDS, 0)
    late_total = 0
    labels_path = out / "labels" / "labels.parquet"
    labels_path.parent.mkdir(parents=True, exist_ok=True)
    labels_tmp = labels_path.with_name(f".{labels_path.name}.{os.getpid()}.tmp")
    try:
        with pq.ParquetWriter(labels_tmp, _LABEL_SCHEMA) as labels_writer:
            for d in range(days):
                day = start + timedelta(days=d)
                day_us = start_us + d * US_PER_DAY
                drifted = drift_from_day is not None and d >= drift_from_day
                rng = np.random.default_rng([seed, 1, d])
                risk_before = published.copy()
                mr, upd_ts, published = _merchant_day(rng, world, logit, published, day_us, d == 0, drifted)
                prof = _profiles_day(rng, world, credit, country, day_us, d)
                tx = _transactions_day(rng, world, transactions_per_day, day_us, drifted, risk_before, upd_ts,
                                       published, tail)
                keep = tx["ts"] >= day_us + US_PER_DAY - _BURST_WINDOW_US
                tail = (tx["user"][keep], tx["ts"][keep])
                seq = pc.cast(pa.array(np.arange(len(tx["ts"]))), pa.string())
                tx_ids = pc.binary_join_element_wise(f"tx-{day:%Y%m%d}-", pc.utf8_lpad(seq, 8, "0"), "")
                extra = np.where(tx["fraud"] == 1, _FRAUD_EXTRA_DELAY_US, _CLEAN_EXTRA_DELAY_US)
                arrival = tx["ts"] + LABEL_DELAY_US + (rng.exponential(1.0, len(tx["ts"])) * extra).astype(np.int64)
                labels_writer.write_table(pa.table({
                    "transaction_id": tx_ids, "user_id": pa.array(tx["user"] + 1, pa.int64()),
                    "merchant_id": pa.array(tx["merchant"] + 1, pa.int64()), "event_ts": _ts(tx["ts"]),
                    "amount": pa.array(tx["amount"], pa.float64()), "is_online": pa.array(tx["online"], pa.bool_()),
                    "is_fraud": pa.array(tx["fraud"], pa.int64()), "label_arrived_at": _ts(arrival)},
                    schema=_LABEL_SCHEMA))
                on_time, late, kinds = _apply_defects(np.random.default_rng([seed, 2, d]), tx, tx_ids, day_us,
                                                      late_fraction if d < days - 1 else 0.0, malformed_fraction)
                for k, c in zip(MALFORMED_KINDS, np.bincount(kinds, minlength=len(MALFORMED_KINDS)), strict=True):
                    malformed[k] += int(c)
                parts = [on_time] + ([pending_late] if pending_late is not None else [])
                pending_late, late_total = late, late_total + late.num_rows
                part = f"date={day:%Y-%m-%d}"
                for name, tbl in (("transactions", pa.concat_tables(parts)), ("user_profiles", prof),
                                  ("merchant_risk", mr)):
                    paths[name].append(_atomic_parquet(tbl, out / "events" / name / part / PART_NAME))
                    rows[name] += tbl.num_rows
                rows["labels"] += len(tx["ts"])
        os.replace(labels_tmp, labels_path)
    finally:
        labels_tmp.unlink(missing_ok=True)
    for name, written in paths.items():
        _prune(out / "events" / name, set(written))
    return GenerationSummary(out, start, days, seed, {**{k: tuple(v) for k, v in paths.items()},
                                                      "labels": (labels_path,)},
                             rows, late_total, malformed, drift_from_day)


def _apply_defects(rng: np.random.Generator, tx: dict[str, np.ndarray], tx_ids: pa.Array, day_us: int,
                   late_fraction: float, malformed_fraction: float) -> tuple[pa.Table, pa.Table, np.ndarray]:
    """Split the day into (on-time rows sorted by event_ts, late rows, malformed kinds); the sets are disjoint."""
    n = len(tx["ts"])
    perm = rng.permutation(n)
    n_late, n_bad = round(late_fraction * n), round(malformed_fraction * n)
    late_idx, bad = np.sort(perm[:n_late]), perm[n_late:n_late + n_bad]
    kinds = rng.integers(0, len(MALFORMED_KINDS), n_bad)
    null_user = np.zeros(n, bool)
    amount, cat, ts = tx["amount"].copy(), tx["cat"].copy(), tx["ts"].copy()
    null_user[bad[kinds == 0]] = True
    amount[bad[kinds == 1]] = np.nan
    amount[bad[kinds == 2]] *= -1.0
    cat[bad[kinds == 3]] = len(CATEGORIES)
    ts[bad[kinds == 4]] += FUTURE_DAY_US - day_us
    table = pa.table({
        "transaction_id": tx_ids, "user_id": pa.array(tx["user"] + 1, pa.int64(), mask=null_user),
        "merchant_id": pa.array(tx["merchant"] + 1, pa.int64()), "amount": pa.array(amount, pa.float64()),
        "category": _lookup((*CATEGORIES, UNKNOWN_CATEGORY), cat), "is_online": pa.array(tx["online"], pa.bool_()),
        "event_ts": _ts(ts)})
    is_late = np.zeros(n, bool)
    is_late[late_idx] = True
    on_time = np.flatnonzero(~is_late)
    # Re-sort on the defective timestamps, so far-future rows sit at the end of the on-time block.
    on_time = on_time[np.argsort(ts[on_time], kind="stable")]
    return table.take(on_time), table.take(late_idx), kinds


def _prune(table_dir: Path, keep: set[Path]) -> None:
    for stale in table_dir.glob(f"date=*/{PART_NAME}"):
        if stale not in keep:
            stale.unlink()
            if not any(stale.parent.iterdir()):
                stale.parent.rmdir()


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point: generate, then print the summary table."""
    p = argparse.ArgumentParser(prog="python -m quiver.pipelines.demo_data", description=__doc__.splitlines()[0])
    p.add_argument("--out", default="data", help="output directory")
    p.add_argument("--start", type=date.fromisoformat, default=date(2026, 11, 1), help="YYYY-MM-DD")
    for flag, kind, default in (("days", int, 7), ("seed", int, 7), ("users", int, 2_000), ("merchants", int, 200),
                                ("transactions-per-day", int, 20_000), ("drift-from-day", int, None),
                                ("late-fraction", float, 0.0), ("malformed-fraction", float, 0.0)):
        p.add_argument(f"--{flag}", type=kind, default=default)
    args = vars(p.parse_args(argv))
    t0 = time.perf_counter()
    summary = generate(args.pop("out"), **args)
    print(summary.format_table())
    print(f"took {time.perf_counter() - t0:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
