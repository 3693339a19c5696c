"""The loop's state cannot be reversed or wedged by a manual action, a retry or a slow poll: each reproduction
of issue 20 on the real parts (Redis, the prediction service, artifacts, the registry, the `quiver` CLI)."""

from __future__ import annotations

import shutil
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from quiver.catalog.errors import QuiverError
from quiver.monitoring.canary_judge import apply_decision, judge_step, rollback, start_canary
from quiver.monitoring.canary_stats import JudgeSettings
from quiver.monitoring.labels import write_labels
from quiver.pipelines.loop_common import Project as LoopProject
from quiver.registry import rollouts
from quiver.serving.logs import ServingLogger, read_serving_logs
from tests.cli_runs import done, quiver
from tests.integration.test_canary_rollout import SETTINGS, serve
from tests.integration.test_prediction_service import MODEL, USERS, Project, project, register, rows

pytestmark = pytest.mark.integration
__all__ = ["project"]


def test_a_promote_decided_before_a_manual_rollback_and_applied_after_it_does_nothing(project: Project) -> None:
    v1 = register(project.models, project.root, seed=1)
    v2 = register(project.models, project.root, seed=1)
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="first")
    start_canary(project.config, MODEL, v2, settings=SETTINGS)
    _, moment = serve(project, batches=14, seed=1, truth=v1)
    decided = judge_step(project.config, MODEL, as_of=moment, apply=False)
    assert decided.verdict.outcome == "promote" and decided.decision is not None
    rollback(project.config, MODEL, reason="operator: pulled it")
    actions = apply_decision(project.config, decided.decision)
    assert actions and actions[0].startswith("stale"), actions
    assert project.models.aliases(MODEL) == {"champion": v1}  # the rolled-back canary never becomes champion
    stored = rollouts.get_decision(project.registry, decided.decision.id)
    assert stored.applied_at is not None and stored.actions == actions  # carried out (as nothing) once


def test_a_rollback_ends_the_candidacy_and_the_loop_never_canaries_that_version_again(project: Project) -> None:
    from quiver.pipelines.loop_rollout import start_canary as loop_start

    v1 = register(project.models, project.root, seed=1)
    v2 = register(project.models, project.root, seed=2)
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="first")
    project.models.set_alias(MODEL, "challenger", v2, expected=None, reason="trained")
    start_canary(project.config, MODEL, v2, settings=SETTINGS)
    rollback(project.config, MODEL, reason="operator: looks wrong")
    assert project.models.aliases(MODEL) == {"champion": v1}  # challenger gone with the canary
    # The next hourly run finds no candidate; asked for v2 by name it refuses unless told "again".
    assert loop_start(LoopProject(project.config), MODEL)["status"] == "waiting"
    with pytest.raises(QuiverError, match="rolled back in rollout"):
        start_canary(project.config, MODEL, v2, settings=SETTINGS)
    again = start_canary(project.config, MODEL, v2, settings=SETTINGS, again=True)
    assert again.status == rollouts.RUNNING


def test_an_arm_that_failed_to_load_once_is_swapped_in_as_soon_as_it_loads(project: Project) -> None:
    v1 = register(project.models, project.root, seed=1)
    v2 = register(project.models, project.root, seed=2)
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="first")
    start_canary(project.config, MODEL, v2, settings=JudgeSettings(steps=(0.99, 1.0)))
    artifact = project.models.artifacts.local_dir(project.models.get(MODEL, v2).artifact_path)
    hidden = artifact.with_name(artifact.name + ".away")
    artifact.rename(hidden)  # the artifact store is briefly unreadable
    service = project.service(retry_base_s=0.05)
    assert service.arms.canary is not None and service.arms.canary.model is None
    first = service.predict(rows(list(range(50))))
    assert all(p.arm == "champion" for p in first) and any(p.fallback for p in first)
    hidden.rename(artifact)
    time.sleep(0.1)  # past the first backoff
    assert service.refresh()  # the loaded arm replaces the failed one
    served = service.predict(rows(list(range(50)), prefix="again-"))
    assert sum(p.arm == "canary" for p in served) > 40 and not any(p.fallback for p in served)
    service.close()


def test_rows_routed_before_a_step_change_never_count_in_the_new_step(project: Project) -> None:
    v1 = register(project.models, project.root, seed=1)
    v2 = register(project.models, project.root, seed=1)
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="first")
    settings = JudgeSettings(steps=(0.05, 0.5, 1.0), min_rows=100, min_labels=100)
    rollout = start_canary(project.config, MODEL, v2, settings=settings)
    with ServingLogger(project.config.offline_dir) as logger, project.service(logger=logger) as service:
        service.predict(rows(list(range(USERS))))
        # The judge advances the step; this server polls later and routes more rows at the old 5 %.
        assert rollouts.advance_rollout(project.registry, rollout.id, from_step=0, fraction=0.5,
                                        at=datetime.now(UTC))
        for b in range(3):
            service.predict(rows(list(range(USERS)), prefix=f"late{b}-"))
    logged = read_serving_logs(project.config.offline_dir).to_pandas()
    served = logged[logged["arm"] != "paired"]
    assert set(served["rollout_step"]) == {0} and set(served["canary_fraction"]) == {0.05}
    # Judged at step 1 (50 %), the 5 % rows would look like a sample-ratio mismatch: they are not counted.
    outcome = judge_step(project.config, MODEL, as_of=datetime.now(UTC) + timedelta(seconds=1))
    assert outcome.verdict.outcome == "hold" and "no traffic" in outcome.verdict.reason
    assert outcome.rollout.status == rollouts.RUNNING


def loop_project(project: Project, **settings: object) -> LoopProject:
    return LoopProject(replace(project.config, **settings))


def test_the_shadow_sensor_sees_labels_that_arrive_after_the_interval_and_no_shadow_during_a_rollout(
        project: Project) -> None:
    from quiver.pipelines.loop_shadow import labelled_pairs, shadow_verdict, start_shadow

    v1 = register(project.models, project.root, seed=1)
    v2 = register(project.models, project.root, seed=1)
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="first")
    project.models.set_alias(MODEL, "challenger", v2, expected=None, reason="trained")
    loop = loop_project(project)
    assert start_shadow(loop, MODEL)["status"] == "shadowing"
    ids: list[str] = []
    with ServingLogger(project.config.offline_dir) as logger, project.service(logger=logger) as service:
        for start in range(0, USERS, 4):  # one call can never show a call-level variance: many calls
            ids += [p.request_id for p in service.predict(rows(list(range(start, start + 4))))]
        assert service.drain(30)
    interval_end = datetime.now(UTC)
    # The labels arrive after the run's interval ended: an as-of frozen at the interval end never sees them.
    write_labels(project.config.offline_dir, ids, [0.0] * len(ids), arrived_at=interval_end + timedelta(seconds=2))
    assert labelled_pairs(loop, MODEL, interval_end) == 0
    poked = interval_end + timedelta(seconds=3)  # the moment the sensor pokes
    assert labelled_pairs(loop, MODEL, poked) == USERS
    verdict = shadow_verdict(loop, MODEL, poked, min_pairs=USERS)
    assert verdict["verdict"] == "not worse" and verdict["as_of"] == poked.isoformat()
    again = shadow_verdict(loop, MODEL, poked, min_pairs=USERS)  # a retried verdict task: same moment
    assert again["decision_id"] == verdict["decision_id"]
    # The canary takes v2; the daily shadow run must not re-point `shadow` at it.
    start_canary(project.config, MODEL, v2, settings=SETTINGS)
    assert "shadow" not in project.models.aliases(MODEL)
    assert start_shadow(loop, MODEL)["status"] == "rollout_running"
    assert "shadow" not in project.models.aliases(MODEL)


def test_an_inconclusive_challenger_is_dropped_after_the_maximum_shadow_duration(project: Project) -> None:
    from quiver.monitoring.alerts import AlertManager
    from quiver.pipelines.loop_retrain import busy_with
    from quiver.pipelines.loop_shadow import shadow_verdict, start_shadow

    v1 = register(project.models, project.root, seed=1)
    v2 = register(project.models, project.root, seed=2)
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="first")
    project.models.set_alias(MODEL, "challenger", v2, expected=None, reason="trained")
    loop = loop_project(project, loop_max_shadow_days=1.0)
    start_shadow(loop, MODEL)
    assert busy_with(loop, MODEL) is not None  # a shadowed challenger blocks retraining…
    # No labelled pair yet: no verdict and nothing recorded (an empty comparison is not evidence)…
    early = shadow_verdict(loop, MODEL, datetime.now(UTC), min_pairs=300)
    assert early["verdict"] == "none" and not early["expired"] and "no rows compared" in early["reason"], early
    assert rollouts.list_decisions(project.registry, MODEL, kind="shadow_evaluation") == []
    # …until the shadow has run its maximum: then the lack of evidence is the decision, and it expires.
    later = shadow_verdict(loop, MODEL, datetime.now(UTC) + timedelta(days=1, seconds=1), min_pairs=300)
    assert later["verdict"] == "inconclusive" and later["expired"], later
    assert "no labelled pair in 1 day(s) of shadowing" in later["reason"]
    assert project.models.aliases(MODEL) == {"champion": v1}
    assert busy_with(loop, MODEL) is None  # …until it expires
    expired = AlertManager(project.registry).open_alerts("shadow_expired")
    assert [a.subject for a in expired] == [f"{MODEL}:{v2}"]


def test_a_drift_asset_is_emitted_once_per_window_however_often_it_is_judged(project: Project) -> None:
    from quiver.pipelines.loop_drift import check_serving_drift

    v1 = register(project.models, project.root, seed=1, labelled_reference=True)
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="first")
    with ServingLogger(project.config.offline_dir) as logger, project.service(logger=logger) as service:
        service.predict(rows(list(range(USERS))))
    loop = loop_project(project)
    end = datetime.now(UTC) + timedelta(seconds=1)
    start = end - timedelta(hours=1)
    first = check_serving_drift(loop, MODEL, start, end, report_html=False, run="run-1")
    assert first["status"] == "computed"
    retry = check_serving_drift(loop, MODEL, start, end, report_html=False, run="run-1")
    assert retry["status"] == "recorded" and retry["repeated"] is False  # a retried task: emit if it drifted
    other = check_serving_drift(loop, MODEL, start, end, report_html=False, run="run-2")
    assert other["repeated"] is True and other["run_id"] == first["run_id"]  # another run: emitted already


def write_project(project: Project) -> Path:
    """The fixture's project as a folder the `quiver` command can run in."""
    root = project.config.root
    (root / "quiver.yaml").write_text(f"project: p\nregistry_url: {project.config.registry_url}\n"
                                      f"redis_url: {project.config.redis_url}\noffline_root: offline\n")
    shutil.copytree(Path(__file__).resolve().parents[2] / "feature_defs", root / "feature_defs",
                    dirs_exist_ok=True)
    return root


def test_manual_commands_are_safe_by_default(project: Project) -> None:
    v1 = register(project.models, project.root, seed=1)
    v2 = register(project.models, project.root, seed=2)
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="first")
    project.models.set_alias(MODEL, "champion", v2, expected=v1, reason="promoted")
    root = write_project(project)
    # No rollout runs: `canary rollback` refuses, and the production champion stays.
    refused = quiver("canary", "rollback", MODEL, "--reason", "incident", cwd=root)
    assert refused.returncode != 0 and "no running or watched rollout" in refused.stdout + refused.stderr
    assert project.models.aliases(MODEL)["champion"] == v2
    # `models alias rollback` says what it would do and wants --expected (or --yes).
    plan = quiver("models", "alias", "rollback", MODEL, "--reason", "incident", cwd=root)
    assert plan.returncode != 0 and f"--expected {v2}" in plan.stdout + plan.stderr
    assert project.models.aliases(MODEL)["champion"] == v2
    moved = done(quiver("models", "alias", "rollback", MODEL, "--reason", "incident", "--expected", str(v2),
                        cwd=root))
    assert f"champion: {v2} → {v1} (rolled back)" in moved
    assert project.models.aliases(MODEL)["champion"] == v1
    # The second person answering the same incident: refused, the bad model does not come back.
    twice = quiver("models", "alias", "rollback", MODEL, "--reason", "incident", "--expected", str(v2), cwd=root)
    assert twice.returncode != 0 and "not the expected" in twice.stdout + twice.stderr
    assert project.models.aliases(MODEL)["champion"] == v1


def test_training_never_hands_out_a_serving_alias_past_the_gates(project: Project) -> None:
    from quiver.pipelines.training import check_training_alias

    v1 = register(project.models, project.root, seed=1)
    check_training_alias(project.models, MODEL, "champion")  # the first champion of a model: allowed
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="first")
    with pytest.raises(QuiverError, match="challenger → shadow → canary"):
        check_training_alias(project.models, MODEL, "champion")
    for alias in ("canary", "shadow", "previous"):
        with pytest.raises(QuiverError, match="moved only by the loop"):
            check_training_alias(project.models, MODEL, alias)
    check_training_alias(project.models, MODEL, "challenger")
    check_training_alias(project.models, MODEL, "my_experiment")


def test_a_requested_alias_that_was_not_set_is_a_failed_command(project: Project, monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    from typer.testing import CliRunner

    from quiver import cli
    from quiver.pipelines import training

    v1 = register(project.models, project.root, seed=1)
    rejected = replace(project.models.get(MODEL, v1), status="rejected")
    metrics = {k: 0.5 for k in ("roc_auc", "pr_auc", "log_loss", "brier", "ece")}
    result = training.TrainingResult(rejected, metrics, metrics, "rejected", "cpu", 1.0, 10, None, [])
    monkeypatch.setattr(training, "run_training", lambda *a, **k: result)
    root = write_project(project)
    cli._register_optional_commands()
    ran = CliRunner().invoke(cli.app, ["train", "--cutoff", "2026-11-10", "--alias", "challenger", "--config",
                                       str(root / "quiver.yaml")])
    assert ran.exit_code != 0 and "was not set" in ran.output


def test_the_champion_scores_the_canary_rows_off_the_path_and_its_own_failures_are_logged(
        project: Project) -> None:
    from quiver.monitoring.alerts import AlertManager, LogSink

    v1 = register(project.models, project.root, seed=1)
    v2 = register(project.models, project.root, seed=2)
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="first")
    start_canary(project.config, MODEL, v2, settings=SETTINGS)
    with ServingLogger(project.config.offline_dir) as logger, project.service(logger=logger) as service:
        out = service.predict(rows(list(range(USERS))))
        assert service.drain(30)
    logged = read_serving_logs(project.config.offline_dir).to_pandas()
    canary = logged[logged["arm"] == "canary"].set_index("request_id")
    paired = logged[logged["arm"] == "paired"].set_index("request_id")
    assert len(canary) > 100 and set(paired.index) == set(canary.index)
    assert set(paired["model_version"]) == {f"{MODEL}:{v1}"} and paired["call_id"].equals(
        canary.loc[paired.index, "call_id"])
    users = [int(r.split("-")[1]) for r in paired.index]
    np.testing.assert_allclose(paired["prediction"], project.scores(v1, users), atol=1e-12)
    assert sum(p.arm == "canary" for p in out) == len(canary)
    # A champion that raises: the request fails, and the failed call is logged on the champion arm.
    with ServingLogger(project.config.offline_dir) as logger:
        service = project.service(logger=logger, alerts=AlertManager(project.registry, [LogSink()]))
        service.arms.champion.model.predict = lambda columns: (_ for _ in ()).throw(RuntimeError("boom"))  # type: ignore
        with pytest.raises(RuntimeError, match="boom"):
            service.predict(rows(list(range(40)), prefix="x"))  # some users route to the champion
    failed = read_serving_logs(project.config.offline_dir, arm="champion").to_pandas()
    failed = failed[failed["request_id"].str.startswith("x")]
    assert len(failed) >= 1 and (failed["error"].str.contains("boom")).all() and failed["prediction"].isna().all()


def test_a_champion_that_cannot_load_keeps_the_old_one_serving_and_a_fresh_server_starts_on_the_last_good(
        project: Project) -> None:
    from quiver.monitoring.alerts import AlertManager, LogSink

    v1 = register(project.models, project.root, seed=1)
    v2 = register(project.models, project.root, seed=2)
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="first")
    alerts = AlertManager(project.registry, [LogSink()])
    running = project.service(alerts=alerts)
    project.models.set_alias(MODEL, "champion", v2, expected=v1, reason="promoted")
    (project.models.artifacts.local_dir(project.models.get(MODEL, v2).artifact_path) / "weights.pt").write_bytes(
        b"corrupt")
    assert not running.refresh()  # the new champion does not load: the old one keeps serving
    assert running.arms.champion.version == v1
    assert alerts.open_alerts("champion_load_failed")
    fresh = project.service(alerts=alerts)  # a restart: serves the newest earlier champion that loads
    assert fresh.arms.champion.version == v1 and fresh.fallback_from == v2
    assert {p.model_version for p in fresh.predict(rows([0, 1]))} == {f"{MODEL}:{v1}"}
