"""An independent reference for point-in-time joins, shared by the PIT tests (and its own sanity tests).

* `write_offline` writes tiles and last values per quiver/offline/layout.py with plain Python loops — a
  second, deliberately naive writer, independent of the backfill job.
* `reference_features` computes every feature of every label row straight from the raw events (no tiles):
  filter the entity's events to the window bounds, then count/sum/min/… directly.
* `make_world` builds a small random project with the awkward cases: ties at t, events exactly at t - ttl,
  nulls in values, null keys, a two-key view, a string key, several views over two sources, date partitions.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quiver import Aggregation, Bool, Entity, FeatureView, Field, Float64, Int64, Source, String
from quiver.catalog.aggregations import (
    AGG_FUNCTIONS,
    EVENTS_COLUMN,
    TILE_START,
    last_ts_column,
    view_partials,
)
from quiver.catalog.ir import Catalog, ViewSpec
from quiver.catalog.validate import build_catalog
from quiver.config import Config
from quiver.offline.layout import EVENT_TS, LAST_VALUES, TILES, last_values_schema, partition_dir, tile_schema

US = 1_000_000
MINUTE = 60 * US
HOUR = 60 * MINUTE
BASE = int(datetime(2026, 11, 1, 20, tzinfo=UTC).timestamp()) * US  # spans midnight: two date partitions
TS_TYPE = pa.timestamp("us", tz="UTC")


# --- the project -----------------------------------------------------------------------------------------

user = Entity("user", ["user_id"], dtype=Int64)
merchant = Entity("merchant", ["merchant_code"], dtype=String)
tx_source = Source("tx", path="events/tx", timestamp_field="event_ts")
profile_source = Source("profiles", path="events/profiles", timestamp_field="event_ts")

user_profile = FeatureView(
    "user_profile", [user], profile_source, ttl="2h",
    schema=[Field("score", Float64), Field("level", Int64), Field("tier", String), Field("flag", Bool)])
user_last_tx = FeatureView(
    "user_last_tx", [user], tx_source, ttl="1h",
    schema=[Field("last_amount", Float64, column="amount"), Field("category", String)])
user_spend = FeatureView(
    "user_spend", [user], tx_source, tile="10m",
    aggregations=[*(Aggregation("amount", fn, w) for fn in AGG_FUNCTIONS for w in ("30m", "2h")),
                  *(Aggregation("qty", fn, "1h") for fn in ("count", "sum", "min", "max", "last", "stddev")),
                  *(Aggregation("is_online", fn, "1h") for fn in ("mean", "min", "max", "last")),
                  Aggregation("category", "count", "1h"), Aggregation("category", "last", "1h")])
pair_spend = FeatureView(
    "pair_spend", [user, merchant], tx_source, tile="5m",
    aggregations=[Aggregation("amount", "sum", "20m"), Aggregation("amount", "count", "1h"),
                  Aggregation("amount", "last", "1h"), Aggregation("qty", "max", "20m")])
merchant_stats = FeatureView(
    "merchant_stats", [merchant], tx_source, tile="15m",
    aggregations=[Aggregation("amount", "max", "1h"), Aggregation("amount", "mean", "1h"),
                  Aggregation("amount", "count", "1h")])  # the same short name as in pair_spend
DEFINITIONS = [user, merchant, tx_source, profile_source, user_profile, user_last_tx, user_spend, pair_spend,
               merchant_stats]
ALL_FEATURES = [f"{v.name}:{f}" for v in DEFINITIONS if isinstance(v, FeatureView) for f in v.feature_names]


@dataclass
class World:
    root: Path
    catalog: Catalog
    config: Config
    events: dict[str, pd.DataFrame]  # source name → raw events (µs int column `ts`)
    labels: pd.DataFrame


def make_world(root: Path, seed: int = 0, n_users: int = 6, n_events: int = 500, n_labels: int = 300,
               write: bool = True) -> World:
    rng = random.Random(seed)
    merchants = ["m-a", "m-b", "m-c"]

    def maybe(value: Any, p: float = 0.15) -> Any:
        return None if rng.random() < p else value

    # Whole minutes in a 6 h span: many ties between events, labels and tile edges.
    tx = [{"user_id": maybe(rng.randrange(n_users), 0.02), "merchant_code": maybe(rng.choice(merchants), 0.02),
           "ts": maybe(BASE + rng.randrange(6 * 60) * MINUTE, 0.01),
           "amount": maybe(round(rng.uniform(-5, 100), 2)), "qty": maybe(rng.randrange(-3, 9)),
           "is_online": maybe(rng.random() < 0.4), "category": maybe(rng.choice(["food", "fuel", "toys"]))}
          for _ in range(n_events)]
    profiles = [{"user_id": rng.randrange(n_users), "ts": BASE + rng.randrange(6 * 12) * 5 * MINUTE,
                 "score": maybe(round(rng.uniform(0, 1), 3)), "level": maybe(rng.randrange(5)),
                 "tier": maybe(rng.choice(["gold", "silver"])), "flag": maybe(rng.random() < 0.5)}
                for _ in range(n_events // 5)]
    events = {"tx": pd.DataFrame(tx), "profiles": pd.DataFrame(profiles)}
    for frame in events.values():
        frame["user_id"] = frame["user_id"].astype("Int64")
        frame["ts"] = frame["ts"].astype("Int64")
    events["tx"]["qty"] = events["tx"]["qty"].astype("Int64")
    events["tx"]["is_online"] = events["tx"]["is_online"].astype("boolean")
    events["profiles"]["level"] = events["profiles"]["level"].astype("Int64")
    events["profiles"]["flag"] = events["profiles"]["flag"].astype("boolean")
    for name, frame in events.items():
        _write_source(root / "events" / name, frame)
    catalog = build_catalog(DEFINITIONS, root)
    config = Config(root=root, offline_root="offline")
    labels = _labels(rng, events, n_users, merchants, n_labels)
    world = World(root, catalog, config, events, labels)
    if write:
        write_offline(world)
    return world


def _labels(rng: random.Random, events: dict[str, pd.DataFrame], n_users: int, merchants: list[str],
            n: int) -> pd.DataFrame:
    tx = events["tx"].dropna(subset=["ts"])
    event_times = [int(v) for v in tx["ts"]] + [int(v) for v in events["profiles"]["ts"]]
    rows = []
    for i in range(n):
        pick = i % 6
        if pick == 0:  # exactly at an event: that event must not count
            t = rng.choice(event_times)
        elif pick == 1:  # exactly one TTL (1 h or 2 h) after an event: the event is still in
            t = rng.choice(event_times) + rng.choice([HOUR, 2 * HOUR])
        elif pick == 2:  # one µs past the TTL: out
            t = rng.choice(event_times) + rng.choice([HOUR, 2 * HOUR]) + 1
        elif pick == 3:  # on a tile edge: the head is empty
            t = BASE + rng.randrange(8 * 12) * 5 * MINUTE
        else:
            t = BASE - HOUR + rng.randrange(9 * HOUR)
        user_id = rng.randrange(n_users + 1)  # n_users has no events at all
        rows.append({"user_id": user_id, "merchant_code": rng.choice(merchants), "t": t, "label": i % 2})
    rows.append({**rows[0]})  # duplicates are kept
    rows.append({**rows[1]})
    rows.append({**rows[2], "user_id": None})  # a null key: no features
    frame = pd.DataFrame(rows)
    frame["user_id"] = frame["user_id"].astype("Int64")
    frame["event_ts"] = pd.to_datetime(frame.pop("t"), unit="us", utc=True)
    frame["row_id"] = np.arange(len(frame))
    return frame.sample(frac=1, random_state=1).reset_index(drop=True)  # labels arrive in no order


def _write_source(folder: Path, frame: pd.DataFrame) -> None:
    table = pa.Table.from_pandas(frame.rename(columns={"ts": "event_ts"}), preserve_index=False)
    table = table.set_column(table.schema.get_field_index("event_ts"), "event_ts",
                             pa.array(frame["ts"].to_numpy(dtype="float64", na_value=np.nan), from_pandas=True)
                             .cast(pa.int64()).cast(TS_TYPE))
    half = len(frame) // 2  # two files, to read a multi-file source
    for i, part in enumerate((table.slice(0, half), table.slice(half))):
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(part, folder / f"part-{i}.parquet")


# --- a naive offline writer --------------------------------------------------------------------------------


def _day(us: int) -> Any:
    return datetime.fromtimestamp(us // US, tz=UTC).date()


def _valid_rows(world: World, view: ViewSpec) -> list[dict[str, Any]]:
    frame = world.events[view.source]
    rows = []
    for record in frame.to_dict("records"):
        row = {k: (None if _is_null(v) else v.item() if isinstance(v, np.generic) else v)
               for k, v in record.items()}
        if row["ts"] is None or any(row[k] is None for k in view.key_names):
            continue
        rows.append(row)
    return rows


def _is_null(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def _value_key(value: Any) -> tuple[int, Any]:
    """Order for ties: null lowest."""
    return (0, 0) if value is None else (1, value)


def write_offline(world: World) -> None:
    """Tiles and last values of every view, per layout.py, from the raw events."""
    root = world.config.offline_dir
    for view in world.catalog.views.values():
        rows = _valid_rows(world, view)
        by_day: dict[Any, list[dict[str, Any]]] = defaultdict(list)
        if view.kind == "last":
            groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
            for row in rows:
                groups[(*(row[k] for k in view.key_names), row["ts"])].append(row)
            for (*keys, ts), members in groups.items():
                values = [[m[f.column] for f in view.fields] for m in members]
                best = max(values, key=lambda vals: tuple(_value_key(v) for v in vals))
                record = dict(zip(view.key_names, keys, strict=True))
                record[EVENT_TS] = ts
                record.update({f.name: v for f, v in zip(view.fields, best, strict=True)})
                by_day[_day(ts)].append(record)
            schema = last_values_schema(view)
            kind = LAST_VALUES
        else:
            tiles: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
            for row in rows:
                tiles[(*(row[k] for k in view.key_names), row["ts"] - row["ts"] % view.tile_us)].append(row)
            partials = view_partials([(a.column, a.fn, a.input_dtype) for a in view.aggregations])
            for (*keys, start), members in tiles.items():
                record = dict(zip(view.key_names, keys, strict=True))
                record[TILE_START], record[EVENTS_COLUMN] = start, len(members)
                for partial in partials:
                    record.update(_tile_partial(partial.column, partial.partial.kind, members))
                by_day[_day(start)].append(record)
            schema = tile_schema(view)
            kind = TILES
        for day, records in by_day.items():
            folder = partition_dir(root, view.name, kind, day)
            folder.mkdir(parents=True, exist_ok=True)
            columns = {f.name: [r.get(f.name) for r in records] for f in schema}
            if EVENT_TS in columns:
                columns[EVENT_TS] = pa.array(columns[EVENT_TS], pa.int64()).cast(TS_TYPE)
            pq.write_table(pa.table(columns, schema=schema), folder / "part-00000.parquet")


def _tile_partial(column: str, kind: str, members: list[dict[str, Any]]) -> dict[str, Any]:
    present = [(m["ts"], m[column]) for m in members if m[column] is not None]
    values = [int(v) if isinstance(v, bool) else v for _, v in present]
    name = f"{column}__{kind}"
    if kind == "cnt":
        return {name: len(values)}
    if not values:
        return {name: None, **({last_ts_column(column): None} if kind == "last" else {})}
    if kind == "sum":
        return {name: math.fsum(values)}
    if kind == "sumsq":
        return {name: math.fsum(v * v for v in values)}
    if kind in ("min", "max"):
        return {name: min(values) if kind == "min" else max(values)}
    ts, value = max(present, key=lambda p: (p[0], _value_key(p[1])))
    if isinstance(value, bool):  # layout.tile_schema stores a bool column's partials as int64
        value = int(value)
    return {name: value, last_ts_column(column): ts}


def tied_last_values(world: World, root: Path) -> tuple[Config, pd.DataFrame, dict[str, list[Any]]]:
    """An offline store whose last values break the layout's one-row-per-(keys, event_ts) promise, and
    what the tie rule (greatest field values, null lowest, in field order) makes of it."""
    view = world.catalog.views["user_profile"]
    rows = [(1, 0.7, 2, None, False), (1, 0.5, 1, "gold", True), (1, 0.7, None, None, None),
            (2, None, 5, "a", True), (2, None, 3, "b", True), (2, None, 5, "a", None)]
    columns: dict[str, Any] = {"user_id": [r[0] for r in rows],
                               EVENT_TS: pa.array([BASE] * len(rows), pa.int64()).cast(TS_TYPE)}
    for i, f in enumerate(view.fields, start=1):
        columns[f.name] = [r[i] for r in rows]
    config = Config(root=root, offline_root=str(root / "tied"))
    folder = partition_dir(config.offline_dir, view.name, LAST_VALUES, _day(BASE))
    folder.mkdir(parents=True)
    pq.write_table(pa.table(columns, schema=last_values_schema(view)), folder / "part-00000.parquet")
    labels = pd.DataFrame({"user_id": [1, 2, 1], "event_ts": pd.to_datetime([BASE + 1, BASE + 1, BASE], unit="us",
                                                                             utc=True)})
    expected = {"score": [0.7, None, None], "level": [2, 5, None], "tier": [None, "a", None],
                "flag": [False, True, None]}
    return config, labels, expected


# --- brute force -------------------------------------------------------------------------------------------


def reference_features(world: World, features: list[str], full_names: bool = False) -> pd.DataFrame:
    """Every feature of every label row, straight from raw events (label columns first, in label order)."""
    out = world.labels.copy()
    times = (out["event_ts"].astype("int64") // 1000).tolist() if out["event_ts"].dt.unit == "ns" else \
        out["event_ts"].astype("int64").tolist()
    for ref in features:
        view_name, _, feature = ref.partition(":")
        if view_name in world.catalog.on_demand:
            column = f"{view_name}__{feature}" if full_names else feature
            out[column] = _on_demand_feature(world, world.catalog.on_demand[view_name], feature)
            continue
        view = world.catalog.views[view_name]
        rows = _valid_rows(world, view)
        by_key: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
        for row in rows:
            by_key[tuple(row[k] for k in view.key_names)].append(row)
        column = f"{view_name}__{feature}" if full_names else feature
        values = []
        for label, t in zip(out.to_dict("records"), times, strict=True):
            key = tuple(None if pd.isna(label[k]) else label[k] for k in view.key_names)
            values.append(_one_feature(view, feature, by_key.get(key, []), t))
        out[column] = values
    return out


def _on_demand_feature(world: World, spec: Any, feature: str) -> list[Any]:
    """One on-demand output per label row, one row at a time: its stored inputs by brute force as of the
    label's time, its request fields from the label row, `request_ts` the label's time."""
    inputs = reference_features(world, [f"{v}:{f}" for v, f in spec.inputs])
    values = []
    for i in range(len(world.labels)):
        row = {name: [world.labels[name].iloc[i]] for name, _ in spec.request_fields}
        row |= {f: [inputs[f].iloc[i]] for _, f in spec.inputs}
        row["request_ts"] = [pd.Timestamp(world.labels["event_ts"].iloc[i])]
        if spec.mode == "python":  # plain Python values, None where missing; the time as a UTC datetime
            plain = {name: [None if pd.isna(v) else v.item() if hasattr(v, "item") else v for v in values]
                     for name, values in row.items() if name != "request_ts"}
            plain["request_ts"] = [pd.Timestamp(row["request_ts"][0]).tz_convert("UTC").to_pydatetime()]
            result = spec.udf(plain)[feature][0]
            values.append(None if result is None or (isinstance(result, float) and math.isnan(result)) else result)
            continue
        frame = pd.DataFrame(row)
        frame["request_ts"] = pd.to_datetime(frame["request_ts"], utc=True)
        result = spec.udf(frame)[feature].iloc[0]
        values.append(None if pd.isna(result) else result)
    return values


def _one_feature(view: ViewSpec, feature: str, events: list[dict[str, Any]], t: int) -> Any:
    if view.kind == "last":
        ttl = view.ttl_us
        inside = [e for e in events if e["ts"] < t and (ttl is None or e["ts"] >= t - ttl)]
        if not inside:
            return None
        newest = max(e["ts"] for e in inside)
        candidates = [[e[f.column] for f in view.fields] for e in inside if e["ts"] == newest]
        best = max(candidates, key=lambda vals: tuple(_value_key(v) for v in vals))
        index = [f.name for f in view.fields].index(feature)
        return best[index]
    agg = next(a for a in view.aggregations if a.name == feature)
    tile = view.tile_us
    low = t - t % tile - agg.window_us
    present = [(e["ts"], e[agg.column]) for e in events if low <= e["ts"] < t and e[agg.column] is not None]
    values = [v for _, v in present]
    numbers = [float(v) for v in values] if agg.fn in ("sum", "mean", "stddev") else values
    if agg.fn == "count":
        return len(values)
    if agg.fn == "sum":
        return math.fsum(numbers) if numbers else 0.0
    if not values:
        return None
    if agg.fn == "mean":
        return math.fsum(numbers) / len(numbers)
    if agg.fn == "stddev":
        return statistics.stdev(numbers) if len(numbers) >= 2 else None
    if agg.fn in ("min", "max"):
        ints = [int(v) if isinstance(v, bool) else v for v in values]
        return min(ints) if agg.fn == "min" else max(ints)
    _, value = max(present, key=lambda p: (p[0], _value_key(p[1])))  # last: newest, ties greatest
    return value


def assert_same(actual: pd.DataFrame, expected: pd.DataFrame, columns: list[str], rel: float = 1e-9) -> None:
    """Every value equal (floats to `rel`), nulls in the same places; reports the first differences."""
    assert len(actual) == len(expected)
    problems = []
    for column in columns:
        for i, (a, e) in enumerate(zip(actual[column].tolist(), expected[column].tolist(), strict=True)):
            if not _equal(a, e, rel):
                problems.append(f"{column} row {i}: got {a!r}, expected {e!r}")
    assert not problems, f"{len(problems)} differences, first: " + "; ".join(problems[:8])


def _equal(a: Any, e: Any, rel: float) -> bool:
    a_null = a is None or a is pd.NA or a is pd.NaT or (isinstance(a, float) and math.isnan(a))
    e_null = e is None or e is pd.NA or (isinstance(e, float) and math.isnan(e))
    if a_null or e_null:
        return a_null and e_null
    if isinstance(e, float) or isinstance(a, float):
        return math.isclose(float(a), float(e), rel_tol=rel, abs_tol=1e-9)
    if isinstance(e, bool) or isinstance(a, bool | np.bool_):
        return bool(a) == bool(e)
    return bool(a == e)


# --- sanity of the reference itself -------------------------------------------------------------------------


def test_reference_tiles_reproduce_raw_counts(tmp_path: Path) -> None:
    world = make_world(tmp_path, seed=3, n_events=200)
    tiles = pq.read_table(tmp_path / "offline" / "user_spend" / "tiles").to_pandas()
    raw = world.events["tx"].dropna(subset=["user_id", "ts"])
    assert tiles[EVENTS_COLUMN].sum() == len(raw)
    assert tiles["amount__cnt"].sum() == raw["amount"].notna().sum()
    assert tiles["amount__sum"].sum() == pytest.approx(raw["amount"].sum())


def test_reference_as_of_rule_on_a_hand_made_case(tmp_path: Path) -> None:
    world = make_world(tmp_path, seed=1, n_events=50, write=False)
    view = world.catalog.views["user_spend"]
    events = [{"ts": BASE, "amount": 1.0}, {"ts": BASE + MINUTE, "amount": 2.0}, {"ts": BASE + MINUTE, "amount": 5.0},
              {"ts": BASE + 2 * MINUTE, "amount": None}]
    assert _one_feature(view, "amount_count_30m", events, BASE + MINUTE) == 1  # the event at t is excluded
    assert _one_feature(view, "amount_last_30m", events, BASE + 2 * MINUTE) == 5.0  # tie: greatest
    assert _one_feature(view, "amount_sum_30m", events, BASE) == 0.0
    assert _one_feature(view, "amount_mean_30m", events, BASE) is None
    # Sawtooth: at 00:31 a 30 m window starts at floor_10m(t) - 30 m = 00:00.
    assert _one_feature(view, "amount_count_30m", events, BASE + 31 * MINUTE) == 3
    assert _one_feature(view, "amount_count_30m", events, BASE + 40 * MINUTE) == 0
    last = world.catalog.views["user_profile"]
    profile = [{"ts": BASE, "score": 0.5, "level": 1, "tier": None, "flag": True}]
    assert _one_feature(last, "score", profile, BASE + 2 * HOUR) == 0.5  # exactly t - ttl: in
    assert _one_feature(last, "score", profile, BASE + 2 * HOUR + 1) is None
