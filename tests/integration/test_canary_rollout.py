"""Canary rollouts end to end: the real prediction service (Redis, artifacts) writes serving logs, delayed
labels arrive, the judge reads both from disk and the registry, records its decision (idempotently) and
promotes, rolls back or halts — moving aliases through the model registry with the decision's id, in one
transaction with the rollout change and the alert."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from quiver.catalog.errors import NoRowsError, QuiverError
from quiver.monitoring import repository
from quiver.monitoring.canary_judge import apply_decision, judge_step, rollback, start_canary
from quiver.monitoring.canary_stats import JudgeSettings
from quiver.monitoring.labels import write_labels
from quiver.registry import rollouts
from quiver.serving.logs import ServingLogger, read_serving_logs
from tests.integration.test_prediction_service import MODEL, USERS, Project, project, register, rows

pytestmark = pytest.mark.integration
__all__ = ["project"]  # the fixture, shared with the service tests

# Small, fast rollouts: one judged step at 50 %, then promotion; floors wide enough for ~1,400 calls of 4 rows
# (errors and latency are one observation per call, so their floors are wide too).
SETTINGS = JudgeSettings(steps=(0.5, 1.0), min_rows=300, min_labels=300, log_loss_floor=0.08, brier_floor=0.03,
                         error_rate_floor=0.05, latency_exceedance_floor=0.5, max_canary_calls=50_000)
ROWS_PER_CALL = 4


def serve(project: Project, batches: int, seed: int, truth: int, pair_canary: bool = True) -> tuple[int, datetime]:
    """Send every user `batches` times through the service, 4 rows a call; labels drawn from version
    `truth`'s scores arrive afterwards. Returns (rows served, a moment after everything was logged)."""
    rng = np.random.default_rng(seed)
    truth_scores = dict(zip(range(USERS), project.scores(truth, list(range(USERS))), strict=True))
    ids: list[str] = []
    with ServingLogger(project.config.offline_dir) as logger, \
            project.service(logger=logger, pair_canary=pair_canary) as service:
        for b in range(batches):
            users = list(range(USERS))
            for start in range(0, USERS, ROWS_PER_CALL):
                chunk = rows(users[start:start + ROWS_PER_CALL], prefix=f"s{seed}-{b}-{start}-")
                ids += [p.request_id for p in service.predict(chunk)]
        assert service.drain(30)  # the champion's paired scores of canary rows
    labels = [float(rng.random() < truth_scores[int(i.split("-")[-1])]) for i in ids]
    write_labels(project.config.offline_dir, ids, labels)
    return len(ids), datetime.now(UTC) + timedelta(seconds=1)


def log_tagged(logger: ServingLogger, rollout: rollouts.Rollout, request_id: str, keys: dict[str, int],
               version: int, arm: str) -> None:
    """One row as the service logs it under `rollout` (its tag and a call of its own)."""
    logger.log_batch([request_id], {k: [v] for k, v in keys.items()}, {"f0": [0.1]}, f"{MODEL}:{version}", arm,
                     1.0, np.array([0.2]), rollout=(rollout.id, rollout.step, rollout.fraction),
                     call_id=f"c-{request_id}")


def test_a_canary_as_good_as_the_champion_is_promoted_and_repeats_record_nothing(project: Project) -> None:
    v1 = register(project.models, project.root, seed=1)
    v2 = register(project.models, project.root, seed=1)  # the same weights: a canary exactly as good
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="first")
    rollout = start_canary(project.config, MODEL, v2, settings=SETTINGS)
    assert project.models.aliases(MODEL)["canary"] == v2 and rollout.fraction == 0.5

    early = judge_step(project.config, MODEL)  # nothing served yet: hold, never pass
    assert early.verdict.outcome == "hold" and early.decision.created and not early.actions
    again = judge_step(project.config, MODEL)
    assert again.decision.id == early.decision.id and not again.decision.created  # same data: nothing new

    drifted, _ = repository.open_alert(project.registry, "dataset_drift", MODEL, "critical", "drift", "",
                                       {"reference": f"{MODEL}:{v1} reference"}, [])
    served, moment = serve(project, batches=14, seed=1, truth=v1)
    logged = read_serving_logs(project.config.offline_dir).to_pandas()
    served_rows = logged[logged["arm"] != "paired"]
    assert len(served_rows) == served and set(logged["arm"]) == {"champion", "canary", "paired"}
    assert set(served_rows["rollout_id"]) == {rollout.id} and served_rows["call_id"].nunique() > 1000
    outcome = judge_step(project.config, MODEL, as_of=moment)
    assert outcome.verdict.outcome == "promote", outcome.verdict.reason
    assert outcome.rollout.status == rollouts.WATCHING  # the post-promotion watch starts
    aliases = project.models.aliases(MODEL)
    assert aliases["champion"] == v2 and aliases["previous"] == v1 and "canary" not in aliases
    assert aliases["shadow"] == v1  # the old champion keeps scoring every request, off the path
    # The old champion's drift alert ends with its reign, in the promotion's transaction.
    assert repository.get_alert(project.registry, drifted.id).status == "resolved"
    assert repository.alert_history(project.registry, drifted.id)[-1].reason == \
        f"the model changed: {MODEL}:{v1} → {MODEL}:{v2}"
    move = project.models.history(MODEL, "champion")[-1]
    assert move.decision_id == outcome.decision.id and move.to_version == v2
    stored = rollouts.get_decision(project.registry, outcome.decision.id)
    assert stored.kind == "canary_step" and stored.statistics["srm"]["significant"] is False
    guardrails = {g["name"]: g for g in stored.statistics["guardrails"]}
    assert set(guardrails) == {"error_rate", "latency_p99", "score_shift", "log_loss", "brier"}
    assert "paired" in guardrails["log_loss"]["statistics"]["test"]  # the champion scored the canary rows
    assert stored.applied_at is not None and "rollout watching" in " ".join(stored.actions)
    decisions = rollouts.list_decisions(project.registry, MODEL)
    history = project.models.history(MODEL)
    # Applying the same decision again returns what it did and moves nothing.
    assert apply_decision(project.config, stored) == stored.actions
    assert rollouts.list_decisions(project.registry, MODEL) == decisions
    assert project.models.history(MODEL) == history
    with pytest.raises(QuiverError, match="no running rollout"):
        judge_step(project.config, MODEL)


def test_a_worse_canary_is_rolled_back_with_an_alert(project: Project) -> None:
    from quiver.monitoring.alerts import AlertManager

    # Sharp models (scores far from ½), so versions differ in log loss by much more than the floor; the truth
    # follows the champion, and the canary has other weights.
    v1 = register(project.models, project.root, seed=1, spread=40.0)
    v3 = register(project.models, project.root, seed=5, spread=40.0)
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="first")
    start_canary(project.config, MODEL, v3, settings=SETTINGS)
    _, moment = serve(project, batches=14, seed=2, truth=v1)
    outcome = judge_step(project.config, MODEL, as_of=moment)
    assert outcome.verdict.outcome == "rollback", [(g.name, g.status, g.reason) for g in outcome.verdict.guardrails]
    assert outcome.rollout.status == rollouts.ROLLED_BACK and outcome.rollout.fraction == 0.0
    assert {g.name for g in outcome.verdict.guardrails if g.status == "fail"} & {"log_loss", "brier", "score_shift"}
    assert project.models.aliases(MODEL) == {"champion": v1}
    assert [m.decision_id for m in project.models.history(MODEL, "canary")][-1] == outcome.decision.id
    alerts = AlertManager(project.registry).open_alerts("canary_rollback")
    assert [a.subject for a in alerts] == [f"{MODEL}:{v3}"]
    # After a rollback the service routes nothing to the canary any more.
    assert project.service().arms.canary is None


def test_a_sample_ratio_mismatch_halts(project: Project) -> None:
    v1 = register(project.models, project.root, seed=1)
    v2 = register(project.models, project.root, seed=1)
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="first")
    rollout = start_canary(project.config, MODEL, v2, settings=SETTINGS)
    # A broken router: 10 % of the users logged on the canary instead of 50 %.
    with ServingLogger(project.config.offline_dir) as logger:
        for u in range(USERS):
            arm, version = ("canary", v2) if u % 10 == 0 else ("champion", v1)
            for k in range(3):
                log_tagged(logger, rollout, f"h{u}-{k}", {"user_id": u}, version, arm)
    outcome = judge_step(project.config, MODEL, as_of=datetime.now(UTC) + timedelta(seconds=1))
    assert outcome.verdict.outcome == "halt"
    assert outcome.verdict.srm["observed_fraction"] == pytest.approx(0.1)
    assert outcome.rollout.status == rollouts.HALTED
    assert "canary" not in project.models.aliases(MODEL)


def test_the_split_is_judged_on_the_routing_key_not_on_every_key_pair(project: Project) -> None:
    from tests.integration.test_prediction_service import catalog

    project.registry.apply(catalog())  # the judge takes the routing key from the applied catalog
    v1 = register(project.models, project.root, seed=1)
    v2 = register(project.models, project.root, seed=1)
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="first")
    rollout = start_canary(project.config, MODEL, v2, settings=SETTINGS)
    # Routing hashes the user; rows also carry a merchant. Canary users here buy from 20 merchants each,
    # champion users from one: user x merchant pairs split 20:1 although the users split exactly 50:50.
    with ServingLogger(project.config.offline_dir) as logger:
        for u in range(USERS):
            arm, version, merchants = ("canary", v2, 20) if u % 2 == 0 else ("champion", v1, 1)
            for m in range(merchants):
                log_tagged(logger, rollout, f"p{u}-{m}", {"user_id": u, "merchant_id": m}, version, arm)
    outcome = judge_step(project.config, MODEL, as_of=datetime.now(UTC) + timedelta(seconds=1))
    assert outcome.verdict.srm["observed_fraction"] == pytest.approx(0.5, abs=0.5 / USERS + 1e-9)
    assert outcome.verdict.outcome != "halt", outcome.verdict.reason


def test_manual_rollback_ends_the_rollout_and_refuses_when_none_runs(project: Project) -> None:
    v1 = register(project.models, project.root, seed=1)
    v2 = register(project.models, project.root, seed=2)
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="first")
    start_canary(project.config, MODEL, v2, settings=SETTINGS)
    decision, actions = rollback(project.config, MODEL, reason="looks wrong")
    assert decision.kind == "manual_rollback" and "rollout rolled_back" in actions
    assert project.models.aliases(MODEL) == {"champion": v1}
    # With no rollout running, a canary rollback never touches the production champion (it used to demote
    # it to `previous` without a prompt).
    project.models.set_alias(MODEL, "champion", v2, expected=v1, reason="promoted by hand")
    with pytest.raises(QuiverError, match="no running or watched rollout"):
        rollback(project.config, MODEL, reason="bad release")
    assert project.models.aliases(MODEL)["champion"] == v2



def test_shadow_evaluation_from_served_traffic_is_recorded_once(project: Project) -> None:
    from sklearn.metrics import log_loss

    from quiver.monitoring.evaluation import evaluate_shadow

    v1 = register(project.models, project.root, seed=1, spread=40.0)
    v2 = register(project.models, project.root, seed=5, spread=40.0)
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="first")
    project.models.set_alias(MODEL, "shadow", v2, expected=None, reason="shadow it")
    rng = np.random.default_rng(3)
    truth = dict(zip(range(USERS), project.scores(v2, list(range(USERS))), strict=True))  # the shadow is right
    ids: list[str] = []
    with ServingLogger(project.config.offline_dir) as logger, project.service(logger=logger) as service:
        for b in range(3):
            ids += [p.request_id for p in service.predict(rows(list(range(USERS)), prefix=f"e{b}-"))]
        assert service.drain(30)
    with pytest.raises(NoRowsError, match=f"no rows compared: {len(ids):,} requests scored by both "
                                          f"{MODEL}:{v1} and {MODEL}:{v2} .* none labelled as of"):
        evaluate_shadow(project.config, MODEL)  # before any label arrived: no verdict, nothing recorded
    assert rollouts.list_decisions(project.registry, MODEL, kind="shadow_evaluation") == []
    labels = [float(rng.random() < truth[int(i.split("-")[-1])]) for i in ids]
    write_labels(project.config.offline_dir, ids, labels)
    moment = datetime.now(UTC) + timedelta(seconds=1)
    result = evaluate_shadow(project.config, MODEL, as_of=moment)
    assert result.verdict == "better" and result.labeled_pairs == len(ids)
    users = [int(i.split("-")[-1]) for i in ids]
    assert result.log_loss.champion == pytest.approx(log_loss(labels, project.scores(v1, users)), rel=1e-9)
    assert result.log_loss.shadow == pytest.approx(log_loss(labels, project.scores(v2, users)), rel=1e-9)
    again = evaluate_shadow(project.config, MODEL, as_of=moment)
    assert again.decision_id == result.decision_id  # same inputs: the same decision, not a new one
    stored = rollouts.get_decision(project.registry, result.decision_id)
    assert stored.kind == "shadow_evaluation" and stored.outcome == "better"
    assert stored.statistics["log_loss"]["difference"] == pytest.approx(result.log_loss.difference)
    assert len(rollouts.list_decisions(project.registry, MODEL, kind="shadow_evaluation")) == 1
