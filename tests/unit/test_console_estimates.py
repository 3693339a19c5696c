"""The console's estimated vs realized performance (read from `performance_estimates`) and an alert's history
page: two lines per metric with the band and units, arms as separate series, a note where labels have not
arrived, words when there is nothing yet; every state change of an alert with both clocks."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from quiver.config import load_config
from quiver.monitoring.repository import open_alert, resolve_alerts
from quiver.registry import Registry
from quiver.registry.estimate_tables import performance_estimates
from quiver.ui.alert_pages import alert_page
from quiver.ui.data import Console, NotFound
from quiver.ui.estimate_pages import estimate_chart, performance_points, performance_section

SVG = "{http://www.w3.org/2000/svg}"
DAY = datetime(2026, 11, 10, tzinfo=UTC)


@pytest.fixture
def console(tmp_path: Path) -> Iterator[Console]:
    (tmp_path / "quiver.yaml").write_text(f"project: fraud\nregistry_url: sqlite:///{tmp_path}/r.db\n")
    console = Console(load_config(tmp_path / "quiver.yaml"))
    yield console
    console.close()


def estimate_row(day: int, arm: str, metric: str = "roc_auc", *, realized: float | None = None,
                 version: str = "fraud_model:2", status: str = "estimated", estimate: float | None = 0.9,
                 **extra: Any) -> dict[str, Any]:
    start = DAY + timedelta(days=day)
    return {"project": "fraud", "model": "fraud_model", "version": version, "arm": arm, "window_start": start,
            "window_end": start + timedelta(days=1), "as_of": start + timedelta(days=1),
            "computed_at": datetime(2026, 12, 7, 9, day, tzinfo=UTC), "metric": metric,
            "status": "realized" if realized is not None else status, "rows": 5_000, "estimate": estimate,
            "lower": None if estimate is None else estimate - 0.02, "upper": None if estimate is None else estimate + 0.02,
            "reference": 0.91, "realized": realized, "realized_rows": 4_800 if realized is not None else None,
            "realized_at": None, "detail_json": json.dumps(extra)}


def insert(registry: Registry, rows: list[dict[str, Any]]) -> None:
    with registry.engine.begin() as connection:
        connection.execute(sa.insert(performance_estimates), rows)


def test_no_estimates_is_said_in_words(console: Console) -> None:
    text = performance_section(console.registry, "fraud_model")
    assert "no estimates yet: the drift check estimates performance daily once" in text and "<svg" not in text


def test_estimated_vs_realized_draws_both_per_arm_with_bands_units_and_waiting_labels(console: Console) -> None:
    rows = [estimate_row(d, "champion", realized=0.88 + d / 100 if d < 2 else None, estimate=0.9 - d / 100)
            for d in range(3)]
    rows += [estimate_row(d, "canary", version="fraud_model:3", estimate=0.92, realized=0.93 if d == 1 else None)
             for d in (1, 2)]
    rows += [estimate_row(d, "champion", "log_loss", estimate=0.2) for d in range(3)]
    rows += [estimate_row(3, "shadow", version="fraud_model:4", status="uncalibrated", estimate=None,
                          reason="expected calibration error 0.08 > 0.05")]
    insert(console.registry, rows)
    points = performance_points(console.registry, "fraud_model")
    assert len(points) == len(rows) and points[0].as_of == DAY + timedelta(days=1)
    svg = ET.fromstring(estimate_chart("roc_auc", [p for p in points if p.metric == "roc_auc"]))
    texts = [t.text or "" for t in svg.iter(f"{SVG}text")]
    assert "ROC-AUC (0–1, higher is better)" in texts  # the unit on the y-axis
    bands = svg.findall(f"{SVG}polygon[@class='band']")
    assert len(bands) == 2 and {b.get("fill") for b in bands} == {"#0b57d0", "#e8710a"}  # champion, canary
    assert len(svg.findall(f"{SVG}polyline[@class='estimate-line']")) == 2
    realized = svg.findall(f"{SVG}circle[@class='realized']")
    assert len(realized) == 3 and all("realized" in (c.findtext(f"{SVG}title") or "") for c in realized)
    assert "estimate off by" in (realized[0].findtext(f"{SVG}title") or "")
    # Labels arrive late: the windows without a realized value say so (day 2 for both arms: one note).
    assert [t for t in texts if t == "no labels yet"] == ["no labels yet"]
    assert {t for t in texts if t.startswith(("champion:", "canary:"))} == {
        "champion: estimate (line, band shaded), realized (dot)", "canary: estimate (line, band shaded), realized (dot)"}
    assert "reference 0.91" in texts
    page = performance_section(console.registry, "fraud_model")
    assert page.count("<svg") == 2 and "data-metric='log_loss'" in page  # one chart per metric
    assert "Not estimated (the scores failed the calibration check)" in page and "calibration error 0.08" in page
    table_rows = re.findall(r"<tr><td>.*?</tr>", page.split("id='performance-estimates'")[1])
    assert len(table_rows) == 8 and "no labels yet" in table_rows[0]  # newest first, waiting windows said so


def test_one_window_draws_its_band_as_a_bar(console: Console) -> None:
    insert(console.registry, [estimate_row(0, "champion")])
    svg = ET.fromstring(estimate_chart("roc_auc", performance_points(console.registry, "fraud_model")))
    assert len(svg.findall(f"{SVG}rect[@class='band']")) == 1


def test_the_alert_page_shows_its_history_with_both_clocks(console: Console) -> None:
    registry = console.registry
    detail = {"reference": "fraud_model:2 reference", "drifted": ["amount"], "drift_share": 0.5}
    alert, _ = open_alert(registry, "dataset_drift", "fraud_model", "critical", "Dataset drift in fraud_model",
                          "Share 50 %", {**detail, "as_of": "2026-11-11T00:00:00+00:00"}, [])
    open_alert(registry, "dataset_drift", "fraud_model", "critical", "Dataset drift in fraud_model", "Share 52 %",
               {**detail, "as_of": "2026-11-12T00:00:00+00:00"}, [])
    resolve_alerts(registry, "", alert_id=alert.id, reason="the model changed: fraud_model:2 → fraud_model:3")
    html = alert_page(console, alert.id)
    history = html.split("id='alert-history'")[1]
    rows = re.findall(r"<tr>(.*?)</tr>", history)[1:]
    assert [re.search(r"class='(\w+)'", r)[1] for r in rows] == ["opened", "updated", "resolved"]  # type: ignore[index]
    assert "2026-11-11 00:00" in rows[0] and "2026-11-12 00:00" in rows[1]  # the data time of each
    assert "the model changed: fraud_model:2 → fraud_model:3" in rows[2]
    assert "fraud_model:2 reference" in html and "The data fraud_model sees no longer looks like" in html
    with pytest.raises(NotFound):
        alert_page(console, 999)


def test_the_drift_page_shows_each_features_effect_its_bound_and_the_rule(console: Console) -> None:
    import numpy as np
    import pandas as pd

    from quiver.monitoring.checks import run_drift_check
    from quiver.ui.catalog_pages import drift_page

    rng = np.random.default_rng(3)
    reference = pd.DataFrame({"amount": rng.normal(0, 1, 3_000), "country": rng.choice(["DE", "US"], 3_000)})
    current = pd.DataFrame({"amount": rng.normal(0.8, 1, 3_000), "country": rng.choice(["DE", "US"], 3_000)})
    from quiver.pipelines.loop_drift import window_label

    run_drift_check(reference, current, name="fraud_model", registry=console.registry,
                    reference_label="train.parquet", current_label=window_label(DAY, DAY + timedelta(days=1)))
    text = drift_page(console)
    assert "effect shown per feature (lower confidence bound)" in text and "min effect 0.1" in text
    assert "<th>lower bound</th>" in text and "<th>detectable</th>" in text
    assert "drifted = effect shown above its minimum effect, at most 0.5 false alerts per 90 days" in text
    amount = re.search(r"<tr><td>amount</td>(.*?)</tr>", text, re.S)
    assert amount is not None
    cells = re.findall(r"<td[^>]*>(.*?)</td>", amount.group(1))
    effect, lower = float(cells[2]), float(cells[3])  # after kind and status
    assert 0.1 < lower < effect  # a 0.8 sd move: shown beyond the minimum effect
