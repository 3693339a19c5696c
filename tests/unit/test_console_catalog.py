"""The console over the demo's own catalog (feature_defs/: a request source and an on-demand view beside the
stored views), and what its status codes mean: a page naming something the project lacks is a 404, any other
failure a 500 with the traceback logged."""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from quiver.catalog.loader import load_catalog
from quiver.config import Config, load_config
from quiver.pipelines.demo_data import generate
from quiver.registry import Registry
from quiver.ui import app as console_app
from quiver.ui import catalog_pages
from quiver.ui.data import Console, LineageRow, lineage_rows

REPO = Path(__file__).resolve().parents[2]
KEY = "k"


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Config:
    """A project with the repo's feature_defs/ applied over a day of tiny demo data; no model, no Redis."""
    root = tmp_path_factory.mktemp("console")
    shutil.copytree(REPO / "feature_defs", root / "feature_defs", ignore=shutil.ignore_patterns("__pycache__"))
    generate(root / "data", days=1, users=20, merchants=5, transactions_per_day=50)
    # Nothing listens on port 1: the page reports the store unreachable instead of waiting for it.
    (root / "quiver.yaml").write_text(f"project: fraud\ncatalog: feature_defs\nregistry_url: sqlite:///{root}/r.db\n"
                                      "redis_url: redis://127.0.0.1:1/0\n")
    config = load_config(root / "quiver.yaml")
    registry = Registry(config.registry, project=config.project)
    registry.apply(load_catalog(root / "feature_defs", root=root), author="test")
    registry.close()
    return config


Get = Callable[[str], httpx.Response]


@pytest.fixture(scope="module")
def get(config: Config) -> Iterator[Get]:
    """GET a console page in-process (the app over `config`, with its key)."""
    app = console_app.create_app(config, api_key=KEY)

    async def fetch(path: str) -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://console",
                                     headers={"X-API-Key": KEY}) as client:
            return await client.get(path)

    yield lambda path: asyncio.run(fetch(path))
    app.state.console.close()


def test_lineage_shows_what_an_on_demand_view_reads(config: Config) -> None:
    catalog = load_catalog(config.catalog_dir, root=config.root)
    trained = [SimpleNamespace(label="fraud_model:1", lineage={"service": "fraud_model"})]
    rows = {row.view: row for row in lineage_rows(catalog, trained)}
    assert rows["transaction_context"] == LineageRow(
        (("request source", "transaction"), ("view", "user_spend")), "transaction_context", "on-demand view",
        "fraud_model", ("fraud_model:1",))
    assert rows["user_spend"] == LineageRow((("source", "transactions"),), "user_spend", "view", "fraud_model",
                                            ("fraud_model:1",))
    assert set(rows) == {*catalog.views, *catalog.on_demand}


def test_the_catalog_page_shows_request_sources_and_on_demand_views(get: Get) -> None:
    answer = get("/catalog")
    assert answer.status_code == 200, answer.text
    text = answer.text
    for anchor in ("view-transaction_context", "view-user_spend", "request-transaction", "source-transactions"):
        assert f"id='{anchor}'" in text, anchor
    # The on-demand view's inputs and outputs, and its lineage row linking what it reads.
    assert "<a href='#view-user_spend'>user_spend</a>:amount_mean_7d" in text
    assert "tx_amount <span class='muted'>float64</span>" in text
    assert "<code>transaction_context_features</code> <span class='muted'>python</span>" in text  # and its mode
    assert "amount float64, is_online bool" in text  # the request source's fields
    lineage = text[text.index("id='lineage'"):]
    assert ("<a href='#request-transaction'>request source transaction</a><br>"
            "<a href='#view-user_spend'>view user_spend</a>") in lineage[:lineage.index("</table>")]


@pytest.mark.parametrize(("path", "says"), [("/models/fraud_modl", "unknown model &#x27;fraud_modl&#x27;"),
                                            ("/decisions/99", "no decision #99"), ("/rollouts/99", "no rollout #99")])
def test_a_page_naming_something_missing_is_a_404(get: Get, path: str, says: str) -> None:
    answer = get(path)
    assert answer.status_code == 404 and says in answer.text, (answer.status_code, answer.text)


def test_a_failing_page_is_a_500_with_the_traceback_logged(get: Get, monkeypatch: pytest.MonkeyPatch,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    def broken(*_: Any) -> list[LineageRow]:
        raise KeyError("transaction_context")  # what the catalog page raised on the demo project

    monkeypatch.setattr(catalog_pages, "lineage_rows", broken)
    with caplog.at_level(logging.ERROR, logger="quiver.ui.app"):
        answer = get("/catalog")
    assert answer.status_code == 500 and "Not found" not in answer.text
    assert "Server error" in answer.text and "transaction_context" not in answer.text  # no internals shown
    [record] = [r for r in caplog.records if r.name == "quiver.ui.app"]
    assert "/catalog" in record.getMessage() and record.exc_info and record.exc_info[0] is KeyError


def test_the_catalog_page_measures_freshness_against_the_stores_data_time(get: Get,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """On replayed (historical) data every view is as fresh as the store: not "12.4 d old" by the wall clock."""
    from datetime import UTC, datetime

    held = {"user_spend": datetime(2026, 11, 23, 14, tzinfo=UTC), "user_profile": datetime(2026, 11, 23, 10, tzinfo=UTC),
            "merchant_traffic": None, "user_last_transaction": datetime(2026, 11, 23, 14, tzinfo=UTC)}
    monkeypatch.setattr(Console, "freshness", lambda self, views: ({v: held.get(v) for v in views}, ""))
    text = get("/catalog").text
    assert "2026-11-23 14:00 (the store&#x27;s newest)" in text and "d old" not in text
    assert "2026-11-23 10:00 (4.0 h behind the newest)" in text
    assert "freshness is measured against the newest event the store holds, 2026-11-23 14:00 UTC" in text
