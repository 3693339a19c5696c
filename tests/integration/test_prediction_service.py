"""The prediction service on a real Redis, real model artifacts (saved, checksummed, loaded with torch) and a
real registry: one store call per request, champion scores equal the artifact's own, a shadow never changes
a response, a broken canary falls back and alerts, hot swap under load loses no request."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from quiver import Entity, FeatureView, Field, Float64, Source, String
from quiver.artifacts import ArtifactStore
from quiver.catalog.validate import build_catalog
from quiver.composition import prediction_service
from quiver.config import Config
from quiver.monitoring.alerts import AlertManager, LogSink
from quiver.offline.layout import last_values_schema
from quiver.online.factory import redis_store_for
from quiver.registry import Registry, rollouts
from quiver.registry.models import ModelRegistry
from quiver.serving.logs import ServingLogger, read_serving_logs
from quiver.serving.prediction import PredictionService
from quiver.serving.store import FeatureStore

pytestmark = pytest.mark.integration

MODEL = "fraud"
BEAT_BASELINE = {"roc_auc": 0.7, "baseline": {"roc_auc": 0.6}}  # so the registry makes it a serving version
USERS = 400
COLUMNS = {"user_id": "int64", "event_ts": "timestamp", "f0": "float64", "f1": "float64", "category": "string"}
T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)


def catalog() -> Any:
    user = Entity("user", ["user_id"])
    source = Source("tx", "unused")
    stats = FeatureView("stats", [user], source, ttl="30d",
                        schema=[Field("f0", Float64), Field("f1", Float64), Field("category", String)])
    return build_catalog([user, source, stats], schema_reader=lambda s: COLUMNS)


def save_model(root: Path, seed: int, *, numeric: tuple[str, ...] = ("f0", "f1"),
               categorical: tuple[str, ...] = ("category",), spread: float = 4.0,
               labelled_reference: bool = False, reference_rows: int = 200,
               reference_scores: np.ndarray | None = None) -> tuple[Path, str]:
    """A real artifact: a small TabularNet with seeded random weights, saved and checksummed. `spread`
    scales the output layer: larger gives sharper scores (further from ½); `labelled_reference` stores a
    `label` column with the reference (the retrain gate compares versions on it)."""
    import torch

    from quiver.models.artifact import save_artifact
    from quiver.models.network import NetworkConfig, TabularNet
    from quiver.models.scoring import Preprocessor

    prep = Preprocessor(numeric, categorical, (0.0,) * len(numeric), (1.0,) * len(numeric),
                        tuple(("a", "b") for _ in categorical))
    torch.manual_seed(seed)
    net = TabularNet(NetworkConfig(n_numeric=len(numeric), cardinalities=prep.cardinalities, hidden=(8,),
                                   dropout=0.0))
    with torch.no_grad():
        net.head.weight.mul_(spread)  # spread the scores so versions differ clearly
    refs = [f"stats:{f}" for f in (*numeric, *categorical)]
    rng = np.random.default_rng(seed)
    n = reference_rows
    reference = pd.DataFrame({"f0": rng.normal(size=n), "f1": rng.normal(size=n), "category": rng.choice(["a", "b"], n)})
    reference["score"] = rng.random(n) if reference_scores is None else reference_scores
    if labelled_reference:
        reference["label"] = (rng.random(n) < 0.5).astype(float)
    return save_artifact(root, MODEL, net, prep, feature_refs=refs, catalog_version=None, catalog_hash="test",
                         label_column="label", reference=reference)


def register(models: ModelRegistry, root: Path, seed: int, **kwargs: Any) -> int:
    folder, sha = save_model(root, seed, **kwargs)
    version = models.register(MODEL, artifact_path=str(folder), sha256=sha, metrics=BEAT_BASELINE,
                              window_start=T0 - timedelta(days=7), cutoff=T0, features=["f0", "f1", "category"],
                              catalog_version=None, label_column="label", lineage={"seed": seed},
                              reference_path=str(folder / "reference.parquet"))
    return version.version


@dataclass
class Project:
    config: Config
    store: FeatureStore
    registry: Registry
    models: ModelRegistry
    root: Path
    features: pd.DataFrame

    def service(self, **kwargs: Any) -> PredictionService:
        return PredictionService(self.store, MODEL, models=self.models, **kwargs)

    def scores(self, version: int, users: list[int]) -> np.ndarray:
        """What the artifact itself says for these users (independent of the service)."""
        return self.models.load(MODEL, version).predict(self.features.set_index("user_id").loc[users].reset_index())


@pytest.fixture
def project(redis_url: str, tmp_path: Path) -> Iterator[Project]:
    with prediction_project(redis_url, tmp_path) as made:
        yield made


@contextlib.contextmanager
def prediction_project(redis_url: str, tmp_path: Path) -> Iterator[Project]:
    """The prediction tests' project on the Redis (or Redis Cluster) at `redis_url`."""
    cat = catalog()
    config = Config(root=tmp_path, project="p", redis_url=redis_url, registry_url=f"sqlite:///{tmp_path}/reg.db",
                    offline_root=str(tmp_path / "offline"))
    online = redis_store_for(redis_url, "p", timeout_s=1.0)
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"user_id": np.arange(USERS, dtype=np.int64), "f0": rng.normal(size=USERS),
                          "f1": rng.normal(size=USERS), "category": rng.choice(["a", "b", "c"], USERS)})
    schema = last_values_schema(cat.views["stats"])
    table = pa.Table.from_pandas(frame.assign(event_ts=pd.Timestamp(T0)), preserve_index=False)
    online.write_last_values(cat.views["stats"], table.select(schema.names).cast(schema))
    registry = Registry(config.registry, project="p")
    models = ModelRegistry(registry, ArtifactStore.from_config(config))  # root: <tmp>/.quiver
    with FeatureStore(config=config, catalog=cat, online_store=online) as store:
        yield Project(config, store, registry, models, tmp_path / ".quiver" / "models", frame)
    registry.close()


class Server:
    """A real uvicorn server on a free loopback port, in a thread; yields an httpx client."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        from tests.harness import free_port

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Any:
        import httpx

        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=10)
        return self.client

    def __exit__(self, *exc: object) -> None:
        self.client.close()
        self.server.should_exit = True
        self.thread.join(10)


def rows(users: list[int], prefix: str = "r") -> list[dict[str, Any]]:
    return [{"request_id": f"{prefix}{i}-{u}", "entities": {"user_id": u}} for i, u in enumerate(users)]


def test_champion_scores_come_from_one_store_call_and_equal_the_artifact(project: Project) -> None:
    v1 = register(project.models, project.root, seed=1)
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="first")
    calls = []
    fetch = project.store.online.fetch  # the one blocking round trip of an online read

    def counting_fetch(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return fetch(*args, **kwargs)

    project.store.online.fetch = counting_fetch  # type: ignore[method-assign]
    users = list(range(0, 300, 3))
    with ServingLogger(project.config.offline_dir) as logger:
        service = project.service(logger=logger)
        out = service.predict(rows(users))
    assert len(calls) == 1
    assert [p.model_version for p in out] == [f"{MODEL}:{v1}"] * len(users)
    assert {p.arm for p in out} == {"champion"}
    np.testing.assert_allclose([p.score for p in out], project.scores(v1, users), rtol=0, atol=1e-12)
    logged = read_serving_logs(project.config.offline_dir)
    assert logged.num_rows == len(users)
    assert logged["feature.f0"].to_pylist() == pytest.approx(project.features.loc[users, "f0"].tolist())
    assert logged["prediction"].to_pylist() == pytest.approx([p.score for p in out])


class Stuck:
    """A real scorer that does not answer until released (a shadow as slow as can be)."""

    def __init__(self, scorer: Any, release: threading.Event, entered: threading.Event):
        self.scorer, self.release, self.entered = scorer, release, entered
        self.features, self.feature_refs, self.version_label = scorer.features, scorer.feature_refs, \
            scorer.version_label

    def predict(self, columns: Any) -> np.ndarray:
        self.entered.set()
        self.release.wait()
        return np.asarray(self.scorer.predict(columns))


def test_shadow_never_changes_a_response(project: Project) -> None:
    v1 = register(project.models, project.root, seed=1)
    v2 = register(project.models, project.root, seed=2)
    broken = register(project.models, project.root, seed=3, numeric=("f0", "category"), categorical=())
    # The registry would refuse an alias to `broken` (its features differ from its registration); what is under
    # test is the server's side, when such a version slips through: let the alias move.
    project.models.verify_artifacts = False
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="first")
    users = list(range(50))
    baseline = project.service().predict(rows(users))
    with ServingLogger(project.config.offline_dir) as logger:
        for shadow, stuck in ((v2, False), (broken, False), (v2, True)):
            project.models.set_alias(MODEL, "shadow", shadow, expected=project.models.aliases(MODEL).get("shadow"),
                                     reason="test")
            release, entered = threading.Event(), threading.Event()

            def loader(version: Any, stuck: bool = stuck, release: threading.Event = release,
                       entered: threading.Event = entered) -> Any:
                from quiver.models.artifact import load_model

                scorer = load_model(project.models.artifacts.local_dir(version.artifact_path),
                                    expected_sha256=version.sha256, version_label=version.label)
                return Stuck(scorer, release, entered) if stuck and version.version != v1 else scorer

            if not stuck:
                release.set()
            with project.service(logger=logger, loader=loader, shadow_queue_size=2) as service:
                assert service.arms.shadow is not None and service.arms.shadow.version == shadow
                # While a stuck shadow holds its worker, every response still comes back, unchanged.
                answers = [service.predict(rows(users))]
                if stuck:  # the worker holds the first request's rows before the rest arrive
                    assert entered.wait(20)
                answers += [service.predict(rows(users)) for _ in range(3)]
                release.set()
                assert service.drain(20)
                stats = service.stats.snapshot()
            for answer in answers:
                assert answer == baseline  # same ids, scores, versions, arms
            if shadow == broken:
                assert stats["shadow_errors"] == stats["shadow_rows"] > 0
            if stuck:
                assert stats["shadow_dropped"] == len(users)  # 3 more requests, 2 queue slots, worker held by the 1st
                assert stats["shadow_rows"] + stats["shadow_dropped"] == 4 * len(users)
    logged = read_serving_logs(project.config.offline_dir, arm="shadow")
    assert set(logged["model_version"].to_pylist()) == {f"{MODEL}:{v2}", f"{MODEL}:{broken}"}
    # Shadow rows mirror the champion's request ids.
    assert set(logged["request_id"].to_pylist()) == {p.request_id for p in baseline}
    errors = [e for e, v in zip(logged["error"].to_pylist(), logged["model_version"].to_pylist(), strict=True)
              if v == f"{MODEL}:{broken}"]
    assert errors and all("numeric" in e for e in errors)


def start_rollout(project: Project, champion: int, canary: int, fraction: float) -> rollouts.Rollout:
    project.models.set_alias(MODEL, "canary", canary, expected=project.models.aliases(MODEL).get("canary"),
                             reason="test canary")
    return rollouts.start_rollout(project.registry, MODEL, champion_version=champion, canary_version=canary,
                                  fraction=fraction, settings={}, salt="s1")


def test_canary_rows_route_by_entity_and_a_broken_canary_falls_back_and_alerts(project: Project) -> None:
    v1 = register(project.models, project.root, seed=1)
    v2 = register(project.models, project.root, seed=2)
    broken = register(project.models, project.root, seed=3, numeric=("f0", "category"), categorical=())
    # The registry would refuse an alias to `broken` (its features differ from its registration); what is under
    # test is the server's side, when such a version slips through: let the alias move.
    project.models.verify_artifacts = False
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="first")
    rollout = start_rollout(project, v1, v2, 0.5)
    users = list(range(USERS))
    service = project.service()
    first = service.predict(rows(users))
    again = service.predict(rows(users[::-1], prefix="again"))
    arm_of = {int(p.request_id.split("-")[1]): p.arm for p in first}
    assert {int(p.request_id.split("-")[1]): p.arm for p in again} == arm_of  # stable per entity
    share = sum(a == "canary" for a in arm_of.values()) / USERS
    assert 0.4 < share < 0.6
    canary_users = [u for u in users if arm_of[u] == "canary"]
    by_user = {int(p.request_id.split("-")[1]): p for p in first}
    np.testing.assert_allclose([by_user[u].score for u in canary_users], project.scores(v2, canary_users),
                               atol=1e-12)
    assert {by_user[u].model_version for u in canary_users} == {f"{MODEL}:{v2}"}

    # Now the canary raises on every row: champion scores, counted, alert recorded, rows logged as failed.
    rollouts.finish_rollout(project.registry, rollout.id, rollouts.ROLLED_BACK, fraction=0.0)
    start_rollout(project, v1, broken, 0.5)
    alerts = AlertManager(project.registry, [LogSink()])
    with ServingLogger(project.config.offline_dir) as logger:
        service = project.service(logger=logger, alerts=alerts)
        out = service.predict(rows(users, prefix="b"))
    assert {p.arm for p in out} == {"champion"}
    np.testing.assert_allclose([p.score for p in out], project.scores(v1, users), atol=1e-12)
    fallbacks = sum(p.fallback for p in out)
    assert 0 < fallbacks == service.stats.snapshot()["canary_fallbacks"]
    opened = alerts.open_alerts("canary_failed")
    assert len(opened) == 1 and opened[0].subject == f"{MODEL}:{broken}"
    logged = read_serving_logs(project.config.offline_dir, arm="canary").to_pandas()
    failed = logged[logged["model_version"] == f"{MODEL}:{broken}"]
    assert len(failed) == fallbacks and failed["prediction"].isna().all() and (failed["error"] != "").all()


def test_a_canary_that_cannot_load_falls_back(project: Project) -> None:
    v1 = register(project.models, project.root, seed=1)
    v2 = register(project.models, project.root, seed=2)
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="first")
    start_rollout(project, v1, v2, 1.0 - 1e-9)
    # Damaged after the registry verified it (the registry refuses an alias to a damaged artifact).
    (project.models.artifacts.local_dir(project.models.get(MODEL, v2).artifact_path) / "weights.pt").write_bytes(
        b"tampered")
    alerts = AlertManager(project.registry, [LogSink()])
    service = project.service(alerts=alerts)
    assert service.arms.canary is not None and service.arms.canary.model is None
    assert "checksum" in service.arms.canary.error
    out = service.predict(rows(list(range(40))))
    assert all(p.fallback and p.arm == "champion" for p in out)
    assert alerts.open_alerts("canary_load_failed")


def test_hot_swap_under_load_loses_no_request(project: Project) -> None:
    v1 = register(project.models, project.root, seed=1)
    v2 = register(project.models, project.root, seed=2)
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="first")
    users = list(range(0, USERS, 7))
    expected = {f"{MODEL}:{v1}": project.scores(v1, users), f"{MODEL}:{v2}": project.scores(v2, users)}
    service = project.service(poll_interval_s=0.05, micro_batch=True).start()  # concurrent calls batch, too
    results: list[list[Any]] = []
    failures: list[BaseException] = []
    stop = threading.Event()

    def client(k: int) -> None:
        i = 0
        while not stop.is_set():
            try:
                results.append(service.predict(rows(users, prefix=f"c{k}-{i}-")))
            except BaseException as exc:
                failures.append(exc)
            i += 1

    threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 30
        while len(results) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        project.models.set_alias(MODEL, "champion", v2, expected=v1, reason="swap under load")
        while service.arms.champion.version != v2 and time.monotonic() < deadline:
            time.sleep(0.01)
        swapped_at = len(results)
        while len(results) < swapped_at + 20 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        for t in threads:
            t.join()
        service.close()
    assert not failures
    assert service.arms.champion.version == v2 and service.stats.snapshot()["swaps"] == 1
    versions_seen = set()
    for answer in results:
        labels = {p.model_version for p in answer}
        assert len(labels) == 1  # a request never mixes models
        label = labels.pop()
        versions_seen.add(label)
        np.testing.assert_allclose([p.score for p in answer], expected[label], atol=1e-12)
    assert versions_seen == set(expected)
    assert {p.model_version for p in results[-1]} == {f"{MODEL}:{v2}"}


def test_rows_log_at_their_own_time_and_from_config_flushes_on_close(project: Project) -> None:
    v1 = register(project.models, project.root, seed=1)
    v2 = register(project.models, project.root, seed=2)
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="first")
    project.models.set_alias(MODEL, "shadow", v2, expected=None, reason="shadow")
    simulated = datetime(2026, 11, 3, 9, 30, tzinfo=UTC)
    service = prediction_service(project.config, MODEL, store=project.store)
    out = service.predict([{"request_id": f"t{u}", "entities": {"user_id": u},
                            "at": simulated + timedelta(minutes=u)} for u in range(5)])
    service.close()  # never started: the queued shadow batch is scored here, then the log is flushed
    logged = read_serving_logs(project.config.offline_dir).to_pandas()
    assert sorted(logged["arm"]) == ["champion"] * 5 + ["shadow"] * 5
    for arm in ("champion", "shadow"):
        times = [t.to_pydatetime() for t in logged[logged["arm"] == arm].sort_values("request_id")["ts"]]
        assert times == [simulated + timedelta(minutes=u) for u in range(5)]
    assert [p.request_id for p in out] == [f"t{u}" for u in range(5)]
