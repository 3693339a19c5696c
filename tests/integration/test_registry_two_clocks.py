"""Two clocks (issue 36, item 3): every loop record keeps the data time it judged and the wall time it was
recorded; migration 0007 backfills both on an old registry; timelines (`models describe`, `models history`,
`decisions list`, the console's model page) sort by data time and label which clock each column shows."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from quiver.registry import Registry, rollouts
from quiver.registry.models import ModelRegistry
from quiver.registry.repository import make_engine
from tests.integration.registry_upgrade import upgrade_to

pytestmark = pytest.mark.integration

T = datetime(2026, 11, 14, tzinfo=UTC)  # the loop's data time (simulated); the wall clock is today
MODEL = "fraud_model"


def _utc(value: datetime | None) -> datetime | None:
    return None if value is None else (value.replace(tzinfo=UTC) if value.tzinfo is None else value)


def test_0007_backfills_both_clocks(registry_url: str) -> None:
    upgrade_to(registry_url, "0006")
    wall = datetime(2026, 12, 3, 18, 7, tzinfo=UTC)
    meta = sa.MetaData()
    decisions = sa.Table("decisions", meta, autoload_with=make_engine(registry_url))
    history = sa.Table("model_alias_history", meta, autoload_with=make_engine(registry_url))
    alerts = sa.Table("alerts", meta, autoload_with=make_engine(registry_url))
    drift_runs = sa.Table("drift_runs", meta, autoload_with=make_engine(registry_url))
    common = {"project": "p", "model": MODEL, "champion_version": f"{MODEL}:1", "candidate_version": f"{MODEL}:2",
              "decided_by": "t"}
    canary_as_of = T + timedelta(days=3)
    engine = make_engine(registry_url)
    with engine.begin() as connection:
        connection.execute(sa.insert(decisions).values(  # the canary judge wrote its as_of as decided_at
            **common, id=1, kind="canary_step", outcome="promote", idempotency_key="a" * 32, decided_at=canary_as_of,
            statistics_json=json.dumps({"window": {"as_of": canary_as_of.isoformat()}})))
        connection.execute(sa.insert(decisions).values(  # a shadow verdict: decided_at was the wall clock
            **common, id=2, kind="shadow_evaluation", outcome="better", idempotency_key="b" * 32, decided_at=wall,
            statistics_json=json.dumps({"window": {"start": None, "end": (T + timedelta(days=1)).isoformat(),
                                                   "as_of": (T + timedelta(days=2)).isoformat()}})))
        connection.execute(sa.insert(decisions).values(  # no window at all: the one moment is both
            **common, id=3, kind="manual_rollback", outcome="rollback", idempotency_key="c" * 32, decided_at=wall,
            statistics_json=json.dumps({"reason": "by hand"})))
        moves = {"project": "p", "name": MODEL, "reason": "r", "moved_by": "t", "moved_at": wall}
        connection.execute(sa.insert(history).values(**moves, id=1, alias="champion", from_version=1, to_version=2,
                                                     decision_id=1))
        connection.execute(sa.insert(history).values(**moves, id=2, alias="shadow", from_version=None,
                                                     to_version=2, decision_id=None))
        connection.execute(sa.insert(alerts).values(
            id=1, project="p", kind="canary", subject="s", dedup_key="canary:s", severity="warning", status="open",
            title="t", message="", occurrences=1, created_at=wall, last_seen_at=wall,
            detail_json=json.dumps({"as_of": (T + timedelta(days=4)).isoformat()})))
        connection.execute(sa.insert(drift_runs).values(
            id=1, project="p", name="n", reference="", current="", engine="e", started_at=wall, finished_at=wall,
            n_features=0, n_judged=0, n_drifted=0, drift_share=0.0, dataset_drift=False, status="succeeded",
            detail_json=json.dumps({"window": {"end": (T + timedelta(days=5)).isoformat()}})))
    engine.dispose()

    registry = Registry(registry_url, project="p")  # migrates to head
    try:
        assert (registry.schema_revision() or "") >= "0007"
        from quiver.registry.model_tables import model_alias_history as moves_table
        from quiver.registry.monitoring_tables import alerts as alerts_table
        from quiver.registry.monitoring_tables import drift_runs as runs_table
        from quiver.registry.rollout_tables import decisions as decisions_table

        with registry.engine.connect() as connection:
            got = {r.id: (_utc(r.as_of), _utc(r.recorded_at)) for r in connection.execute(sa.select(
                decisions_table.c.id, decisions_table.c.as_of, decisions_table.c.recorded_at))}
            moved = {r.id: _utc(r.as_of) for r in connection.execute(sa.select(moves_table.c.id,
                                                                               moves_table.c.as_of))}
            alert_as_of = _utc(connection.execute(sa.select(alerts_table.c.as_of)).scalar())
            drift_as_of = _utc(connection.execute(sa.select(runs_table.c.as_of)).scalar())
        assert got[1] == (canary_as_of, None)  # its wall time was never recorded: left empty, not invented
        assert got[2] == (T + timedelta(days=2), wall)
        assert got[3] == (wall, wall)
        assert moved == {1: canary_as_of, 2: wall}  # a move caused by a decision happened at its data time
        assert alert_as_of == T + timedelta(days=4) and drift_as_of == T + timedelta(days=5)
        shadow = rollouts.get_decision(registry, 2)
        assert (shadow.as_of, shadow.recorded_at) == (T + timedelta(days=2), wall)
        Registry(registry_url, project="p").close()  # a second open is a no-op
    finally:
        registry.close()


@pytest.fixture
def world(tmp_path: Path) -> Path:
    """Canary steps judged Nov 15 and Nov 18 (the promotion moves champion), and a shadow verdict about data
    up to Nov 16 that was recorded afterwards, on today's wall clock."""
    (tmp_path / "quiver.yaml").write_text(f"project: clocks\nregistry_url: sqlite:///{tmp_path}/r.db\n")
    registry = Registry(f"sqlite:///{tmp_path}/r.db", project="clocks")
    models = ModelRegistry(registry, verify_artifacts=False)
    metrics = {"roc_auc": 0.72, "log_loss": 0.41, "baseline": {"roc_auc": 0.68, "log_loss": 0.44}}
    for seed in (1, 2):
        models.register(MODEL, artifact_path=f"models/{MODEL}/{seed}", sha256=f"{seed}" * 64, metrics=metrics,
                        window_start=T - timedelta(days=7), cutoff=T, features=["f0"], catalog_version=None,
                        label_column="y", lineage={}, reference_path=f"models/{MODEL}/{seed}/ref.parquet")
    models.set_alias(MODEL, "champion", 1, expected=None, reason="first model", as_of=T)
    rollout = rollouts.start_rollout(registry, MODEL, champion_version=1, canary_version=2, fraction=0.5,
                                     settings={}, now=T)
    labels = {"rollout_id": rollout.id, "champion_version": f"{MODEL}:1", "candidate_version": f"{MODEL}:2"}
    for day, outcome, key in ((1, "hold", "h"), (4, "promote", "p")):
        at = T + timedelta(days=day)
        decision = rollouts.record_decision(
            registry, MODEL, kind="canary_step", outcome=outcome, idempotency_key=key * 32, at=at,
            statistics={"reason": f"why-{outcome}", "window": {"as_of": at.isoformat()}}, **labels)
    models.set_alias(MODEL, "champion", 2, expected=1, reason="canary promoted", decision_id=decision.id)
    shadow_as_of = T + timedelta(days=2)
    rollouts.record_decision(registry, MODEL, kind="shadow_evaluation", outcome="better", idempotency_key="s" * 32,
                             champion_version=f"{MODEL}:1", candidate_version=f"{MODEL}:2",
                             statistics={"reason": "why-shadow", "window": {"as_of": shadow_as_of.isoformat()}})
    registry.close()
    return tmp_path


def test_records_keep_both_clocks(world: Path) -> None:
    registry = Registry(f"sqlite:///{world}/r.db", project="clocks")
    try:
        found = {d.statistics["reason"]: d for d in rollouts.list_decisions(registry, MODEL)}
        today = datetime.now(UTC)
        shadow, promote = found["why-shadow"], found["why-promote"]
        assert shadow.as_of == T + timedelta(days=2)
        assert promote.as_of == T + timedelta(days=4)
        for d in (shadow, promote):
            assert d.recorded_at is not None and abs(d.recorded_at - today) < timedelta(days=1)
        moves = ModelRegistry(registry).history(MODEL)
        assert [(m.alias, m.as_of) for m in moves] == [  # a move a decision caused happened at its data time
            ("champion", T), ("champion", T + timedelta(days=4)), ("previous", T + timedelta(days=4))]
        assert moves[-1].moved_at > T + timedelta(days=10)  # recorded on the wall clock
        timeline = rollouts.timeline(list(found.values()))
        assert [d.statistics["reason"] for d in timeline] == ["why-promote", "why-shadow", "why-hold"]
        from quiver.monitoring.repository import open_alert

        alert, _ = open_alert(registry, "canary", MODEL, "warning", "guardrail failed", "",
                              {"window": {"as_of": (T + timedelta(days=3)).isoformat()}}, [])
        assert alert.data_time == T + timedelta(days=3) and alert.created_at > T + timedelta(days=10)
        assert rollouts.list_rollouts(registry, MODEL)[0].recorded_at is not None
    finally:
        registry.close()


def _rows(output: str, pattern: str) -> list[str]:
    return [m.group(0) for m in re.finditer(pattern, output)]


def _cli(world: Path, *args: str) -> str:
    from quiver.cli import _register_optional_commands, app

    _register_optional_commands()
    result = CliRunner().invoke(app, [*args, "--config", str(world / "quiver.yaml")], env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    return result.output


def test_cli_timelines_sort_by_data_time_and_label_both_clocks(world: Path) -> None:
    describe = _cli(world, "models", "describe", MODEL, "2")
    assert "data time" in describe and "recorded" in describe
    assert re.findall(r"why-\w+", describe) == [
        "why-promote", "why-shadow", "why-hold"]
    assert "champion since 2026-11-18 00:00 (data time)" in describe
    listed = _cli(world, "decisions", "list", MODEL)
    assert "data time" in listed and "recorded" in listed
    assert re.findall(r"why-\w+", listed) == [
        "why-promote", "why-shadow", "why-hold"]
    history = _cli(world, "models", "history", MODEL)
    assert "data time" in history and "recorded" in history
    assert "2026-11-18 00:00" in history
    shown = _cli(world, "decisions", "show", str(min(int(i) for i in re.findall(r"#(\d+)", listed))))
    assert "(data time)" in shown and "(wall clock)" in shown


def test_console_model_page_sorts_by_data_time_and_labels_both_clocks(world: Path) -> None:
    from quiver.config import load_config
    from quiver.ui import app as console_app

    app = console_app.create_app(load_config(world / "quiver.yaml"), api_key="k")

    async def fetch(path: str) -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://console",
                                     headers={"X-API-Key": "k"}) as client:
            return await client.get(path)

    try:
        page = asyncio.run(fetch(f"/models/{MODEL}")).text
    finally:
        app.state.console.close()
    decisions = page[page.index("id='decisions'"):]
    decisions = decisions[:decisions.index("</table>")]
    assert "<th>data time ↓</th>" in decisions and "<th>recorded</th>" in decisions
    assert re.findall(r"why-\w+", decisions) == [
        "why-promote", "why-shadow", "why-hold"]
    history = page[page.index("id='alias-history'"):]
    history = history[:history.index("</table>")]
    assert "<th>data time ↓</th>" in history and "<th>recorded</th>" in history
    assert "since 2026-11-18 00:00 (data time)" in page
