"""The resource markers `make test-fast` relies on name real test modules (a typo would run a heavy module in
the inner loop, or mark nothing)."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import HEAVY_MODULES

TESTS = Path(__file__).resolve().parents[1]


def test_every_module_named_for_a_heavy_resource_exists() -> None:
    modules = {path.stem for path in TESTS.rglob("test_*.py")}
    for resource, named in HEAVY_MODULES.items():
        assert named and named <= modules, f"{resource}: no such test module {sorted(named - modules)}"
