"""The retrain trigger file is what Airflow 3.3's own FileDeleteTrigger (an AssetWatcher trigger) fires on."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from quiver.monitoring.alerts import AirflowAssetSink, AlertManager
from quiver.registry import Registry

pytestmark = pytest.mark.integration


def test_file_delete_trigger_fires_on_the_trigger_file(tmp_path: Path, sqlite_url: str) -> None:
    from airflow.providers.standard.triggers.file import FileDeleteTrigger
    from airflow.sdk import Asset, AssetWatcher

    sink = AirflowAssetSink("quiver://monitoring/drift", trigger_dir=tmp_path / "triggers")
    assert sink.trigger_file is not None
    trigger = FileDeleteTrigger(filepath=str(sink.trigger_file), poke_interval=0.05)
    # The retrain DAG declares exactly this: an Asset watched by the trigger on our file.
    asset = Asset("quiver://monitoring/drift", watchers=[AssetWatcher(name="drift_trigger", trigger=trigger)])
    assert asset.watchers[0].trigger is trigger

    raised = AlertManager(Registry(sqlite_url, project="fraud"), [sink]).raise_alert(
        "retrain_needed", "fraud_model", "critical", "Retrain fraud_model: expected harm", detail={"share": 0.6})
    assert raised.alert.deliveries == {"airflow_asset": "delivered"}
    payload = json.loads(sink.trigger_file.read_text())
    assert payload["extra"]["alert_id"] == raised.alert.id

    async def first_event() -> object:
        return await asyncio.wait_for(anext(trigger.run()), timeout=10)

    event = asyncio.run(first_event())
    assert event is not None
    assert not sink.trigger_file.exists()  # consumed by the trigger, as in a running triggerer
    assert len(list((tmp_path / "triggers" / "monitoring_drift.events").glob("*.json"))) == 1
