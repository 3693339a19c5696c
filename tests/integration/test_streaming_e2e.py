"""The streaming path end to end on real parts: stream files → PyFlink job (bounded) → change files → Redis.

One shared job run (Flink startup costs 10-40 s here) feeds a random event stream with out-of-order events
inside the lateness bound, ties, null keys, events later than the allowed lateness and malformed lines.
The batch backfill and point-in-time join read the same valid events from Parquet. Then:

* online values read from Redis equal get_historical_features at several request times, exactly;
* the tiles in Redis equal the batch tiles, partial for partial;
* late events are in the late-events log (not in Redis), malformed lines in the quarantine with reasons,
  and `quiver stream-status` reports both counts.
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
import pyarrow.parquet as pq
import pytest

from pipelines.stream_producer import to_ndjson
from quiver.catalog.ir import Catalog, ViewSpec
from quiver.catalog.loader import load_catalog
from quiver.config import Config, load_config
from quiver.offline import layout
from quiver.offline.backfill import backfill
from quiver.offline.pit import get_historical_features
from quiver.online.base import ViewRead
from quiver.online.layout import entity_keys, key_prefix, tile_partials, tile_record_dtype
from quiver.online.redis_store import RedisOnlineStore
from quiver.streaming.loader import late_events
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

# Malformed lines and the quarantine reason each must get (the future one also must not move the watermark).
MALFORMED = [
    (b"not json at all", "unparseable_json"),
    (b'{"ts_ms": 1793491200000, "user_id": 1', "unparseable_json"),
    (b"[1, 2, 3]", "unparseable_json"),
    (b'{"user_id": 1, "amount": 1.0}', "null_event_ts"),
    (b'{"ts_ms": "yesterday", "user_id": 1}', "bad_type:ts_ms"),
    (b'{"ts_ms": 1793491200000.5, "user_id": 1}', "bad_type:ts_ms"),
    (b'{"ts_ms": 4102444800000, "user_id": 1, "amount": 5.0}', "event_ts_out_of_range"),
    (b'{"ts_ms": 1793491260000, "user_id": "abc", "amount": 1.0}', "bad_type:user_id"),
    (b'{"ts_ms": 1793491260000, "user_id": 2, "amount": "lots"}', "bad_type:amount"),
    (b'{"ts_ms": 1793491260000, "user_id": 2, "qty": 2.5}', "bad_type:qty"),
    (b'{"ts_ms": 1793491260000, "user_id": 2, "flag": "maybe"}', "bad_type:flag"),
]


@dataclass
class StreamData:
    valid: pa.Table  # every valid event, in arrival order (batch sees these too)
    late: pa.Table  # events later than the allowed lateness (stream only, at the end)
    request_times: list[int]  # mid-stream times with no event in [t, ceil_10m(t))
    end_us: int


def random_stream(seed: int, n: int = 8000, n_late: int = 20) -> StreamData:
    """Events over 20 h, ms-aligned (the stream's precision), values exact in binary (sums never round)."""
    rng = np.random.default_rng(seed)
    ts = DAY0_US + rng.integers(0, SPAN // 1000, n) * MS
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
    def nullable(values: np.ndarray, share: float) -> list[Any]:
        out = values.astype(object)
        out[rng.random(len(values)) < share] = None
        return list(out)
    columns = {
        "user_id": nullable(user, 0.01),
        "merchant_id": nullable(rng.integers(0, MERCHANTS, n), 0.02),
        "amount": nullable(rng.integers(0, 400, n) * 0.25, 0.1),
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
    for line, _ in MALFORMED:  # anywhere in the stream, the far-future one early
        at = int(rng.integers(0, len(lines) // 10)) if b"4102444800000" in line else int(rng.integers(0, len(lines)))
        lines.insert(at, line)
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
    backfill(config, catalog, DAY0, DAY0 + timedelta(days=1))
    store = RedisOnlineStore(redis_for_module.url, config.project)
    yield Streamed(config, catalog, data, StreamPaths.at(root / ".quiver" / "stream"), store, result)
    store.close()


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
            off_missing = off is None or off is pd.NA or (isinstance(off, float) and math.isnan(off))
            where = f"{view.name}:{feature} entity={[int(v[i]) for v in entities.values()]} t={t}"
            assert bool(column.valid[i]) != off_missing, f"{where}: online {column.values[i]!r} offline {off!r}"
            if off_missing:
                continue
            on = column.values[i]
            on = on.item() if hasattr(on, "item") else on
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
    for view in s.catalog.views.values():
        if view.kind != "agg":
            continue
        online = redis_tiles(s.store, s.config.project, view, entity_grid(view))
        folder = layout.view_dir(s.config.offline_dir, view.name, layout.TILES)
        offline = pq.read_table(folder, partitioning=None).select(online.column_names)
        keys = [*view.key_names, "tile_start"]
        on = {tuple(r[k] for k in keys): r for r in online.to_pylist()}
        off = {}
        for r in offline.to_pylist():
            # Redis keeps 0 for a partial whose column had no value in the tile; the batch keeps NULL.
            off[tuple(r[k] for k in keys)] = {c: (v if v is not None else 0) for c, v in r.items()}
        assert set(on) == set(off), f"{view.name}: tiles differ: {sorted(set(on) ^ set(off))[:5]}"
        for key, row in off.items():
            fixed = {c: ("" if isinstance(on[key][c], str) and v == 0 else v) for c, v in row.items()}
            assert on[key] == fixed, f"{view.name} tile {key}: redis {on[key]} batch {row}"
        assert len(off) > 500


def test_late_events_are_logged_not_loaded(streamed: Streamed) -> None:
    s = streamed
    late = late_events(s.paths, "events")
    assert late.num_rows == s.data.late.num_rows
    want = sorted(zip(s.data.late.column("user_id").to_pylist(), s.data.late.column("ts").cast(pa.int64()).to_pylist(),
                      strict=True))
    got = sorted(zip(late.column("user_id").to_pylist(), late.column("event_ts").cast(pa.int64()).to_pylist(),
                     strict=True))
    assert got == want
    assert set(late.column("cat").to_pylist()) == {"late"}
    status = json.loads(s.paths.status_file.read_text())
    assert status["loader"]["late"] == {"events": s.data.late.num_rows}
    assert status["state"] == "finished"
    # A backfill can take them: the log has the source's columns and a proper event_ts.
    assert {"user_id", "merchant_id", "amount", "qty", "flag", "cat", "event_ts"} <= set(late.column_names)


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


def test_stream_status_cli_reports_counts(streamed: Streamed) -> None:
    from typer.testing import CliRunner

    from quiver.cli import _register_optional_commands, app

    _register_optional_commands()
    out = CliRunner().invoke(app, ["stream-status", "--json", "--config", str(Path(streamed.config.root) / "quiver.yaml")])
    assert out.exit_code == 0, out.output
    status = json.loads(out.output)
    assert status["state"] == "finished"
    assert status["loader"]["late"]["events"] == streamed.data.late.num_rows
    text = CliRunner().invoke(app, ["stream-status", "--config", str(Path(streamed.config.root) / "quiver.yaml")])
    assert text.exit_code == 0 and "late events" in text.output and "unparseable_json 3" in text.output


def test_everything_fed_was_accounted_for(streamed: Streamed) -> None:
    """Fed lines = valid + late + malformed-but-parseable: nothing vanished between feeder and sinks."""
    s = streamed
    status = json.loads(s.paths.status_file.read_text())
    parseable_bad = sum(1 for _, reason in MALFORMED if reason != "unparseable_json")
    assert status["feeder"]["lines"] == s.data.valid.num_rows + s.data.late.num_rows + parseable_bad
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
    _register_optional_commands()
    out = CliRunner().invoke(app, ["stream", "--bounded", "--parallelism", "2",
                                   "--config", str(Path(s.config.root) / "quiver.yaml")])
    assert out.exit_code == 0, out.output
    status = json.loads(s.paths.status_file.read_text())
    assert status["restored_from"] and status["state"] == "finished"
    assert status["loader"]["late"] == counts["late"] and status["loader"]["quarantined"] == counts["quarantined"]
    assert status["feeder"]["lines"] == 0  # nothing new to feed
    for name, tiles in before.items():
        view = s.catalog.views[name]
        assert redis_tiles(s.store, s.config.project, view, entity_grid(view)).equals(tiles)
