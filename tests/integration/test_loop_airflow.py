"""The closed loop through real Airflow (`dag.test()`, one metadata DB), real Redis and the real prediction service.

One story run is shared by the module (it is the expensive part): a champion trained before the drift, a
calm day, drift, retraining, shadow, canary, promotion; then a model trained on flipped labels forced into a
canary. Each test reads a different part of what happened from the registry and from Airflow's own DB.
"""

from __future__ import annotations

import shutil
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quiver.pipelines.demo.loop import Story, StoryLog, run_story
from quiver.pipelines.loop_common import Project, utc

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
START = date(2026, 11, 1)
# Days enough, under knowledge time (labels a day late), for a retrain on labels of the drifted traffic, its
# shadow and canary, the watch, and the bad model's rollback.
STORY = Story(start=START, days=23, drift_from_day=8, retrain_window_days=7, canary_min_rows=150,
              min_labelled=200)


@pytest.fixture(scope="module")
def story(tmp_path_factory: pytest.TempPathFactory, redis_server: Any) -> tuple[Project, StoryLog]:
    from quiver.catalog.loader import load_catalog
    from quiver.config import load_config
    from quiver.offline.backfill import backfill
    from quiver.pipelines.demo_data import generate
    from quiver.registry import Registry

    root = tmp_path_factory.mktemp("loop")
    shutil.copytree(REPO / "feature_defs", root / "feature_defs")
    (root / "quiver.yaml").write_text(f"project: looptest\nregistry_url: sqlite:///.quiver/registry.db\n"
                                      f"redis_url: {redis_server.url}\n")
    # One extra day beyond the story: the quality-gate test corrupts it.
    generate(root / "data", days=STORY.days + 1, start=START, users=1_000, merchants=100, transactions_per_day=4_000,
             seed=7, drift_from_day=STORY.drift_from_day, malformed_fraction=0.001)
    config = load_config(root / "quiver.yaml")
    catalog = load_catalog(config.catalog_dir, root=config.root)
    Registry(config.registry, project=config.project).apply(catalog, author="test")
    backfill(config, catalog, START, START + timedelta(days=STORY.days - 1))
    log = run_story(config, STORY, say=print)
    return Project(load_config(root / "quiver.yaml")), log


def runs_of(log: StoryLog, dag_id: str) -> list[dict[str, Any]]:
    return [r for r in log.runs if r["dag_id"] == dag_id]


def test_every_dag_run_succeeded_inside_airflow(story: tuple[Project, StoryLog]) -> None:
    _, log = story
    assert {r["dag_id"] for r in log.runs} == {"quiver_materialize", "quiver_drift", "quiver_retrain",
                                               "quiver_shadow_eval", "quiver_canary"}
    assert all(r["state"] == "success" for r in log.runs), [(r["dag_id"], r["tasks"]) for r in log.runs]
    # Daily runs cover the day before their midnight: Airflow's data interval, not the wall clock.
    materialize = runs_of(log, "quiver_materialize")[0]
    assert materialize["data_interval"] == ["2026-11-08T00:00:00+00:00", "2026-11-09T00:00:00+00:00"]


def test_calm_day_raises_no_drift_and_triggers_no_retraining(story: tuple[Project, StoryLog]) -> None:
    project, log = story
    calm = runs_of(log, "quiver_drift")[0]  # judges the last day before the drift
    assert calm["results"]["check_drift"]["window_end"] == "2026-11-09T00:00:00+00:00"
    assert calm["results"]["check_drift"]["status"] == "computed"
    assert calm["results"]["check_drift"]["dataset_drift"] is False
    assert calm["tasks"]["emit_drift"] == "skipped"
    assert log.drift_alert_at is not None and log.drift_alert_at > calm["at"]
    retrains = runs_of(log, "quiver_retrain")
    assert retrains[0]["at"] == log.drift_alert_at and all(r["at"] >= log.drift_alert_at for r in retrains)
    # Nothing was trained on the calm day: every version ends either at the drift day (the champion's
    # pre-drift window) or at a drift window's end, after the calm day.
    drift_day = STORY.day(STORY.drift_from_day)
    cutoffs = {v.cutoff for v in project.models.versions(project.config.loop_model)}
    assert drift_day in cutoffs and all(c == drift_day or c > calm["at"] for c in cutoffs)


def test_drift_retrains_shadows_canaries_and_promotes(story: tuple[Project, StoryLog]) -> None:
    from quiver.registry import rollouts

    project, log = story
    model = project.config.loop_model
    drift = next(r for r in runs_of(log, "quiver_drift") if r["tasks"]["emit_drift"] == "success")
    event = drift["results"]["emit_drift"]
    assert event["drift_run_id"] == drift["results"]["check_drift"]["run_id"] and event["drifted"]
    promoted = [r for r in rollouts.list_rollouts(project.registry, model) if r.status == rollouts.PROMOTED]
    assert len(promoted) == 1
    # The promoted version is a challenger the retrain gate set (an earlier one may have been halted).
    challenger = next(r["results"]["gate"] for r in runs_of(log, "quiver_retrain")
                      if r["results"].get("gate", {}).get("decision") == "challenger"
                      and r["results"]["gate"]["version"] == promoted[0].canary_version)
    comparison = challenger["comparison"]
    assert comparison["challenger"]["roc_auc"] >= comparison["champion"]["roc_auc"] - 0.005
    judged = [r for r in runs_of(log, "quiver_shadow_eval") if "verdict" in r["results"]]
    verdicts = [r["results"]["verdict"] for r in judged]
    assert verdicts and verdicts[-1]["handed_on"] and verdicts[-1]["verdict"] in ("better", "not worse")
    # The story pins the loop's clock: each verdict judged as of its run's simulated moment (its data time),
    # never the wall clock, so the timeline puts it before the canary steps it led to.
    assert [utc(v["as_of"]) for v in verdicts] == [utc(r["at"]) for r in judged]
    assert utc(verdicts[-1]["as_of"]) <= log.promoted_at  # type: ignore[operator]
    assert verdicts[-1]["labelled_pairs"] >= STORY.min_labelled
    outcomes = [d.outcome for d in reversed(rollouts.list_decisions(project.registry, model,
                                                                       rollout_id=promoted[0].id, kind="canary_step"))]
    assert outcomes[-1] == "promote" and set(outcomes[:-1]) <= {"hold", "advance"}  # held until labels arrived
    # The story's rows say what was judged (the step's share), then where the decision moved it; never "None".
    promotion = next(r["results"]["judge"] for r in runs_of(log, "quiver_canary")
                     if r["results"].get("judge", {}).get("outcome") == "promote")
    last_step = rollouts.list_decisions(project.registry, model, rollout_id=promoted[0].id, kind="canary_step")[0]
    assert promotion["fraction"] == last_step.fraction < 1 and promotion["fraction_after"] == 1.0, promotion
    assert not [r["numbers"] for r in log.runs if "None" in r["numbers"] or r["numbers"] == "skipped"]
    watched = [d.outcome for d in rollouts.list_decisions(project.registry, model, rollout_id=promoted[0].id,
                                                           kind="watch")]
    assert watched[0] == "confirm" and set(watched[1:]) <= {"hold"}  # the post-promotion watch confirmed it
    assert log.promoted_at is not None and log.promoted_at > log.drift_alert_at  # type: ignore[operator]
    aliases = project.models.aliases(model)
    first_champion = project.models.history(model, "champion")[0].to_version
    assert aliases["champion"] == challenger["version"] and aliases["previous"] == first_champion
    move = project.models.history(model, "champion")[-1]
    assert move.to_version == challenger["version"] and move.decision_id is not None
    assert any(a.kind == "dataset_drift" and a.subject == model for a in _all_alerts(project))
    assert any(a.kind == "canary_promoted" and "promoted" in a.title for a in _all_alerts(project))
    # Each loop alert carries the data time its decision judged (what every sink and `alerts list` show).
    announced = next(a for a in _all_alerts(project) if a.kind == "canary_promoted")
    promotion = rollouts.list_decisions(project.registry, model, rollout_id=promoted[0].id, kind="canary_step")[0]
    assert announced.as_of == promotion.data_time, (announced.as_of, promotion.data_time)
    retrain = next(a for a in _all_alerts(project) if a.kind == "retrain")
    assert retrain.as_of == project.models.get(model, int(retrain.detail["version"])).cutoff


def test_retraining_starts_from_the_drift_asset_event_as_the_scheduler_delivers_it(
        story: tuple[Project, StoryLog]) -> None:
    _, log = story
    # The first retrain that planned (earlier ones waited for labels of the drifted traffic), and the drift
    # run whose Asset event started it: the one at the same tick.
    retrain = next(r for r in runs_of(log, "quiver_retrain") if "plan" in r["results"])
    drift = next(r for r in runs_of(log, "quiver_drift")
                 if r["tasks"]["emit_drift"] == "success" and r["at"] == retrain["at"])
    assert retrain["run_type"] == "asset_triggered"  # created by the scheduler's own code from the queue
    plan = retrain["results"]["plan"]
    assert plan["triggering_events"] >= 1 and plan["trigger"] == "drift"  # read from triggering_asset_events
    assert plan["drift_run_id"] == drift["results"]["emit_drift"]["drift_run_id"]
    assert plan["cutoff"] == drift["results"]["emit_drift"]["window_end"]


def test_bad_challenger_is_rolled_back_with_an_alert_and_the_champion_stays(
        story: tuple[Project, StoryLog]) -> None:
    from quiver.registry import rollouts

    project, log = story
    model = project.config.loop_model
    last = rollouts.list_rollouts(project.registry, model)[0]
    assert last.status == rollouts.ROLLED_BACK
    bad = project.models.get(model, last.canary_version)
    assert bad.status == "registered"  # passed its own (flipped) labels, or was registered by hand over the gate
    aliases = project.models.aliases(model)
    assert last.canary_version not in aliases.values()
    assert aliases["champion"] == last.champion_version  # the promoted challenger, unchanged by the rollback
    decision = rollouts.list_decisions(project.registry, model, rollout_id=last.id)[0]
    assert decision.outcome == "rollback"
    assert any(a.kind == "canary_rollback" and a.subject == f"{model}:{last.canary_version}"
               for a in _all_alerts(project))
    assert log.rolled_back_at is not None


def test_retried_steps_change_nothing(story: tuple[Project, StoryLog]) -> None:
    """Re-running a day's drift check and a finished retrain through Airflow returns what the first run did."""
    from quiver.pipelines.loop_airflow import AirflowWorker

    project, log = story
    model = project.config.loop_model
    drift = runs_of(log, "quiver_drift")[-1]  # judged against the champion that is still serving
    retrain = next(r for r in runs_of(log, "quiver_retrain") if "train" in r["results"])
    versions = len(project.models.versions(model))
    with AirflowWorker(project.config.root / ".quiver" / "airflow", project.config.root / "quiver.yaml") as af:
        # The story promoted a new champion after its last drift run: a re-run judges the champion serving now
        # (a new record); retrying that run again returns it unchanged.
        first = af.run("quiver_drift", logical_date=drift["at"])["results"]["check_drift"]
        rerun = af.run("quiver_drift", logical_date=drift["at"])  # the same run, cleared and run again
        again = rerun["results"]["check_drift"]
        assert again["run_id"] == first["run_id"] and again["status"] == "recorded"
        if again["dataset_drift"]:  # its Asset event went out the first time: Airflow's record says so
            assert rerun["tasks"]["emit_drift"] == "skipped"
        assert again["champion"] == f"{model}:{project.models.aliases(model)['champion']}"
        redo = af.run("quiver_retrain", logical_date=retrain["at"], conf={"cutoff": retrain["results"]["plan"]["cutoff"],
                                                                        "window_days": STORY.retrain_window_days})
    assert redo["results"]["train"]["version"] == retrain["results"]["train"]["version"]
    assert redo["results"]["train"]["reused"] is True
    assert len(project.models.versions(model)) == versions


def test_quality_gate_quarantines_a_broken_batch_before_the_backfill(story: tuple[Project, StoryLog]) -> None:
    from quiver.pipelines.loop_airflow import AirflowWorker

    project, _ = story
    day = START + timedelta(days=STORY.days)
    batch = project.config.root / f"data/events/transactions/date={day}/part-00000.parquet"
    table = pq.read_table(batch)
    # Every row loses its join key (columns and types stay, so the catalog still loads): far above tolerance.
    keys = table.schema.get_field_index("user_id")
    pq.write_table(table.set_column(keys, "user_id", pa.nulls(table.num_rows, pa.int64())), batch)
    with AirflowWorker(project.config.root / ".quiver" / "airflow", project.config.root / "quiver.yaml") as af:
        run = af.run("quiver_materialize", logical_date=_midnight(day + timedelta(days=1)))
    assert run["state"] == "success"
    gate = run["results"]["quality_gate"]
    assert gate["quarantined"] == ["transactions"] and not gate["passed"]
    assert not batch.exists()  # moved out of the ingest path
    assert list((project.config.offline_dir / "_quarantine/batches/transactions").glob("*/validation.json"))
    tiles = list((project.config.offline_dir / "user_spend/tiles").glob(f"date={day}/*.parquet"))
    assert sum(pq.read_metadata(t).num_rows for t in tiles) == 0  # nothing of the quarantined batch backfilled
    assert any(a.kind == "quality" and a.subject == "transactions" for a in project.alerts.open_alerts())


def _midnight(day: date) -> Any:
    from quiver.pipelines.replay import day_start

    return day_start(day)


def _all_alerts(project: Project) -> list[Any]:
    from quiver.monitoring import repository

    return repository.list_alerts(project.registry, None)


def test_every_served_value_equals_the_training_sets_on_the_replayed_traffic(story: tuple[Project, StoryLog]) -> None:
    """The drift DAG's daily consistency check over the story's traffic: stored and on-demand features are
    compared, and with the online store following the events (a stream with no lag), every value served
    equals the training set's at the request's time: no feature gets a row wrong, whatever the cause."""
    from quiver.monitoring.consistency_records import consistency_results_of

    project, log = story
    checks = [r["results"]["check_consistency"] for r in runs_of(log, "quiver_drift")]
    recorded = [c for c in checks if c.get("run_id")]
    assert recorded and len(recorded) == len(checks), checks
    compared = 0
    for check in recorded:
        results = consistency_results_of(project.registry, check["run_id"])
        features = {r["feature"] for r in results}
        assert "transaction_context:log_amount_vs_usual" in features and "user_spend:amount_mean_7d" in features
        for result in results:
            assert result["wrong"] == 0 and result["status"] == "ok", (check["window_end"], result["feature"],
                                                                      result["causes"], result["examples"])
            compared += result["compared"]
    assert compared > 0


def test_the_docs_demo_examples_name_what_the_story_does(story: tuple[Project, StoryLog]) -> None:
    """The docs' worked examples of the demo (which version is promoted, which rolled back, the alias move,
    the evaluation report's name) are what the story's code does: the demo runs this same story."""
    import re

    from quiver.pipelines.demo.loop import write_reports
    from quiver.registry import rollouts

    project, log = story
    model = project.config.loop_model
    finished = rollouts.list_rollouts(project.registry, model)
    promoted = next(r for r in finished if r.status == rollouts.PROMOTED)
    assert any(r.status == rollouts.ROLLED_BACK and r.canary_version > promoted.canary_version for r in finished)
    docs = {p.name: p.read_text() for p in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]}
    said = [(name, m) for name, text in docs.items()
            for m in re.finditer(rf"{model}:(\d+) (is |was )?(promoted|rolled back)", text)]
    assert said, "the docs give no example of the demo's story"
    for name, m in said:
        if m.group(3) == "promoted":
            assert int(m.group(1)) == promoted.canary_version, f"{name}: {m.group(0)!r}"
        else:  # the fast-tracked model comes after the promoted one (how many challengers came between depends
            # on the data's size: the demo's has one more than this test's)
            assert int(m.group(1)) > promoted.canary_version, f"{name}: {m.group(0)!r}"
    for name, text in docs.items():
        for m in re.finditer(r"`champion (\d+) → (\d+)`", text):
            assert (int(m.group(1)), int(m.group(2))) == (promoted.champion_version, promoted.canary_version), name
        for m in re.finditer(rf"evaluation-{model}-v(\d+)-vs-v(\d+)-\d{{8}}-\d{{8}}\.html", text):
            assert (int(m.group(1)), int(m.group(2))) == (promoted.canary_version, promoted.champion_version), name
    reports = write_reports(project, log, max(r["at"] for r in log.runs))  # as the demo writes them
    assert re.fullmatch(rf"evaluation-{model}-v{promoted.canary_version}-vs-v{promoted.champion_version}-\d{{8}}-"
                        rf"\d{{8}}\.html", Path(reports["evaluation"]).name), reports


# NannyML's CBPE on one day of the story: its reference is the champion's held-out rows (what Quiver calibrates
# on), its analysis the day's champion scores. It writes its ROC-AUC estimate and whether it calibrated.
_NANNYML_DAY = """
import json, sys
import numpy as np, pandas as pd
import nannyml as nml
ref, ana = pd.read_parquet(sys.argv[1]), pd.read_parquet(sys.argv[2])
for frame in (ref, ana):
    frame["y_pred"] = (frame["score"] >= 0.5).astype(int)
ref["y_true"], ana["y_true"] = ref.pop("label").astype(int), np.nan
cbpe = nml.CBPE(y_pred_proba="score", y_pred="y_pred", y_true="y_true", metrics=["roc_auc"], chunk_number=1,
                problem_type="classification_binary")
cbpe.fit(ref)
table = cbpe.estimate(ana).filter(period="analysis").to_df()
print(json.dumps({"needs_calibration": bool(cbpe.needs_calibration), "roc_auc": float(table[("roc_auc", "value")].iloc[0])}))
"""


def test_drift_alone_warns_a_lasting_one_retrains_and_estimates_meet_their_labels_and_nannyml(
        story: tuple[Project, StoryLog], tmp_path: Path) -> None:
    import json

    import numpy as np
    import pyarrow.compute as pc

    from quiver.monitoring import performance_estimation as pe
    from quiver.monitoring.estimate_records import estimates_of
    from quiver.pipelines.loop_harm import held_out
    from quiver.serving.logs import read_serving_logs
    from tests.integration.nannyml_env import run_nannyml_script

    project, log = story
    model = project.config.loop_model
    drifts = runs_of(log, "quiver_drift")
    first = next(r for r in drifts if r["results"]["check_drift"].get("dataset_drift"))
    judged = first["results"]["check_drift"]
    # The drift's first day does not hurt the champion by more than the tolerance: a warning, no retrain.
    assert first["tasks"]["emit_drift"] == "skipped" and not judged["retrain"], judged["reason"]
    assert judged["reason"].startswith("drift without expected harm (day 1 of 2)"), judged["reason"]
    emitted = next(r for r in drifts if r["tasks"]["emit_drift"] == "success")
    assert emitted["results"]["check_drift"]["trigger"] == "persistent_drift" and emitted["at"] > first["at"]
    assert emitted["results"]["emit_drift"]["reason"] == emitted["results"]["check_drift"]["reason"]

    # Every served day was estimated without labels; once the labels came, the realized value sits beside it.
    rows = [r for r in estimates_of(project.registry, model, metric="roc_auc") if r["estimate"] is not None]
    realized = [r for r in rows if r["realized"] is not None and r["realized_rows"] >= 0.9 * r["rows"]]
    assert {r["arm"] for r in rows} >= {"champion", "shadow", "canary"} and len(realized) >= 5
    # Near the truth, though not always within the band: the story's drift also raises merchants' fraud risk
    # (how inputs relate to outcomes), which no label-free estimate can see; hence the persistent-drift rule.
    assert np.mean([abs(r["error"]) for r in realized]) < 0.05
    assert np.mean([r["within_band"] for r in realized]) >= 0.5, [(r["estimate"], r["realized"]) for r in realized]

    # NannyML on the first drifted day, fitted on the same held-out rows: both map the scores by an isotonic
    # fit on them (NannyML whenever the map lowers their ECE, Quiver whenever the map passes its cross-fitted
    # check), so the ROC-AUC estimates agree; Quiver's band also carries the map's own uncertainty.
    champion = project.models.resolve(model, judged["champion"].rsplit(":", 1)[1])
    scores, labels = held_out(project, champion)
    start, end = utc(judged["window_start"]), utc(judged["window_end"])
    served = read_serving_logs(project.serving_log_root, start, end, arm="champion")
    day = served.filter(pc.equal(served["model_version"], judged["champion"]))["prediction"].to_numpy()
    pq.write_table(pa.table({"score": scores, "label": labels}), tmp_path / "reference.parquet")
    pq.write_table(pa.table({"score": day}), tmp_path / "analysis.parquet")
    (tmp_path / "nannyml_day.py").write_text(_NANNYML_DAY)
    theirs = json.loads(run_nannyml_script(tmp_path / "nannyml_day.py", str(tmp_path / "reference.parquet"),
                                           str(tmp_path / "analysis.parquet")).strip().splitlines()[-1])
    same_map = pe.expected_roc_auc(day, pe.fit_isotonic(scores, labels)(day))
    ours = judged["estimates"]["champion"]["roc_auc"]
    assert theirs["needs_calibration"] and abs(theirs["roc_auc"] - same_map) < 0.005, (theirs, same_map)
    assert abs(theirs["roc_auc"] - ours["estimate"]) < 0.005, (theirs, ours)
