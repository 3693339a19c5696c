"""Monitoring tables on SQLite and PostgreSQL: migration 0002, drift time series, alert dedup under races."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime

import numpy as np
import pandas as pd
import pytest
import sqlalchemy as sa

from quiver.monitoring.alerts import AlertManager
from quiver.monitoring.checks import run_drift_check
from quiver.monitoring.repository import drift_history, drift_results_of, list_alerts, list_drift_runs
from quiver.registry import Registry

pytestmark = pytest.mark.integration


@pytest.fixture
def registry(registry_url: str) -> Iterator[Registry]:
    reg = Registry(registry_url, project="fraud")
    yield reg
    reg.close()


def test_migration_creates_the_monitoring_tables(registry: Registry) -> None:
    # The migrations run to the newest revision (0002 added these tables; later ones must keep them).
    from pathlib import Path

    import quiver.registry

    versions = Path(quiver.registry.__file__).parent / "migrations" / "versions"
    assert registry.schema_revision() == max(p.name[:4] for p in versions.glob("[0-9][0-9][0-9][0-9]_*.py"))
    tables = set(sa.inspect(registry.engine).get_table_names())
    assert {"drift_runs", "drift_results", "alerts", "alert_deliveries"} <= tables


def test_open_alert_uniqueness_is_enforced_by_the_database(registry: Registry) -> None:
    now = datetime.now(UTC)
    row = {"project": "fraud", "kind": "drift", "subject": "a", "dedup_key": "drift:a", "severity": "warning",
           "status": "open", "title": "t", "message": "", "detail_json": "{}", "occurrences": 1,
           "created_at": now, "last_seen_at": now}
    from quiver.registry.monitoring_tables import alerts

    with registry.engine.begin() as connection:
        connection.execute(sa.insert(alerts).values(**row))
        connection.execute(sa.insert(alerts).values(**{**row, "status": "resolved"}))  # history is fine
    with pytest.raises(sa.exc.IntegrityError), registry.engine.begin() as connection:
        connection.execute(sa.insert(alerts).values(**row))


def test_concurrent_raises_leave_one_open_alert(registry: Registry) -> None:
    manager = AlertManager(registry)
    outcomes: list[str] = []
    errors: list[BaseException] = []

    def raise_it() -> None:
        try:
            outcomes.append(manager.raise_alert("drift", "fraud_model:amount", "warning", "amount drifted").outcome)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=raise_it) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(outcomes) == ["created"] + ["repeated"] * 7
    [alert] = list_alerts(registry, "open", "drift")
    assert alert.occurrences == 8


def test_drift_checks_build_a_time_series_and_alerts(registry: Registry) -> None:
    rng = np.random.default_rng(0)
    ref = pd.DataFrame({"amount": rng.lognormal(3, 1, 4_000), "country": rng.choice(["DE", "US"], 4_000),
                        "score": rng.normal(0, 1, 4_000)})
    manager = AlertManager(registry)
    run_ids = []
    for shift in (0.0, 0.6, 0.0):
        cur = pd.DataFrame({"amount": rng.lognormal(3 + shift, 1, 4_000),
                            "country": rng.choice(["DE", "US"], 4_000), "score": rng.normal(0, 1, 4_000)})
        check = run_drift_check(ref, cur, name="fraud_model", registry=registry, alerts=manager,
                                reference_label="train.parquet", current_label=f"serving shift={shift}")
        run_ids.append(check.run_id)
        if shift:
            assert {a.outcome for a in check.alerts} == {"created"}
            # One feature shown beyond its minimum effect is a dataset drift (the bounded rule is family-wise).
            assert {a.alert.kind for a in check.alerts} == {"drift", "dataset_drift"}
            assert {a.subject for a in manager.open_alerts()} == {"fraud_model:amount", "fraud_model"}
        else:
            assert manager.open_alerts() == []  # the third run resolved what the second opened
    history = drift_history(registry, "amount", "fraud_model")
    assert [h["run_id"] for h in history] == run_ids
    assert [h["status"] for h in history] == ["ok", "alert", "ok"]
    assert history[1]["ks_statistic"] >= 0.1 and history[1]["psi"] > history[0]["psi"]
    assert history[1]["ks_pvalue"] is not None and history[1]["n_ref"] == 4_000
    runs = list_drift_runs(registry, "fraud_model")
    assert [r["id"] for r in runs] == run_ids[::-1]
    assert runs[1]["n_drifted"] == 1 and runs[1]["current"] == "serving shift=0.6"
    assert {r["feature"] for r in drift_results_of(registry, run_ids[0])} == {"amount", "country", "score"}
    resolved = list_alerts(registry, "resolved", "drift")
    assert len(resolved) == 1 and resolved[0].resolved_at is not None


def test_dataset_drift_alert(registry: Registry) -> None:
    rng = np.random.default_rng(1)
    ref = pd.DataFrame({f"f{i}": rng.normal(0, 1, 3_000) for i in range(4)})
    cur = pd.DataFrame({f"f{i}": rng.normal(0.8 if i < 3 else 0, 1, 3_000) for i in range(4)})
    manager = AlertManager(registry)
    check = run_drift_check(ref, cur, name="fraud_model", registry=registry, alerts=manager)
    assert check.report.dataset_drift and check.report.drift_share == 0.75
    [dataset] = manager.open_alerts("dataset_drift")
    assert dataset.severity == "warning" and dataset.detail["drifted"] == ["f0", "f1", "f2"]


def test_drift_alerts_keep_the_data_time_their_run_judged(registry: Registry) -> None:
    """Before: the alerts of a drift run over a simulated day carried only the wall clock, so the console's
    timeline put them days after the decisions they caused (the run itself kept its window's end)."""
    rng = np.random.default_rng(2)
    ref = pd.DataFrame({f"f{i}": rng.normal(0, 1, 3_000) for i in range(4)})
    cur = pd.DataFrame({f"f{i}": rng.normal(0.8 if i < 3 else 0, 1, 3_000) for i in range(4)})
    manager = AlertManager(registry)
    window = {"start": "2026-11-09T00:00:00+00:00", "end": "2026-11-10T00:00:00+00:00"}
    run_drift_check(ref, cur, name="fraud_model", registry=registry, alerts=manager, detail={"window": window})
    raised = manager.open_alerts()
    assert {a.kind for a in raised} == {"drift", "dataset_drift"}
    judged = datetime(2026, 11, 10, tzinfo=UTC)
    assert all(a.as_of == judged and a.data_time == judged for a in raised), [(a.kind, a.as_of) for a in raised]
    assert all(a.created_at > judged for a in raised)  # the wall clock, recorded beside it
