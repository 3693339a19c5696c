"""The in-process `quiver()` of tests/cli_runs.py answers as the executable would: in the project folder,
without QUIVER_* settings, on consoles as wide as COLUMNS; an uncaught error fails with its traceback on
stderr, warnings and log warnings reach stderr; and nothing of a run is left behind for the next."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from quiver import cli
from quiver.cli import common
from tests.cli_runs import done, quiver


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    (root / "quiver.yaml").write_text("project: probe\n")
    (root / "feature_defs").mkdir()
    return root


def probe(monkeypatch: pytest.MonkeyPatch, action: Any) -> None:
    """Make `quiver list` run `action` where it would load the config."""

    def load_config(*_args: Any, **_kwargs: Any) -> Any:
        return action()

    monkeypatch.setattr(common, "load_config", load_config)  # what `quiver list` opens its project with


def test_a_run_sees_the_project_folder_and_a_clean_environment(project: Path, monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    monkeypatch.setenv("QUIVER_REGISTRY_URL", "sqlite:///elsewhere.db")
    monkeypatch.chdir(tmp_path)
    seen: dict[str, Any] = {}

    def action() -> None:
        seen.update(cwd=os.getcwd(), quiver={k for k in os.environ if k.startswith("QUIVER_")},
                    columns=os.environ.get("COLUMNS"), extra=os.environ.get("EXTRA"), width=cli.console.width,
                    argv=sys.argv[1:])
        os.environ["LEFT_BEHIND"] = "1"  # as a command might (e.g. SPARK_LOCAL_IP)
        raise SystemExit(0)

    probe(monkeypatch, action)
    width = cli.console.width  # as built when pytest imported quiver.cli
    done(quiver("list", cwd=project, env={"EXTRA": "yes"}))
    assert seen == {"cwd": str(project), "quiver": set(), "columns": "250", "extra": "yes", "width": 250,
                    "argv": ["list"]}
    assert os.getcwd() == str(tmp_path) and os.environ["QUIVER_REGISTRY_URL"] == "sqlite:///elsewhere.db"
    assert "LEFT_BEHIND" not in os.environ and "EXTRA" not in os.environ
    assert cli.console.width == width


def test_an_uncaught_error_fails_with_its_traceback(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def action() -> None:
        raise RuntimeError("boom")

    probe(monkeypatch, action)
    result = quiver("list", cwd=project)
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr and "RuntimeError: boom" in result.stderr
    with pytest.raises(AssertionError):
        done(result, code=1)  # `done` refuses a traceback even with the expected code


def test_exit_codes_follow_the_interpreter(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    user_error = quiver("describe", "x", "--config", "nope.yaml", cwd=project)  # the real user-error path
    assert user_error.returncode == 2 and user_error.stderr.startswith("error: ") and not user_error.stdout
    codes = iter([None, 3, "said and failed"])

    def action() -> None:
        raise SystemExit(next(codes))

    probe(monkeypatch, action)
    assert quiver("list", cwd=project).returncode == 0
    assert quiver("list", cwd=project).returncode == 3
    said = quiver("list", cwd=project)
    assert said.returncode == 1 and said.stderr == "said and failed\n"


def test_warnings_and_log_warnings_reach_stderr_as_in_a_fresh_interpreter(project: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    def action() -> None:
        warnings.warn("shown", UserWarning, stacklevel=1)
        warnings.warn("hidden", DeprecationWarning, stacklevel=1)
        logging.getLogger("quiver.probe").warning("logged")
        logging.getLogger("quiver.probe").info("not shown")
        raise SystemExit(0)

    probe(monkeypatch, action)
    for _ in range(2):  # shown by every run, as by every fresh interpreter (not once per test process)
        err = quiver("list", cwd=project).stderr
        # Another library imported by the suite may restyle warnings.formatwarning; the words stay.
        assert "UserWarning" in err and "shown" in err and "logged" in err
        assert "hidden" not in err and "not shown" not in err


def test_a_run_past_its_timeout_raises_like_subprocess(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    probe(monkeypatch, lambda: time.sleep(30))
    with pytest.raises(subprocess.TimeoutExpired):
        quiver("list", cwd=project, timeout=0.5)


def test_a_metrics_export_is_refused_in_process(project: Path) -> None:
    with pytest.raises(ValueError, match="quiver_process"):
        quiver("list", cwd=project, env={"QUIVER_METRICS_EXPORT": str(project / "out.prom")})
