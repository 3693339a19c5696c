"""The canary's consistency gate on a real SQLite registry: runs recorded as the consistency job records them,
a rollout started in the registry, and the loop's canary steps (`pipelines/loop_rollout.py`) asking the gate.
The judge itself is replaced by a stub that says it was asked: these tests are about whether it is."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from quiver.catalog.errors import QuiverError
from quiver.config import load_config
from quiver.monitoring import canary_judge
from quiver.monitoring.consistency import ConsistencyReport, FeatureConsistency
from quiver.monitoring.consistency_gate import GateRules, gate_verdict
from quiver.monitoring.consistency_records import record_consistency_run
from quiver.monitoring.settings import load_settings
from quiver.pipelines import loop_rollout
from quiver.pipelines.loop_common import Project
from quiver.registry import rollouts

MODEL = "fraud_model"
FEATURES = ["user_spend:amount_sum_1h", "user_profile:credit_limit"]
DAY = datetime(2026, 11, 16, tzinfo=UTC)  # the rollout starts at midnight, judged at 18:00
JUDGED = DAY + timedelta(hours=18)


def write_project(root: Path, monitoring: str = "") -> None:
    (root / "quiver.yaml").write_text(f"project: gate\nregistry_url: sqlite:///{root}/registry.db\n")
    if monitoring:
        (root / "monitoring.yaml").write_text(monitoring)


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Project]:
    """Champion v1 and candidate v2 reading the same features, v2's rollout running since DAY; the judge is a
    stub recording its real (not dry-run) calls in `project.judged`, finding `project.would[0]`."""
    write_project(tmp_path)
    loop = Project(load_config(tmp_path / "quiver.yaml"))
    for digit in "12":
        loop.models.register(MODEL, artifact_path="models/x", sha256=digit * 64, metrics={}, window_start=DAY
                             - timedelta(days=9), cutoff=DAY - timedelta(days=2), features=FEATURES,
                             catalog_version=None, label_column="is_fraud", lineage={}, reference_path="ref",
                             override="a test's version, no metrics")
    rollout = rollouts.start_rollout(loop.registry, MODEL, champion_version=1, canary_version=2, fraction=0.05,
                                     settings={}, now=DAY)
    judged: list[datetime] = []
    would = ["advance"]  # what the stub judge finds

    def judge_step(config: Any, model: str, *, as_of: datetime, by: str, dry_run: bool = False) -> Any:
        if not dry_run:
            judged.append(as_of)
        return SimpleNamespace(verdict=SimpleNamespace(outcome=would[0], reason="judged"), actions=(),
                               decision=None if dry_run else SimpleNamespace(id=0, created=True, step=rollout.step, fraction=rollout.fraction),
                               rollout=rollout)

    monkeypatch.setattr(canary_judge, "judge_step", judge_step)
    loop.judged, loop.would = judged, would  # type: ignore[attr-defined]
    yield loop
    loop.registry.close()


def record(loop: Project, start: datetime, end: datetime, *, wrong: float = 0.0, rows: int = 500,
           threshold: float = 0.001, subject: str = f"model {MODEL}", features: list[str] = FEATURES) -> int:
    """A consistency run of [start, end) as the job records it: `rows` compared per feature, a share `wrong`."""
    bad = round(rows * wrong)
    results = tuple(FeatureConsistency(feature=f, compared=rows, equal=rows - bad, mismatched=bad, missing_online=0,
                                       missing_offline=0, causes={"unexplained": bad}, smape=None, threshold=threshold)
                    for f in (features if rows else []))
    report = ConsistencyReport(subject, (start.isoformat(), end.isoformat()), rows, rows, results)
    return record_consistency_run(loop.registry, report)


def step(loop: Project, moment: datetime = JUDGED) -> dict[str, Any]:
    return loop_rollout.canary_step(loop, MODEL, moment)


def held(result: dict[str, Any]) -> str:
    """The reason of a consistency hold (the judge was not asked)."""
    assert result["outcome"] == "hold", result
    return str(result["reason"])


def test_a_canary_with_no_consistency_check_holds_and_names_the_window(project: Project) -> None:
    reason = held(step(project))
    assert reason.startswith("holding: no consistency check covers 2026-11-16 00:00 → 2026-11-16 18:00 for "
                             "fraud_model:2 (none recorded for model fraud_model)"), reason
    assert project.judged == []  # type: ignore[attr-defined]


def test_a_check_of_another_window_holds_even_when_it_is_recent_and_passed(project: Project) -> None:
    # The day before the rollout: fresh (18 h) and clean, but none of the canary's rows were in it.
    run = record(project, DAY - timedelta(days=1), DAY)
    reason = held(step(project))
    assert "no consistency check covers 2026-11-16 00:00 → 2026-11-16 18:00 for fraud_model:2" in reason
    assert f"newest: run #{run} of 11-15 00:00 → 11-16 00:00, 18 h old" in reason, reason


def test_an_old_check_holds(project: Project) -> None:
    rollouts.finish_rollout(project.registry, 1, rollouts.ROLLED_BACK, fraction=0.0)
    rollouts.start_rollout(project.registry, MODEL, champion_version=1, canary_version=2, fraction=0.05, settings={},
                           now=DAY - timedelta(days=2))
    run = record(project, DAY - timedelta(days=2), DAY - timedelta(days=1))  # covers the rollout, 42 h before
    reason = held(step(project))
    assert (f"the newest consistency check covering 2026-11-14 00:00 → 2026-11-16 18:00 for fraud_model:2 is too "
            f"old: run #{run} of 11-14 00:00 → 11-15 00:00, 42 h old, at most 26 h allowed") in reason, reason


def legacy_empty_run(loop: Project, start: datetime, end: datetime) -> int:
    """A run over no rows as earlier releases recorded it (status no_rows): older registries still hold them."""
    from sqlalchemy import insert

    from quiver.registry.consistency_tables import consistency_runs

    with loop.registry._write() as connection:
        key = connection.execute(insert(consistency_runs).values(
            project=loop.registry.project, subject=f"model {MODEL}", window_start=start, window_end=end, as_of=end,
            started_at=end, finished_at=end, rows_logged=0, rows_compared=0, n_features=0, n_inconsistent=0,
            status="no_rows", detail_json="{}")).inserted_primary_key
    assert key is not None
    return int(key[0])


def test_a_run_over_no_rows_is_never_recorded(project: Project) -> None:
    with pytest.raises(ValueError, match="over no rows is not evidence"):
        record(project, DAY, DAY + timedelta(hours=12), rows=0)


def test_an_empty_check_holds(project: Project) -> None:
    run = legacy_empty_run(project, DAY, DAY + timedelta(hours=12))
    reason = held(step(project))
    assert "the newest consistency check covering 2026-11-16 00:00 → 2026-11-16 18:00 for fraud_model:2 compared " \
           f"no rows: run #{run} of 11-16 00:00 → 11-16 12:00, 6 h old, status no_rows" in reason, reason


def test_a_check_that_compared_too_few_rows_of_a_feature_holds(project: Project) -> None:
    run = record(project, DAY, DAY + timedelta(hours=12), rows=40)
    reason = held(step(project))
    assert f"user_spend:amount_sum_1h (40 rows compared in consistency run #{run}, at least 100 needed)" in reason


def test_a_passing_check_of_the_rollouts_window_lets_the_step_be_judged(project: Project) -> None:
    run = record(project, DAY, DAY + timedelta(hours=12))
    result = step(project)
    assert result["outcome"] == "advance" and project.judged == [JUDGED]  # type: ignore[attr-defined]
    assert result["consistency"]["passed"] and result["consistency"]["runs"] == [run]
    assert f"run #{run} of 11-16 00:00 → 11-16 12:00, 6 h old" in result["consistency"]["reason"]


def test_a_failing_check_holds_and_the_hold_is_recorded_once_per_step_and_cause(project: Project) -> None:
    run = record(project, DAY, DAY + timedelta(hours=12), wrong=0.02)
    first = step(project)
    assert "user_spend:amount_sum_1h (2.00% wrong in consistency run" in held(first)
    again = step(project, JUDGED + timedelta(hours=1))
    assert again["decision_id"] == first["decision_id"] and not again["new_decision"]
    decision = rollouts.get_decision(project.registry, first["decision_id"])
    assert decision.outcome == "hold" and decision.statistics["consistency"]["runs"] == [run]
    assert "user_profile:credit_limit" in decision.statistics["inconsistent"]


def test_a_looser_threshold_run_never_clears_a_failing_check(project: Project) -> None:
    failing = record(project, DAY, DAY + timedelta(hours=12), wrong=0.02)
    record(project, DAY, DAY + timedelta(hours=12), wrong=0.02, threshold=0.5)  # `--threshold 0.5`: passes itself
    reason = held(step(project))
    assert f"2.00% wrong in consistency run #{failing}, threshold 0.10%" in reason, reason


def test_a_looser_threshold_run_alone_does_not_clear_and_a_failing_one_holds(project: Project) -> None:
    loose = record(project, DAY, DAY + timedelta(hours=12), threshold=0.5)
    assert "only consistency checks with a looser threshold than the project's cover" in held(step(project))
    passing = record(project, DAY, DAY + timedelta(hours=6))  # the project's own check clears it
    assert step(project, JUDGED + timedelta(hours=1))["outcome"] == "advance"
    # A looser run of a window as new as the deciding one that measured over the project's threshold holds.
    record(project, DAY + timedelta(hours=6), DAY + timedelta(hours=12), wrong=0.01, threshold=0.5)
    reason = held(step(project, JUDGED + timedelta(hours=2)))
    assert "1.00% wrong in consistency run" in reason and "looser threshold, over the project's 0.10%" in reason
    assert loose != passing


def test_runs_are_chosen_by_window_not_by_insertion_order(project: Project) -> None:
    record(project, DAY + timedelta(hours=6), DAY + timedelta(hours=12), wrong=0.02)  # today's: failing
    record(project, DAY, DAY + timedelta(hours=6))  # a catch-up of an earlier window, recorded after it
    assert "2.00% wrong" in held(step(project))
    # Another model's clean run of the same window does not count; the model's run with a service does.
    record(project, DAY + timedelta(hours=6), DAY + timedelta(hours=12), subject="model other_model")
    assert "2.00% wrong" in held(step(project, JUDGED + timedelta(hours=1)))
    run = record(project, DAY + timedelta(hours=6), DAY + timedelta(hours=12),
                 subject=f"model {MODEL} service fraud_model")
    assert step(project, JUDGED + timedelta(hours=2))["consistency"]["runs"] == [run]


@pytest.mark.parametrize("outcome", ["rollback", "halt"])
def test_a_canary_the_judge_would_end_is_ended_while_the_gate_holds(project: Project, outcome: str) -> None:
    """Closed to growing, not to shrinking: no check, yet the judge's rollback goes through."""
    project.would[0] = outcome  # type: ignore[attr-defined]
    result = step(project)
    assert result["outcome"] == outcome and project.judged == [JUDGED]  # type: ignore[attr-defined]
    assert not result["consistency"]["passed"] and "no consistency check covers" in result["consistency"]["reason"]


def test_with_the_gate_off_a_canary_proceeds_without_a_check(project: Project) -> None:
    (project.config.root / "monitoring.yaml").write_text("consistency_gate: false  # this test's canary\n")
    result = step(project)
    assert result["outcome"] == "advance" and project.judged == [JUDGED]  # type: ignore[attr-defined]
    assert result["consistency"] == {"passed": True, "runs": [], "blocked": [],
                                     "reason": "the consistency gate is off (consistency_gate: false in "
                                               "monitoring.yaml)"}


def test_a_canary_does_not_start_without_a_recent_check_and_starts_with_one(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[int] = []

    def start(config: Any, model: str, version: int, **kwargs: Any) -> Any:
        started.append(version)
        return SimpleNamespace(id=9, step=0, fraction=0.05)

    monkeypatch.setattr(canary_judge, "start_canary", start)
    rollouts.finish_rollout(project.registry, 1, rollouts.ROLLED_BACK, fraction=0.0)
    at = DAY + timedelta(days=1)
    record(project, DAY - timedelta(days=2), DAY - timedelta(days=1))  # 48 h before: too old to start on
    waiting = loop_rollout.start_canary(project, MODEL, version=2, at=at, again=True)
    assert waiting["status"] == "waiting" and not started
    assert waiting["reason"].startswith("no consistency check covers 2026-11-15 22:00 → 2026-11-17 00:00 for "
                                        "fraud_model:2"), waiting["reason"]
    run = record(project, DAY, at)  # the day before the start
    begun = loop_rollout.start_canary(project, MODEL, version=2, at=at, again=True)
    assert begun["started"] and started == [2] and begun["consistency"]["runs"] == [run]


def test_at_the_start_a_feature_only_the_candidate_reads_is_left_to_the_canary_steps(project: Project) -> None:
    new = "merchant_risk:chargebacks_30d"
    record(project, DAY, DAY + timedelta(hours=12))  # the champion's rows: the candidate's new feature is not in it
    rules = GateRules()
    verdict = gate_verdict(project.registry, MODEL, 3, [*FEATURES, new], start=JUDGED - rules.max_age,
                           moment=JUDGED, rules=rules, first_served=[new])
    assert verdict.passed and f"not required before the canary serves them: {new}" in verdict.reason
    stepped = gate_verdict(project.registry, MODEL, 3, [*FEATURES, new], start=DAY, moment=JUDGED, rules=rules)
    assert not stepped.passed and f"{new} (0 rows compared" in stepped.reason


def test_bare_feature_names_match_their_view_qualified_results(project: Project) -> None:
    record(project, DAY, DAY + timedelta(hours=12), wrong=0.02, features=["user_spend:amount_sum_1h"])
    verdict = gate_verdict(project.registry, MODEL, 2, ["amount_sum_1h"], start=DAY, moment=JUDGED,
                           rules=GateRules())
    assert not verdict.passed and verdict.blocked[0].startswith("user_spend:amount_sum_1h (2.00% wrong")


def test_the_gate_is_on_by_default_and_its_settings_are_read_and_checked(tmp_path: Path) -> None:
    write_project(tmp_path)
    config = load_config(tmp_path / "quiver.yaml")
    settings = load_settings(config)
    assert (settings.consistency_gate, settings.consistency_max_age_hours, settings.consistency_min_rows) == \
        (True, 26.0, 100)
    (tmp_path / "monitoring.yaml").write_text("consistency_gate: false\nconsistency_max_age_hours: 50\n"
                                              "consistency_min_rows: 1000\n")
    settings = load_settings(config)
    assert (settings.consistency_gate, settings.consistency_max_age_hours, settings.consistency_min_rows) == \
        (False, 50.0, 1000)
    assert GateRules.of_settings(settings).max_age == timedelta(hours=50)
    for bad in ("consistency_max_age_hours: 0\n", "consistency_min_rows: 2.5\n", "consistency_min_rows: true\n"):
        (tmp_path / "monitoring.yaml").write_text(bad)
        with pytest.raises(QuiverError, match=bad.split(":")[0]):
            load_settings(config)


def test_a_feature_served_staler_than_its_freshness_objective_holds_and_says_so(project: Project) -> None:
    """Stream lag within the view's objective is not wrong; a p99 lag over it holds the step, named as such."""
    results = tuple(FeatureConsistency(feature=f, compared=500, equal=400, mismatched=100, missing_online=0,
                                       missing_offline=0, causes={"stream_lag": 100}, smape=None, threshold=0.001,
                                       lag_p50_s=0.0, lag_p99_s=3_600.0, objective_s=600.0) for f in FEATURES)
    assert all(f.wrong == 0 and f.freshness_status == "over" and f.status == "alert" for f in results)
    window = (DAY.isoformat(), (DAY + timedelta(hours=12)).isoformat())
    run = record_consistency_run(project.registry, ConsistencyReport(f"model {MODEL}", window, 500, 500, results))
    reason = held(step(project))
    assert f"user_spend:amount_sum_1h (p99 lag 3600 s in consistency run #{run}, freshness objective 600 s)" in reason
    within = tuple(FeatureConsistency(**{**f.__dict__, "objective_s": 7_200.0}) for f in results)
    assert all(f.status == "ok" and f.freshness_status == "ok" for f in within)
