"""Fault injection at every step boundary of the loop: kill a task between two of its writes, retry it, and
check that the loop's state is what it would have been without the crash.

The world is real (Redis, the prediction service writing serving logs, artifacts, SQLite registry, a webhook
sink on loopback counting deliveries). The loop's tasks run in-process, one after another, as the DAGs run
them: retrain gate → shadow start → shadow verdict → canary start → canary step (promote) → watch (confirm),
then a second candidate rolled back by the judge. For each task, a dry run lists the crash points it passes
(`quiver.monitoring.faults`); then for every point the registry is restored to its state before the task,
the task is killed there (`InjectedCrash`, which no handler on the way swallows), retried, and checked:

1. one champion, and it is a registered version;
2. no alias points at a version whose last rollout was rolled back or halted;
3. every decision is applied at most once: its alias moves appear once in the history;
4. every alert is delivered exactly once (after a later redelivery pass for claims whose sender died);
5. the state after crash + retry equals the state of the run without a crash (aliases, rollouts, decisions,
   alerts), so the next interval starts from where it should — the loop can make progress.
"""

from __future__ import annotations

import http.server
import json
import sqlite3
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from quiver.monitoring import faults
from quiver.monitoring.labels import write_labels
from quiver.pipelines.loop_common import Project as LoopProject
from quiver.registry import rollouts
from quiver.serving.logs import ServingLogger
from tests.integration.test_prediction_service import MODEL, USERS, Project, project, register, rows

pytestmark = pytest.mark.integration
__all__ = ["project"]

INVARIANTS = ("one registered champion", "no alias on a rolled-back candidate", "decisions applied at most once",
              "alerts delivered exactly once", "same state as without the crash")


class Webhook:
    """A Slack-compatible webhook on loopback that counts what it receives, per alert id."""

    def __init__(self) -> None:
        self.received: Counter[str] = Counter()
        received = self.received

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                received[body["blocks"][-1]["elements"][0]["text"].split(" ·")[0]] += 1  # "alert #N"
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def world(project: Project, tmp_path: Path) -> Iterator[tuple[Project, Webhook]]:
    hook = Webhook()
    # The gate off: this world runs no consistency job (its tasks are the crash points under test), and the gate's
    # own holds are tested in tests/unit/test_consistency_gate.py and test_consistency_job.py.
    (tmp_path / "monitoring.yaml").write_text(f"alert_sinks:\n  - {{type: webhook, url: '{hook.url}', attempts: 1}}\n"
                                              "consistency_gate: false\n")
    project.config = replace(project.config, loop_canary_steps="0.5,1.0", loop_canary_min_rows=300,
                             loop_canary_judge="log_loss_floor=0.08,brier_floor=0.05,error_rate_floor=0.05,"
                                               "latency_exceedance_floor=0.5,score_shift_floor=0.2,watch_hours=1")
    yield project, hook
    hook.close()


def serve(project: Project, seed: int, truth_version: int) -> None:
    """Every user three times through the service (one row a call), labels from `truth_version` arriving
    now."""
    rng = np.random.default_rng(seed)
    truth = dict(zip(range(USERS), project.scores(truth_version, list(range(USERS))), strict=True))
    ids: list[str] = []
    with ServingLogger(project.config.offline_dir) as logger, project.service(logger=logger) as service:
        for b in range(3):
            for user in range(USERS):
                ids += [p.request_id for p in service.predict(rows([user], prefix=f"f{seed}-{b}-"))]
        assert service.drain(30)
    write_labels(project.config.offline_dir, ids, [float(rng.random() < truth[int(i.split("-")[-1])]) for i in ids])


def snapshot(project: Project, to: Path) -> None:
    source = sqlite3.connect(project.config.registry.removeprefix("sqlite:///"))
    target = sqlite3.connect(to)
    source.backup(target)
    source.close()
    target.close()


def restore(project: Project, frm: Path) -> None:
    project.registry.engine.dispose()
    source = sqlite3.connect(frm)
    target = sqlite3.connect(project.config.registry.removeprefix("sqlite:///"))
    source.backup(target)
    source.close()
    target.close()


def state(loop: LoopProject) -> dict[str, Any]:
    """What must come out the same with or without a crash (no timestamps, no ids of retried rows)."""
    registry = loop.registry
    decisions = rollouts.list_decisions(registry, MODEL, limit=1000)
    return {"aliases": loop.models.aliases(MODEL),
            "rollouts": [(r.canary_version, r.status, r.step, r.fraction) for r in rollouts.list_rollouts(registry, MODEL)],
            "decisions": sorted((d.kind, d.outcome, d.applied_at is not None, _moves(d.actions)) for d in decisions),
            "history": [(m.alias, m.from_version, m.to_version) for m in loop.models.history(MODEL)],
            "alerts": sorted((a.kind, a.subject, a.status) for a in all_alerts(loop))}


def _moves(actions: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(a for a in actions if not a.startswith("alert #"))


def all_alerts(loop: LoopProject) -> list[Any]:
    from quiver.monitoring.repository import list_alerts

    return list_alerts(loop.registry, None, limit=10_000)


def check(loop: LoopProject, hook: Webhook, expected: dict[str, Any], known: set[int]) -> list[str]:
    """The invariants (module docstring) on what a task did (alerts it raised: not in `known`); returns the
    ones broken."""
    broken = []
    aliases = loop.models.aliases(MODEL)
    champion = aliases.get("champion")
    if champion is None or loop.models.get(MODEL, champion).status != "registered":
        broken.append(INVARIANTS[0])
    ended = rollouts.ended_candidacies(loop.registry, MODEL)
    if any(aliases.get(a) in ended for a in ("canary", "challenger", "shadow")):
        broken.append(INVARIANTS[1])
    history = Counter(m.decision_id for m in loop.models.history(MODEL) if m.decision_id is not None)
    for decision in rollouts.list_decisions(loop.registry, MODEL, limit=1000):
        moves = [a for a in decision.actions if ("→" in a and not a.startswith("fraction")) or a.endswith("removed")]
        # A champion move records `previous` too, in the same transaction: one extra history row.
        extra = sum(a.startswith("champion") for a in moves)
        if history.get(decision.id, 0) not in (0, len(moves) + extra):
            broken.append(INVARIANTS[2])
            break
    loop.alerts.redeliver(lease_s=0)  # later: a claim whose sender died is taken over
    alerts = [a for a in all_alerts(loop) if a.id not in known]
    if any(hook.received.get(f"alert #{a.id}", 0) != 1 for a in alerts) or \
            any(a.delivery_status != "delivered" for a in alerts):
        broken.append(INVARIANTS[3])
    if state(loop) != expected:
        broken.append(INVARIANTS[4])
    return broken


def test_a_crash_between_any_two_writes_of_a_loop_task_and_a_retry_leave_the_loop_consistent(
        world: tuple[Project, Webhook], tmp_path: Path) -> None:
    from quiver.monitoring import canary_judge
    from quiver.pipelines import loop_drift, loop_retrain, loop_rollout, loop_shadow

    project, hook = world
    v1 = register(project.models, project.root, seed=1, spread=40.0, labelled_reference=True)
    v2 = register(project.models, project.root, seed=1, spread=40.0, labelled_reference=True)  # as good
    v3 = register(project.models, project.root, seed=5, spread=40.0, labelled_reference=True)  # worse
    v4 = register(project.models, project.root, seed=7, spread=40.0, labelled_reference=True)
    v5 = register(project.models, project.root, seed=9, spread=40.0, labelled_reference=True)  # worse
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="first")
    serve(project, 0, v1)
    t0 = datetime.now(UTC)
    clock: dict[str, datetime] = {}  # each task's moment, fixed before it runs (as a DAG run fixes its as-of)

    def loop() -> LoopProject:
        return LoopProject(project.config)

    def _now() -> datetime:
        return clock["now"]

    def challenger(version: int) -> Callable[[], None]:
        def make() -> None:
            project.models.set_alias(MODEL, "challenger", version, expected=None, reason="trained by hand")
        return make

    tasks: list[tuple[str, Callable[[], Any], Callable[[], None] | None]] = [
        ("drift check", lambda: loop_drift.check_serving_drift(loop(), MODEL, _now() - timedelta(hours=1), _now(),
                                                               report_html=False, run="harness-run"), None),
        ("retrain gate", lambda: loop_retrain.gate_step(loop(), MODEL, v2), None),
        ("shadow start", lambda: loop_shadow.start_shadow(loop(), MODEL), lambda: serve(project, 1, v1)),
        ("shadow verdict", lambda: loop_shadow.shadow_verdict(loop(), MODEL, _now(), min_pairs=300), None),
        ("canary start", lambda: loop_rollout.start_canary(loop(), MODEL, at=_now()),
         lambda: serve(project, 2, v1)),
        ("canary step (promote)", lambda: loop_rollout.canary_step(loop(), MODEL, _now()),
         lambda: serve(project, 3, v1)),
        ("watch (confirm)", lambda: loop_rollout.canary_step(loop(), MODEL, _now() + timedelta(hours=2)), None),
        ("canary start (bad)", lambda: loop_rollout.start_canary(loop(), MODEL, version=v3, at=_now()),
         lambda: serve(project, 4, v2)),
        ("canary step (roll back)", lambda: loop_rollout.canary_step(loop(), MODEL, _now()), challenger(v5)),
        ("shadow start (bad)", lambda: loop_shadow.start_shadow(loop(), MODEL), lambda: serve(project, 5, v2)),
        ("shadow verdict (worse)", lambda: loop_shadow.shadow_verdict(loop(), MODEL, _now(), min_pairs=300), None),
        ("canary start (by hand)", lambda: loop_rollout.start_canary(loop(), MODEL, version=v4, at=_now()), None),
        ("manual rollback", lambda: canary_judge.rollback(project.config, MODEL, reason="operator: looks wrong"),
         None),
    ]
    report: list[tuple[str, int, int]] = []
    for name, task, then in tasks:
        clock["now"] = datetime.now(UTC)
        before = tmp_path / f"before-{len(report)}.db"
        snapshot(project, before)
        known = {a.id for a in all_alerts(loop())}
        hook.received.clear()
        with faults.record() as plan:
            task()
        expected = state(loop())
        assert not check(loop(), hook, expected, known), name  # the run without a crash is consistent itself
        after = tmp_path / f"after-{len(report)}.db"
        snapshot(project, after)
        for point in range(len(plan.passed)):
            restore(project, before)
            hook.received.clear()
            with pytest.raises(faults.InjectedCrash), faults.inject(faults.FaultPlan(crash_at=point)):
                task()
            task()  # the retry
            broken = check(loop(), hook, expected, known)
            assert not broken, f"{name}: crash at #{point} {plan.passed[point]!r}: broken {broken}"
        report.append((name, len(plan.passed), len(INVARIANTS)))
        restore(project, after)
        if then is not None:
            then()
    print("\n".join(f"{n:<26} {k:>3} crash points × {i} invariants held" for n, k, i in report))
    total = sum(k for _, k, _ in report)
    assert total >= 35, report  # every task with two or more writes has points between them
    final = loop().models.aliases(MODEL)
    assert final == {"champion": v2, "previous": v1}  # challenger v5 rejected in shadow, v3 and v4 rolled back
    assert rollouts.ended_candidacies(loop().registry, MODEL).keys() == {v3, v4}
    assert t0 < datetime.now(UTC)

