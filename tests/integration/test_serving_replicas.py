"""Several prediction servers, one store (issue 50): two `quiver serve-model` replicas, each started from its
own copy of the project folder (no shared disk), one Postgres registry, one Redis, a moto S3 server as the
store root. Every reader on a third host (here: a third folder) reads the rows of both; a store that goes
away for 15 s under load costs no row (the spool), and neither does a SIGTERM."""

from __future__ import annotations

import contextlib
import shutil
import signal
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pyarrow.compute as pc
import pytest

from quiver.config import load_config
from quiver.offline.store import store_for
from quiver.serving.logs import read_serving_logs
from quiver.serving.logs.compact import compact
from quiver.serving.logs.read import log_files
from tests.cli_runs import quiver
from tests.harness import TcpProxy
from tests.serving_processes import KEY, MODEL, USERS, ServingProject, make_project, rows, serve_model

pytestmark = pytest.mark.integration

BUCKET = "quiver-replicas"


def store_root(s3_server: Any, endpoint: str | None = None) -> str:
    """A fresh prefix of the test bucket, reached directly or through `endpoint` (a proxy)."""
    with contextlib.suppress(OSError):  # made by an earlier test
        s3_server.create_bucket(BUCKET)
    uri = s3_server.uri(BUCKET, f"store-{uuid.uuid4().hex[:8]}")
    return uri if endpoint is None else uri.replace(s3_server.endpoint, endpoint)


def copy_of(project: ServingProject, folder: Path) -> ServingProject:
    """Another host's copy of the project folder (its own .quiver, spool and artifacts; nothing shared)."""
    shutil.copytree(project.root, folder, ignore=shutil.ignore_patterns("server-*.log", "spool"))
    return ServingProject(folder, project.redis_url)


def wait_for(predicate: Any, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def send(server: Any, tag: str, requests: int, size: int) -> int:
    """`requests` predictions of `size` rows each; returns the rows answered (every one must be)."""
    answered = 0
    for k in range(requests):
        users = [(k * size + i) % USERS for i in range(size)]
        response = server.client.post("/predict", json=rows(users, f"{tag}{k}"))
        assert response.status_code == 200, response.text
        answered += len(response.json()["predictions"])
    return answered


class Load:
    """Two-row predictions in a thread until `stop`: the ids answered (`sent`, with when) and the requests
    refused while the server was meant to be up (`refused`; none is acceptable before `stopping` is set)."""

    def __init__(self, server: Any, tag: str) -> None:
        self.server, self.tag = server, tag
        self.sent: list[tuple[float, str]] = []
        self.refused: list[str] = []
        self.stop, self.stopping = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    @property
    def ids(self) -> list[str]:
        return [rid for _, rid in self.sent]

    def _run(self) -> None:
        k = 0
        with httpx.Client(base_url=self.server.base, timeout=10, headers={"X-API-Key": KEY}) as client:
            while not self.stop.is_set():
                body = rows([k % USERS, (k + 1) % USERS], f"{self.tag}{k}-")
                try:
                    response = client.post("/predict", json=body)
                    failure = "" if response.status_code == 200 else response.text
                except httpx.HTTPError as exc:
                    failure = repr(exc)
                if failure:  # not acknowledged; the server is stopping, or this is a defect
                    if not self.stopping.is_set():
                        self.refused.append(failure)
                    return
                now = time.monotonic()
                self.sent.extend((now, r["request_id"]) for r in body["rows"])  # type: ignore[index]
                k += 1
                time.sleep(0.01)

    def end(self) -> None:
        self.stopping.set()
        self.stop.set()
        self.thread.join(15)


def test_two_replicas_one_store_every_reader_reads_both(tmp_path: Path, redis_url: str, pg_url: str,
                                                        s3_server: Any) -> None:
    from quiver.catalog.loader import load_catalog
    from quiver.monitoring import canary_judge
    from quiver.monitoring.canary_stats import JudgeSettings
    from quiver.monitoring.consistency_job import run_consistency
    from quiver.registry import Registry
    from quiver.registry.models import ModelRegistry

    first = make_project(tmp_path / "host-a", redis_url, registry_url=pg_url, offline_root=store_root(s3_server))
    second, reader = copy_of(first, tmp_path / "host-b"), copy_of(first, tmp_path / "host-c")
    config = load_config(first.config_file)
    models = ModelRegistry(Registry(config.registry, project=config.project))
    models.set_alias(MODEL, "shadow", None, expected=2, reason="the canary takes version 2")
    canary_judge.start_canary(config, MODEL, 2, settings=JudgeSettings(steps=(0.5, 1.0), min_rows=10, min_labels=5))
    began = datetime.now(UTC) - timedelta(seconds=1)
    servers = [serve_model(first, env={"QUIVER_REPLICA_ID": "replica-a"}),
               serve_model(second, env={"QUIVER_REPLICA_ID": "replica-b"})]
    try:
        for server in servers:  # each has picked up the rollout from the shared registry
            wait_for(lambda s=server: s.client.get("/health").json().get("canary_fraction") == 0.5, "the canary")
        sent = sum(send(server, f"{name}-", requests=30, size=7) for name, server in zip("ab", servers, strict=True))
    finally:
        for server in servers:
            assert server.signal(signal.SIGTERM) == 0  # a stop writes everything it logged
            server.stop()
    ended = datetime.now(UTC) + timedelta(seconds=1)

    reader_config = load_config(reader.config_file)
    logged = read_serving_logs(store_for(reader_config), began, ended)
    answering = logged.filter(pc.is_in(logged["arm"], pc.cast(["champion", "canary"], "string")))
    assert answering.num_rows == sent == 2 * 30 * 7
    by_replica = answering.group_by("replica").aggregate([("request_id", "count")]).to_pydict()
    assert dict(zip(by_replica["replica"], by_replica["request_id_count"], strict=True)) == \
        {"replica-a": 210, "replica-b": 210}
    names = [p.rsplit("/", 1)[-1] for p in store_for(reader_config).files_under(store_for(reader_config).base)]
    assert any("-replica-a-" in n for n in names) and any("-replica-b-" in n for n in names)
    assert not (first.root / "data" / "offline").exists()  # nothing on a local disk

    # Labels written on one host are read on another.
    from quiver.monitoring.labels import read_labels, write_labels

    ids = answering["request_id"].to_pylist()
    write_labels(store_for(load_config(second.config_file)), ids, [i % 2 for i in range(len(ids))], ended)
    assert sorted(read_labels(store_for(reader_config))["request_id"].to_pylist()) == sorted(ids)

    # The judge, from the third folder, counts every routed row of both replicas, by arm.
    outcome = canary_judge.judge_step(reader_config, MODEL, as_of=ended, dry_run=True)
    routed = pc.value_counts(answering["arm"]).to_pylist()
    expected = {item["values"]: item["counts"] for item in routed}
    assert outcome.verdict.champion["rows"] == expected["champion"]
    assert outcome.verdict.canary["rows"] == expected["canary"]
    assert outcome.verdict.champion["rows"] + outcome.verdict.canary["rows"] == sent

    # Compaction from the third folder (the CLI an hourly task runs): one file an hour, the same rows, and the
    # judge's counts unchanged.
    files_before = len(log_files(store_for(reader_config), began, ended))
    hours = quiver("logs", "hours", "--start", began.isoformat(), "--end", ended.isoformat(), cwd=reader.root)
    assert hours.returncode == 0 and "replica-a" in hours.stdout and "replica-b" in hours.stdout, hours.stdout
    done = quiver("logs", "compact", "--start", began.isoformat(), "--end", ended.isoformat(), "--open-hours",
                  cwd=reader.root)
    assert done.returncode == 0 and "files → 1" in done.stdout, done.stdout + done.stderr
    assert len(log_files(store_for(reader_config), began, ended)) < files_before
    compacted = read_serving_logs(store_for(reader_config), began, ended)
    assert sorted(compacted["request_id"].to_pylist()) == sorted(logged["request_id"].to_pylist())
    again = canary_judge.judge_step(reader_config, MODEL, as_of=ended, dry_run=True)
    assert again.verdict.champion["rows"] == expected["champion"] and again.verdict.canary["rows"] == expected["canary"]

    # The consistency job, from the third folder, reads both replicas' rows too (against the offline values
    # a backfill there wrote into the same store).
    from quiver.offline.backfill import backfill

    catalog = load_catalog(reader_config.catalog_dir, reader_config.root)
    backfill(reader_config, catalog, (began - timedelta(days=1)).date(), ended.date())
    check = run_consistency(reader_config, model=MODEL, start=began, end=ended, record=False, catalog=catalog)
    assert check.report.rows_logged == sent


def test_a_store_outage_under_load_loses_nothing(tmp_path: Path, redis_url: str, s3_server: Any) -> None:
    """The store unreachable for 15 s while requests keep coming: serving goes on, /health says degraded with
    the spool's size, then everything uploads; every acknowledged row is in the store exactly once, and a
    SIGTERM under load loses none either."""
    proxy = TcpProxy(s3_server.endpoint)
    project = make_project(tmp_path / "host", redis_url, offline_root=store_root(s3_server, proxy.endpoint),
                           shadow=False)
    server = serve_model(project, "--log-flush-interval", "0.5", env={"QUIVER_REPLICA_ID": "solo"})
    load = Load(server, "load")
    try:
        wait_for(lambda: len(load.sent) > 100, "traffic")
        proxy.cut()
        down_at = time.monotonic()
        wait_for(lambda: server.client.get("/health").json().get("serving_log", {}).get("spooled_rows", 0) > 0,
                 "the spool to fill", timeout_s=30)
        health = server.client.get("/health").json()
        assert health["status"] == "degraded" and health["serving_log"]["status"] == "spooling"
        assert any(r["reason"] == "serving_log_spooling" for r in health["reasons"])
        time.sleep(max(0.0, 15 - (time.monotonic() - down_at)))
        assert load.thread.is_alive() and not load.refused  # serving went on
        proxy.restore()
        wait_for(lambda: server.client.get("/health").json()["serving_log"]["spooled_rows"] == 0,
                 "the spool to drain", timeout_s=90)
        assert server.client.get("/health").json()["status"] == "ok"
        time.sleep(1)  # more traffic after the outage, then a stop under load
        assert not load.refused and load.thread.is_alive()
        load.stopping.set()
        assert server.signal(signal.SIGTERM) == 0
    finally:
        load.end()
        server.stop()
    acknowledged = set(load.ids)
    store = store_for(load_config(project.config_file))
    far = datetime.now(UTC) + timedelta(hours=3)
    compact(store, far - timedelta(days=1), far, now=far)  # after compaction too: each row once
    logged = read_serving_logs(store)
    ids = logged["request_id"].to_pylist()
    assert len(ids) == len(set(ids))  # exactly once
    assert acknowledged <= set(ids)  # every acknowledged row (a request refused at the stop was not answered)
    assert not list((project.root / ".quiver" / "spool").rglob("*.parquet"))  # the spool is empty again
    proxy.close()


def test_a_killed_replica_loses_at_most_its_unflushed_rows_and_the_next_start_counts_them(
        tmp_path: Path, redis_url: str) -> None:
    """kill -9 under load: the rows logged since the last flush are gone (at most one flush interval), and
    the replica's next start settles the dead process's journal: the hour's accounts say how many were lost
    (within the journal's one-second cadence), and a clean stop leaves no journal to settle."""
    from quiver.serving.logs.accounts import read_accounts

    project = make_project(tmp_path / "host", redis_url, shadow=False)
    env = {"QUIVER_REPLICA_ID": "victim"}
    server = serve_model(project, "--log-flush-interval", "3", env=env)
    load = Load(server, "kill")
    time.sleep(7.5)  # two flushes, then half of the next interval
    load.stopping.set()
    server.proc.kill()
    server.proc.wait(30)
    load.end()
    server.stop()
    store = store_for(load_config(project.config_file))
    acknowledged, sent = set(load.ids), load.sent
    lost = acknowledged - set(read_serving_logs(store)["request_id"].to_pylist())
    rate = len(sent) / (sent[-1][0] - sent[0][0])
    assert 0 < len(lost) <= rate * 3.5, (len(lost), rate)  # at most one flush interval (3 s) and a little
    journals = project.root / ".quiver" / "spool" / "victim" / "_journal"
    [dead] = list(journals.glob("*.json"))  # the dead process's journal

    again = serve_model(project, "--log-flush-interval", "3", env=env)  # the replica comes back
    wait_for(lambda: not dead.exists(), "the dead process's journal to be settled", timeout_s=30)
    assert again.signal(signal.SIGTERM) == 0
    again.stop()
    counted = sum(read_accounts(store).dropped.get("killed", {}).values())
    assert len(lost) - rate * 1.5 <= counted <= len(lost), (counted, len(lost), rate)
    assert not list(journals.glob("*.json"))  # settled, and the clean stop left none
