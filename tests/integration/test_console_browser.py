"""The web console in a real browser: Playwright driving the system's Chromium (no browser download) against
`quiver ui`'s app served by uvicorn over the demo-like project (`operator_world`).

Every page loads behind the API key (the login form sets the cookie), every link on every page resolves,
nothing is requested from anywhere but the console, no console error is logged, and the operator's question
"why was fraud_model:3 promoted, and on what evidence?" is answered in two clicks from the home page. A
screenshot of each page is saved (to $QUIVER_CONSOLE_SCREENSHOTS when set, else the test's project folder).
The same crawl (`console_crawl`: every link from the home page, each answering 200 with no error text, each
#fragment present) runs again over the demo's own catalog — request source and on-demand view included.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.console_crawl import crawl

pytestmark = pytest.mark.integration
KEY = "console-secret"
REPO = Path(__file__).resolve().parents[2]
PAGES = {"home": "/", "catalog": "/catalog", "models": "/models", "model": "/models/fraud_model",
         "rollouts": "/rollouts", "drift": "/drift"}


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("chromium not found: run `make setup` (as root it installs Debian's chromium)", pytrace=False)
    return found


@contextlib.contextmanager
def serve(config: Any) -> Iterator[str]:
    """The console app over `config` served by uvicorn on a free port, for as long as the block runs."""
    import uvicorn

    from quiver.ui.app import create_app
    from tests.harness import free_port

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(config, api_key=KEY), host="127.0.0.1", port=port,
                                           log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the console did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def console_url(operator_world: Any) -> Iterator[str]:
    with serve(operator_world.config) as url:
        yield url


def login(page: Any, console_url: str, key: str) -> tuple[int, str]:
    """Open the console and sign in through its form; (status, title) of the first, unauthenticated load."""
    response = page.goto(console_url + "/")
    first = (response.status if response else 0, page.title())
    page.fill("input[name=api_key]", key)
    page.click("button[type=submit]")
    page.wait_for_load_state()
    return first


@pytest.fixture(scope="module")
def browser(console_url: str) -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def browser_page(browser: Any, console_url: str) -> Iterator[tuple[Any, list[str], list[str]]]:
    """A signed-in page; console errors and requests to anywhere but the console are collected."""
    errors: list[str] = []
    foreign: list[str] = []
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    page = context.new_page()
    first = login(page, console_url, KEY)
    assert first[0] == 401 and first[1].startswith("Sign in"), first
    assert page.url == console_url + "/" and page.title().startswith("Quiver console")
    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))

    def watch(request: Any) -> None:
        if not (request.url.startswith(console_url) or request.url.startswith("data:")):
            foreign.append(request.url)

    page.on("request", watch)
    yield page, errors, foreign
    context.close()


def shots(operator_world: Any) -> Path:
    folder = Path(os.environ.get("QUIVER_CONSOLE_SCREENSHOTS") or operator_world.root / "screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def test_a_wrong_key_gets_the_login_form_again(browser: Any, console_url: str) -> None:
    context = browser.new_context()
    page = context.new_page()
    login(page, console_url, "wrong")
    assert "wrong key" in page.content() and page.title().startswith("Sign in")
    assert page.goto(console_url + "/catalog").status == 401
    context.close()


def test_every_page_loads_links_resolve_nothing_external_no_console_errors(browser_page: Any, console_url: str,
                                                                           operator_world: Any) -> None:
    page, errors, foreign = browser_page
    world = operator_world
    found = crawl(page, console_url, screenshots=shots(world))
    assert found.problems == [], found.problems
    expected = {*PAGES.values(), f"/decisions/{world.decisions['promote']}", f"/rollouts/{world.rollout_id}",
                *(f"/decisions/{d}" for d in world.decisions.values())}
    assert expected <= found.paths(console_url), expected - found.paths(console_url)
    assert foreign == [], foreign
    assert errors == [], errors


@pytest.fixture(scope="module")
def demo_console_url(operator_world: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The console over the demo's own catalog: the repo's feature_defs/ (several sources, a request source, an
    on-demand view, the fraud_model service) applied with `quiver apply` over a copy of the operator world's
    registry (its models, decisions, rollout, drift runs, alerts), with a day of tiny demo data for the
    sources' schemas. Cheaper than `make demo`, and the same kinds of records on every page."""
    from quiver.config import load_config
    from quiver.pipelines.demo_data import generate
    from tests.cli_runs import done, quiver

    root = tmp_path_factory.mktemp("demo_console")
    with contextlib.closing(sqlite3.connect(operator_world.root / "registry.db")) as source, \
            contextlib.closing(sqlite3.connect(root / "registry.db")) as copy:
        source.backup(copy)  # a consistent copy whatever the journal holds
    shutil.copytree(REPO / "feature_defs", root / "feature_defs", ignore=shutil.ignore_patterns("__pycache__"))
    reports = operator_world.root / "data" / "reports"
    if reports.is_dir():
        shutil.copytree(reports, root / "data" / "reports")
    generate(root / "data", days=1, users=50, merchants=10, transactions_per_day=200)
    (root / "quiver.yaml").write_text(f"project: fraud\ncatalog: feature_defs\nregistry_url: sqlite:///{root}/"
                                      f"registry.db\nredis_url: {operator_world.config.redis_url}\n")
    assert "applied catalog version 3" in done(quiver("apply", "--author", "carol", cwd=root))
    with serve(load_config(root / "quiver.yaml")) as url:
        yield url


def test_every_link_of_the_demo_catalogs_console_answers(browser: Any, demo_console_url: str) -> None:
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    page = context.new_page()
    login(page, demo_console_url, KEY)
    errors: list[str] = []
    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    found = crawl(page, demo_console_url)
    context.close()
    assert found.problems == [], found.problems
    assert found.status[demo_console_url + "/catalog"] == 200
    assert {"/", "/catalog", "/models", "/models/fraud_model", "/rollouts", "/drift"} <= found.paths(demo_console_url)
    assert found.links >= 100 and errors == [], (found.links, errors)


def test_why_was_fraud_model_3_promoted_is_two_clicks_from_home(browser_page: Any, console_url: str,
                                                               operator_world: Any) -> None:
    page, errors, _ = browser_page
    world = operator_world
    page.goto(console_url + "/")
    page.click("h3 >> text=fraud_model")  # click 1: the model
    page.wait_for_url(console_url + "/models/fraud_model")
    rows = page.locator("#alias-history tr")
    cells = [rows.nth(i).locator("td").all_inner_texts() for i in range(rows.count())]
    [index] = [i for i, c in enumerate(cells) if c[1:2] == ["champion"] and c[3:4] == ["3"]]
    rows.nth(index).locator("td").nth(6).locator("a").click()  # click 2: the decision that moved champion to :3
    page.wait_for_url(console_url + f"/decisions/{world.decisions['promote']}")
    text = page.inner_text("main")
    assert "promote" in text and "fraud_model:3" in text and "every guardrail passed" in text
    headers = page.eval_on_selector_all("#guardrails th", "els => els.map(e => e.textContent)")
    assert {"estimate (canary − champion)", "confidence sequence", "floor", "verdict"} <= set(headers)
    guardrails = page.locator("#guardrails tr").all_inner_texts()[1:]
    assert {g.split("\t")[0] for g in guardrails} == {"error_rate", "latency_p99", "score_shift", "log_loss", "brier"}
    assert all("pass" in g and "[" in g for g in guardrails), guardrails  # a verdict and an interval each
    # Where the champion's scores of the canary rows came from: the service paired them all.
    assert re.search(r"[1-9][\d,]* paired while serving, 0 replayed .* 0 unpaired", page.inner_text("#pairing"))
    # What the serving loggers did with the step's rows (every replica's accounts): nothing dropped.
    assert re.search(r"[1-9][\d,]* rows served by .*, dropped: none \(0.00 % of the answering rows\)",
                     page.inner_text("#serving-log")), page.inner_text("#serving-log")
    # The rollout's confidence sequence per guardrail over its looks, each with its floor.
    charts = page.locator("svg.cs-chart[data-kind=canary_step]")
    assert charts.count() == 5 and page.locator("svg.cs-chart[data-kind=watch]").count() == 2
    log_loss = page.locator("svg.cs-chart[data-kind=canary_step][data-guardrail=log_loss]")
    assert "floor 0.08" in log_loss.inner_html() and log_loss.locator("circle").count() >= 2
    page.screenshot(path=str(shots(world) / "two-clicks-answer.png"), full_page=True)
    assert errors == [], errors


def test_the_drift_page_shows_the_consistency_runs_beside_drift(browser_page: Any, console_url: str,
                                                                  operator_world: Any) -> None:
    page, errors, _ = browser_page
    page.goto(console_url + "/drift")
    section = page.locator("#consistency-model-fraud-model")
    assert section.inner_text() == "model fraud_model"
    runs = page.locator("h3#consistency-model-fraud-model + table tr").all_inner_texts()[1:]
    assert len(runs) == 1 and "\tok\t" in runs[0]
    logged, compared = (int(c.replace(",", "")) for c in runs[0].split("\t")[2:4])
    assert compared == logged > 0
    features = [r.split("\t") for r in page.locator("h4:has-text('per feature') + table tr").all_inner_texts()[1:]]
    assert {f[0] for f in features} == {"stats:f0", "stats:f1", "stats:category"}
    assert all(f[1] == "ok" and f[2] == f[3] == f"{compared:,}" and f[-1] == "–" for f in features), features
    chart = page.locator("svg[aria-label='model fraud_model: wrong share per feature over data time']")
    assert chart.locator("circle").count() == 3  # one run, a point per feature
    assert errors == [], errors
