"""The Redis online store on a real redis-server: round trips, TTL, newer-wins, window decay, replays,
trimming, AUTH, TLS, restart recovery and the embedded server."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import redis

from quiver import Aggregation, Entity, FeatureView, Field, Float64, Int64, Source, String
from quiver.catalog.validate import build_catalog
from quiver.config import Config
from quiver.offline.layout import last_values_schema, tile_schema
from quiver.online.base import OnlineStoreError, OnlineStoreUnavailable, ViewRead
from quiver.online.codec import TileCodec
from quiver.online.embedded import ensure_redis, stop_embedded
from quiver.online.layout import key_prefix
from quiver.online.redis_store import RedisOnlineStore
from tests.harness import free_port

pytestmark = pytest.mark.integration

M = 60_000_000
H = 60 * M
TILE = 10 * M
T0 = 1_800_000_000_000_000 // H * H
COLUMNS = {"user_id": "int64", "event_ts": "timestamp", "amount": "float64", "category": "string", "n": "int64"}


@pytest.fixture(scope="module")
def cat():
    user = Entity("user", ["user_id"])
    src = Source("tx", "unused")
    last = FeatureView("last", [user], src, ttl="1h",
                       schema=[Field("amount", Float64), Field("category", String), Field("n", Int64)])
    agg = FeatureView("agg", [user], src, tile="10m", aggregations=[
        Aggregation("amount", "count", "1h"), Aggregation("amount", "sum", "1h"),
        Aggregation("amount", "mean", "2h"), Aggregation("category", "last", "1h")])
    return build_catalog([user, src, last, agg], schema_reader=lambda s: COLUMNS)


@pytest.fixture
def store(redis_url):
    with RedisOnlineStore(redis_url, "t", timeout_s=2.0) as s:
        yield s


def rows(view, **columns):
    n = len(columns["user_id"])
    data = {name: columns.get(name, [None] * n) for name in last_values_schema(view).names}
    data["event_ts"] = pa.array(columns["event_ts"], pa.timestamp("us", tz="UTC"))
    return pa.table(data).cast(last_values_schema(view))


def tiles(view, events, before=None):
    """Tiles of (user, ts, amount, category) events with ts < before (a tiny reference tiler)."""
    grouped: dict[tuple[int, int], list[tuple[int, float, str]]] = {}
    for user, ts, amount, category in events:
        if before is None or ts < before:
            grouped.setdefault((user, ts - ts % TILE), []).append((ts, amount, category))
    out = []
    for (user, start), evs in sorted(grouped.items()):
        last = max((ts, c) for ts, _, c in evs)
        out.append({"user_id": user, "tile_start": start, "n_events": len(evs), "amount__cnt": len(evs),
                    "amount__sum": sum(a for _, a, _ in evs), "category__cnt": len(evs),
                    "category__last": last[1], "category__last_ts": last[0]})
    schema = tile_schema(view)
    return pa.table({n: [r.get(n) for r in out] for n in schema.names}).cast(schema)


def read(store, view, features, users, at):
    out = store.read([ViewRead(view, tuple(features))], {"user_id": np.array(users)}, at)
    return {f: [c.values[i] if c.valid[i] else None for i in range(len(users))]
            for (_, f), c in out.items()}


def test_round_trip_both_kinds_in_one_mget(store, cat, redis_url):
    last, agg = cat.views["last"], cat.views["agg"]
    store.write_last_values(last, rows(last, user_id=[1, 2], event_ts=[T0, T0 + 1], amount=[1.5, None],
                                       category=["a", "b"], n=[3, 4]))
    store.write_tiles(agg, tiles(agg, [(1, T0 + 5, 2.0, "x"), (1, T0 + 20 * M, 3.0, "y")]))
    client = redis.Redis.from_url(redis_url)
    before = client.info("commandstats").get("cmdstat_mget", {}).get("calls", 0)
    out = store.read([ViewRead(last, ("amount", "category", "n")), ViewRead(agg, ("amount_sum_1h", "category_last_1h"))],
                     {"user_id": np.array([1, 2, 3])}, T0 + 30 * M)
    after = client.info("commandstats")["cmdstat_mget"]["calls"]
    assert after - before == 1  # every view and entity in one round trip
    assert out[("last", "amount")].values[0] == 1.5 and out[("last", "amount")].valid.tolist() == [True, False, False]
    assert out[("last", "category")].values.tolist()[:2] == ["a", "b"]
    assert out[("agg", "amount_sum_1h")].values.tolist() == [5.0, 0.0, 0.0]
    assert out[("agg", "category_last_1h")].values.tolist() == ["y", None, None]


def test_ttl_is_enforced_at_read(store, cat):
    last = cat.views["last"]
    store.write_last_values(last, rows(last, user_id=[1], event_ts=[T0], amount=[1.0]))
    assert read(store, last, ["amount"], [1], T0)["amount"] == [None]  # event_ts < t is strict
    assert read(store, last, ["amount"], [1], T0 + 1)["amount"] == [1.0]
    assert read(store, last, ["amount"], [1], T0 + H)["amount"] == [1.0]  # t - ttl <= event_ts
    assert read(store, last, ["amount"], [1], T0 + H + 1)["amount"] == [None]


@pytest.mark.parametrize("seed", range(4))
def test_newer_wins_under_reordered_writes(store, cat, seed):
    rng = np.random.default_rng(seed)
    last = cat.views["last"]
    events = [(u, T0 + int(rng.integers(0, 50 * M)), float(rng.normal())) for u in range(5) for _ in range(6)]
    order = rng.permutation(len(events))
    for start in range(0, len(order), 4):  # batches mixing entities, some with two events of one entity
        chunk = [events[i] for i in order[start:start + 4]]
        store.write_last_values(last, rows(last, user_id=[e[0] for e in chunk], event_ts=[e[1] for e in chunk],
                                           amount=[e[2] for e in chunk]))
    newest = {u: max((e for e in events if e[0] == u), key=lambda e: e[1])[2] for u in range(5)}
    assert read(store, last, ["amount"], list(range(5)), T0 + 55 * M)["amount"] == [newest[u] for u in range(5)]
    # Replaying an old event changes nothing.
    store.write_last_values(last, rows(last, user_id=[0], event_ts=[T0], amount=[99.0]))
    assert read(store, last, ["amount"], [0], T0 + 55 * M)["amount"] == [newest[0]]


def test_bulk_write_falls_back_to_newer_wins_when_keys_exist(store, cat, redis_url):
    last = cat.views["last"]
    client = redis.Redis.from_url(redis_url)

    def calls(command: str) -> int:
        return int(client.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))

    nx, evals = calls("msetnx"), calls("eval")
    store.write_last_values(last, rows(last, user_id=[1], event_ts=[T0 + 10], amount=[10.0]))
    # Fresh keys: one plain bulk set, and one EVAL for the freshness metadata.
    assert (calls("msetnx") - nx, calls("eval") - evals) == (1, 1)
    # One batch with a fresh key, a key holding a newer value, and another fresh key: MSETNX refuses the
    # whole batch (writes nothing), the newer-wins merge writes it.
    store.write_last_values(last, rows(last, user_id=[0, 1, 2], event_ts=[T0, T0, T0], amount=[0.5, 1.5, 2.5]))
    assert (calls("msetnx") - nx, calls("eval") - evals) == (2, 3)
    assert read(store, last, ["amount"], [0, 1, 2], T0 + 20)["amount"] == [0.5, 10.0, 2.5]


def test_windows_decay_over_simulated_time(store, cat):
    agg = cat.views["agg"]
    events = [(1, T0 + 1 * M, 1.0, "a"), (1, T0 + 12 * M, 2.0, "b"), (1, T0 + 47 * M, 4.0, "c")]
    store.write_tiles(agg, tiles(agg, events))
    feats = ["amount_count_1h", "amount_sum_1h", "amount_mean_2h", "category_last_1h"]
    seen = {}
    for minutes in (50, 65, 75, 105, 115, 125, 185):
        seen[minutes] = read(store, agg, feats, [1], T0 + minutes * M)
    assert seen[50]["amount_count_1h"] == [3] and seen[50]["amount_sum_1h"] == [7.0]
    assert seen[65]["amount_count_1h"] == [3]  # window [floor(65m) - 1h, 65m) = [0, 65m)
    assert seen[75]["amount_count_1h"] == [2] and seen[75]["amount_sum_1h"] == [6.0]  # tile 0 left the window
    assert seen[105]["amount_count_1h"] == [1] and seen[105]["category_last_1h"] == ["c"]
    assert seen[115]["amount_count_1h"] == [0] and seen[115]["amount_sum_1h"] == [0.0]
    assert seen[115]["category_last_1h"] == [None] and seen[115]["amount_mean_2h"] == [7.0 / 3]
    assert seen[185]["amount_mean_2h"] == [None]


def test_tiles_are_replay_safe_and_trimmed(store, cat, redis_url):
    agg = cat.views["agg"]
    key = key_prefix("t", agg) + b"1}"
    client = redis.Redis.from_url(redis_url)
    full = tiles(agg, [(1, T0 + 1, 1.0, "a"), (1, T0 + 2, 2.0, "b"), (1, T0 + 11 * M, 5.0, "c")])
    store.write_tiles(agg, full)
    stored = client.get(key)
    store.write_tiles(agg, full)  # the same tiles again: nothing double counts
    assert client.get(key) == stored
    # A stale partial of tile 0 (one event) must not replace the fuller tile already stored.
    store.write_tiles(agg, tiles(agg, [(1, T0 + 1, 1.0, "a")]))
    assert read(store, agg, ["amount_count_1h", "amount_sum_1h"], [1], T0 + 15 * M) == {
        "amount_count_1h": [3], "amount_sum_1h": [8.0]}
    # A grown tile replaces its older copy; other tiles are kept.
    store.write_tiles(agg, tiles(agg, [(1, T0 + 11 * M, 5.0, "c"), (1, T0 + 12 * M, 1.0, "d")]))
    assert read(store, agg, ["amount_count_1h", "amount_sum_1h"], [1], T0 + 15 * M) == {
        "amount_count_1h": [4], "amount_sum_1h": [9.0]}
    # A tile far ahead trims every tile older than the longest window + one tile.
    store.write_tiles(agg, tiles(agg, [(1, T0 + 10 * H, 1.0, "z")]))
    assert len(client.get(key)) == TileCodec(agg).width + len("z")  # one record and its string


def test_raise_freshness_never_lowers_it(store):
    """The stream loader and a batch materialization both raise a view's freshness: to the max, never lower."""
    store.raise_freshness("agg", T0 + 5)
    store.raise_freshness("agg", T0 + 3)  # an older load after a newer one: kept at the newer
    assert store.freshness(["agg"]) == {"agg": T0 + 5}
    store.raise_freshness("agg", T0 + 9)
    assert store.get_meta("agg", "max_event_ts") == str(T0 + 9)


def test_fixed_width_tiles_change_in_place_like_a_full_merge(redis_url):
    """A few tiles without string partials change the stored value in place (GETRANGE / SETRANGE / APPEND,
    the value never read whole); many go through one merge of the whole value. After every batch of random
    writes (out of order, replays, stale and grown copies, tiles inserted before the newest, jumps that trim,
    small and large batches per key) each stored value equals a plain model of the rule: the fuller tile
    wins, ties go to the incoming one, tiles older than the newest minus the horizon go."""
    user = Entity("user", ["user_id"])
    src = Source("tx", "unused")
    spend = FeatureView("spend", [user], src, tile="10m", aggregations=[
        Aggregation("amount", "count", "1h"), Aggregation("amount", "sum", "1h")])
    view = build_catalog([user, src, spend], schema_reader=lambda s: COLUMNS).views["spend"]
    codec = TileCodec(view)
    assert codec.var_offset == 0  # the fixed-width path
    rng = np.random.default_rng(7)
    model: dict[bytes, dict[int, bytes]] = {}
    kept = 0
    client = redis.Redis.from_url(redis_url)
    with RedisOnlineStore(redis_url, "splice", timeout_s=2.0, batch=7) as store:
        clock = T0
        for step in range(80):
            clock += TILE if step % 20 else 3 * H  # mostly a tile at a time; now and then a jump that trims
            n = int(rng.integers(1, 40) if step % 4 else rng.integers(60, 160))  # ≤ 8 a key: in place
            table = pa.table({
                "user_id": pa.array(rng.integers(1, 6, n), pa.int64()),
                "tile_start": pa.array(clock + rng.integers(-9, 2, n) * TILE, pa.int64()),
                "n_events": pa.array(rng.integers(1, 4, n), pa.int64()),
                "amount__cnt": pa.array(rng.integers(0, 9, n), pa.int64()),
                "amount__sum": pa.array(rng.random(n).round(3)),
            }).cast(tile_schema(view))
            firsts, values, _ = codec.encode(table)
            store.write_tiles(view, table)
            for user_id, value in zip(firsts.column("user_id").to_pylist(), values, strict=True):
                stored = model.setdefault(key_prefix("splice", view) + b"%d}" % user_id, {})
                for i in range(0, len(value), codec.width):
                    rec = value[i:i + codec.width]
                    ts, events = np.frombuffer(rec[:16], "<i8")
                    if ts not in stored or events >= np.frombuffer(stored[ts][8:16], "<i8")[0]:
                        stored[int(ts)] = rec
                newest = max(stored)
                for ts in [t for t in stored if t < newest - codec.horizon]:
                    del stored[ts]
            for key, stored in model.items():
                assert client.get(key) == b"".join(stored[t] for t in sorted(stored)), (step, key)
                kept += len(stored)
    assert kept > 2000  # the keys held many tiles along the way: splices, replays and trims all ran


def test_unavailable_is_a_clear_error_and_recovers_after_restart(cat, redis_server, redis_url):
    last = cat.views["last"]
    store = RedisOnlineStore(redis_url, "t", timeout_s=1.0)
    store.write_last_values(last, rows(last, user_id=[1], event_ts=[T0], amount=[1.0]))
    assert read(store, last, ["amount"], [1], T0 + 1)["amount"] == [1.0]
    redis_server.stop()
    try:
        with pytest.raises(OnlineStoreUnavailable, match="unavailable"):
            read(store, last, ["amount"], [1], T0 + 1)
        with pytest.raises(OnlineStoreUnavailable):
            store.write_last_values(last, rows(last, user_id=[1], event_ts=[T0], amount=[1.0]))
    finally:
        redis_server.start()
    # Same store object, no restart: the server came back empty (no persistence), writes and reads work.
    assert read(store, last, ["amount"], [1], T0 + 1)["amount"] == [None]
    store.write_last_values(last, rows(last, user_id=[1], event_ts=[T0], amount=[2.0]))
    assert read(store, last, ["amount"], [1], T0 + 1)["amount"] == [2.0]
    store.close()


def test_unreachable_port_fails_fast_with_quiver_error(cat):
    store = RedisOnlineStore(f"redis://127.0.0.1:{free_port()}/0", "t", timeout_s=0.5)
    with pytest.raises(OnlineStoreUnavailable):
        store.ping()
    from quiver.catalog.errors import QuiverError

    assert issubclass(OnlineStoreUnavailable, QuiverError)


def _spawn(args: list[str], port: int, tmp: Path, client_kwargs: dict) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while True:
        try:
            if redis.Redis(host="127.0.0.1", port=port, socket_timeout=1, **client_kwargs).ping():
                return proc
        except (redis.ConnectionError, redis.ResponseError):
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"redis-server {args} did not start")
        time.sleep(0.05)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    proc.wait(timeout=10)


def test_auth_via_url(cat, tmp_path):
    port = free_port()
    proc = _spawn(["--port", str(port), "--requirepass", "s3cret"], port, tmp_path, {"password": "s3cret"})
    try:
        last = cat.views["last"]
        with RedisOnlineStore(f"redis://:s3cret@127.0.0.1:{port}/0", "t") as good:
            good.write_last_values(last, rows(last, user_id=[1], event_ts=[T0], amount=[4.0]))
            assert read(good, last, ["amount"], [1], T0 + 1)["amount"] == [4.0]
        with RedisOnlineStore(f"redis://:wrong@127.0.0.1:{port}/0", "t") as bad, \
                pytest.raises(OnlineStoreError, match="credentials") as wrong:
            bad.ping()
        assert "wrong" not in str(wrong.value)  # the password is never echoed
        with RedisOnlineStore(f"redis://127.0.0.1:{port}/0", "t") as anonymous, \
                pytest.raises(OnlineStoreError, match=r"credentials|NOAUTH"):
            anonymous.ping()
    finally:
        _stop(proc)


def test_tls_via_rediss_url(cat, tmp_path):
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    port = free_port()
    proc = _spawn(["--port", "0", "--tls-port", str(port), "--tls-cert-file", str(cert), "--tls-key-file", str(key),
                   "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no"], port, tmp_path,
                  {"ssl": True, "ssl_ca_certs": str(cert)})
    try:
        last = cat.views["last"]
        with RedisOnlineStore(f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={cert}", "t") as tls:
            tls.write_last_values(last, rows(last, user_id=[1], event_ts=[T0], amount=[6.0]))
            assert read(tls, last, ["amount"], [1], T0 + 1)["amount"] == [6.0]
            assert tls.async_fetch() is None  # the asyncio client speaks no TLS: servers read on their threads
        with RedisOnlineStore(f"redis://127.0.0.1:{port}/0", "t", timeout_s=1.0) as plain, \
                pytest.raises(OnlineStoreError):
            plain.ping()  # plain TCP to a TLS port never gets an answer
    finally:
        _stop(proc)


def test_embedded_redis_is_shared_and_stoppable(tmp_path, cat):
    config = Config(root=tmp_path, project="emb")
    url = ensure_redis(config)
    try:
        assert url.startswith("unix://")
        assert ensure_redis(config) == url  # a second process finds the running one
        last = cat.views["last"]
        with RedisOnlineStore(url, "emb") as s:
            s.write_last_values(last, rows(last, user_id=[1], event_ts=[T0], amount=[1.0]))
        with RedisOnlineStore(ensure_redis(config), "emb") as s:
            assert read(s, last, ["amount"], [1], T0 + 1)["amount"] == [1.0]
    finally:
        assert stop_embedded(config)
    assert ensure_redis(Config(root=tmp_path, redis_url="redis://elsewhere:1/0")) == "redis://elsewhere:1/0"
