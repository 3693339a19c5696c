"""The consistency job on a real small project: events backfilled (DuckDB), materialized into a real Redis,
served by the real prediction service (which writes the serving logs), then replayed through the
point-in-time engine. A healthy world shows no difference; then one failure of each kind is injected — a
value corrupted in Redis, an entity missing online, a late event after serving — and each is reported under
its own cause, with only the late event left out of the wrong count."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import redis

from quiver.config import Config, load_config
from tests.cli_runs import done, quiver

pytestmark = pytest.mark.integration

USERS = 40
LATE_USER, CORRUPT_USER, MISSING_USER = 5, 7, 9
DEFINITIONS = '''
from quiver import Aggregation, Entity, FeatureService, FeatureView, Field, Float64, Int64, Source, String

user = Entity(name="user", join_keys=["user_id"], dtype=Int64)
tx = Source(name="tx", path="data/events/tx", timestamp_field="event_ts")
stats = FeatureView(name="stats", entities=[user], source=tx, ttl="2h",
                    schema=[Field("f0", Float64), Field("f1", Float64), Field("category", String)])
spend = FeatureView(name="spend", entities=[user], source=tx, tile="10m",
                    aggregations=[Aggregation("f0", "sum", "1h"), Aggregation("f0", "count", "1h")])
fraud = FeatureService(name="fraud", features=[stats])
fraud_next = FeatureService(name="fraud_next", features=[stats, "spend:f0_sum_1h"])  # one feature more
'''


@dataclass
class World:
    root: Path
    config: Config
    t0: datetime  # the materialization's data time; requests come after it
    catalog: Any


def _events(t0: datetime) -> pa.Table:
    """Two events per user, 100 and 50 minutes before t0 (inside the 2 h TTL at every request)."""
    rng = np.random.default_rng(3)
    users = np.tile(np.arange(USERS), 2)
    times = [t0 - timedelta(minutes=100 if i < USERS else 50, seconds=int(u)) for i, u in enumerate(users)]
    return pa.table({"user_id": pa.array(users, pa.int64()), "event_ts": pa.array(times, pa.timestamp("us", tz="UTC")),
                     "f0": rng.normal(size=2 * USERS), "f1": rng.normal(size=2 * USERS),
                     "category": rng.choice(["a", "b"], 2 * USERS)})


def _backfill(world: World) -> None:
    from quiver.offline.backfill import backfill

    backfill(world.config, world.catalog, (world.t0 - timedelta(days=1)).date(), world.t0.date())


def _serve(world: World, minutes: range, tag: str) -> None:
    """Every user at each of `minutes` after t0, through the real prediction service and serving logger."""
    from quiver.registry import Registry
    from quiver.registry.models import ModelRegistry
    from quiver.serving.logs import ServingLogger, log_schema
    from quiver.serving.prediction import PredictionService
    from quiver.serving.store import FeatureStore
    from tests.integration.test_prediction_service import MODEL

    registry = Registry(world.config.registry, project=world.config.project)
    with FeatureStore(config=world.config) as store, \
            ServingLogger(world.config.offline_dir, schema=log_schema(store.catalog)) as logger, \
            PredictionService(store, MODEL, models=ModelRegistry(registry), logger=logger) as service:
        for minute in minutes:
            at = world.t0 + timedelta(minutes=minute)
            service.predict([{"request_id": f"{tag}{minute}-{u}", "entities": {"user_id": u}, "at": at}
                             for u in range(USERS)])
    registry.close()


@pytest.fixture
def world(tmp_path: Path, redis_url: str) -> World:
    from quiver.artifacts import ArtifactStore
    from quiver.online.materialize import materialize
    from quiver.registry import Registry
    from quiver.registry.models import ModelRegistry
    from quiver.registry.repository import load_applied_catalog
    from tests.integration.test_online_materialize import write_source
    from tests.integration.test_prediction_service import MODEL, register

    root = tmp_path / "project"
    root.mkdir()
    (root / "quiver.yaml").write_text(f"project: cons\nregistry_url: sqlite:///{root}/registry.db\n"
                                      f"redis_url: {redis_url}\noffline_root: data/offline\n")
    (root / "monitoring.yaml").write_text("consistency_gate: true\n")  # the default, said: these tests are about it
    # Data times two days back: the late-event file written during the test is then dated after them.
    t0 = (datetime.now(UTC) - timedelta(days=2)).replace(minute=0, second=0, microsecond=0)
    write_source(root, _events(t0))
    (root / "feature_defs").mkdir()
    (root / "feature_defs" / "definitions.py").write_text(DEFINITIONS)
    done(quiver("apply", cwd=root))
    config = load_config(root / "quiver.yaml")
    world = World(root, config, t0, load_applied_catalog(config).catalog)
    _backfill(world)
    materialize(config, world.catalog, int(t0.timestamp() * 1_000_000))
    registry = Registry(config.registry, project=config.project)
    models = ModelRegistry(registry, ArtifactStore.from_config(config))
    version = register(models, root / ".quiver" / "models", seed=1)
    models.set_alias(MODEL, "champion", version, expected=None, reason="first")
    registry.close()
    return world


def _window(world: World) -> list[str]:
    return ["--start", world.t0.isoformat(), "--end", (world.t0 + timedelta(hours=1)).isoformat()]


def test_served_values_equal_offline_then_each_injected_failure_gets_its_cause(world: World) -> None:
    import json

    from quiver.monitoring import canary_judge
    from quiver.monitoring.consistency_records import consistency_results_of
    from quiver.monitoring.repository import list_alerts
    from quiver.offline import layout
    from quiver.online.redis_store import RedisOnlineStore
    from quiver.pipelines.loop import consistency_step
    from quiver.pipelines.loop_common import Project
    from quiver.pipelines.loop_rollout import canary_step, consistency_verdict, start_canary
    from quiver.registry import Registry, rollouts
    from quiver.streaming.late import late_dir
    from tests.integration.test_prediction_service import MODEL, register

    _serve(world, range(1, 11), "a")
    healthy = json.loads(done(quiver("consistency", "--model", "fraud", *_window(world), "--json", cwd=world.root)))
    assert healthy["rows_logged"] == healthy["rows_compared"] == 10 * USERS
    assert {f["feature"] for f in healthy["features"]} == {"stats:f0", "stats:f1", "stats:category"}
    for feature in healthy["features"]:
        assert (feature["compared"], feature["equal"], feature["status"]) == (10 * USERS, 10 * USERS, "ok")
    by_service = json.loads(done(quiver("consistency", "--service", "fraud", *_window(world), "--json",
                                        cwd=world.root)))
    assert [f["feature"] for f in by_service["features"]] == ["stats:f0", "stats:f1", "stats:category"]
    assert not by_service["inconsistent"]
    project = Project(world.config)
    candidate = register(project.models, world.root / ".quiver" / "models", seed=2)
    # Consistent, and the check covers the moment it starts at (the canary's steps then cover its rollout).
    started_at = world.t0 + timedelta(minutes=30)
    assert consistency_verdict(project, MODEL, candidate, None, started_at).passed
    assert start_canary(project, MODEL, version=candidate, at=started_at)["started"]

    # A value corrupted in Redis (same event time, another amount), an entity gone from Redis.
    view = world.catalog.views["stats"]
    with RedisOnlineStore(world.config.redis_url, world.config.project) as online:
        last = pq.read_table(layout.view_dir(world.config.offline_dir, "stats", layout.LAST_VALUES)).to_pandas()
        row = last[last["user_id"] == CORRUPT_USER].sort_values("event_ts").tail(1).assign(f0=-1234.5)
        online.write_last_values(view, pa.Table.from_pandas(row[["user_id", "event_ts", "f0", "f1", "category"]],
                                                            preserve_index=False))
    client = redis.Redis.from_url(world.config.redis_url)
    assert client.delete(*client.keys(f"q:cons:stats:*:{{{MISSING_USER}}}")) == 1
    client.close()
    _serve(world, range(30, 35), "b")
    # A late event, after serving: dated 10 minutes before t0, it reaches offline through the late-event store
    # and the next backfill; serving could not have had it.
    late = late_dir(world.config.offline_dir) / "tx" / f"date={world.t0.date()}"
    late.mkdir(parents=True)
    pq.write_table(pa.table({"user_id": pa.array([LATE_USER], pa.int64()),
                             "event_ts": pa.array([world.t0 - timedelta(minutes=10)], pa.timestamp("us", tz="UTC")),
                             "f0": [999.0], "f1": [999.0], "category": ["z"]}), late / "upto-late.parquet")
    _backfill(world)

    result = quiver("consistency", "--model", "fraud", *_window(world), "--json", cwd=world.root)
    report = json.loads(done(result, code=1))  # features over their threshold: exit 1
    by = {f["feature"]: f for f in report["features"]}
    rounds, second = 15, 5  # requests per user: all, after the injections
    f0 = by["stats:f0"]
    assert f0["compared"] == 15 * USERS
    assert f0["causes"] == {"late_event": rounds, "ttl_boundary": 0, "stream_lag": 0,
                            "materialization_gap": second, "unexplained": second}
    assert (f0["late"], f0["wrong"], f0["mismatched"], f0["missing_online"]) == \
        (rounds, 2 * second, rounds + second, second)
    assert f0["smape"] is not None and f0["status"] == "alert"
    unexplained = [e for e in f0["examples"] if e["cause"] == "unexplained"]
    assert unexplained and all(e["keys"] == {"user_id": CORRUPT_USER} and e["served"] == -1234.5
                               for e in unexplained)
    for name in ("stats:f1", "stats:category"):
        assert by[name]["causes"] == {"late_event": rounds, "ttl_boundary": 0, "stream_lag": 0,
                                      "materialization_gap": second, "unexplained": 0}, name
    assert report["inconsistent"] == ["stats:f0", "stats:f1", "stats:category"]

    registry = Registry(world.config.registry, project="cons")
    stored = {r["feature"]: r for r in consistency_results_of(registry, report["run_id"])}
    assert stored["stats:f0"]["wrong"] == 2 * second and stored["stats:f0"]["late"] == rounds
    assert stored["stats:f0"]["causes"]["unexplained"] == second
    alerts = {a.subject: a for a in list_alerts(registry, "open", "consistency")}
    assert set(alerts) == {"stats:f0", "stats:f1", "stats:category"}
    registry.close()
    # The running canary holds, without a look, and the decision says why (once per step and set of features).
    held = canary_step(project, MODEL, world.t0 + timedelta(hours=2))
    assert held["outcome"] == "hold" and "stats:f0" in held["reason"] and held["new_decision"]
    assert canary_step(project, MODEL, world.t0 + timedelta(hours=3))["decision_id"] == held["decision_id"]
    decision = rollouts.get_decision(project.registry, held["decision_id"])
    assert decision.outcome == "hold" and "stats:f0" in decision.statistics["inconsistent"]
    assert rollouts.active_rollout(project.registry, MODEL) is not None  # held, not stopped
    # A canary does not start while a feature its candidate reads is inconsistent.
    canary_judge.rollback(world.config, MODEL, reason="test: make room for the next candidate")
    other = register(project.models, world.root / ".quiver" / "models", seed=3)
    waiting = start_canary(project, MODEL, version=other, at=world.t0 + timedelta(hours=1))
    assert waiting["status"] == "waiting" and not waiting["started"]
    # With the gate off the report still alerts, but canaries do not wait on it.
    (world.root / "monitoring.yaml").write_text("consistency_gate: false\n")
    assert consistency_verdict(project, MODEL, other, None, world.t0 + timedelta(hours=1)).passed
    (world.root / "monitoring.yaml").write_text("consistency_gate: true\n")
    assert "stats:f0" in waiting["reason"] and f"consistency run #{report['run_id']}" in waiting["reason"]

    table = done(quiver("consistency", "--model", "fraud", *_window(world), "--no-record", cwd=world.root), code=1)
    assert "stats:f0" in table and "inconsistent" in table

    # The drift DAG's daily task: the same check over the run's window, summarized for the task log.
    daily = consistency_step(str(world.root / "quiver.yaml"), MODEL, world.t0, world.t0 + timedelta(hours=1))
    assert daily["status"] == "inconsistent" and daily["rows_compared"] == 15 * USERS
    assert daily["inconsistent"] == ["stats:f0", "stats:f1", "stats:category"]
    unknown = consistency_step(str(world.root / "quiver.yaml"), "nobody", world.t0, world.t0 + timedelta(hours=1))
    assert unknown["status"] == "unavailable" and "nobody" in unknown["reason"]


def test_the_loop_canary_waits_and_holds_until_a_consistency_check_covers_its_traffic(world: World) -> None:
    """The gate fails closed, through the loop's steps: no check, no canary; a check of the day before lets
    it start; its first step holds until the drift DAG's consistency task has compared rows served under it,
    and is judged once it has."""
    from quiver.pipelines.loop import consistency_step
    from quiver.pipelines.loop_common import Project
    from quiver.pipelines.loop_rollout import canary_step, start_canary
    from tests.integration.test_prediction_service import MODEL, register

    config_path = str(world.root / "quiver.yaml")
    _serve(world, range(1, 6), "before")  # the champion's traffic before the canary
    project = Project(world.config)
    candidate = register(project.models, world.root / ".quiver" / "models", seed=2)
    start = world.t0 + timedelta(hours=1)
    waiting = start_canary(project, MODEL, version=candidate, at=start)
    assert waiting["status"] == "waiting" and waiting["reason"].startswith(
        f"no consistency check covers {start - timedelta(hours=26):%Y-%m-%d %H:%M} → {start:%Y-%m-%d %H:%M} for "
        f"{MODEL}:{candidate} (none recorded for model {MODEL})"), waiting["reason"]
    before = consistency_step(config_path, MODEL, world.t0, start)
    assert before["status"] == "consistent" and before["rows_compared"] == 5 * USERS
    started = start_canary(project, MODEL, version=candidate, at=start)
    assert started["started"] and started["consistency"]["runs"] == [before["run_id"]]

    _serve(world, range(61, 66), "under")  # served under the rollout, both arms
    held = canary_step(project, MODEL, start + timedelta(minutes=30))
    assert held["outcome"] == "hold" and held["reason"].startswith("holding: no consistency check covers"), held
    assert f"newest: run #{before['run_id']}" in held["reason"]
    after = consistency_step(config_path, MODEL, start, start + timedelta(minutes=30))
    assert after["status"] == "consistent" and after["rows_compared"] == 5 * USERS
    judged = canary_step(project, MODEL, start + timedelta(hours=1))
    assert judged["consistency"]["passed"] and judged["consistency"]["runs"] == [after["run_id"]], judged
    assert judged["decision_id"] != held["decision_id"] and "consistency" not in judged["reason"]

def test_a_stale_store_is_replayed_as_the_online_reader_reads_it(world: World) -> None:
    """A window served from a store last fed at M is anchored at the request: the events of
    [floor(t) − w, M), not the window as of M. Replayed that way it equals Redis's answer row for row, so
    staleness is reported as stream lag, never as a wrong value."""
    from quiver.catalog.references import resolve_features
    from quiver.monitoring import consistency as cons
    from quiver.monitoring import consistency_evidence as ev
    from quiver.online.materialize import materialize
    from quiver.serving.store import FeatureStore

    cutoff = world.t0 - timedelta(minutes=60)  # between the events 100 and 50 minutes before t0
    client = redis.Redis.from_url(world.config.redis_url)
    client.delete(*client.keys("q:cons:*"))
    client.close()
    materialize(world.config, world.catalog, int(cutoff.timestamp() * 1_000_000), full=True)

    users = np.repeat(np.arange(USERS), 9)
    at = np.tile([cutoff + timedelta(minutes=m) for m in (0, 3, 9, 11, 29, 45, 58, 61, 75)], USERS)
    t_us = np.array([int(a.timestamp() * 1_000_000) for a in at], dtype=np.int64)
    refs = resolve_features(world.catalog, ["spend:f0_sum_1h", "spend:f0_count_1h"], False)
    with FeatureStore(config=world.config) as store:
        served = store.get_online_features(["spend:f0_sum_1h", "spend:f0_count_1h"],
                                           {"user_id": users.tolist()}, at=t_us.tolist()).to_arrow()
    rows = ev.Rows(t_us, {"user_id": pa.array(users, pa.int64())})
    view = world.catalog.views["spend"]
    cut_us = np.full_like(t_us, int(cutoff.timestamp() * 1_000_000))
    replayed = ev.read_before(world.config, world.catalog, view, refs, rows, cut_us)
    as_of_cutoff = ev.point_in_time(world.config, world.catalog, refs, rows.at(cut_us))
    as_of_request = ev.point_in_time(world.config, world.catalog, refs, rows)
    for ref in refs:
        online = cons.as_values(served[ref.feature])
        key = (ref.view, ref.feature)
        assert cons.equal(online, replayed[key]).all(), ref
        assert not cons.equal(online, as_of_cutoff[key]).all(), ref  # the window as of M is another window
        assert not cons.equal(online, as_of_request[key]).all(), ref  # the 50-minute events are offline only


def _stop_the_stream_an_hour_before(world: World) -> None:
    """The online store as a stream stopped an hour before t0 leaves it, then five minutes of traffic."""
    from quiver.online.materialize import materialize

    client = redis.Redis.from_url(world.config.redis_url)
    client.delete(*client.keys("q:cons:*"))
    client.close()
    materialize(world.config, world.catalog, int((world.t0 - timedelta(hours=1)).timestamp() * 1_000_000), full=True)
    _serve(world, range(1, 6), "s")


def test_a_stream_stopped_for_an_hour_is_reported_as_stream_lag_and_holds_the_canary(world: World) -> None:
    """The online store stops taking events an hour before t0 (as a stopped stream leaves it): every served
    row that differs (every one for the floats; a category may be the same in both events) is explained as
    stream lag once lags up to an hour are tried, and the canary waits."""
    import json

    from quiver.pipelines.loop_common import Project
    from quiver.pipelines.loop_rollout import start_canary
    from tests.integration.test_prediction_service import MODEL, register

    _stop_the_stream_an_hour_before(world)

    result = quiver("consistency", "--model", "fraud", *_window(world), "--max-lag", "3600", "--json",
                    cwd=world.root)
    report = json.loads(done(result, code=1))
    by = {f["feature"]: f for f in report["features"]}
    for name in ("stats:f0", "stats:f1", "stats:category"):
        differ = by[name]["compared"] - by[name]["equal"]
        assert by[name]["compared"] == 5 * USERS and differ > 0, by[name]
        assert by[name]["causes"] == {"late_event": 0, "ttl_boundary": 0, "stream_lag": differ,
                                      "materialization_gap": 0, "unexplained": 0}, name
    assert by["stats:f0"]["equal"] == by["stats:f1"]["equal"] == 0  # floats: the older event's value differs
    assert report["inconsistent"] == ["stats:f0", "stats:f1", "stats:category"]
    project = Project(world.config)
    candidate = register(project.models, world.root / ".quiver" / "models", seed=2)
    waiting = start_canary(project, MODEL, version=candidate, at=world.t0 + timedelta(hours=1))
    assert waiting["status"] == "waiting" and not waiting["started"] and "stats:f0" in waiting["reason"]


def test_stream_lag_is_counted_against_the_views_freshness_objective_not_as_wrong(world: World) -> None:
    """The same stopped stream, with a freshness objective for the view (monitoring.yaml): the rows lag explains
    are not wrong; the measured p99 lag (about the hour the stream stopped) is reported beside the objective,
    and only an objective it exceeds makes the features inconsistent, with the lag named."""
    import json

    _stop_the_stream_an_hour_before(world)

    def check(objective_s: int) -> dict[str, object]:
        (world.root / "monitoring.yaml").write_text(f"freshness_objectives: {{stats: {objective_s}}}\n")
        result = quiver("consistency", "--model", "fraud", *_window(world), "--max-lag", "3600", "--json",
                        cwd=world.root)
        return {"code": result.returncode, "report": json.loads(result.stdout), "text": result.stdout}

    loose = check(7200)
    assert loose["code"] == 0, loose["text"]
    features = {f["feature"]: f for f in loose["report"]["features"]}  # type: ignore[index]
    for name in ("stats:f0", "stats:f1", "stats:category"):
        feature = features[name]
        assert feature["status"] == "ok" and feature["wrong"] == 0 and feature["causes"]["stream_lag"] > 0, feature
        lag = feature["freshness"]
        assert lag["objective_s"] == 7200 and lag["status"] == "ok", lag
        assert 60 * 60 <= lag["lag_p99_s"] <= 2 * 60 * 60, lag  # stopped an hour before t0, served 1-5 min after
    tight = check(600)
    assert tight["code"] == 1
    assert tight["report"]["inconsistent"] == ["stats:f0", "stats:f1", "stats:category"]  # type: ignore[index]
    shown = quiver("consistency", "--model", "fraud", *_window(world), "--max-lag", "3600", cwd=world.root)
    assert "600 s over" in shown.stdout and "over their freshness objective" in shown.stdout, shown.stdout


def test_a_value_served_just_past_its_ttl_is_reported_as_a_ttl_edge_and_holds_the_canary(world: World) -> None:
    """A producer whose clock runs 45 s ahead stamps one user's newest event late in the online store. Served
    30 s past the 2 h TTL of the event's true time, the store still answers it (15 s within the TTL by its
    stamp) while offline, from the true time, has nothing: a TTL edge, explained by moving the TTL by the
    job's 60 s margin, and counted as wrong (serving answered what the feature's TTL says it must not)."""
    import json

    from quiver.offline import layout
    from quiver.online.materialize import materialize
    from quiver.online.redis_store import RedisOnlineStore
    from quiver.pipelines.loop_common import Project
    from quiver.pipelines.loop_rollout import start_canary
    from tests.integration.test_prediction_service import MODEL, register

    user = 30  # its newest event: 50 min 30 s before t0, so 2 h after it is t0 + 69 min 30 s
    client = redis.Redis.from_url(world.config.redis_url)
    client.delete(*client.keys("q:cons:*"))
    client.close()
    materialize(world.config, world.catalog, int(world.t0.timestamp() * 1_000_000), full=True)
    with RedisOnlineStore(world.config.redis_url, world.config.project) as online:
        last = pq.read_table(layout.view_dir(world.config.offline_dir, "stats", layout.LAST_VALUES)).to_pandas()
        row = last[last["user_id"] == user].sort_values("event_ts").tail(1)
        assert row["event_ts"].iloc[0] == world.t0 - timedelta(minutes=50, seconds=user)
        skewed = row.assign(event_ts=row["event_ts"] + timedelta(seconds=45))
        online.write_last_values(world.catalog.views["stats"], pa.Table.from_pandas(
            skewed[["user_id", "event_ts", "f0", "f1", "category"]], preserve_index=False))
    _serve(world, range(70, 71), "ttl")  # t0 + 70 min: 2 h 30 s after the user's newest event

    window = ["--start", world.t0.isoformat(), "--end", (world.t0 + timedelta(hours=2)).isoformat()]
    report = json.loads(done(quiver("consistency", "--model", "fraud", *window, "--json", cwd=world.root), code=1))
    by = {f["feature"]: f for f in report["features"]}
    for name in ("stats:f0", "stats:f1", "stats:category"):
        assert by[name]["compared"] - by[name]["equal"] == 1, by[name]  # only that user's row differs
        assert by[name]["causes"] == {"late_event": 0, "ttl_boundary": 1, "stream_lag": 0,
                                      "materialization_gap": 0, "unexplained": 0}, name
        assert by[name]["wrong"] == 1 and by[name]["status"] == "alert", by[name]
    assert report["inconsistent"] == ["stats:f0", "stats:f1", "stats:category"]
    project = Project(world.config)
    waiting = start_canary(project, MODEL, version=register(project.models, world.root / ".quiver" / "models", seed=2),
                           at=world.t0 + timedelta(hours=2))
    assert waiting["status"] == "waiting" and not waiting["started"] and "stats:f0" in waiting["reason"]


def test_a_check_over_no_rows_fails_names_where_the_rows_are_and_never_replaces_a_real_run(world: World) -> None:
    """An evidence command over an empty window says "no rows", exits 2 and records nothing: the real run
    stays the newest on the console's page; each names the hours the serving logs do hold."""
    import json

    from quiver.monitoring.consistency_records import consistency_runs_of
    from quiver.registry import Registry

    _serve(world, range(1, 4), "a")
    real = json.loads(done(quiver("consistency", "--model", "fraud", *_window(world), "--json", cwd=world.root)))
    hours = f"the serving logs hold {world.t0:%Y-%m-%d %H:00} … {world.t0 + timedelta(hours=1):%Y-%m-%d %H:00} UTC"
    empty = quiver("consistency", "--model", "fraud", cwd=world.root)  # the default window ends now: no traffic
    assert empty.returncode == 2 and "no rows compared for model fraud" in empty.stderr, empty.stderr
    assert hours in empty.stderr and "consistent" not in empty.stdout, (empty.stdout, empty.stderr)
    registry = Registry(world.config.registry, project=world.config.project)
    try:
        assert [r["id"] for r in consistency_runs_of(registry)] == [real["run_id"]]
    finally:
        registry.close()
    later = world.t0 + timedelta(days=1)
    evaluated = quiver("evaluate", "fraud", "--start", later.isoformat(), cwd=world.root)
    assert evaluated.returncode == 2 and "no rows evaluated" in evaluated.stderr and hours in evaluated.stderr, \
        evaluated.stderr
    drift = quiver("drift", "--model", "fraud", "--start", later.isoformat(), cwd=world.root)
    assert drift.returncode == 2 and "no rows compared" in drift.stderr and hours in drift.stderr, drift.stderr
    backwards = quiver("drift", "--model", "fraud", "--start", later.isoformat(), "--end", world.t0.isoformat(),
                       cwd=world.root)
    assert backwards.returncode == 2 and "the window is empty: --end" in backwards.stderr, backwards.stderr
