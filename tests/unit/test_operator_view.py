"""Pure pieces of the operator's view: reading a decision's evidence, where a rollout stands (in fractions),
why a version has its status, which drift charts are drawn, evaluation intervals, console HTML escaping."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import numpy as np
import pytest

from quiver.catalog.errors import QuiverError, did_you_mean
from quiver.monitoring.drift import FeatureDrift
from quiver.monitoring.evaluation_window import entity_bootstrap_auc, wilson
from quiver.monitoring.plots import drawn_features
from quiver.registry import explain
from quiver.registry.rollouts import Decision, Rollout

NOW = datetime(2026, 11, 10, tzinfo=UTC)


def decision(id_: int, kind: str = "canary_step", outcome: str = "hold", **stats: object) -> Decision:
    return Decision(id_, "m", 1, kind, outcome, 0, 0.5, "m:1", "m:2", dict(stats), "k" * 16, NOW, "judge")


def guardrail(name: str, status: str, estimate: float, lower: float, upper: float) -> dict[str, object]:
    return {"name": name, "status": status, "reason": "why",
            "statistics": {"estimate": estimate, "lower": lower, "upper": upper, "floor": 0.02, "fail_above": 0.01,
                           "test": "t"}}


def test_guardrail_rows_and_looks_read_the_stored_statistics() -> None:
    first = decision(3, guardrails=[guardrail("log_loss", "wait", 0.01, -0.02, 0.04)])
    second = decision(4, outcome="advance", guardrails=[guardrail("log_loss", "pass", 0.0, -0.005, 0.006)])
    watch = decision(5, kind="watch", guardrails=[guardrail("log_loss", "pass", 0.0, -0.001, 0.001)])
    [row] = explain.guardrail_rows(second)
    assert (row.name, row.status, row.lower, row.upper, row.floor, row.fail_above) == \
        ("log_loss", "pass", -0.005, 0.006, 0.02, 0.01)
    series = explain.looks([second, watch, first])
    assert [p.decision_id for p in series["log_loss"]] == [3, 4]  # canary looks only, oldest first
    assert [p.decision_id for p in explain.looks([watch], "watch")["log_loss"]] == [5]
    nan = decision(6, guardrails=[guardrail("brier", "wait", float("nan"), float("nan"), 1.0)])
    assert explain.guardrail_rows(nan)[0].estimate is None  # NaN reads as "no number", never as a value


def test_shadow_rows_and_the_json_record() -> None:
    shadow = decision(1, kind="shadow_evaluation", outcome="not worse", reason="upper bound < margin",
                      log_loss={"champion": 0.3, "shadow": 0.29, "difference": -0.01, "lower": -0.02, "upper": 0.001},
                      brier={"champion": 0.1, "shadow": 0.1, "difference": 0.0, "lower": -0.01, "upper": 0.01},
                      auc={"champion": 0.7, "shadow": 0.72, "difference": 0.02, "lower": 0.0, "upper": 0.04})
    rows = explain.shadow_rows(shadow)
    assert [r.metric for r in rows] == ["log_loss", "brier", "auc"] and rows[0].upper == 0.001
    record = explain.decision_record(shadow)
    assert record["kind_label"] == "shadow verdict" and record["intervals"][2]["candidate"] == 0.72
    assert record["headline"].startswith("#1 shadow verdict: not worse — m:2 vs m:1")


def rollout(status: str, step: int, fraction: float) -> Rollout:
    return Rollout(1, "m", 1, 2, "salt", fraction, step, status, {"steps": [0.05, 0.25, 0.5, 1.0]}, NOW, NOW, None,
                   "op")


def test_where_a_rollout_stands_in_fractions() -> None:
    assert explain.step_label(rollout("running", 1, 0.25)) == "step 2 of 3, canary share 0.25"
    # Before: a promoted rollout read "step 0, 100%".
    promoted = explain.step_label(rollout("promoted", 2, 1.0))
    assert promoted == "promoted after step 3 of 3 (canary share 0.5); share now 1"
    assert explain.step_label(rollout("rolled_back", 0, 0.0)).startswith("rolled back after step 1 of 3 (canary "
                                                                         "share 0.05)")


def test_status_reason_names_the_gate_and_the_decision_that_moved_the_alias() -> None:
    from quiver.registry.models import AliasMove, ModelVersion

    version = ModelVersion("m", 2, "registered", "a", "0" * 64, {"roc_auc": 0.71, "baseline": {"roc_auc": 0.65}},
                           NOW, NOW, ["f"], 1, "y", {}, "r", NOW, "op")
    move = AliasMove(7, "m", "champion", 1, 2, "canary promoted by decision #4: every guardrail passed", "judge", 4,
                     NOW)
    why = explain.status_reason(version, {"champion": 2}, [move], {4: decision(4, outcome="promote")})
    assert "ROC-AUC 0.7100 vs baseline 0.6500" in why and "champion since 2026-11-10 00:00" in why
    assert "[decision #4, canary step → promote]" in why
    rejected = explain.status_reason(replace(version, status="rejected"), {}, [], {})
    assert rejected.startswith("rejected by the offline gate")
    # A network that kept the baseline's weights it started from says so in words.
    same = replace(version, metrics={"roc_auc": 0.65, "best_epoch": -1.0, "baseline": {"roc_auc": 0.65}})
    assert explain.status_reason(same, {}, [], {}).startswith(
        "registered (it equals its logistic baseline: no epoch improved on the weights it started from; ROC-AUC")


def test_did_you_mean() -> None:
    assert did_you_mean("fraud_modl", ["fraud_model", "churn"]) == " (did you mean 'fraud_model'?)"
    assert did_you_mean("zzz", ["fraud_model"]) == ""


def test_percentage_steps_are_refused_with_the_fractions_they_meant() -> None:
    from quiver.cli.predict import _steps

    assert _steps("0.05,0.25,0.5,1") == (0.05, 0.25, 0.5, 1.0)
    with pytest.raises(QuiverError, match=r"did you mean 0.05,0.25,0.5,1\?"):
        _steps("5,25,50,100")


def test_evaluate_prints_a_dash_where_an_arm_has_no_figure() -> None:
    # Before: an arm without labelled rows printed "nan" in the ECE column.
    from quiver.cli.predict import _number, _with_ci

    assert _number(float("nan")) == "-" and _number(0.01234) == "0.0123" and _number(2.5, ".2f") == "2.50"
    assert _with_ci(float("nan"), (0.0, 1.0)) == "-"


def test_the_drift_grid_always_draws_the_score() -> None:
    # Before: the score lost its place to 12 drifted features and the page dropped it.
    features = [FeatureDrift(f"f{i:02d}", "numerical", "alert", {"psi": 1.0}, 10, 10, 0, 0) for i in range(13)]
    features.append(FeatureDrift("score", "numerical", "ok", {"psi": 0.01}, 10, 10, 0, 0))

    class Report:
        pass

    report = Report()
    report.features = features  # type: ignore[attr-defined]
    chosen = drawn_features(report)  # type: ignore[arg-type]
    assert chosen[0] == "score" and len(chosen) == 12


def test_evaluation_intervals() -> None:
    from sklearn.metrics import roc_auc_score

    lower, upper = wilson(0, 100)
    assert lower == pytest.approx(0.0, abs=1e-12) and 0.03 < upper < 0.04
    rng = np.random.default_rng(0)
    entity = rng.integers(0, 300, 6_000)
    labels = (rng.random(6_000) < 0.2).astype(np.float64)
    scores = np.clip(0.2 + 0.3 * labels + rng.normal(0, 0.2, 6_000), 0, 1)
    low, high = entity_bootstrap_auc(scores, labels, entity)
    assert low < roc_auc_score(labels, scores) < high and high - low < 0.05


def test_console_html_escapes_and_links_decisions() -> None:
    from quiver.ui.html import table, text_with_links

    assert text_with_links("<b> by decision #12") == "&lt;b&gt; by <a href='/decisions/12'>decision #12</a>"
    assert "&lt;script&gt;" in table(["a"], [[text_with_links("<script>")]])
