"""The online store on a real Redis Cluster (six redis-server processes: 3 masters, 3 replicas, made with
`redis-cli --cluster create`): the demo catalog materialized into it stores the single server's bytes under
the same keys, spread over every master, and answers `get_online_features` as the single server does for
every entity; a master killed with SIGKILL under reads and writes gives fast errors for its slots only, and
the store recovers without a restart once its replica takes over; bad addresses give one clear line."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import redis
from redis.crc import key_slot
from typer.testing import CliRunner

from quiver.catalog.loader import load_catalog
from quiver.cli import _register_optional_commands, app
from quiver.config import Config
from quiver.offline.backfill import backfill
from quiver.online.base import OnlineStoreError, OnlineStoreUnavailable, ViewRead
from quiver.online.cluster_wire import parse_cluster_url
from quiver.online.factory import redis_store_for
from quiver.online.materialize import materialize
from quiver.online.redis_cluster import RedisClusterOnlineStore
from quiver.online.redis_store import RedisOnlineStore
from quiver.pipelines.demo_data import generate
from quiver.registry import Registry
from quiver.serving.store import FeatureStore
from tests.harness import RedisCluster, RedisServer, free_port

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
START = date(2026, 11, 1)
DAYS = 3
END = datetime.combine(START + timedelta(days=DAYS), datetime.min.time(), tzinfo=UTC)


def _project(folder: Path, redis_url: str) -> Config:
    import shutil

    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "feature_defs").exists():
        shutil.copytree(REPO / "feature_defs", folder / "feature_defs", ignore=shutil.ignore_patterns("__pycache__"))
    return Config(root=folder, project="fraud", registry_url=f"sqlite:///{folder}/registry.db",
                  offline_root=str(folder.parent / "offline"), redis_url=redis_url)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer,
         redis_cluster: RedisCluster) -> Iterator[dict[str, Any]]:
    """The demo catalog over three days of generated traffic, backfilled once, materialized into the single
    server and into the cluster."""
    base = tmp_path_factory.mktemp("cluster-demo")
    redis_server.start()
    with redis_server.client() as c:
        c.flushall()
    redis_cluster.flushall()
    single = _project(base / "single", redis_server.url)
    clustered = _project(base / "cluster", redis_cluster.url)
    generate(base / "data", days=DAYS, start=START, users=300, merchants=40, transactions_per_day=3_000, seed=11)
    for config in (single, clustered):
        (config.root / "data").symlink_to(base / "data", target_is_directory=True)
    catalog = load_catalog(single.catalog_dir, root=single.root)
    Registry(single.registry, project=single.project).apply(catalog, author="test")
    backfill(single, catalog, START, START + timedelta(days=DAYS - 1))
    for config in (single, clustered):
        Registry(config.registry, project=config.project).apply(catalog, author="test")
        materialize(config, catalog, END, full=True)
    yield {"single": single, "cluster": clustered, "catalog": catalog, "redis_cluster": redis_cluster,
           "redis_server": redis_server}


def _values(clients: list[redis.Redis]) -> dict[bytes, bytes]:
    out = {}
    for client in clients:
        for key in client.scan_iter(match="q:fraud:*", count=1000):
            if b":_meta:" not in key:
                out[key] = client.get(key)
    return out


def test_the_cluster_holds_the_single_servers_bytes_spread_over_every_master(demo: dict[str, Any]) -> None:
    cluster: RedisCluster = demo["redis_cluster"]
    masters = cluster.masters()
    per_master = [_values([cluster.client(port)]) for port in masters]
    with demo["redis_server"].client() as single:
        expected = _values([single])
    merged = {k: v for part in per_master for k, v in part.items()}
    assert len(expected) > 500 and merged == expected
    # An entity's values of every view share a slot; the entities spread over all masters.
    counts = [len(part) for part in per_master]
    assert len(masters) == 3 and min(counts) > 0.2 * len(expected), counts
    by_user = [k for k in expected if k.endswith(b"{7}")]
    assert len(by_user) >= 2 and len({key_slot(k) for k in by_user}) == 1
    # Again over what is stored: every slot's keys now go through the merge scripts (tiles and newer-wins).
    materialize(demo["cluster"], demo["catalog"], END, full=True)
    assert {k: v for port in masters for k, v in _values([cluster.client(port)]).items()} == expected


def test_the_merge_rules_hold_per_slot_with_many_keys_in_a_slot(redis_server: RedisServer,
                                                                redis_cluster: RedisCluster) -> None:
    """50,000 entities (three keys a slot): older records never replace newer ones, on both stores alike."""
    view = _last_view()
    users = np.arange(50_000)
    redis_server.start()
    stores = [RedisOnlineStore(redis_server.url, "merge"), RedisClusterOnlineStore(redis_cluster.url, "merge", timeout_s=5)]
    for store in stores:
        store.flush_project()
        assert store.write_last_values(view, _rows(users, 10)) == len(users)
        newer, older = _rows(users[::2], 20), _rows(users[1::2], 5)
        store.write_last_values(view, pa.concat_tables([newer, older]))
    at = int(END.timestamp() * 1e6) + 10**9
    single, clustered = (store.read([ViewRead(view, ("amount",))], {"user_id": users}, at)[("balance", "amount")]
                         for store in stores)
    want = users * 1000.0 + np.where(users % 2 == 0, 20, 10)
    np.testing.assert_array_equal(single.values, want)
    np.testing.assert_array_equal(clustered.values, want)
    for store in stores:
        store.close()


def test_get_online_features_on_the_cluster_equals_the_single_server(demo: dict[str, Any]) -> None:
    catalog = demo["catalog"]
    views = [v for v in catalog.views.values() if v.online and v.kind in ("last", "agg")]
    refs = [f"{v.name}:{f}" for v in views for f in catalog.views[v.name].feature_names]
    users, merchants = np.arange(300), np.arange(300) % 40
    rows = {"user_id": users, "merchant_id": merchants}
    answers = []
    for name in ("single", "cluster"):
        with FeatureStore(config=demo[name]) as store:
            answers.append(store.get_online_features(refs, rows, at=END).to_arrow())
    single, clustered = answers
    assert single.num_columns > 10 and single.schema == clustered.schema
    pd.testing.assert_frame_equal(single.to_pandas(), clustered.to_pandas())
    present = sum(single.column(i).length() - single.column(i).null_count for i in range(single.num_columns))
    # One entity's views share a slot: the request path's read of one user is one MGET on one master.
    of_user = [ref for ref in refs if catalog.views[ref.split(":")[0]].key_names == ["user_id"]]
    for user in (0, 7, 299):
        one = []
        for name in ("single", "cluster"):
            with FeatureStore(config=demo[name]) as store:
                one.append(store.get_online_features(of_user, {"user_id": [user]}, at=END).to_arrow().to_pandas())
        pd.testing.assert_frame_equal(*one)
    assert present > 1000  # the comparison is over values, not over nothing


def test_redis_status_shows_every_node(demo: dict[str, Any], tmp_path: Path) -> None:

    config = demo["cluster"]
    (tmp_path / "quiver.yaml").write_text(f"project: fraud\nredis_url: {config.redis_url}\n")
    result = _cli().invoke(app, ["redis", "status", "--config", str(tmp_path / "quiver.yaml")])
    assert result.exit_code == 0, result.output
    assert "3 masters serve 16384 of 16384 slots" in result.output
    assert result.output.count("master") >= 3 and result.output.count("replica") == 3


def test_bad_cluster_addresses_give_one_clear_line(redis_server: RedisServer, tmp_path: Path) -> None:

    nobody = f"redis+cluster://127.0.0.1:{free_port()},127.0.0.1:{free_port()}"
    with pytest.raises(OnlineStoreUnavailable, match=r"no node of the Redis Cluster .* answered within"):
        RedisClusterOnlineStore(nobody, "p", timeout_s=0.5).ping()
    redis_server.start()
    single = f"redis+cluster://127.0.0.1:{redis_server.port}"
    with pytest.raises(OnlineStoreError, match=r"not in cluster mode .* use redis://127\.0\.0\.1"):
        RedisClusterOnlineStore(single, "p").ping()
    # A cluster-enabled node that was never given slots: every slot uncovered.
    lonely = RedisCluster(str(redis_server.binary), tmp_path / "lonely", masters=1)
    lonely.start_node(lonely.ports[0])
    try:
        with pytest.raises(OnlineStoreError, match="assigns no node to 16384 of 16384 slots"):
            RedisClusterOnlineStore(f"redis+cluster://127.0.0.1:{lonely.ports[0]}", "p").ping()
    finally:
        lonely.stop()
    with pytest.raises(OnlineStoreError, match="is not host:port"):
        parse_cluster_url("redis+cluster://127.0.0.1")
    for url in (nobody, single):
        (tmp_path / "quiver.yaml").write_text(f"project: p\nredis_url: {url}\nredis_timeout_s: 0.5\n")
        result = _cli().invoke(app, ["redis", "status", "--config", str(tmp_path / "quiver.yaml")])
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert len(result.output.strip().splitlines()) <= 2, result.output


def test_the_factory_opens_a_cluster_for_a_cluster_url(redis_cluster: RedisCluster) -> None:
    store = redis_store_for(redis_cluster.url, "p", timeout_s=1.0)
    assert isinstance(store, RedisClusterOnlineStore)
    store.ping()
    store.close()
    assert type(redis_store_for("redis://127.0.0.1:1/0", "p")) is RedisOnlineStore


def test_the_feature_and_prediction_servers_answer_from_the_cluster(redis_cluster: RedisCluster,
                                                                    tmp_path: Path) -> None:
    """`POST /features/online` and `POST /predict` over real HTTP with the online store on the cluster: the
    values written, and the artifact's own scores."""
    from quiver.serving.predict_server import create_app as prediction_app
    from quiver.serving.server import create_app as feature_app
    from tests.integration import test_serving_http as features_http
    from tests.integration.test_prediction_service import MODEL, Server, prediction_project, register

    redis_cluster.flushall()
    with prediction_project(redis_cluster.url, tmp_path) as project:
        assert isinstance(project.store.online, RedisClusterOnlineStore)
        v1 = register(project.models, project.root, seed=1)
        project.models.set_alias(MODEL, "champion", v1, expected=None, reason="first")
        users = [3, 1, 4, 1, 5, 399]
        service = project.service()
        with service, Server(prediction_app(service)) as client:
            body = {"rows": [{"request_id": f"q{i}", "entities": {"user_id": u}} for i, u in enumerate(users)]}
            r = client.post("/predict", json=body)
            assert r.status_code == 200, r.text
            scores = [p["score"] for p in r.json()["predictions"]]
            np.testing.assert_allclose(scores, project.scores(v1, users), atol=1e-12)
            assert client.get("/health").json()["status"] == "ok"
        with features_http.Server(feature_app(project.store)) as client:
            r = client.post("/features/online", json={"features": ["stats:f0", "stats:category"],
                                                      "entities": {"user_id": users}})
            assert r.status_code == 200, r.text
            frame = project.features.set_index("user_id").loc[users]
            assert r.json()["features"] == {"f0": frame["f0"].tolist(), "category": frame["category"].tolist()}


def _cli() -> CliRunner:
    _register_optional_commands()
    return CliRunner()


# ----- failover -----

def _last_view() -> Any:
    from quiver import Entity, FeatureView, Field, Float64, Source
    from quiver.catalog.validate import build_catalog

    user = Entity("user", ["user_id"])
    src = Source("tx", "unused")
    view = FeatureView("balance", [user], src, ttl="30d", schema=[Field("amount", Float64)])
    columns = {"user_id": "int64", "event_ts": "timestamp", "amount": "float64"}
    return build_catalog([user, src, view], schema_reader=lambda s: columns).views["balance"]


def _rows(users: np.ndarray, step: int) -> pa.Table:
    t0 = int(END.timestamp() * 1e6)
    return pa.table({"user_id": pa.array(users, pa.int64()),
                     "event_ts": pa.array(np.full(len(users), t0 + step), pa.timestamp("us", tz="UTC")),
                     "amount": pa.array(users * 1000.0 + step, pa.float64())})


def test_a_killed_master_fails_its_slots_fast_and_the_store_recovers_after_promotion(
        redis_cluster: RedisCluster) -> None:
    """Twice, at different moments of a write stream: SIGKILL one master while reads and writes run. Reads of
    its slots are refused within the timeout (never a stale value, never a hang), reads of the other masters'
    slots are served meanwhile, and the same store object reads and writes again once the replica is promoted;
    at the end every entity holds the last value written."""
    view = _last_view()
    users = np.arange(2_000)
    timeout_s = 0.5
    store = RedisClusterOnlineStore(redis_cluster.url, "failover", timeout_s=timeout_s)
    writer = RedisClusterOnlineStore(redis_cluster.url, "failover", timeout_s=5.0)
    store.flush_project()
    step = [0]
    writer.write_last_values(view, _rows(users, 0))
    stop = threading.Event()
    errors: list[BaseException] = []

    def write_forever() -> None:
        while not stop.is_set():
            try:
                writer.write_last_values(view, _rows(users, step[0] + 1))
                step[0] += 1
            except OnlineStoreError as exc:  # a write past its retries: the caller retries (the stream does)
                errors.append(exc)
                time.sleep(0.2)

    thread = threading.Thread(target=write_forever, daemon=True)
    thread.start()
    try:
        for moment in (0.3, 1.5):
            time.sleep(moment)
            victim = redis_cluster.masters()[0]
            owner, masters = store._slot_map()
            victim_slots = np.flatnonzero(owner == masters.index(("127.0.0.1", victim)))
            redis_cluster.kill(victim)
            refused = served = 0
            deadline = time.monotonic() + 30
            recovered = False
            while time.monotonic() < deadline:
                try:
                    batch = store.read([ViewRead(view, ("amount",))], {"user_id": users}, int(END.timestamp() * 1e6) + 10**9)
                    values = batch[("balance", "amount")]
                    assert values.valid.all()
                    # Never a value from a later write than exists, never someone else's value.
                    assert np.array_equal(np.floor(values.values / 1000.0), users.astype(float))
                    recovered = True
                    break
                except OnlineStoreUnavailable:
                    refused += 1
                # Meanwhile the slots of the other masters answer.
                alive = users[np.isin(np.array([key_slot(b"%d" % u) for u in users]), victim_slots,
                                      invert=True)]
                part = store.read([ViewRead(view, ("amount",))], {"user_id": alive[:50]},
                                  int(END.timestamp() * 1e6) + 10**9)
                served += int(part[("balance", "amount")].valid.sum())
                time.sleep(0.05)
            assert recovered, f"no recovery within 30 s after the kill ({refused} reads refused)"
            assert served > 0, "reads of the other masters' slots were not served while one was down"
            redis_cluster.restart(victim)  # it rejoins as a replica of its promoted replica
            redis_cluster.wait_until_ok()
    finally:
        stop.set()
        thread.join(30)
    final = step[0]
    writer.write_last_values(view, _rows(users, final))
    batch = store.read([ViewRead(view, ("amount",))], {"user_id": users}, int(END.timestamp() * 1e6) + 10**9)
    np.testing.assert_array_equal(batch[("balance", "amount")].values, users * 1000.0 + final)
    assert final > 5, "the writes did not go on across the failovers"
    store.close()
    writer.close()
