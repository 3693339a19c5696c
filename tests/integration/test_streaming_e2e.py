"""The streaming path end to end on real parts: stream files → PyFlink job (bounded) → change files → Redis.

One shared job run (Flink startup costs 10-40 s here) feeds a random event stream with out-of-order events
inside the lateness bound, ties, null keys, events later than the allowed lateness and malformed lines.
The batch backfill and point-in-time join read the same valid events from Parquet. Then:

* online values read from Redis equal get_historical_features at several request times, exactly;
* the tiles in Redis equal the batch tiles, partial for partial;
* late and future-dated events are set aside for the batch route (not in Redis), malformed lines are in
  the quarantine with reasons, and `quiver stream-status` reports the counts;
* last in the module: the next backfill picks the late events up, and materialization takes them to Redis.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from quiver.catalog.ir import Catalog, ViewSpec
from quiver.catalog.loader import load_catalog
from quiver.config import Config, load_config
from quiver.offline import layout
from quiver.offline.backfill import backfill
from quiver.offline.pit import get_historical_features
from quiver.offline.store import store_for
from quiver.online.base import ViewRead
from quiver.online.layout import entity_keys, key_prefix, tile_partials, tile_record_dtype
from quiver.online.redis_store import RedisOnlineStore
from quiver.pipelines.stream_producer import to_ndjson
from quiver.streaming.late import late_dir, late_events
from quiver.streaming.paths import StreamPaths
from tests.harness import RedisServer

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
STREAM_PYTHON = Path(os.environ.get("QUIVER_STREAM_PYTHON", REPO / ".venv-stream" / "bin" / "python"))
MS = 1_000
M = 60_000_000
H = 60 * M
DAY0 = date(2026, 11, 1)
DAY0_US = (DAY0 - date(1970, 1, 1)).days * 86_400_000_000
SPAN = 20 * H
USERS, MERCHANTS = 40, 4

CATALOG = '''
from quiver import Aggregation, Bool, Entity, FeatureView, Field, Float64, Int64, Source, StreamBinding, String

FNS = ("count", "sum", "mean", "min", "max", "last", "stddev")
user = Entity(name="user", join_keys=["user_id"])
merchant = Entity(name="merchant", join_keys=["merchant_id"])
events = Source(name="events", path="data/events/events", timestamp_field="ts",
                stream=StreamBinding(path="data/stream/events", watermark_delay="2s", allowed_lateness="10m"))
user_activity = FeatureView(
    name="user_activity", entities=[user], source=events, tile="5m",
    aggregations=[*[Aggregation("amount", fn, "1h") for fn in FNS], Aggregation("amount", "sum", "1d"),
                  *[Aggregation("qty", fn, "6h") for fn in FNS], *[Aggregation("flag", fn, "1h") for fn in FNS],
                  Aggregation("cat", "count", "1h"), Aggregation("cat", "last", "1d")])
user_merchant = FeatureView(
    name="user_merchant", entities=[user, merchant], source=events, tile="10m",
    aggregations=[Aggregation("amount", "count", "30m"), Aggregation("amount", "sum", "30m"),
                  Aggregation("amount", "last", "1d"), Aggregation("qty", "max", "1d")])
user_last = FeatureView(
    name="user_last", entities=[user], source=events, ttl="1d",
    schema=[Field("amount", Float64), Field("qty", Int64), Field("flag", Bool), Field("cat", String),
            Field("last_merchant", Int64, column="merchant_id")])
pair_last = FeatureView(name="pair_last", entities=[user, merchant], source=events, ttl="12h",
                        schema=[Field("amount", Float64), Field("cat", String)])
'''

SCHEMA = pa.schema([("user_id", pa.int64()), ("merchant_id", pa.int64()), ("amount", pa.float64()),
                    ("qty", pa.int64()), ("flag", pa.bool_()), ("cat", pa.string()),
                    ("ts", pa.timestamp("us", tz="UTC"))])

# Malformed lines and the quarantine reason each must get.
MALFORMED = [
    (b"not json at all", "unparseable_json"),
    (b'{"ts_ms": 1793491200000, "user_id": 1', "unparseable_json"),
    (b"[1, 2, 3]", "unparseable_json"),
    (b'{"user_id": 1, "amount": 1.0}', "null_event_ts"),
    (b'{"ts_ms": "yesterday", "user_id": 1}', "bad_type:ts_ms"),
    (b'{"ts_ms": 1793491200000.5, "user_id": 1}', "bad_type:ts_ms"),
    (b'{"ts_ms": 1793491260000, "user_id": "abc", "amount": 1.0}', "bad_type:user_id"),
    (b'{"ts_ms": 1793491260000, "user_id": 2, "amount": "lots"}', "bad_type:amount"),
    (b'{"ts_ms": 1793491260000, "user_id": 2, "qty": 2.5}', "bad_type:qty"),
    (b'{"ts_ms": 1793491260000, "user_id": 2, "flag": "maybe"}', "bad_type:flag"),
    (b'{"ts_us": 1793491260000000, "user_id": 2, "flag": "yes"}', "bad_type:flag"),  # batch has no "yes" either
    (b'{"ts_us": 1793491260000000, "user_id": 2, "__batch": "upto-x"}', "reserved_field:__batch"),
    (b'{"ts_us": 99999999999999999999, "user_id": 2}', "bad_type:ts_us"),
]
# Dated in 2100: held back from the online store (it must not move the watermark either) for the batch route.
FUTURE = b'{"ts_ms": 4102444800000, "user_id": 1, "merchant_id": 1, "amount": 5.0, "qty": 1, "cat": "future"}'



@dataclass
class StreamData:
    valid: pa.Table  # every valid event, in arrival order (batch sees these too)
    late: pa.Table  # events later than the allowed lateness (stream only, at the end)
    request_times: list[int]  # mid-stream times with no event in [t, ceil_10m(t))
    end_us: int


def random_stream(seed: int, n: int = 8000, n_late: int = 20) -> StreamData:
    """Events over 20 h at µs resolution (the catalog's), values exact in binary (sums never round), some
    amounts NaN (a value, the greatest), and events 1 µs before each request time."""
    rng = np.random.default_rng(seed)
    ts = DAY0_US + rng.integers(0, SPAN, n)
    # Ties: some events share (user, time) with another one.
    dup = rng.integers(0, n, 150)
    user = rng.integers(0, USERS, n)
    user[n - 150:] = user[dup]
    ts[n - 150:] = ts[dup]
    request_times = sorted(int(DAY0_US + k * 3 * H + rng.integers(1, 60 * M)) for k in range(1, 6))
    request_times.append(DAY0_US + 13 * H)  # tile-aligned
    keep = np.ones(n, dtype=bool)
    for t in request_times:
        keep &= ~((ts >= t) & (ts < (t // (10 * M) + 1) * 10 * M))
    for k, t in enumerate(request_times):  # counted as of t, in the same millisecond as t
        ts[k * 7:(k + 1) * 7] = t - 1
    def nullable(values: np.ndarray, share: float) -> list[Any]:
        out = values.astype(object)
        out[rng.random(len(values)) < share] = None
        return list(out)
    columns = {
        "user_id": nullable(user, 0.01),
        "merchant_id": nullable(rng.integers(0, MERCHANTS, n), 0.02),
        "amount": nullable(np.where(rng.random(n) < 0.01, np.nan, rng.integers(0, 400, n) * 0.25), 0.1),
        "qty": nullable(rng.integers(1, 6, n), 0.05),
        "flag": nullable(rng.random(n) < 0.4, 0.05),
        "cat": nullable(rng.choice(np.array(["a", "b", "c", "ü"], dtype=object), n), 0.1),
        "ts": ts.tolist(),
    }
    table = pa.table({k: pa.array(v, SCHEMA.field(k).type) for k, v in columns.items()}, schema=SCHEMA)
    table = table.filter(pa.array(keep))
    # Arrival order: time order, but 5% of events arrive up to 5 minutes late (inside 2 s + 10 min).
    t = table.column("ts").cast(pa.int64()).to_numpy()
    arrival = t + np.where(rng.random(len(t)) < 0.05, rng.integers(0, 5 * M, len(t)), 0)
    table = table.take(pa.array(np.argsort(arrival, kind="stable")))
    late_ts = DAY0_US + rng.integers(0, 2 * H // 1000, n_late) * MS
    late = pa.table({"user_id": rng.integers(0, USERS, n_late), "merchant_id": rng.integers(0, MERCHANTS, n_late),
                     "amount": rng.integers(1, 400, n_late) * 0.25, "qty": rng.integers(1, 6, n_late),
                     "flag": rng.random(n_late) < 0.5, "cat": ["late"] * n_late,
                     "ts": pa.array(late_ts, SCHEMA.field("ts").type)}, schema=SCHEMA)
    end = int(max(t)) + 1
    return StreamData(table, late, request_times, end)


def write_project(root: Path, redis_url: str, data: StreamData, rows_per_file: int = 500, seed: int = 0) -> Config:
    (root / "feature_defs").mkdir(parents=True)
    (root / "feature_defs" / "features.py").write_text(CATALOG)
    (root / "quiver.yaml").write_text(f"project: streamtest\ncatalog: feature_defs\nregistry_url: "
                                      f"sqlite:///{root}/registry.db\noffline_root: offline\nredis_url: {redis_url}\n")
    batch = root / "data" / "events" / "events" / f"date={DAY0.isoformat()}"
    batch.mkdir(parents=True)
    pq.write_table(data.valid, batch / "part-00000.parquet")
    lines = to_ndjson(data.valid, "ts").splitlines()
    rng = np.random.default_rng(seed)
    for line, _ in MALFORMED:  # anywhere in the stream
        lines.insert(int(rng.integers(0, len(lines))), line)
    lines.insert(int(rng.integers(0, len(lines) // 10)), FUTURE)  # early: it would make everything late
    lines += to_ndjson(data.late, "ts").splitlines()
    stream = root / "data" / "stream" / "events"
    stream.mkdir(parents=True)
    for seq, start in enumerate(range(0, len(lines), rows_per_file)):
        (stream / f"{seq:013d}-{seq:08d}.jsonl").write_bytes(b"\n".join(lines[start:start + rows_per_file]) + b"\n")
    return load_config(root / "quiver.yaml")


def run_stream(config: Config, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    if not STREAM_PYTHON.exists():
        pytest.fail(f"streaming virtualenv missing ({STREAM_PYTHON}): run `make setup`", pytrace=False)
    cmd = [str(STREAM_PYTHON), "-m", "quiver.streaming.runner", "--config", str(Path(config.root) / "quiver.yaml"),
           *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=str(REPO))


@dataclass
class Streamed:
    config: Config
    catalog: Catalog
    data: StreamData
    paths: StreamPaths
    store: RedisOnlineStore
    result: subprocess.CompletedProcess[str]


@pytest.fixture(scope="module")
def redis_for_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    # Our own server: other modules' tests flush theirs, and this module's job runs once for all its tests.
    import shutil

    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server not found on PATH: run `make setup`", pytrace=False)
    server = RedisServer(binary, tmp_path_factory.mktemp("redis-stream"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def streamed(tmp_path_factory: pytest.TempPathFactory, redis_for_module: RedisServer) -> Iterator[Streamed]:
    root = tmp_path_factory.mktemp("stream-project")
    data = random_stream(seed=21)
    config = write_project(root, redis_for_module.url, data)
    result = run_stream(config, "--bounded", "--parallelism", "2")
    assert result.returncode == 0, f"streaming job failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    catalog = load_catalog(config.catalog_dir, root=config.root)
    backfill_on_time(config, catalog)
    store = RedisOnlineStore(redis_for_module.url, config.project)
    yield Streamed(config, catalog, data, StreamPaths.at(root / ".quiver" / "stream"), store, result)
    store.close()


def backfill_on_time(config: Config, catalog: Catalog) -> None:
    """The batch recompute of the events the stream applied: the late ones (set aside for the next
    backfill, see the last test) are moved out of the way for this one."""
    late = late_dir(config.offline_dir)
    aside = late.with_name(".late-aside")
    if late.exists():
        late.rename(aside)
    try:
        backfill(config, catalog, DAY0, DAY0 + timedelta(days=1))
    finally:
        if aside.exists():
            aside.rename(late)


# ---- comparisons ----


def entity_grid(view: ViewSpec) -> dict[str, np.ndarray]:
    if view.key_names == ["user_id"]:
        return {"user_id": np.arange(USERS, dtype=np.int64)}
    users, merchants = np.meshgrid(np.arange(USERS), np.arange(MERCHANTS), indexing="ij")
    return {"user_id": users.ravel().astype(np.int64), "merchant_id": merchants.ravel().astype(np.int64)}


def offline_values(s: Streamed, view: ViewSpec, entities: dict[str, np.ndarray], t: int) -> pd.DataFrame:
    n = len(next(iter(entities.values())))
    labels = pd.DataFrame({**entities, "event_ts": pd.to_datetime(np.full(n, t), unit="us", utc=True)})
    return get_historical_features(labels, [f"{view.name}:{f}" for f in view.feature_names],
                                   catalog=s.catalog, config=s.config)


def assert_equal_values(s: Streamed, view: ViewSpec, t: int) -> int:
    entities = entity_grid(view)
    online = s.store.read([ViewRead(view, tuple(view.feature_names))], entities, t)
    offline = offline_values(s, view, entities, t)
    checked = 0
    for feature in view.feature_names:
        column = online[(view.name, feature)]
        for i in range(len(column.values)):
            off = offline[feature].iloc[i]
            on = column.values[i]
            on = on.item() if hasattr(on, "item") else on
            where = f"{view.name}:{feature} entity={[int(v[i]) for v in entities.values()]} t={t}"
            if isinstance(off, float) and math.isnan(off) and column.valid[i] and isinstance(on, float) \
                    and math.isnan(on):
                checked += 1  # NaN is a value; pandas shows null float as NaN too, so NaN online matches
                continue
            off_missing = off is None or off is pd.NA or (isinstance(off, float) and math.isnan(off))
            assert bool(column.valid[i]) != off_missing, f"{where}: online {column.values[i]!r} offline {off!r}"
            if off_missing:
                continue
            off = off.item() if hasattr(off, "item") else off
            if feature.endswith("stddev"):  # a square root of merged sums: allow the last bits
                assert math.isclose(on, off, rel_tol=1e-12, abs_tol=1e-12), f"{where}: {on!r} != {off!r}"
            else:
                assert on == off, f"{where}: online {on!r} offline {off!r}"
            checked += 1
    return checked


def test_online_equals_offline_at_several_request_times(streamed: Streamed) -> None:
    s = streamed
    after_end = [s.data.end_us, s.data.end_us + 30 * M, s.data.end_us + 11 * H, s.data.end_us + 13 * H,
                 s.data.end_us + 25 * H]
    checked = 0
    for view in s.catalog.views.values():
        # Redis holds one last value per entity (the newest), so last-value views are read after the end.
        times = after_end if view.kind == "last" else s.data.request_times + after_end
        for t in times:
            checked += assert_equal_values(s, view, t)
    assert checked > 5000  # most values are non-null: the comparison is not vacuous


def redis_tiles(store: RedisOnlineStore, project: str, view: ViewSpec, entities: dict[str, np.ndarray]) -> pa.Table:
    """Every tile record stored in Redis for `entities`, decoded with the layout's record dtype."""
    keys = entity_keys(key_prefix(project, view), view, entities)
    dtype = tile_record_dtype(view)
    partials = tile_partials(view)
    strings = [i for i, p in enumerate(partials) if p.dtype == "string"]
    rows: list[dict[str, Any]] = []
    for e, value in enumerate(store.read_raw(keys)):
        pos = 0
        while value and pos < len(value):
            rec = np.frombuffer(value[pos:pos + dtype.itemsize], dtype)[0]
            pos += dtype.itemsize
            row = {k: int(v[e]) for k, v in entities.items()}
            row.update(tile_start=int(rec["tile_start"]), n_events=int(rec["n_events"]))
            for i, p in enumerate(partials):
                if i in strings:
                    size = int(rec[f"p{i}"])
                    row[p.name] = value[pos:pos + size].decode()
                    pos += size
                else:
                    row[p.name] = rec[f"p{i}"].item()
                if p.partial.kind == "last":
                    row[f"{p.column}__last_ts"] = int(rec[f"t{i}"])
            rows.append(row)
    return pa.Table.from_pylist(rows)


def test_tiles_in_redis_equal_batch_tiles(streamed: Streamed) -> None:
    s = streamed
    status = json.loads(s.paths.status_file.read_text())
    # redis_url is redis://, so the job wrote the values itself (the JVM sink): no change file to load.
    assert status["sink"] == "redis (JVM sink)" and status["loader"]["files"] == 0
    for view in s.catalog.views.values():
        if view.kind != "agg":
            continue
        online = redis_tiles(s.store, s.config.project, view, entity_grid(view))
        folder = layout.view_dir(s.config.offline_dir, view.name, layout.TILES)
        offline = pq.read_table(folder, partitioning=None).select(online.column_names)
        keys = [*view.key_names, "tile_start"]
        on = {tuple(r[k] for k in keys): _nan_named(r) for r in online.to_pylist()}
        off = {}
        for r in offline.to_pylist():
            # Redis keeps 0 for a partial whose column had no value in the tile; the batch keeps NULL.
            off[tuple(r[k] for k in keys)] = _nan_named({c: (v if v is not None else 0) for c, v in r.items()})
        assert set(on) == set(off), f"{view.name}: tiles differ: {sorted(set(on) ^ set(off))[:5]}"
        for key, row in off.items():
            fixed = {c: ("" if isinstance(on[key][c], str) and v == 0 else v) for c, v in row.items()}
            assert on[key] == fixed, f"{view.name} tile {key}: redis {on[key]} batch {row}"
        assert len(off) > 500


def _nan_named(row: dict[str, Any]) -> dict[str, Any]:
    """NaN partials as the text 'NaN', so that rows compare equal (NaN is a value)."""
    return {c: ("NaN" if isinstance(v, float) and math.isnan(v) else v) for c, v in row.items()}


def test_tiles_hold_nan_min_max_and_last_like_the_batch(streamed: Streamed) -> None:
    """NaN is the greatest value: a tile's max and last take it, its min skips it (stream = batch)."""
    s = streamed
    view = s.catalog.views["user_activity"]
    tiles = redis_tiles(s.store, s.config.project, view, entity_grid(view))
    maxes = [v for v in tiles.column("amount__max").to_pylist() if isinstance(v, float) and math.isnan(v)]
    mins = [v for v in tiles.column("amount__min").to_pylist() if isinstance(v, float) and math.isnan(v)]
    assert maxes and len(mins) < len(maxes)  # NaN-only tiles are rare; tiles with NaN and numbers are not


def test_late_and_future_events_are_set_aside_not_loaded(streamed: Streamed) -> None:
    s = streamed
    late = late_events(store_for(s.config), "events")
    assert late is not None and late.num_rows == s.data.late.num_rows + 1  # + the one dated in 2100
    want = sorted(zip(s.data.late.column("user_id").to_pylist(), s.data.late.column("ts").cast(pa.int64()).to_pylist(),
                      strict=True))
    want.append((1, 4102444800000 * 1000))
    got = sorted(zip(late.column("user_id").to_pylist(), late.column("ts").cast(pa.int64()).to_pylist(), strict=True))
    assert got == sorted(want)
    assert set(late.column("cat").to_pylist()) == {"late", "future"}
    status = json.loads(s.paths.status_file.read_text())
    assert status["late"] == {"events": s.data.late.num_rows}
    assert status["feeder"]["future"] == {"events": 1}
    assert status["state"] == "finished"
    # The batch route can take them: the source's columns, typed, with the source's event-time column.
    assert late.schema.field("ts").type == pa.timestamp("us", tz="UTC")
    assert {"user_id", "merchant_id", "amount", "qty", "flag", "cat", "ts"} <= set(late.column_names)
    late_users = np.array(sorted(set(s.data.late.column("user_id").to_pylist())), dtype=np.int64)
    online = s.store.read([ViewRead(s.catalog.views["user_last"], ("cat",))], {"user_id": late_users}, s.data.end_us)
    column = online[("user_last", "cat")]
    assert "late" not in [v for v, ok in zip(column.values, column.valid, strict=True) if ok]


def expected_quarantine(s: Streamed) -> dict[str, int]:
    want: dict[str, int] = {}
    for _, reason in MALFORMED:
        want[reason] = want.get(reason, 0) + 1
    users = np.array([u is None for u in s.data.valid.column("user_id").to_pylist()])
    merchants = np.array([m is None for m in s.data.valid.column("merchant_id").to_pylist()])
    for view in s.catalog.views.values():
        null = users | merchants if "merchant_id" in view.key_names else users
        if null.any():
            want[f"null_key:{view.name}"] = int(null.sum())
    return want


def test_malformed_events_are_quarantined_with_their_reason(streamed: Streamed) -> None:
    s = streamed
    status = json.loads(s.paths.status_file.read_text())
    assert status["loader"]["quarantined"]["events"] == expected_quarantine(s)
    assert status["feeder"]["unparseable"] == {"events": 3}
    rows = [json.loads(line) for p in sorted(s.paths.sink("quarantine", "events").iterdir())
            for line in p.read_bytes().splitlines()]
    by_line = {r["line"].encode(): r["reason"] for r in rows if not r["view"]}
    for line, reason in MALFORMED:  # each line kept verbatim with its reason
        assert by_line[line] == reason


def test_stream_status_cli_reports_counts(streamed: Streamed) -> None:
    from typer.testing import CliRunner

    from quiver.cli import _register_optional_commands, app

    _register_optional_commands()
    out = CliRunner().invoke(app, ["stream-status", "--json", "--config", str(Path(streamed.config.root) / "quiver.yaml")])
    assert out.exit_code == 0, out.output
    status = json.loads(out.output)
    assert status["state"] == "finished"
    assert status["late"]["events"] == streamed.data.late.num_rows
    text = CliRunner().invoke(app, ["stream-status", "--config", str(Path(streamed.config.root) / "quiver.yaml")])
    assert text.exit_code == 0 and "late events" in text.output and "unparseable_json 3" in text.output


def test_everything_fed_was_accounted_for(streamed: Streamed) -> None:
    """Fed (on-time) lines = the valid events; late + future + quarantined = the rest: nothing vanished."""
    s = streamed
    status = json.loads(s.paths.status_file.read_text())
    assert status["feeder"]["lines"] == s.data.valid.num_rows
    assert status["late"]["events"] + status["feeder"]["future"]["events"] == s.data.late.num_rows + 1
    n_events = 0
    view = s.catalog.views["user_activity"]
    tiles = pq.read_table(layout.view_dir(s.config.offline_dir, view.name, layout.TILES), partitioning=None)
    n_events = sum(tiles.column("n_events").to_pylist())
    non_null_users = sum(u is not None for u in s.data.valid.column("user_id").to_pylist())
    assert sum(redis_tiles(s.store, s.config.project, view, entity_grid(view)).column("n_events").to_pylist()) \
        == n_events == non_null_users


def test_quiver_stream_cli_resumes_without_counting_anything_twice(streamed: Streamed) -> None:
    """Last in this module: `quiver stream --bounded` again (via the CLI and the streaming venv) resumes
    from the retained checkpoint, finds nothing new, and leaves Redis and every count unchanged."""
    from typer.testing import CliRunner

    from quiver.cli import _register_optional_commands, app

    s = streamed
    before = {v: redis_tiles(s.store, s.config.project, s.catalog.views[v], entity_grid(s.catalog.views[v]))
              for v in ("user_activity", "user_merchant")}
    counts = json.loads(s.paths.status_file.read_text())["loader"]
    counts_late = json.loads(s.paths.status_file.read_text())["late"]
    _register_optional_commands()
    out = CliRunner().invoke(app, ["stream", "--bounded", "--parallelism", "2",
                                   "--config", str(Path(s.config.root) / "quiver.yaml")])
    assert out.exit_code == 0, out.output
    status = json.loads(s.paths.status_file.read_text())
    assert status["restored_from"] and status["state"] == "finished"
    assert status["late"] == counts_late and status["loader"]["quarantined"] == counts["quarantined"]
    assert status["feeder"]["lines"] == 0  # nothing new to feed
    for name, tiles in before.items():
        view = s.catalog.views[name]
        after = redis_tiles(s.store, s.config.project, view, entity_grid(view))
        assert [_nan_named(r) for r in after.to_pylist()] == [_nan_named(r) for r in tiles.to_pylist()]


def test_late_events_reach_the_offline_store_then_redis(streamed: Streamed) -> None:
    """Last: the next backfill reads the late events the stream set aside; materialization writes them on."""
    from quiver.online.materialize import materialize

    s = streamed
    view = s.catalog.views["user_activity"]
    tiles_dir = layout.view_dir(s.config.offline_dir, view.name, layout.TILES)
    before = sum(pq.read_table(tiles_dir, partitioning=None).column("n_events").to_pylist())
    backfill(s.config, s.catalog, DAY0, DAY0 + timedelta(days=1))
    offline = pq.read_table(tiles_dir, partitioning=None)
    assert sum(offline.column("n_events").to_pylist()) == before + s.data.late.num_rows  # all late events in
    end = s.data.end_us
    materialize(s.config, s.catalog, end=end, store=s.store, full=True)
    # Redis holds each entity's tiles within the longest window before the end: the batch's, late events in.
    online = redis_tiles(s.store, s.config.project, view, entity_grid(view))
    lo = end - view.max_window_us - int(view.tile_us or 0)
    recent = offline.filter(pc.greater_equal(offline.column("tile_start"), lo))
    got = sorted(zip(online.column("user_id").to_pylist(), online.column("tile_start").to_pylist(),
                     online.column("n_events").to_pylist(), strict=True))
    want = sorted(zip(recent.column("user_id").to_pylist(), recent.column("tile_start").to_pylist(),
                      recent.column("n_events").to_pylist(), strict=True))
    assert [r for r in got if r[1] >= lo] == want
    late_ts = s.data.late.column("ts").cast(pa.int64()).to_pylist()
    assert any(t >= lo for t in late_ts), "the test needs late events inside the window read online"


def test_a_job_flink_refuses_fails_with_its_reason_not_a_trace(tmp_path: Path, redis_for_module: RedisServer) -> None:
    # The reason of a Java error is at the head of a 200-line trace, which a terminal or a CI log cuts off:
    # the runner says the cause chain in one line and keeps the trace in a file.
    config = write_project(tmp_path, redis_for_module.url, random_stream(seed=3, n=500, n_late=2))
    result = run_stream(config, "--bounded", "--table-set", "table.exec.sink.not-null-enforcer=BOGUS", timeout=300)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "\tat org.apache" not in result.stderr, result.stderr[-3000:]
    assert "the Flink job could not run: java.lang.IllegalArgumentException: Could not parse value 'BOGUS' for key " \
           "'table.exec.sink.not-null-enforcer'" in result.stderr, result.stderr[-3000:]
    paths = StreamPaths.at(tmp_path / ".quiver" / "stream")
    assert "\tat org.apache.flink" in paths.error_file.read_text()
    status = json.loads(paths.status_file.read_text())
    assert status["state"] == "failed" and "Could not parse value 'BOGUS'" in status["error"], status


def test_the_job_is_planned_with_no_thread_of_the_runner_running(tmp_path: Path, redis_for_module: RedisServer,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # Flink's planner keeps state in a Java ThreadLocal (FLINK-23020): a py4j command sent from another Python
    # thread while the job is planned (a finalizer run by a collection the loader thread set off) made py4j
    # open a second connection, and the planner failed on the other Java thread (NullPointerException:
    # metadataHandlerProvider, on CI and once here). The loader and feeder now start after the submission.
    import threading

    from quiver.streaming import runner as runner_module

    config = write_project(tmp_path, redis_for_module.url, random_stream(seed=5, n=300, n_late=1))
    catalog = load_catalog(config.catalog_dir, root=config.root)
    seen: dict[str, Any] = {}

    class Py4JJavaError(Exception):
        pass

    def planned(*args: Any) -> Any:
        seen["threads"] = {t.name for t in threading.enumerate()}
        raise Py4JJavaError("An error occurred while calling o9.execute.\n: java.lang.NullPointerException: "
                            "metadataHandlerProvider\n\tat org.apache.calcite.Foo.bar(Foo.java:1)\n")

    monkeypatch.setattr(runner_module, "submit", planned)
    store = RedisOnlineStore(redis_for_module.url, config.project)
    paths = StreamPaths.at(tmp_path / ".quiver" / "stream")
    runner = runner_module.StreamRunner(config, catalog, paths, runner_module.StreamOptions(bounded=True), store=store)
    assert runner.run() == 1
    assert not {"loader", "feeder"} & seen["threads"], seen
    status = json.loads(paths.status_file.read_text())
    assert status["state"] == "failed" and status["error"] == "java.lang.NullPointerException: metadataHandlerProvider"
    store.close()
