"""Off-path scoring in a process of its own (`off_path="process"`, what `quiver serve-model` runs), on a real
Redis, real artifacts and a real child process: the shadow's and the paired scores are computed and logged
there (never by the serving process's models), equal the artifacts' own, follow a hot swap, survive the
child's death (the batch it held counted as dropped), and every row it was sent is written on close."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from quiver.models.artifact import load_model
from quiver.registry import rollouts
from quiver.serving.logs import ServingLogger, read_serving_logs
from tests.integration import test_prediction_service as prediction
from tests.integration.test_prediction_service import MODEL, Project, register, rows

project = prediction.project  # the fixture: a real Redis, registry and artifact store

pytestmark = pytest.mark.integration
# The off-path worker scores the requests it holds in one call: a float32 network's sums then run in another
# order than over one request alone, a few units in the last place of a float32 apart.
FLOAT32 = 1e-6


class Counting:
    """A loaded artifact that counts the calls made to it in this process (the child loads its own)."""

    def __init__(self, scorer: Any):
        self.scorer, self.calls = scorer, 0
        self.features, self.feature_refs = scorer.features, scorer.feature_refs
        self.version_label, self.path, self.sha256 = scorer.version_label, scorer.path, scorer.sha256

    def predict(self, columns: Any) -> np.ndarray:
        self.calls += 1
        return np.asarray(self.scorer.predict(columns))


def counting_loader(project: Project, loaded: dict[int, Counting]) -> Any:
    def load(version: Any) -> Counting:
        scorer = load_model(project.models.artifacts.local_dir(version.artifact_path),
                            expected_sha256=version.sha256, version_label=version.label)
        loaded[version.version] = Counting(scorer)
        return loaded[version.version]

    return load


def shadow_rows(project: Project, prefix: str) -> dict[str, tuple[str, float, str]]:
    logged = read_serving_logs(project.config.offline_dir, arm="shadow")
    return {r: (v, p, e) for r, v, p, e in zip(logged["request_id"].to_pylist(), logged["model_version"].to_pylist(),
                                                logged["prediction"].to_pylist(), logged["error"].to_pylist(),
                                                strict=True) if r.startswith(prefix)}


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_the_shadow_is_scored_where_the_mode_says_and_equals_its_artifact(project: Project, mode: str) -> None:
    v1 = register(project.models, project.root, seed=1)
    v2 = register(project.models, project.root, seed=2)
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="t")
    project.models.set_alias(MODEL, "shadow", v2, expected=None, reason="t")
    loaded: dict[int, Counting] = {}
    users = list(range(0, 400, 7))
    with ServingLogger(project.config.offline_dir) as logger, \
            project.service(logger=logger, loader=counting_loader(project, loaded), off_path=mode) as service:
        assert service.off_path_health()["mode"] == mode
        for k in range(5):
            service.predict(rows(users, f"a{k}-"))
        assert service.drain(60)
        logger.flush()
        stats = service.stats.snapshot()
        got = shadow_rows(project, "a")
    assert stats["shadow_rows"] == 5 * len(users) and stats["shadow_dropped"] == stats["shadow_errors"] == 0
    # Process mode: the serving process never called the shadow's model; the champion's it did.
    assert loaded[v1].calls == 5
    if mode == "process":
        assert loaded[v2].calls == 0
    else:
        assert loaded[v2].calls > 0
    want = project.scores(v2, users)
    for k in range(5):
        scores = [got[f"a{k}-{i}-{u}"] for i, u in enumerate(users)]
        assert {v for v, _, _ in scores} == {f"{MODEL}:{v2}"} and {e for _, _, e in scores} == {""}
        np.testing.assert_allclose([p for _, p, _ in scores], want, rtol=0, atol=FLOAT32)


def test_the_process_follows_a_hot_swap_survives_its_death_and_writes_everything_on_close(project: Project) -> None:
    v1 = register(project.models, project.root, seed=1)
    v2 = register(project.models, project.root, seed=2)
    v3 = register(project.models, project.root, seed=3)
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="t")
    project.models.set_alias(MODEL, "shadow", v2, expected=None, reason="t")
    users = list(range(1, 400, 5))
    logger = ServingLogger(project.config.offline_dir, flush_interval_s=3600)  # the child's writes on close only
    service = project.service(logger=logger, off_path="process").start()
    try:
        service.predict(rows(users, "s2-"))
        assert service.drain(60)
        process = service._off_path_queue.process
        assert process is not None
        # A signal to the whole process group (Ctrl-C, a stop of the unit) is the parent's to handle: the
        # child ignores it and keeps scoring until the parent stops it.
        os.kill(process._child.pid, signal.SIGTERM)
        os.kill(process._child.pid, signal.SIGINT)
        service.predict(rows(users, "s2b-"))
        assert service.drain(60) and process.restarts == 0

        project.models.set_alias(MODEL, "shadow", v3, expected=v2, reason="swap")
        assert service.refresh()
        service.predict(rows(users, "s3-"))
        assert service.drain(60)

        process._child.kill()  # the child dies: its batch is counted, and the next one is scored again
        process._child.join(10)
        service.predict(rows(users, "dead-"))
        assert service.drain(60)
        assert process.restarts == 1 and service.stats.snapshot()["shadow_dropped"] == len(users)
        service.predict(rows(users, "after-"))

        # A canary: the champion's paired scores of its rows go through the process too.
        project.models.set_alias(MODEL, "canary", v3, expected=None, reason="t")
        rollouts.start_rollout(project.registry, MODEL, champion_version=v1, canary_version=v3, fraction=0.5,
                               settings={}, salt="s")
        assert service.refresh()
        answer = service.predict(rows(users, "pair-"))
    finally:
        service.close()
        logger.close()
    health = service.off_path_health()
    assert health["mode"] == "process" and health["serving_log"]["status"] == "closed"
    got = shadow_rows(project, "")
    for prefix, version in (("s2-", v2), ("s2b-", v2), ("s3-", v3), ("after-", v3)):
        scores = [got[f"{prefix}{i}-{u}"] for i, u in enumerate(users)]
        assert {v for v, _, _ in scores} == {f"{MODEL}:{version}"}, prefix
        np.testing.assert_allclose([p for _, p, _ in scores], project.scores(version, users), rtol=0, atol=FLOAT32)
    assert not any(r.startswith("dead-") for r in got)  # dropped, and counted above
    paired = read_serving_logs(project.config.offline_dir, arm="paired")
    on_canary = [p.request_id for p in answer if p.arm == "canary"]
    assert on_canary and sorted(paired["request_id"].to_pylist()) == sorted(on_canary)
    assert paired["model_version"].to_pylist() == [f"{MODEL}:{v1}"] * len(on_canary)
    # What the second child wrote (the first one's rows were flushed by each drain before it was killed): the
    # "after-" and "pair-" shadow rows and the paired rows.
    assert health["serving_log"]["written_rows"] == 2 * len(users) + len(on_canary)


def test_an_artifact_the_process_cannot_load_logs_its_rows_as_errors(project: Project) -> None:
    v1 = register(project.models, project.root, seed=1)
    v2 = register(project.models, project.root, seed=2)
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="t")
    project.models.set_alias(MODEL, "shadow", v2, expected=None, reason="t")
    users = list(range(3, 400, 9))
    with ServingLogger(project.config.offline_dir) as logger, \
            project.service(logger=logger, off_path="process") as service:
        folder = Path(service.arms.shadow.model.path)  # type: ignore[union-attr]
        weights = folder / "weights.pt"
        weights.chmod(0o600)
        weights.write_bytes(weights.read_bytes()[:-16] + b"\x00" * 16)  # damaged after the parent loaded it
        answer = service.predict(rows(users, "bad-"))
        assert service.drain(60)
        stats = service.stats.snapshot()
    assert [p.score for p in answer] == pytest.approx(list(project.scores(v1, users)))  # responses unchanged
    assert stats["shadow_errors"] == stats["shadow_rows"] == len(users)
    got = shadow_rows(project, "bad-")
    assert len(got) == len(users)
    assert all(p is None and "cannot load" in e and "checksum" in e for _, p, e in got.values())


def test_the_process_says_when_its_log_cannot_be_written_and_when_it_recovers(project: Project) -> None:
    """Its log's state reaches the server between jobs too: a failure shows, and so does the recovery with no
    request after it (the server's /health reads `off_path_health`)."""
    v1 = register(project.models, project.root, seed=1)
    v2 = register(project.models, project.root, seed=2)
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="t")
    project.models.set_alias(MODEL, "shadow", v2, expected=None, reason="t")
    folder = project.config.offline_dir / "serving_logs"
    users = list(range(2, 400, 11))
    with ServingLogger(project.config.offline_dir, flush_interval_s=0.2) as logger, \
            project.service(logger=logger, off_path="process") as service:
        service.predict(rows(users, "warm-"))
        assert service.drain(60)
        folder.rename(folder.with_name("aside"))
        folder.write_text("not a folder")
        service.predict(rows(users, "held-"))
        assert service.drain(60)  # the child's flush fails: its rows wait for a retry
        assert until(lambda: service.off_path_health()["serving_log"]["status"] == "failing")
        folder.unlink()
        folder.with_name("aside").rename(folder)
        assert until(lambda: service.off_path_health()["serving_log"]["status"] == "ok")
    assert len(shadow_rows(project, "held-")) == len(users)  # written once the folder was back


def until(check: Any, timeout_s: float = 60.0) -> bool:
    import time

    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def test_a_hung_process_cannot_hang_the_stop(project: Project) -> None:
    """A child that stops answering (SIGSTOP: its pipe fills, the server's sends block) is killed on the stop;
    what it held is counted as dropped, and nothing is started in its place."""
    import time

    v1 = register(project.models, project.root, seed=1)
    v2 = register(project.models, project.root, seed=2)
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="t")
    project.models.set_alias(MODEL, "shadow", v2, expected=None, reason="t")
    users = list(range(400))
    logger = ServingLogger(project.config.offline_dir)
    service = project.service(logger=logger, off_path="process").start()
    process = service._off_path_queue.process
    assert process is not None
    service.predict(rows(users, "before-"))
    assert service.drain(60)
    process.stop_timeout_s = 2.0
    child = process._child
    os.kill(child.pid, signal.SIGSTOP)
    try:
        sent = 0
        for k in range(40):  # ~40 batches of 400 rows: far more than a pipe holds
            service.predict(rows(users, f"hung{k}-"))
            sent += len(users)
            time.sleep(0.06)
        began = time.monotonic()
        service.close()
        took = time.monotonic() - began
    finally:
        if child.is_alive():
            os.kill(child.pid, signal.SIGKILL)
        logger.close()
    stats = service.stats.snapshot()
    assert not child.is_alive() and process.restarts == 0 and took < 30
    assert stats["shadow_dropped"] > 0
    assert stats["shadow_rows"] + stats["shadow_dropped"] == len(users) + sent
    assert len(shadow_rows(project, "before-")) == len(users)


def test_a_busy_machine_cannot_starve_the_stop(project: Project) -> None:
    """The child runs in the idle class, which gets no CPU while anything else wants it. Stopped with every
    core busy (here: busy processes, on CI the rest of the suite), and while it may still be starting, it
    leaves that class and writes what it holds; before, it did not answer and its rows were dropped (a
    prediction server then took over a minute to stop)."""
    import subprocess
    import sys

    v1 = register(project.models, project.root, seed=1)
    v2 = register(project.models, project.root, seed=2)
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="t")
    project.models.set_alias(MODEL, "shadow", v2, expected=None, reason="t")
    users = list(range(5, 400, 13))
    logger = ServingLogger(project.config.offline_dir, flush_interval_s=3600)
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 * (os.cpu_count() or 1) + 2)]
    try:
        service = project.service(logger=logger, off_path="process").start()
        process = service._off_path_queue.process
        assert process is not None
        process.stop_timeout_s = 40.0
        service.predict(rows(users, "busy-"))
        service.close()
    finally:
        for hog in busy:
            hog.kill()
        logger.close()
    stats = service.stats.snapshot()
    assert stats["shadow_dropped"] == 0 and stats["shadow_rows"] == len(users)
    assert len(shadow_rows(project, "busy-")) == len(users)
