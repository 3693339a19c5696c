"""Crawl the web console in a browser: from the home page, every link of every page, each page once.

A console page must answer 200 and show no error text; a link's #fragment must name an element of the page it
points to; a report (the project's own HTML under /reports/) must answer 200. Used by the browser test, and by
hand against a running `quiver ui`:

    .venv/bin/python -m tests.integration.console_crawl http://127.0.0.1:8090 [--key KEY]
"""

from __future__ import annotations

import argparse
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urldefrag, urlparse

# Text no console page shows unless something failed (a 404 or 500 page, a traceback, the store unreachable).
ERROR_TEXT = ("Traceback", "Not found", "Server error", "Internal Server Error", "online store not reachable")


@dataclass
class Crawl:
    status: dict[str, int] = field(default_factory=dict)  # every URL reached (no fragment) → status
    links: int = 0  # links followed, fragments and repeats included
    problems: list[str] = field(default_factory=list)

    def paths(self, base: str) -> set[str]:
        return {url.removeprefix(base) for url in self.status}


def crawl(page: Any, base: str, *, screenshots: Path | None = None, limit: int = 1000) -> Crawl:
    """Breadth-first from `base`/ over every same-origin link; `page` is a signed-in Playwright page."""
    found = Crawl()
    ids: dict[str, set[str]] = {}  # console page → ids of its elements
    wanted: list[tuple[str, str, str]] = []  # (page linking, target page, fragment)
    queue = [base + "/"]
    while queue and len(found.status) < limit:
        url = queue.pop(0)
        if url in found.status:
            continue
        if urlparse(url).path.startswith("/reports/"):  # the project's report: its own scripts, no console links
            found.status[url] = page.request.get(url).status
        else:
            response = page.goto(url)
            found.status[url] = response.status if response else 0
            text = page.content()
            found.problems += [f"{url} shows {needle!r}" for needle in ERROR_TEXT if needle in text]
            ids[url] = set(page.eval_on_selector_all("[id]", "els => els.map(e => e.id)"))
            if screenshots is not None:
                name = urlparse(url).path.strip("/").replace("/", "-") or "home"
                page.screenshot(path=str(screenshots / f"{name}.png"), full_page=True)
            for href in page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)"):
                found.links += 1
                target, fragment = urldefrag(href)
                if not target.startswith(base + "/"):
                    found.problems.append(f"{url} links outside the console: {href}")
                    continue
                if fragment:
                    wanted.append((url, target, fragment))
                if target not in found.status:
                    queue.append(target)
        if found.status[url] != 200:
            found.problems.append(f"{url} answered {found.status[url]}")
    found.problems += [f"{source} links to #{fragment} of {target}, which has no such element"
                       for source, target, fragment in wanted if target in ids and fragment not in ids[target]]
    if queue:
        found.problems.append(f"stopped after {limit} pages; {len(queue)} links not followed")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="the console, e.g. http://127.0.0.1:8090")
    parser.add_argument("--key", default="", help="the console's API key, when it has one")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    base = args.url.rstrip("/")
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        context = browser.new_context(extra_http_headers={"X-API-Key": args.key} if args.key else None)
        found = crawl(context.new_page(), base)
        browser.close()
    for url, status in sorted(found.status.items()):
        print(status, url.removeprefix(base))
    print(f"{len(found.status)} pages, {found.links} links followed, {len(found.problems)} problems")
    for problem in found.problems:
        print("PROBLEM", problem)
    return 1 if found.problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
