"""The judge replays the champion on canary rows the serving path did not pair: the real prediction service
(Redis, artifacts) with pairing off writes serving logs, and the judge scores the champion's artifact on the
canary rows' logged inputs — the same scores the paired arm logs when pairing is on."""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pytest

from quiver.monitoring.canary_evidence import PAIRED_ARM, step_rows
from quiver.monitoring.canary_judge import judge_step, start_canary, watch_step
from quiver.monitoring.canary_replay import replay_pairs
from quiver.monitoring.evaluation import join_labels
from quiver.monitoring.labels import read_labels
from quiver.registry import explain, rollouts
from quiver.serving.logs import read_serving_logs
from tests.integration.test_canary_rollout import SETTINGS, serve
from tests.integration.test_prediction_service import MODEL, Project, project, register

pytestmark = pytest.mark.integration
__all__ = ["project"]  # the fixture, shared with the service tests
# A log-loss floor tight enough that 200 users an arm cannot narrow the unpaired comparison to it.
TIGHT = replace(SETTINGS, log_loss_floor=0.01)


def test_with_pairing_off_the_judge_replays_the_champion_and_promotes_an_equal_canary(project: Project) -> None:
    v1 = register(project.models, project.root, seed=1)
    v2 = register(project.models, project.root, seed=1)  # the same weights: a canary exactly as good
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="first")
    start_canary(project.config, MODEL, v2, settings=TIGHT)
    _, moment = serve(project, batches=14, seed=1, truth=v1, pair_canary=False)
    logged = read_serving_logs(project.config.offline_dir).to_pandas()
    assert PAIRED_ARM not in set(logged["arm"])  # the serving path paired nothing
    canary_rows = int((logged["arm"] == "canary").sum())
    outcome = judge_step(project.config, MODEL, as_of=moment)
    # Unpaired, 200 users an arm keep log loss waiting (a hold); paired on the same rows it passes.
    assert outcome.verdict.outcome == "promote", outcome.verdict.reason
    stored = rollouts.get_decision(project.registry, outcome.decision.id)
    assert stored.statistics["pairing"] == {"logged": 0, "replayed": canary_rows, "unpaired": 0, "reason": ""}
    guardrails = {g["name"]: g for g in stored.statistics["guardrails"]}
    assert guardrails["log_loss"]["statistics"]["test"].startswith("paired")
    assert guardrails["log_loss"]["statistics"]["paired_rows"] == canary_rows
    assert f"0 paired while serving, {canary_rows:,} replayed by the judge" in explain.pairing_line(stored)


def test_replayed_scores_equal_the_ones_the_serving_path_paired(project: Project) -> None:
    v1 = register(project.models, project.root, seed=1)
    v2 = register(project.models, project.root, seed=2)
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="first")
    rollout = start_canary(project.config, MODEL, v2, settings=SETTINGS)
    _, moment = serve(project, batches=2, seed=3, truth=v1)
    logs = read_serving_logs(project.config.offline_dir, None, moment)
    joined = join_labels(logs, read_labels(project.config.offline_dir, moment))
    step = step_rows(joined, rollout)
    paired = step[step["arm"] == PAIRED_ARM].set_index("request_id")["prediction"]
    assert len(paired) == int((step["arm"] == "canary").sum()) > 100
    loads = []

    def load() -> object:
        loads.append(1)
        return project.models.load(MODEL, v1)

    # With every paired row in place nothing is replayed and the model is not even loaded.
    same, pairing = replay_pairs(step, logs, load, f"{MODEL}:{v1}")
    assert same is step and pairing.logged == len(paired) and pairing.replayed == 0 and not loads
    # Without them, the judge's replay gives the scores the service logged (through Parquet and back).
    replayed, pairing = replay_pairs(step[step["arm"] != PAIRED_ARM], logs, load, f"{MODEL}:{v1}")
    assert pairing.replayed == len(paired) and pairing.logged == 0 and loads == [1]
    again = replayed[replayed["arm"] == PAIRED_ARM].set_index("request_id")["prediction"]
    # The network computes in float32: a batch of other rows may round a score's last bits differently.
    np.testing.assert_allclose(again.loc[paired.index].to_numpy(), paired.to_numpy(), rtol=0, atol=1e-6)


def test_the_watch_replays_the_previous_champion_where_no_shadow_scored(project: Project) -> None:
    v1 = register(project.models, project.root, seed=1)
    v2 = register(project.models, project.root, seed=1)
    project.models.set_alias(MODEL, "champion", v1, expected=None, reason="first")
    start_canary(project.config, MODEL, v2, settings=SETTINGS)
    _, moment = serve(project, batches=14, seed=1, truth=v1)
    assert judge_step(project.config, MODEL, as_of=moment).verdict.outcome == "promote"
    canary_rows = int((read_serving_logs(project.config.offline_dir).to_pandas()["arm"] == "canary").sum())
    # The old champion stops shadowing (its alias removed): the watch's rows since the promotion go unpaired.
    project.models.set_alias(MODEL, "shadow", None, expected=v1, reason="no shadow")
    time.sleep(1.1)  # served after the promotion's data time
    after, later = serve(project, batches=2, seed=4, truth=v1)
    logged = read_serving_logs(project.config.offline_dir).to_pandas()
    assert "shadow" not in set(logged["arm"])
    watched = watch_step(project.config, MODEL, as_of=later)
    stored = rollouts.get_decision(project.registry, watched["decision_id"])
    assert stored.statistics["pairing"] == {"logged": canary_rows, "replayed": after, "unpaired": 0, "reason": ""}
    assert explain.pairing_line(stored).startswith("the previous champion's scores of the new champion's rows")
