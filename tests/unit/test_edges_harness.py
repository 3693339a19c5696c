"""`make test` is the same suite everywhere: a missing PostgreSQL fails the tests that need it, never skips."""

from __future__ import annotations

import pytest

from tests.conftest import _no_postgres


def test_a_missing_postgres_fails_outside_ci_too(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)  # locally; before, this was a silent skip
    with pytest.raises(pytest.fail.Exception, match=r"PostgreSQL.*make setup"):
        _no_postgres("PostgreSQL binaries not found")
