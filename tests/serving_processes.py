"""Real `quiver serve-model` and `quiver serve` processes over a small project on a real Redis, for the tests
that need a server as users run it (signals, its own serving log, its own settings)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from tests.harness import free_port

KEY = "hardening-key"
MODEL = "fraud"
USERS = 200
REPO = Path(__file__).resolve().parents[1]
DEFS = '''
from quiver import Entity, FeatureView, Field, Float64, Source, String
user = Entity("user", ["user_id"])
tx = Source("tx", "data/tx.parquet", timestamp_field="event_ts")
stats = FeatureView("stats", [user], tx, ttl="30d",
                    schema=[Field("f0", Float64), Field("f1", Float64), Field("category", String)])
'''


@dataclass
class ServingProject:
    root: Path
    redis_url: str

    @property
    def config_file(self) -> Path:
        return self.root / "quiver.yaml"

    @property
    def offline(self) -> Path:
        return self.root / "data" / "offline"


def make_project(root: Path, redis_url: str, *, redis_timeout_s: float = 6.0, shadow: bool = True,
                 registry_url: str = "sqlite:///reg.db", offline_root: str = "data/offline") -> ServingProject:
    """Definitions, events, online values in Redis, and champion (+ shadow) versions with real artifacts."""
    from quiver.artifacts import ArtifactStore
    from quiver.config import load_config
    from quiver.registry import Registry
    from quiver.registry.models import ModelRegistry
    from tests.integration.test_prediction_service import BEAT_BASELINE, save_model

    (root / "feature_defs").mkdir(parents=True)
    (root / "feature_defs" / "defs.py").write_text(DEFS)
    (root / "data").mkdir()
    now = datetime.now(UTC).replace(microsecond=0)
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"user_id": np.arange(USERS, dtype=np.int64), "event_ts": pd.Timestamp(now - timedelta(hours=1)),
                          "f0": rng.normal(size=USERS), "f1": rng.normal(size=USERS),
                          "category": rng.choice(["a", "b"], USERS)})
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), root / "data" / "tx.parquet")
    (root / "quiver.yaml").write_text(f"project: p\nregistry_url: {registry_url}\nredis_url: {redis_url}\n"
                                      f"redis_timeout_s: {redis_timeout_s}\noffline_root: {offline_root}\n")
    config = load_config(root / "quiver.yaml")
    project = ServingProject(root, redis_url)
    write_online(project)
    registry = Registry(config.registry, project="p")
    models = ModelRegistry(registry, ArtifactStore.from_config(config))  # artifacts under <root>/.quiver
    for seed in (1, 2) if shadow else (1,):
        folder, sha = save_model(root / ".quiver" / "models", seed)
        models.register(MODEL, artifact_path=str(folder), sha256=sha, metrics=BEAT_BASELINE, window_start=now - timedelta(days=7),
                        cutoff=now, features=["f0", "f1", "category"], catalog_version=None, label_column="label",
                        lineage={}, reference_path=str(folder / "reference.parquet"))
    models.set_alias(MODEL, "champion", 1, expected=None, reason="test")
    if shadow:
        models.set_alias(MODEL, "shadow", 2, expected=None, reason="test")
    registry.close()
    return project


def write_online(project: ServingProject) -> None:
    """The users' last values into Redis, with the view's freshness marker (as materialization leaves it)."""
    from quiver.catalog.loader import load_catalog
    from quiver.config import load_config
    from quiver.offline.layout import last_values_schema
    from quiver.online.redis_store import RedisOnlineStore

    config = load_config(project.config_file)
    view = load_catalog(config.catalog_dir, config.root).views["stats"]
    table = pq.read_table(project.root / "data" / "tx.parquet")
    with RedisOnlineStore(project.redis_url, "p", timeout_s=5.0) as online:
        online.write_last_values(view, table.select(last_values_schema(view).names).cast(last_values_schema(view)))
        online.raise_freshness("stats", int(table["event_ts"].cast(pa.int64()).to_numpy().max()))


class Process:
    """One server process; `client` talks to it with the API key."""

    def __init__(self, project: ServingProject, *args: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.log = project.root / f"server-{self.port}.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from quiver.cli import main; main()", *args, "--port", str(self.port),
             "--config", str(project.config_file)],
            cwd=project.root, env={**os.environ, "QUIVER_API_KEY": KEY, "PYTHONPATH": f"{REPO}:{REPO / 'platform'}",
                                   **(env or {})},
            stdout=subprocess.DEVNULL, stderr=self.log.open("wb"))
        self.base = f"http://127.0.0.1:{self.port}"
        self.client = httpx.Client(base_url=self.base, timeout=10, headers={"X-API-Key": KEY})
        deadline = time.monotonic() + 120
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                self.client.get("/health", timeout=2)
                return
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"server did not answer:\n{self.log.read_text()[-3000:]}") from None
                time.sleep(0.1)

    def signal(self, sig: signal.Signals, timeout_s: float = 60) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout_s)

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def serve_model(project: ServingProject, *extra: str, env: dict[str, str] | None = None) -> Process:
    return Process(project, "serve-model", MODEL, "--poll-interval", "0.2", *extra, env=env)


def serve_features(project: ServingProject) -> Process:
    return Process(project, "serve")


def rows(users: list[int], tag: str) -> dict[str, object]:
    return {"rows": [{"request_id": f"{tag}-{i}", "entities": {"user_id": u}} for i, u in enumerate(users)]}
