"""Shared by the backfill tests: random events, an independent pure-Python reference, store readers.

The reference (`brute_tiles`, `brute_last_values`, `brute_values_at`) is written from docs/architecture.md, "As of t" and the
layout docstring, row by row, sharing no code with the compiler. The tests at the bottom pin it on a
hand-computed example, so a cross-engine match means the engines match the semantics, not each other.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from quiver.catalog.ir import Catalog, ViewSpec
from quiver.catalog.loader import load_catalog
from quiver.config import Config

GOLDEN_CATALOG = Path(__file__).resolve().parents[1] / "golden" / "catalog"
DAY0 = date(2024, 3, 1)  # events span DAY0 - 1 .. DAY0 + 3; backfills usually cover DAY0 .. DAY0 + 2
US_PER_DAY = 86_400_000_000
EVENT_SCHEMA = pa.schema([
    ("user_id", pa.int64()), ("merchant_id", pa.int64()), ("amount", pa.float64()), ("qty", pa.int64()),
    ("flag", pa.bool_()), ("cat", pa.string()), ("ts", pa.timestamp("us", tz="UTC")),
])
Row = dict[str, Any]


def day_us(day: date) -> int:
    return (day - date(1970, 1, 1)).days * US_PER_DAY


def make_events(seed: int = 1, n: int = 3000, users: int = 25) -> pa.Table:
    """Random events with nulls everywhere, many ties at one time per entity, and equal values."""
    rng = np.random.default_rng(seed)
    start = day_us(DAY0 - timedelta(days=1))
    # 10-minute slots over 5 days: ~120 events per user on ~720 slots gives plenty of same-time ties.
    ts = start + rng.integers(0, 5 * 144, n) * 600_000_000
    ts = ts + np.where(rng.random(n) < 0.1, rng.integers(0, 600_000_000, n), 0)

    def nulls(values: list[Any], share: float) -> list[Any]:
        mask = rng.random(len(values)) < share
        return [None if m else v for v, m in zip(values, mask, strict=True)]

    columns = {
        "user_id": nulls([int(v) for v in rng.integers(1, users + 1, n)], 0.03),
        "merchant_id": nulls([int(v) for v in rng.integers(1, 6, n)], 0.03),
        "amount": nulls([float(v) for v in np.round(rng.gamma(2.0, 20.0, n), 1)], 0.1),
        "qty": nulls([int(v) for v in rng.integers(-5, 8, n)], 0.1),
        "flag": nulls([bool(v) for v in rng.random(n) < 0.4], 0.1),
        "cat": nulls([str(v) for v in rng.choice(["a", "b", "c", "d"], n)], 0.1),
        "ts": nulls([int(v) for v in ts], 0.01),
    }
    return pa.table({k: pa.array(v, type=EVENT_SCHEMA.field(k).type) for k, v in columns.items()},
                    schema=EVENT_SCHEMA)


def write_events(table: pa.Table, folder: Path, files: int = 3, seed: int = 0) -> list[Path]:
    """Split `table` randomly into `files` Parquet files under `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    part = np.random.default_rng(seed).integers(0, files, table.num_rows)
    paths = []
    for i in range(files):
        path = folder / f"events-{i}.parquet"
        pq.write_table(table.filter(pa.array(part == i)), path)
        paths.append(path)
    return paths


def project(tmp: Path, events: pa.Table | None = None) -> tuple[Config, Catalog]:
    """A project in `tmp`: events under tmp/events, the golden catalog, a SQLite registry."""
    write_events(make_events() if events is None else events, tmp / "events")
    config = Config(root=tmp, project="t", offline_root="offline", registry_url=f"sqlite:///{tmp}/registry.db")
    return config, load_catalog(GOLDEN_CATALOG, root=tmp)


# ---- reading the store ----


def read_partitions(folder: Path) -> tuple[pa.Table | None, list[date]]:
    """All date=… partitions of one view/kind folder, concatenated, and the dates present."""
    days = sorted(date.fromisoformat(p.name[5:]) for p in folder.glob("date=*"))
    tables = [pq.read_table(f) for f in sorted(folder.glob("date=*/*.parquet"))]
    return (pa.concat_tables(tables) if tables else None), days


def store_rows(root: Path, view: ViewSpec) -> list[Row]:
    kind = "tiles" if view.kind == "agg" else "last_values"
    table, _ = read_partitions(root / view.name / kind)
    return sort_rows(table.to_pylist() if table is not None else [], view)


def sort_rows(rows: list[Row], view: ViewSpec) -> list[Row]:
    order = [*view.key_names, "tile_start" if view.kind == "agg" else "event_ts"]
    return sorted(rows, key=lambda r: tuple(r[c] for c in order))


def assert_rows_equal(actual: list[Row], expected: list[Row], what: str) -> None:
    """Exact equality except floats (rel tol 1e-9); reports the first differing row."""
    assert len(actual) == len(expected), f"{what}: {len(actual)} rows, expected {len(expected)}"
    for a, e in zip(actual, expected, strict=True):
        assert a.keys() == e.keys(), f"{what}: columns {sorted(a)} != {sorted(e)}"
        for column, want in e.items():
            got = a[column]
            if isinstance(want, float) and isinstance(got, float):
                ok = math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12)
            else:
                ok = got == want and type(got) is type(want)
            assert ok, f"{what}: column {column!r}: {got!r} != {want!r} in row {a} (expected {e})"


# ---- the reference ----


def brute_reason(row: Row, contract: Any, now_us: int) -> str | None:
    """The first check of `contract` the row fails, as `<rule>:<column>` (docs/data-contracts.md), or None."""
    for check in contract.checks:
        value = row[check.column]
        if check.rule == "not_null":
            failed = value is None
        elif value is None:
            failed = False
        elif check.rule == "finite":
            failed = not math.isfinite(value)
        elif check.rule == "one_of":
            failed = value not in check.value
        else:
            number = _us(value) if isinstance(value, datetime) else value
            if check.rule == "future":
                failed = number > now_us + check.value
            else:
                nan = isinstance(number, float) and math.isnan(number)
                failed = nan or (number < check.value if check.rule == "min" else number > check.value)
        if failed:
            return str(check.reason)
    return None


def _in_range(table: pa.Table, view: ViewSpec, start_us: int, end_us: int) -> list[Row]:
    rows = []
    now_us = int(datetime.now(UTC).timestamp() * 1_000_000)
    for row in table.to_pylist():
        ts = row["ts"]
        if ts is None or any(row[k] is None for k in view.key_names):
            continue
        if view.contract is not None and brute_reason(row, view.contract, now_us) is not None:
            continue
        us = _us(ts)
        if start_us <= us < end_us:
            rows.append({**row, "_us": us})
    return rows


def _us(ts: datetime) -> int:
    return (ts - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)


def _num(value: Any) -> Any:
    return int(value) if isinstance(value, bool) else value


def brute_tiles(table: pa.Table, view: ViewSpec, start_us: int, end_us: int) -> list[Row]:
    """Tiles by definition: per (keys, tile), n_events and each partial over the tile's events."""
    tile = view.tile_us
    assert tile
    groups: dict[tuple[Any, ...], list[Row]] = defaultdict(list)
    for row in _in_range(table, view, start_us, end_us):
        groups[(*[row[k] for k in view.key_names], row["_us"] - row["_us"] % tile)].append(row)
    columns = list(dict.fromkeys(a.column for a in view.aggregations))
    fns = {c: {a.fn for a in view.aggregations if a.column == c} for c in columns}
    out = []
    for key, rows in groups.items():
        tile_row: Row = dict(zip([*view.key_names, "tile_start"], key, strict=True))
        tile_row["n_events"] = len(rows)
        for c in columns:
            values = [(r["_us"], _num(r[c])) for r in rows if r[c] is not None]
            nums = [v for _, v in values]
            tile_row[f"{c}__cnt"] = len(values)
            if fns[c] & {"sum", "mean", "stddev"}:
                tile_row[f"{c}__sum"] = float(sum(float(v) for v in nums)) if nums else None
            if "stddev" in fns[c]:
                tile_row[f"{c}__sumsq"] = float(sum(float(v) * float(v) for v in nums)) if nums else None
            if "min" in fns[c]:
                tile_row[f"{c}__min"] = min(nums) if nums else None
            if "max" in fns[c]:
                tile_row[f"{c}__max"] = max(nums) if nums else None
            if "last" in fns[c]:
                best = max(values) if values else (None, None)
                tile_row[f"{c}__last"], tile_row[f"{c}__last_ts"] = best[1], best[0]
        out.append(tile_row)
    return sort_rows(out, view)


def brute_last_values(table: pa.Table, view: ViewSpec, start_us: int, end_us: int) -> list[Row]:
    """One row per (keys, event time): the greatest field values in field order, NULL lowest."""
    groups: dict[tuple[Any, ...], list[Row]] = defaultdict(list)
    for row in _in_range(table, view, start_us, end_us):
        groups[(*[row[k] for k in view.key_names], row["_us"])].append(row)
    out = []
    for rows in groups.values():
        best = max(rows, key=lambda r: tuple((r[f.column] is not None, r[f.column]) for f in view.fields))
        record: Row = {k: best[k] for k in view.key_names}
        record["event_ts"] = best["ts"]
        record.update({f.name: best[f.column] for f in view.fields})
        out.append(record)
    return sort_rows(out, view)


def brute_values_at(table: pa.Table, view: ViewSpec, as_of_us: int) -> list[Row]:
    """Every aggregation's value as of `as_of_us` from raw events in [as_of - w, as_of) (docs/architecture.md, "As of t")."""
    longest = max(a.window_us for a in view.aggregations)
    rows = _in_range(table, view, as_of_us - longest, as_of_us)
    entities = sorted({tuple(r[k] for k in view.key_names) for r in rows})
    out = []
    for entity in entities:
        mine = [r for r in rows if tuple(r[k] for k in view.key_names) == entity]
        record: Row = dict(zip(view.key_names, entity, strict=True))
        for agg in view.aggregations:
            values = [(r["_us"], _num(r[agg.column])) for r in mine
                      if r["_us"] >= as_of_us - agg.window_us and r[agg.column] is not None]
            record[agg.name] = _finalize(agg.fn, values, agg.input_dtype)
        out.append(record)
    return out


def _finalize(fn: str, values: list[tuple[int, Any]], dtype: str) -> Any:
    nums = [v for _, v in values]
    if fn == "count":
        return len(values)
    if fn == "sum":
        return float(sum(float(v) for v in nums))
    if not values:
        return None
    if fn == "mean":
        return float(sum(float(v) for v in nums)) / len(nums)
    if fn in ("min", "max"):
        return (min if fn == "min" else max)(nums)
    if fn == "last":
        value = max(values)[1]
        return bool(value) if dtype == "bool" else value
    if fn == "stddev":
        return statistics.stdev(float(v) for v in nums) if len(nums) >= 2 else None
    raise AssertionError(fn)


def values_close(actual: Iterable[Row], expected: Iterable[Row], what: str) -> None:
    """Like assert_rows_equal, with an absolute tolerance for stddev (sum-of-squares rounding near 0)."""
    actual, expected = list(actual), list(expected)
    assert len(actual) == len(expected), f"{what}: {len(actual)} rows, expected {len(expected)}"
    for a, e in zip(actual, expected, strict=True):
        for column, want in e.items():
            got = a[column]
            if isinstance(want, float) and isinstance(got, float):
                ok = math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-6 if "stddev" in column else 1e-12)
            else:
                ok = got == want and type(got) is type(want)
            assert ok, f"{what}: {column}: {got!r} != {want!r} for {[a[k] for k in list(e)[:2]]}"


# ---- the reference, pinned on a hand-computed example ----


def _tiny() -> tuple[pa.Table, Catalog]:
    t0 = day_us(DAY0)
    rows = [  # user 1: two events in tile 0 (a tie at t0 + 60 s), one in tile 1; user 2: a null amount
        {"user_id": 1, "merchant_id": 1, "amount": 5.0, "qty": 2, "flag": True, "cat": "a", "ts": t0 + 60_000_000},
        {"user_id": 1, "merchant_id": 2, "amount": 7.0, "qty": -1, "flag": False, "cat": "b", "ts": t0 + 60_000_000},
        {"user_id": 1, "merchant_id": 1, "amount": 1.0, "qty": None, "flag": None, "cat": None,
         "ts": t0 + 400_000_000},
        {"user_id": 2, "merchant_id": 1, "amount": None, "qty": 3, "flag": True, "cat": "c", "ts": t0},
        {"user_id": None, "merchant_id": 1, "amount": 9.0, "qty": 1, "flag": True, "cat": "a", "ts": t0},
    ]
    for row in rows:
        row["ts"] = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=row["ts"])
    table = pa.Table.from_pylist(rows, schema=EVENT_SCHEMA)
    columns = {f.name: "timestamp" if f.name == "ts" else _LOGICAL[str(f.type)] for f in EVENT_SCHEMA}
    return table, load_catalog(GOLDEN_CATALOG, schema_reader=lambda s: columns)


_LOGICAL = {"int64": "int64", "double": "float64", "bool": "bool", "string": "string"}


def test_brute_tiles_on_a_hand_computed_example() -> None:
    table, catalog = _tiny()
    t0 = day_us(DAY0)
    tiles = brute_tiles(table, catalog.view("user_activity"), t0, t0 + US_PER_DAY)
    assert [(r["user_id"], r["tile_start"], r["n_events"]) for r in tiles] == [
        (1, t0, 2), (1, t0 + 300_000_000, 1), (2, t0, 1)]
    first = tiles[0]
    assert (first["amount__cnt"], first["amount__sum"], first["amount__sumsq"]) == (2, 12.0, 74.0)
    assert (first["amount__min"], first["amount__max"]) == (5.0, 7.0)
    assert (first["amount__last"], first["amount__last_ts"]) == (7.0, t0 + 60_000_000)  # tie: greatest
    assert (first["qty__last"], first["flag__last"], first["flag__min"], first["cat__last"]) == (2, 1, 0, "b")
    assert (tiles[1]["qty__cnt"], tiles[1]["qty__sum"], tiles[1]["qty__last"]) == (0, None, None)
    assert (tiles[2]["amount__cnt"], tiles[2]["amount__sum"], tiles[2]["amount__last"]) == (0, None, None)


def test_brute_last_values_and_values_on_a_hand_computed_example() -> None:
    table, catalog = _tiny()
    t0 = day_us(DAY0)
    last = brute_last_values(table, catalog.view("user_last"), t0, t0 + US_PER_DAY)
    assert [(r["user_id"], r["amount"], r["last_merchant"]) for r in last] == [(1, 7.0, 2), (1, 1.0, 1),
                                                                                (2, None, 1)]
    values = brute_values_at(table, catalog.view("user_activity"), t0 + 600_000_000)
    user1 = values[0]
    assert (user1["amount_count_1h"], user1["amount_sum_1h"], user1["amount_mean_1h"]) == (3, 13.0, 13.0 / 3)
    assert user1["amount_last_1h"] == 1.0 and user1["flag_last_1h"] is True  # tie at t0+60 s: True > False
    assert math.isclose(user1["amount_stddev_1h"], statistics.stdev([5.0, 7.0, 1.0]))
    user2 = values[1]
    assert (user2["amount_count_1h"], user2["amount_sum_1h"], user2["amount_mean_1h"]) == (0, 0.0, None)
    assert user2["qty_stddev_2h"] is None and user2["qty_sum_2h"] == 3.0
