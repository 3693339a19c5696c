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
from datetime import UTC, datetime
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


@pytest.fixture(scope="module")
def alerts_world(operator_world: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """The console over a copy of the operator world's registry with more open alerts than the home page shows:
    first a canary rollback alert as the judge raises it (its detail names the decision, no data time), judged
    on data three days old, then a dozen warnings and infos raised after it; and fraud_model's label-free
    performance estimates (champion and canary, the newest day still without labels). Yields (url, the
    rollback's decision id)."""
    from quiver.config import load_config
    from quiver.monitoring.repository import open_alert
    from quiver.registry import Registry, rollouts

    root = tmp_path_factory.mktemp("alerts_console")
    with contextlib.closing(sqlite3.connect(operator_world.root / "registry.db")) as source, \
            contextlib.closing(sqlite3.connect(root / "registry.db")) as copy:
        source.backup(copy)
    (root / "quiver.yaml").write_text(f"project: fraud\nregistry_url: sqlite:///{root}/registry.db\n"
                                      f"redis_url: {operator_world.config.redis_url}\n")
    config = load_config(root / "quiver.yaml")
    registry = Registry(config.registry, project=config.project)
    judged = JUDGED_ROLLBACK
    reason = ("score_shift: canary worse by 0.9021: the whole interval [0.8029, 0.9401] lies above 0.025 "
              "(0.5 × floor 0.05)")
    shift = {"name": "score_shift", "status": "fail", "reason": reason.partition(": ")[2],
             "statistics": {"estimate": 0.9021, "lower": 0.8029, "upper": 0.9401, "floor": 0.05, "fail_above": 0.025}}
    rolled = rollouts.record_decision(
        registry, "fraud_model", kind="canary_step", outcome="rollback", idempotency_key="console-rollback-test",
        statistics={"reason": reason, "guardrails": [shift], "pairing": {"logged": 900, "replayed": 0, "unpaired": 0},
                    "window": {"as_of": judged.isoformat()}},
        rollout_id=operator_world.rollout_id, step=0, fraction=0.5, champion_version="fraud_model:3",
        candidate_version="fraud_model:9", by="quiver_canary", at=judged)
    open_alert(registry, "canary_rollback", "fraud_model:9", "critical", "canary fraud_model:9 rolled back at 0.5",
               reason, {"decision_id": rolled.id, "rollout_id": operator_world.rollout_id,
                        "actions": ["canary removed"]}, [])
    for i in range(12):
        open_alert(registry, "drift", f"transactions:extra_{i}", "warning" if i % 2 else "info",
                   f"Feature extra_{i} drifted (transactions)", "PSI 0.3 ≥ 0.2",
                   {"as_of": f"2026-11-{10 + i}T00:00:00+00:00"}, [])
    insert_estimates(registry)
    registry.close()
    with serve(config) as url:
        yield url, rolled.id


JUDGED_ROLLBACK = datetime(2026, 11, 18, 12, tzinfo=UTC)


def insert_estimates(registry: Any) -> None:
    """Rows as the drift check writes them into `performance_estimates`: three days of the champion, two of the
    canary, the newest day's labels not in yet."""
    import json
    from datetime import timedelta

    import sqlalchemy as sa

    from quiver.registry.estimate_tables import performance_estimates

    rows = []
    for day, arm, version in [(d, "champion", "fraud_model:3") for d in range(3)] + [
            (d, "canary", "fraud_model:9") for d in (1, 2)]:
        end = datetime(2026, 11, 16 + day, tzinfo=UTC)
        for metric, value in (("roc_auc", 0.9 - day / 50), ("log_loss", 0.25 + day / 40)):
            labelled = day < 2
            rows.append({"project": "fraud", "model": "fraud_model", "version": version, "arm": arm,
                         "window_start": end - timedelta(days=1), "window_end": end, "as_of": end,
                         "computed_at": datetime.now(UTC), "metric": metric,
                         "status": "realized" if labelled else "estimated", "rows": 4_000, "estimate": value,
                         "lower": value - 0.015, "upper": value + 0.015, "reference": 0.91 if metric == "roc_auc"
                         else 0.24, "realized": value + 0.004 if labelled else None,
                         "realized_rows": 3_900 if labelled else None, "realized_at": None, "detail_json": json.dumps({})})
    with registry.engine.begin() as connection:
        connection.execute(sa.insert(performance_estimates), rows)


def rows_of(page: Any, selector: str) -> list[list[str]]:
    rows = page.locator(f"{selector} tr")
    return [rows.nth(i).locator("td").all_inner_texts() for i in range(1, rows.count())]


def test_the_home_page_puts_the_most_severe_alert_first_and_says_how_many_more(browser: Any,
                                                                               alerts_world: tuple[str, int]) -> None:
    url, rollback_id = alerts_world
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    page = context.new_page()
    login(page, url, KEY)
    rows = rows_of(page, "#open-alerts")
    total = int(re.search(r"of (\d+) open alerts shown", page.inner_text("#more-alerts"))[1])  # type: ignore[index]
    assert len(rows) == 10 and total >= 13, (len(rows), total)
    severities = [r[1] for r in rows]
    order = {"critical": 0, "warning": 1, "info": 2}
    assert severities == sorted(severities, key=order.__getitem__), severities  # before: by id, newest first
    [rolled] = [r for r in rows if "fraud_model:9" in r[4]]  # raised before the dozen others, shown above them
    assert rolled[1] == "critical"
    # A first sentence in plain words, then the numbers; the data time the decision judged, not the wall clock.
    assert rolled[2].startswith("fraud_model:9 was rolled back: its scores were far from the champion's on the same "
                                "requests.") and "0.9021" in rolled[2], rolled
    assert rolled[5].startswith(f"{JUDGED_ROLLBACK:%Y-%m-%d %H:%M}") and f"decision #{rollback_id}" in rolled[5]
    assert f"{total - 10} more" in page.inner_text("#more-alerts")
    page.click("#more-alerts a")
    page.wait_for_url(url + "/alerts")
    assert page.title().startswith("Alerts")
    listed = rows_of(page, "#open-alerts")
    assert len(listed) == total and [r[0] for r in listed[:10]] == [r[0] for r in rows]
    every = [r[1] for r in listed]
    assert every == sorted(every, key=order.__getitem__) and every[-1] == "info", every
    page.locator("#open-alerts tr", has_text="fraud_model:9").locator(f"a[href='/decisions/{rollback_id}']").click()
    page.wait_for_url(url + f"/decisions/{rollback_id}")
    assert page.inner_text("#sentence") == rolled[2].splitlines()[0]
    context.close()


def test_alerts_consistency_and_unknown_paths_are_console_pages(browser_page: Any, console_url: str) -> None:
    page, errors, _ = browser_page
    for path, title in (("/alerts", "Alerts"), ("/consistency", "Online/offline consistency")):
        response = page.goto(console_url + path)
        assert response is not None and response.status == 200 and page.title().startswith(title)
        assert "text/html" in response.headers["content-type"]
        assert page.locator(f"header a[href='{path}']").count() == 1  # in every page's navigation
    runs = rows_of(page, "#consistency-runs")
    assert len(runs) == 1 and runs[0][1] == "model fraud_model" and runs[0][5] == "ok", runs
    page.click("#consistency-runs a")  # to its subject's section, on the same page
    assert page.url.endswith("#consistency-model-fraud-model")
    assert errors == [], errors


def test_a_path_without_a_page_is_an_html_404_with_the_consoles_pages(browser: Any, console_url: str) -> None:
    context = browser.new_context()  # apart from the shared page: Chromium logs every 404 as a console error
    page = context.new_page()
    login(page, console_url, KEY)
    for path in ("/no-such-page", "/decisions/abc"):
        response = page.goto(console_url + path)
        # Before: FastAPI's JSON {"detail": "Not Found"}.
        assert response is not None and response.status == 404 and "text/html" in response.headers["content-type"]
        assert page.title().startswith("Not found") and page.locator("header a[href='/alerts']").count() == 1
    context.close()


def test_the_decision_page_reads_in_plain_words_and_marks_non_default_floors(browser_page: Any, console_url: str,
                                                                             operator_world: Any) -> None:
    page, errors, _ = browser_page
    world = operator_world
    page.goto(console_url + f"/decisions/{world.decisions['promote']}")
    assert page.inner_text("#sentence") == ("fraud_model:3 was promoted to champion: at canary share 0.5 every "
                                            "guardrail showed it no worse than the champion fraud_model:1 beyond its "
                                            "floor.")
    note = page.inner_text("#non-default-settings")
    assert "log-loss floor 0.08 (default 0.02, looser)" in note and "Brier floor 0.03 (default 0.01, looser)" in note
    floors = {r[0]: r[4] for r in rows_of(page, "#guardrails")}
    assert "non-default: looser than 0.02" in floors["log_loss"] and "non-default" not in floors["score_shift"]
    # One latency cut-off for the decision: the facts and its chart's axis name the same recorded number.
    cutoff = page.inner_text("#latency-cutoff")
    assert re.fullmatch(r"\d+(\.\d{1,2})? ms", cutoff), cutoff
    chart = page.locator("svg.cs-chart[data-kind=canary_step][data-guardrail=latency_p99]")
    drawn = chart.text_content() or ""
    assert f"Δ share of calls > {cutoff}" in drawn and f"as decision #{world.decisions['promote']} recorded it" in drawn
    # The x-axis reads each look's data time, as the evaluation report does, not decision ids.
    ticks = chart.locator("text.x-tick").all_text_contents()
    assert ticks and all(re.fullmatch(r"\d\d-\d\d \d\d:\d\d", t) for t in ticks), ticks
    page.goto(console_url + f"/rollouts/{world.rollout_id}")
    text = page.inner_text("main")
    assert "step 0" not in text and "Judged on non-default floors" in text
    assert errors == [], errors


def test_the_model_page_shows_estimated_vs_realized_and_an_alert_shows_its_history(
        browser: Any, alerts_world: tuple[str, int]) -> None:
    url, rollback_id = alerts_world
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    page = context.new_page()
    login(page, url, KEY)
    errors: list[str] = []
    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.goto(url + "/models/fraud_model")
    # Before: no such section; the estimates the drift check records were nowhere on the console.
    charts = page.locator("svg.estimate-chart")
    assert charts.count() == 2 and page.locator("svg.estimate-chart[data-metric=roc_auc]").count() == 1
    auc = page.locator("svg.estimate-chart[data-metric=roc_auc]")
    assert auc.locator("polygon.band").count() == 2 and auc.locator("circle.realized").count() == 3
    assert "ROC-AUC (0–1, higher is better)" in (auc.text_content() or "")
    assert auc.locator("text.no-labels").count() == 1  # the newest day: labels not in yet
    newest = rows_of(page, "#performance-estimates")[0]
    assert newest[0].startswith("2026-11-18") and newest[6] == "no labels yet", newest
    page.goto(url + "/alerts")
    page.locator("#open-alerts tr", has_text="fraud_model:9").locator("a[href^='/alerts/']").click()
    page.wait_for_load_state()
    assert page.title().startswith("Alert #") and "fraud_model:9" in page.inner_text("main")
    history = rows_of(page, "#alert-history")
    assert [r[0] for r in history] == ["opened"] and history[0][2] and history[0][3], history
    found = crawl(page, url)  # every page of this world too, the alert pages and the charts included
    context.close()
    # The fixture's rollback names fraud_model:9, a version this registry never had: its decision page's link to
    # #v9 of the model page is the fixture's fiction, not a console fault.
    problems = [p for p in found.problems if not p.endswith("links to #v9 of " + url + "/models/fraud_model, "
                                                            "which has no such element")]
    assert problems == [], problems
    assert f"/decisions/{rollback_id}" in found.paths(url) and any(
        p.startswith("/alerts/") for p in found.paths(url))
    assert errors == [], errors
