"""Alerts with a lifecycle: opened once per (model, kind), updated while the condition holds (at most a line a
data day unless the drifted features change), resolved when it clears or when the model changes, never
re-delivered for the same condition; every state change in `alert_events` with both clocks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd
import pytest

from quiver.monitoring.alerts import AlertManager, resolve_for_new_champion
from quiver.monitoring.checks import run_drift_check
from quiver.monitoring.repository import alert_history, list_alerts, open_alert, resolve_alerts
from quiver.registry import Registry

DAY0 = datetime(2026, 11, 10, tzinfo=UTC)


class Recorder:
    name = "recorder"

    def __init__(self) -> None:
        self.sent: list[int] = []

    def send(self, alert: Any) -> int:
        self.sent.append(alert.id)
        return 1


@pytest.fixture
def registry(sqlite_url: str) -> Registry:
    return Registry(sqlite_url, project="fraud")


def frames(shifted: int, seed: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A reference of four features and a day whose first `shifted` features moved by 0.8 sd."""
    rng = np.random.default_rng(seed)
    ref = pd.DataFrame({f"f{i}": rng.normal(0, 1, 3_000) for i in range(4)})
    cur = pd.DataFrame({f"f{i}": rng.normal(0.8 if i < shifted else 0, 1, 3_000) for i in range(4)})
    return ref, cur


def check(registry: Registry, manager: AlertManager, day: int, shifted: int = 3,
          champion: str = "fraud_model:2") -> Any:
    ref, cur = frames(shifted, day)
    start = DAY0 + timedelta(days=day)
    window = {"start": start.isoformat(), "end": (start + timedelta(days=1)).isoformat()}
    return run_drift_check(ref, cur, name="fraud_model", registry=registry, alerts=manager,
                           reference_label=f"{champion} reference", current_label=f"day {day}",
                           detail={"window": window})


def test_three_daily_checks_of_one_condition_give_one_alert_one_delivery_three_occurrences(registry: Registry) -> None:
    sink = Recorder()
    manager = AlertManager(registry, [sink])
    outcomes = [[a.outcome for a in check(registry, manager, day).alerts if a.alert.kind == "dataset_drift"]
                for day in range(3)]
    assert outcomes == [["created"], ["repeated"], ["repeated"]]
    [alert] = list_alerts(registry, "open", "dataset_drift")
    assert alert.occurrences == 3 and sink.sent.count(alert.id) == 1  # before and after: no daily re-fire
    events = alert_history(registry, alert.id)
    # Before: no history at all (only the alert row's occurrences and last_seen_at).
    assert [e.event for e in events] == ["opened", "updated", "updated"]
    assert [e.as_of for e in events] == [DAY0 + timedelta(days=d + 1) for d in range(3)]  # data time
    assert all(e.at > e.as_of for e in events)  # the wall clock beside it
    assert events[1].reason.startswith("still holds (seen 2×)") and events[2].detail["occurrences"] == 3


def test_a_repeat_on_the_same_data_day_writes_nothing_unless_the_drifted_features_change(registry: Registry) -> None:
    manager = AlertManager(registry)
    detail = {"as_of": "2026-11-11T00:00:00+00:00", "drifted": ["f0", "f1"], "reference": "fraud_model:2 reference"}
    first, _ = open_alert(registry, "dataset_drift", "fraud_model", "critical", "drift", "share 50 %", detail, [])
    open_alert(registry, "dataset_drift", "fraud_model", "critical", "drift", "share 52 %", detail, [])
    assert [e.event for e in alert_history(registry, first.id)] == ["opened"]  # an hourly check: no flood
    open_alert(registry, "dataset_drift", "fraud_model", "critical", "drift", "share 75 %",
               {**detail, "drifted": ["f0", "f1", "f2"]}, [])
    events = alert_history(registry, first.id)
    assert [e.event for e in events] == ["opened", "updated"]
    assert "drifted features changed: +f2" in events[1].reason
    manager.raise_alert("dataset_drift", "fraud_model", "critical", "drift")
    assert len(alert_history(registry, first.id)) == 3  # another data day (the wall clock's): one more line


def test_escalation_and_resolution_are_in_the_history_with_why(registry: Registry) -> None:
    manager = AlertManager(registry)
    raised = manager.raise_alert("quality", "transactions", "warning", "gate failed", "3 rows null")
    manager.raise_alert("quality", "transactions", "critical", "gate failed hard", "300 rows null")
    assert resolve_alerts(registry, "", alert_id=raised.alert.id, reason="resolved by hand") == 1
    events = alert_history(registry, raised.alert.id)
    assert [(e.event, e.severity) for e in events] == [("opened", "warning"), ("escalated", "critical"),
                                                       ("resolved", "critical")]
    assert events[1].reason == "300 rows null" and events[2].reason == "resolved by hand"
    assert all(e.as_of is not None for e in events)


def test_a_cleared_condition_resolves_saying_the_data_time_it_cleared_on(registry: Registry) -> None:
    manager = AlertManager(registry)
    check(registry, manager, 0)
    check(registry, manager, 1, shifted=0)
    assert list_alerts(registry, "open") == []
    [dataset] = list_alerts(registry, "resolved", "dataset_drift")
    last = alert_history(registry, dataset.id)[-1]
    assert last.event == "resolved" and last.reason == "cleared on 2026-11-12 00:00 UTC"
    assert last.as_of == DAY0 + timedelta(days=2)


def test_a_check_against_a_new_champion_resolves_the_old_ones_alerts_and_opens_its_own(registry: Registry) -> None:
    sink = Recorder()
    manager = AlertManager(registry, [sink])
    first = check(registry, manager, 0, champion="fraud_model:2")
    old_ids = {a.alert.id for a in first.alerts}
    second = check(registry, manager, 1, champion="fraud_model:3")
    # Before: the same open alerts were bumped ("repeated"): fraud_model:3 inherited fraud_model:2's alerts.
    assert {a.outcome for a in second.alerts} == {"created"} and not old_ids & {a.alert.id for a in second.alerts}
    for alert_id in old_ids:
        last = alert_history(registry, alert_id)[-1]
        assert last.event == "resolved" and last.reason == "the model changed: fraud_model:2 → fraud_model:3"
    assert {a.detail["reference"] for a in list_alerts(registry, "open")} == {"fraud_model:3 reference"}
    assert len(sink.sent) == len(old_ids) + len(second.alerts)  # the new version's alerts are news


def test_resolve_for_new_champion_at_promotion(registry: Registry) -> None:
    manager = AlertManager(registry)
    check(registry, manager, 0, champion="fraud_model:2")
    manager.raise_alert("drift", "other_model:f0", "warning", "f0 drifted")  # another model's: untouched
    opened = {a.id for a in list_alerts(registry, "open") if a.subject.startswith("fraud_model")}
    assert resolve_for_new_champion(registry, "fraud_model", "fraud_model:2") == 0  # same version: nothing
    promoted = datetime(2026, 11, 17, tzinfo=UTC)
    assert resolve_for_new_champion(registry, "fraud_model", "fraud_model:3", as_of=promoted) == len(opened)
    assert [a.subject for a in list_alerts(registry, "open")] == ["other_model:f0"]
    for alert_id in opened:
        last = alert_history(registry, alert_id)[-1]
        assert last.reason == "the model changed: fraud_model:2 → fraud_model:3" and last.as_of == promoted
