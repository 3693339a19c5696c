"""`make demo`: the main job end to end on embedded defaults, on freshly generated synthetic data.

Each step prints what it did; the data lives under ./data and the registry under ./.quiver.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from datetime import date, timedelta
from pathlib import Path

from quiver.catalog.ir import Catalog
from quiver.config import Config, load_config
from rich.console import Console

console = Console()
START = date(2026, 11, 1)


def step(title: str) -> Callable[[Callable[..., object]], Callable[..., object]]:
    def wrap(func: Callable[..., object]) -> Callable[..., object]:
        def run(*args: object, **kwargs: object) -> object:
            console.rule(f"[bold]{title}")
            started = time.perf_counter()
            result = func(*args, **kwargs)
            console.print(f"[dim]({time.perf_counter() - started:.1f} s)[/dim]")
            return result

        return run

    return wrap


@step("1. Synthetic events and labels")
def generate_data(config: Config, days: int, drift_from_day: int) -> None:
    from pipelines.demo_data import generate

    summary = generate(config.root / "data", days=days, start=START, seed=7, drift_from_day=drift_from_day,
                       late_fraction=0.01, malformed_fraction=0.001)
    console.print(summary)


@step("2. Apply the feature catalog (feature_defs/)")
def apply_catalog(config: Config) -> Catalog:
    from quiver.catalog.loader import load_catalog
    from quiver.cli import _print_diff, list_views
    from quiver.registry import Registry

    catalog = load_catalog(config.catalog_dir, root=config.root)
    result = Registry(config.registry, project=config.project).apply(catalog, author="make demo")
    _print_diff(result.diff)
    console.print(f"catalog version {result.version} ({'new' if result.created else 'unchanged'})")
    list_views(config=None, catalog=None)
    return catalog


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--days", type=int, default=14)
    parser.add_argument("--drift-from-day", type=int, default=10)
    args = parser.parse_args(argv)
    config = load_config(Path("quiver.yaml") if Path("quiver.yaml").exists() else None)
    generate_data(config, args.days, args.drift_from_day)
    apply_catalog(config)
    console.print(f"[green]demo done[/green]: data in {config.root / 'data'}, "
                  f"end date {START + timedelta(days=args.days - 1)}")


if __name__ == "__main__":
    main()
