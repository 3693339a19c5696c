"""Decisions and alerts read at 3 a.m.: a first sentence in plain words for every kind and outcome, the
settings a decision was judged on that are not the defaults, one latency cut-off per decision (and which),
steps counted from 1, an alert's data time from what it judged, alerts ordered by severity, and charts whose
x-axis reads data times."""

from __future__ import annotations

import itertools
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

from quiver.monitoring.canary_settings import JudgeSettings
from quiver.registry import explain
from quiver.registry.plain_words import alert_sentence, decision_sentence
from quiver.registry.rollouts import Decision
from quiver.ui.alert_pages import AlertView, by_severity
from quiver.ui.charts import guardrail_chart

JUDGED = datetime(2026, 11, 18, 12, tzinfo=UTC)  # the data time judged
WALL = datetime(2026, 12, 7, 14, 43, tzinfo=UTC)  # when the alert was raised
SVG = "{http://www.w3.org/2000/svg}"


def decision(kind: str, outcome: str, id_: int = 15, fraction: float | None = 0.5, by: str = "quiver_canary",
             candidate: str = "fraud_model:3", champion: str = "fraud_model:2", **stats: Any) -> Decision:
    return Decision(id_, "fraud_model", 2, kind, outcome, 0, fraction, champion, candidate, dict(stats), "k" * 16,
                    JUDGED, by, as_of=JUDGED, recorded_at=WALL)


def guardrail(name: str, status: str, reason: str = "why", **stats: Any) -> dict[str, Any]:
    return {"name": name, "status": status, "reason": reason,
            "statistics": {"estimate": 0.01, "lower": 0.0, "upper": 0.02, "floor": 0.05, "fail_above": 0.025, **stats}}


PAIRED = {"logged": 800, "replayed": 0, "unpaired": 0}


def test_a_rollback_on_score_shift_says_what_happened_in_plain_words() -> None:
    rolled = decision("canary_step", "rollback", pairing=PAIRED,
                      reason="score_shift: canary worse by 0.9021: the whole interval [0.8, 0.94] lies above 0.025 "
                             "(0.5 × floor 0.05)",
                      guardrails=[guardrail("error_rate", "wait"), guardrail("score_shift", "fail")])
    assert decision_sentence(rolled) == ("fraud_model:3 was rolled back: its scores were far from the champion's on "
                                         "the same requests.")
    both = decision("canary_step", "rollback", guardrails=[guardrail("error_rate", "fail"), guardrail("log_loss",
                                                                                                     "fail")])
    assert decision_sentence(both) == ("fraud_model:3 was rolled back: its calls failed more often than the "
                                       "champion's and its predictions were worse than the champion's (log loss).")
    timeout = decision("canary_step", "rollback", reason="timeout: log_loss still undecided after 100000 canary calls",
                       guardrails=[guardrail("log_loss", "wait"), guardrail("score_shift", "wait")])
    assert decision_sentence(timeout) == ("fraud_model:3 was rolled back: after the most canary calls a step may "
                                          "take, log loss still could not show it within the floors.")


def test_holds_say_what_the_step_still_needs() -> None:
    labels = "0 canary / 0 champion labelled rows (0 paired), need 200"
    hold = decision("canary_step", "hold", reason="waiting on error_rate, log_loss, brier", guardrails=[
        guardrail("error_rate", "wait", "interval [-0.03, 0.03] not yet decisive against floor 0.01"),
        guardrail("latency_p99", "pass"), guardrail("score_shift", "wait", "not yet decisive"),
        guardrail("log_loss", "wait", labels), guardrail("brier", "wait", labels)])
    assert decision_sentence(hold) == ("fraud_model:3 stays at canary share 0.5: the failed-call rate is not yet "
                                       "shown within its floor; log loss and the Brier score need more labelled rows.")
    empty = decision("canary_step", "hold", reason="no traffic logged in this step yet")
    assert decision_sentence(empty) == "fraud_model:3 stays at canary share 0.5: no traffic was logged in this step yet."
    gate = decision("canary_step", "hold", reason="holding: no consistency check covers …",
                    consistency={"passed": False, "blocked": []})
    assert "no recent online/offline consistency check" in decision_sentence(gate)
    lost = decision("canary_step", "hold", reason="holding: the serving loggers dropped 40 answering rows …",
                    guardrails=[guardrail("log_loss", "pass")])
    assert "serving logs lost too many" in decision_sentence(lost)


def test_every_other_kind_and_outcome_has_its_sentence() -> None:
    sentences = {
        "promote": decision("canary_step", "promote", candidate="fraud_model:2", champion="fraud_model:1"),
        "advance": decision("canary_step", "advance", fraction=0.05, next_fraction=0.25),
        "halt": decision("canary_step", "halt", reason="sample-ratio mismatch: …"),
        "watch rollback": decision("watch", "rollback", candidate="fraud_model:1", champion="fraud_model:2",
                                   fraction=1.0, guardrails=[guardrail("brier", "fail")], pairing=PAIRED),
        "confirm": decision("watch", "confirm", candidate="fraud_model:1", champion="fraud_model:2", fraction=1.0),
        "manual": decision("manual_rollback", "rollback", by="alice", reason="pager: scores look off",
                           status="running"),
        "better": decision("shadow_evaluation", "better", fraction=None, settings={"metric": "log_loss"}),
        "worse": decision("shadow_evaluation", "worse", fraction=None),
        "too few": decision("shadow_evaluation", "inconclusive", fraction=None,
                            reason="12 labelled pairs, need 200"),
    }
    said = {name: decision_sentence(d) for name, d in sentences.items()}
    assert said["promote"] == ("fraud_model:2 was promoted to champion: at canary share 0.5 every guardrail showed "
                               "it no worse than the champion fraud_model:1 beyond its floor.")
    assert said["advance"].startswith("fraud_model:3 moved on from canary share 0.05 to 0.25")
    assert said["halt"].startswith("fraud_model:3's rollout was halted: the router sent a different share")
    assert said["watch rollback"] == ("fraud_model:2's promotion was reverted: after it became champion, its "
                                      "probabilities were further from what happened than the previous champion "
                                      "fraud_model:1's on the same requests (Brier score).")
    assert said["confirm"].startswith("fraud_model:2 stays champion")
    assert said["manual"] == "fraud_model:3 was rolled back by hand by alice: pager: scores look off."
    assert said["better"].startswith("fraud_model:3 did better than the champion fraud_model:2")
    assert said["worse"].endswith("so it goes no further.")
    assert said["too few"].endswith("too few labelled requests were scored by both.")
    assert all(s.endswith(".") and "_" not in s.replace("fraud_model", "") for s in said.values()), said


def alert(kind: str, subject: str, detail: dict[str, Any], severity: str = "critical", id_: int = 26) -> Any:
    return SimpleNamespace(id=id_, kind=kind, subject=subject, detail=detail, severity=severity, title="t",
                           message="m", created_at=WALL, last_seen_at=WALL, as_of=WALL)


def test_an_alert_reads_as_its_decision_and_judged_that_decisions_data_time() -> None:
    rolled = decision("canary_step", "rollback", guardrails=[guardrail("score_shift", "fail")], pairing=PAIRED)
    canary = alert("canary_rollback", "fraud_model:3", {"decision_id": 15, "rollout_id": 2})
    assert alert_sentence(canary, rolled) == decision_sentence(rolled)
    # Before: the alert's data time was the wall clock it was raised at (its detail names no data time).
    assert explain.alert_data_time(canary, rolled) == (JUDGED, "decision #15's data time")
    retrain = alert("retrain", "fraud_model", {"version": 2, "comparison": {"rows": 8000}}, severity="info")
    cutoff = datetime(2026, 11, 11, tzinfo=UTC)
    assert explain.alert_data_time(retrain, None, cutoff) == (cutoff, "the version's training cutoff")
    assert alert_sentence(retrain) == ("fraud_model:2 was trained on newer data and made the challenger: it was no "
                                       "worse than its baseline nor than the champion on the same test rows.")
    drift = alert("drift", "fraud_model:tx_amount", {"as_of": "2026-11-10T00:00:00+00:00"}, severity="warning")
    assert explain.alert_data_time(drift)[0] == datetime(2026, 11, 10, tzinfo=UTC)
    assert alert_sentence(drift) == "Feature tx_amount of fraud_model no longer looks like its reference."
    bare = alert("model_error", "fraud_model:3", {"model": "fraud_model"})
    assert explain.alert_data_time(bare) == (WALL, "wall clock (no data time recorded)")


def test_alerts_are_ordered_by_severity_then_newest() -> None:
    def view(id_: int, severity: str, hours: int) -> AlertView:
        return AlertView(alert("drift", "s", {}, severity, id_), "", JUDGED + timedelta(hours=hours), "recorded",
                         None, None)

    views = [view(1, "warning", 0), view(2, "info", 9), view(3, "critical", -5), view(4, "warning", 3),
             view(5, "critical", 1)]
    assert [v.alert.id for v in by_severity(views)] == [5, 3, 4, 1, 2]  # before: by id, newest first


def test_non_default_floors_are_named_with_their_defaults() -> None:
    # The demo's canary: log loss 0.08 and Brier 0.02 where the defaults are 0.02 and 0.01.
    used = JudgeSettings(steps=(0.5, 1.0), log_loss_floor=0.08, brier_floor=0.02).to_dict()
    promoted = decision("canary_step", "promote", guardrails=[
        guardrail("log_loss", "pass", floor=0.08), guardrail("brier", "pass", floor=0.02),
        guardrail("error_rate", "pass", floor=0.01)])
    changes = explain.non_default_settings(explain.judged_settings(promoted, used), JudgeSettings().to_dict())
    assert [c.name for c in changes] == ["brier_floor", "log_loss_floor", "steps"]
    assert explain.settings_note(changes) == (
        "Judged on non-default floors: Brier floor 0.02 (default 0.01, looser); log-loss floor 0.08 (default 0.02, "
        "looser). Other non-default settings: steps 0.5, 1 (default 0.05, 0.25, 0.5, 1).")
    # Without the rollout's settings, the floors the decision recorded still tell.
    alone = explain.non_default_settings(explain.judged_settings(promoted), JudgeSettings().to_dict())
    assert [c.name for c in alone] == ["brier_floor", "log_loss_floor"]
    [log_loss] = [r for r in explain.guardrail_rows(promoted) if r.name == "log_loss"]
    change = explain.floor_change(log_loss, JudgeSettings().to_dict())
    assert change is not None and change.way == "looser" and change.default == 0.02
    assert explain.non_default_settings(JudgeSettings().to_dict(), JudgeSettings().to_dict()) == []


def look_decision(id_: int, threshold_ms: float | None) -> Decision:
    latency = guardrail("latency_p99", "pass", reference_ms=10.4, threshold_ms=threshold_ms)
    return decision("canary_step", "hold", id_=id_, guardrails=[latency])


def test_one_latency_cut_off_per_decision_and_the_label_says_whose() -> None:
    # Before: the rollout's reference (10.4) on the decision's chart, each look's own elsewhere (9.31, 9.24).
    looks = [look_decision(7, 9.24), look_decision(8, 9.31), look_decision(9, None)]
    reference = {"latency_threshold_ms": 10.4}
    at_8 = explain.latency_cutoff(looks, reference, upto=8)
    assert at_8 is not None and (at_8.value, at_8.decision_id) == ("9.31 ms", 8)
    assert "as decision #8 recorded it" in at_8.source
    at_7 = explain.latency_cutoff(looks, reference, upto=7)
    assert at_7 is not None and at_7.value == "9.24 ms"
    start = explain.latency_cutoff([], reference)
    assert start is not None and start.value == "10.4 ms" and start.decision_id is None
    svg = guardrail_chart("latency_p99", explain.looks(looks)["latency_p99"], cutoff=at_8)
    shown = " ".join(t.text or "" for t in ET.fromstring(svg).iter(f"{SVG}text"))
    assert "Δ share of calls > 9.31 ms" in shown and "as decision #8 recorded it" in shown
    assert "10.4" not in shown and "9.24" not in shown


def test_steps_count_from_one_in_the_latency_source() -> None:
    assert explain.latency_source_text({"latency_source": "champion calls of step 0's first look"}) == \
        "champion calls of the first look at step 1"
    assert explain.latency_source_text({"latency_source": "champion calls in [a, b)"}) == "champion calls in [a, b)"


def test_a_guardrail_charts_x_axis_reads_each_looks_data_time() -> None:
    looks = [decision("canary_step", "hold", id_=i, guardrails=[guardrail("log_loss", "wait")]) for i in (4, 5)]
    looks = [Decision(**{**d.__dict__, "as_of": JUDGED + timedelta(hours=6 * i)}) for i, d in enumerate(looks)]
    svg = guardrail_chart("log_loss", explain.looks(looks)["log_loss"])
    ticks = [t.text for t in ET.fromstring(svg).iter(f"{SVG}text") if t.get("class") == "x-tick"]
    assert ticks == ["11-18 12:00", "11-18 18:00"]  # before: "#4", "#5"
    assert "data time of each look (UTC)" in svg
    crowded = [Decision(**{**looks[0].__dict__, "id": i, "as_of": JUDGED + timedelta(hours=i)}) for i in range(20)]
    labels = [t for t in ET.fromstring(guardrail_chart("log_loss", explain.looks(crowded)["log_loss"])).iter(
        f"{SVG}text") if t.get("class") == "x-tick"]
    xs = [float(t.get("x") or 0) for t in labels]
    assert 1 < len(labels) < 20 and min(b - a for a, b in itertools.pairwise(xs)) >= 58  # kept apart
