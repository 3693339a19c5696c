"""The JVM Flink sink `'connector' = 'quiver-redis'` (infra/jvm/redis-sink): its JUnit tests, and a real PyFlink job
whose Redis sinks write exactly what the change files + Python loader write for the same rows.

One job holds both routes: the compiled streaming job of a small catalog (its file sinks, read by the Loader into
project "py") plus a copy of each view's INSERT into a `quiver-redis` table (project "jvm"). A second run on a
fresh job replays part of the first run's events (fewer events per tile, an older last value, identical rows) and
adds new ones: the Redis contents of both projects must stay equal, value for value, and the replays change
nothing.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from quiver import Aggregation, Entity, FeatureView, Field, Float64, Int64, Source, StreamBinding, String
from quiver.catalog.ir import Catalog, ViewSpec
from quiver.catalog.validate import build_catalog
from quiver.compile.flink import BATCH_FIELD, FlinkTarget, compile_flink, sink_table
from quiver.jars import REDIS_SINK, bundle_jars
from quiver.online.base import ViewRead
from quiver.online.factory import redis_store_for
from quiver.online.jvm_sink import markers_key, sink_options
from quiver.online.redis_store import RedisOnlineStore
from quiver.streaming.loader import Loader
from quiver.streaming.paths import StreamPaths
from tests.integration.test_streaming_e2e import REPO, STREAM_PYTHON

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.flink, pytest.mark.heavy]

POM = REPO / "infra" / "jvm" / "redis-sink" / "pom.xml"
M = 60_000_000
H = 60 * M
T0 = 1_793_491_200_000_000  # 2026-11-01, hour-aligned
COLUMNS = {"user_id": "int64", "amount": "float64", "category": "string", "n": "int64", "event_ts": "timestamp"}
USERS = np.array([1, 2, 3, 4, -7, 99])
AT = (T0 + 30 * M, T0 + 3 * H)  # read times: inside the tiles' windows, and after every event

JOB = '''
import json, sys
from pyflink.table import EnvironmentSettings, TableEnvironment
spec = json.loads(open(sys.argv[1]).read())
env = TableEnvironment.create(EnvironmentSettings.in_streaming_mode())
for key, value in spec["settings"]:
    env.get_config().set(key, value)
for statement in spec["statements"]:
    env.execute_sql(statement)
statements = env.create_statement_set()
for insert in spec["inserts"]:
    statements.add_insert_sql(insert)
statements.execute().wait()
'''


def test_java_unit_tests_pass() -> None:
    """`mvn test` of the sink (vectors, writer on a real redis-server, layout checks): a Java failure fails here."""
    if shutil.which("mvn") is None:
        pytest.fail("Maven is missing: run `make setup`", pytrace=False)
    command = ["mvn", "-B", "-q", "-f", str(POM), "-o", "test"]
    out = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=900)
    if out.returncode != 0 and "offline" in out.stdout + out.stderr:  # first run here: fetch the test plugins once
        out = subprocess.run([a for a in command if a != "-o"], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, (out.stdout + out.stderr)[-8000:]


def catalog() -> Catalog:
    user = Entity("user", ["user_id"])
    src = Source("events", "unused", stream=StreamBinding(path="unused"))
    latest = FeatureView("latest", [user], src, ttl="1d",
                         schema=[Field("amount", Float64), Field("category", String), Field("n", Int64)])
    spend = FeatureView("spend", [user], src, tile="1h", aggregations=[
        Aggregation("amount", "count", "2h"), Aggregation("amount", "sum", "2h"), Aggregation("amount", "max", "2h"),
        Aggregation("category", "last", "2h"), Aggregation("n", "min", "2h")])
    return build_catalog([user, src, latest, spend], schema_reader=lambda s: COLUMNS)


def event(user: int | None, ts: int, amount: float | None, category: str | None, n: int | None) -> dict[str, Any]:
    value: Any = amount
    if amount is not None and not math.isfinite(amount):  # the feeder hands non-finite floats as strings
        value = "NaN" if math.isnan(amount) else ("Infinity" if amount > 0 else "-Infinity")
    return {"ts_us": ts, "user_id": user, "amount": value, "category": category, "n": n}


RUN1 = [event(1, T0 + M, 10.0, "a", 1), event(1, T0 + 2 * M, math.nan, "ü✓", 2),
        event(1, T0 + 2 * M, 3.0, "c", 9),  # a tie at one time: the offline rule picks the row
        event(1, T0 + 61 * M, 5.0, "", 3), event(2, T0 + 3 * M, -0.0, None, None),
        event(2, T0 - 10 * M, 1.5, "x:y%", -4), event(-7, T0 + 5 * M, math.inf, "b", 0),
        event(None, T0 + 4 * M, 1.0, "null key", 1)]
# A fresh job over part of it: tiles with fewer events, an older last value, identical rows; plus new events.
RUN2 = [event(1, T0 + M, 10.0, "a", 1), event(-7, T0 + 5 * M, math.inf, "b", 0),
        event(4, T0 + 30 * M, 2.0, "new", 7), event(2, T0 - 2 * H, 8.0, "older tile", 5)]


def job_spec(cat: Catalog, inbox: Path, paths: StreamPaths, url: str, jar: Path) -> dict[str, Any]:
    """The compiled job (bounded file source), each view's sink doubled by a quiver-redis table."""
    job = compile_flink(cat, FlinkTarget(inbox={"events": inbox.as_uri()}, sink_root=paths.sinks.as_uri()))
    statements = [re.sub(r",\n  'source.monitor-interval' = '[^']*'", "", s) for s in job.statements]
    inserts = list(job.inserts)
    for name in job.views:
        view = cat.views[name]
        kind = "tiles" if view.kind == "agg" else "last"
        table = sink_table(kind, name)
        ddl = next(s for s in job.statements if s.startswith(f"CREATE TABLE `{table}`"))
        columns = ddl[:ddl.index(") WITH (")]
        marks = f"`{BATCH_FIELD}`" in columns
        options = sink_options(view, kind, url, project="jvm", buffer_rows=3,  # several flushes per run
                               markers_key=markers_key("jvm", view.source) if marks else None)
        with_clause = ",\n".join(f"  '{k}' = '{v.replace(chr(39), chr(39) * 2)}'" for k, v in options.items())
        statements.append(columns.replace(f"`{table}`", f"`redis__{table}`", 1) + f") WITH (\n{with_clause}\n)")
        insert = next(i for i in job.inserts if i.startswith(f"INSERT INTO `{table}`"))
        inserts.append(insert.replace(f"INSERT INTO `{table}`", f"INSERT INTO `redis__{table}`", 1))
    settings = [*job.settings, ("parallelism.default", "1"), ("pipeline.jars", jar.as_uri()),
                ("execution.checkpointing.interval", "200 ms")]
    return {"settings": settings, "statements": statements, "inserts": inserts}


def run_job(tmp: Path, run: str, spec: dict[str, Any]) -> None:
    spec_file, script = tmp / f"{run}.json", tmp / "job.py"
    spec_file.write_text(json.dumps(spec))
    script.write_text(JOB)
    out = subprocess.run([str(STREAM_PYTHON), str(script), str(spec_file)], capture_output=True, text=True,
                         timeout=600, cwd=str(REPO))
    assert out.returncode == 0, out.stderr[-6000:]


def snapshot(client: redis.Redis, project: str) -> dict[bytes, bytes]:
    """Every value key of a project, the project prefix cut off."""
    prefix = f"q:{project}:".encode()
    out = {}
    for key in client.scan_iter(match=prefix + b"*", count=1000):
        if not key.startswith(prefix + b"_"):
            out[key[len(prefix):]] = client.get(key)
    return out


def reads(store: Any, views: list[ViewSpec], at: int) -> dict[tuple[str, str], list[str | None]]:
    """Every feature of every user as of `at`, as text (so NaN equals NaN)."""
    batch = store.read([ViewRead(v, tuple(v.feature_names)) for v in views], {"user_id": USERS}, at)
    return {key: [repr(v) if ok else None for v, ok in zip(col.values.tolist(), col.valid.tolist(), strict=True)]
            for key, col in batch.items()}


class Snapshots:
    """`snapshot` of one server, or of every master of a cluster."""

    def __init__(self, clients: list[redis.Redis]):
        self.clients = clients

    def __call__(self, project: str) -> dict[bytes, bytes]:
        return {k: v for client in self.clients for k, v in snapshot(client, project).items()}


@pytest.mark.parametrize("where", ["server", "cluster"])
def test_the_flink_sink_writes_what_the_loader_writes(tmp_path: Path, where: str, request: Any) -> None:
    """On one server and on a Redis Cluster (the sink routes each slot's keys to its master; the loader writes
    through the cluster store)."""
    if where == "server":
        redis_url = request.getfixturevalue("redis_url")
        shots = Snapshots([redis.Redis.from_url(redis_url)])
    else:
        cluster = request.getfixturevalue("redis_cluster")
        redis_url = cluster.url
        shots = Snapshots([cluster.client(port) for port in cluster.masters()])
    if not STREAM_PYTHON.exists():
        pytest.fail(f"streaming virtualenv missing ({STREAM_PYTHON}): run `make setup`", pytrace=False)
    built = subprocess.run(["bash", "scripts/jars.sh", REDIS_SINK], cwd=REPO, capture_output=True, text=True,
                           timeout=900)
    assert built.returncode == 0, built.stderr[-4000:]
    (jar,) = bundle_jars(REDIS_SINK)
    cat = catalog()
    views = [cat.views["latest"], cat.views["spend"]]
    py, jvm = (redis_store_for(redis_url, project, timeout_s=5.0) for project in ("py", "jvm"))
    for store in (py, jvm):
        store.flush_project()
        store.remove_members(markers_key(store.project, "events"), sorted(store.set_members(
            markers_key(store.project, "events"))))
    paths = StreamPaths.at(tmp_path / "state")
    loader = Loader(views, ["events"], py, paths, marking=["latest"])  # the first view of the source carries them
    states = []
    for run, events in (("run1", RUN1), ("run2", RUN2)):
        inbox = tmp_path / "inbox" / run
        inbox.mkdir(parents=True)
        lines = [json.dumps(e, ensure_ascii=False) for e in events] + [json.dumps({BATCH_FIELD: run})]
        (inbox / "batch.json").write_text("\n".join(lines) + "\n", encoding="utf-8")
        shutil.rmtree(paths.sinks, ignore_errors=True)
        run_job(tmp_path, run, job_spec(cat, inbox, paths, redis_url, jar))
        assert loader.poll() > 0
        expected, got = shots("py"), shots("jvm")
        assert len(expected) == 2 * (3 if run == "run1" else 4)  # 3 then 4 users, the null key dropped
        assert got == expected, run
        assert jvm.freshness(["latest", "spend"]) == py.freshness(["latest", "spend"])
        assert jvm.set_members(markers_key("jvm", "events")) == loader.markers
        for at in AT:
            assert reads(jvm, views, at) == reads(py, views, at), (run, at)
        states.append(got)
    first, second = states
    # The replayed rows changed nothing: user 1's fuller tiles and newer last value, user -7's identical rows.
    replayed = [key for key in first if key.endswith((b"{1}", b"{-7}"))]
    assert len(replayed) == 4 and all(second[key] == first[key] for key in replayed)
    assert loader.markers == {"run1", "run2"}
    assert reads(jvm, views, AT[1])[("latest", "category")][0] == repr("")  # user 1's newest, not the replayed one
    assert reads(jvm, views, AT[0])[("spend", "amount_count_2h")][1] == repr(3)  # user 2: three tiles, one event each
    py.close()
    jvm.close()


def test_values_are_written_on_the_flush_timer_long_before_a_checkpoint(tmp_path: Path, redis_url: str) -> None:
    """An endless source, no checkpoints, a buffer far larger than the rows: only the sink's flush timer can
    write, and it does within seconds (before it, values waited for the next checkpoint)."""
    view = catalog().views["latest"]
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(match="q:timer:*", count=1000):
        client.delete(key)
    options = sink_options(view, "last", redis_url, project="timer", buffer_rows=1_000_000, flush_interval_ms=200)
    with_clause = ",\n".join(f"  '{k}' = '{v.replace(chr(39), chr(39) * 2)}'" for k, v in options.items())
    statements = [
        "CREATE TABLE src (user_id BIGINT, amount DOUBLE) WITH ('connector' = 'datagen', "
        "'rows-per-second' = '20', 'fields.user_id.min' = '1', 'fields.user_id.max' = '50')",
        "CREATE TABLE sink (user_id BIGINT, `__batch` STRING, event_ts BIGINT, amount DOUBLE, category STRING, "
        f"n BIGINT) WITH (\n{with_clause}\n)"]
    insert = (f"INSERT INTO sink SELECT user_id, CAST(NULL AS STRING), CAST({T0} AS BIGINT) + user_id, amount, "
              "'c', CAST(1 AS BIGINT) FROM src")
    # No checkpointing at all (even an hour's interval may fire its first checkpoint early).
    settings = [("parallelism.default", "1"), ("pipeline.jars", bundle_jars(REDIS_SINK)[0].as_uri())]
    spec_file, script = tmp_path / "live.json", tmp_path / "live.py"
    spec_file.write_text(json.dumps({"settings": settings, "statements": statements, "inserts": [insert]}))
    script.write_text(JOB)
    proc = subprocess.Popen([str(STREAM_PYTHON), str(script), str(spec_file)], cwd=str(REPO),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not list(client.scan_iter(match="q:timer:latest:*", count=1000)):
            assert proc.poll() is None, (proc.stderr.read() if proc.stderr else "")[-4000:]
            assert time.monotonic() < deadline, "no value written within 120 s: the flush timer did not fire"
            time.sleep(0.2)
        with RedisOnlineStore(redis_url, "timer") as store:  # what was written is readable, in the store's layout
            got = store.read([ViewRead(view, ("amount",))], {"user_id": np.arange(1, 51)}, T0 + H)
        assert got[("latest", "amount")].valid.any()
    finally:
        proc.kill()
        proc.wait(30)
