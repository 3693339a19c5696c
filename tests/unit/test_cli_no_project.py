"""Commands outside a project refuse in one line and create nothing; a project is found from a subfolder, by
--config or by QUIVER_CONFIG; only the commands whose job it is create state without one (issue 36, item 4)."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from quiver.cli import _register_optional_commands, app
from quiver.config import load_config

# Every command that works on a project, with the arguments it needs to get as far as loading one.
PROJECT_COMMANDS = [
    ["models", "list"],
    ["models", "describe", "fraud_model"],
    ["list"],
    ["versions"],
    ["plan"],
    ["apply"],
    ["describe", "user"],
    ["decisions", "list"],
    ["alerts", "list"],
    ["drift-history", "amount"],
    ["canary", "status", "fraud_model"],
    ["redis", "status"],
    ["kafka", "status"],
    ["ui"],
]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("QUIVER_"):
            monkeypatch.delenv(key)


@pytest.fixture(scope="module")
def runner() -> CliRunner:
    _register_optional_commands()
    return CliRunner()


@pytest.fixture
def empty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "not_a_project"
    folder.mkdir()
    monkeypatch.chdir(folder)
    # `quiver ui` must never get as far as serving in a test: if it does, it returns at once.
    monkeypatch.setattr("quiver.serving.runtime.run_uvicorn", lambda *a, **k: None)
    return folder


@pytest.mark.parametrize("args", PROJECT_COMMANDS, ids=" ".join)
def test_project_commands_refuse_outside_a_project(runner: CliRunner, empty: Path, args: list[str]) -> None:
    result = runner.invoke(app, args, env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: no quiver.yaml in ")
    assert str(empty) in lines[0] and "--config" in lines[0] and "QUIVER_CONFIG" in lines[0]
    assert "feature_defs" not in lines[0]
    assert list(empty.iterdir()) == [], "a refused command left state behind"


def test_a_wrong_quiver_config_is_an_error(runner: CliRunner, empty: Path) -> None:
    result = runner.invoke(app, ["models", "list"], env={"QUIVER_CONFIG": str(empty / "nope.yaml")})
    assert result.exit_code == 2
    assert f"config file {empty / 'nope.yaml'} (named by QUIVER_CONFIG) does not exist" in result.output
    assert list(empty.iterdir()) == []


def test_the_project_is_found_from_a_subfolder_and_by_quiver_config(runner: CliRunner, tmp_path: Path,
                                                                    empty: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from quiver.config import find_config

    project = tmp_path / "proj"
    (project / "notebooks" / "deep").mkdir(parents=True)
    (project / "quiver.yaml").write_text("project: found\n")
    assert find_config(project / "notebooks" / "deep") == project / "quiver.yaml"
    monkeypatch.chdir(project / "notebooks" / "deep")
    result = runner.invoke(app, ["models", "list"])
    assert result.exit_code == 0, result.output
    assert (project / ".quiver" / "registry.db").exists()  # the project's registry, not one in the subfolder
    assert not (project / "notebooks" / "deep" / ".quiver").exists()
    monkeypatch.chdir(empty)
    with_env = runner.invoke(app, ["models", "list"], env={"QUIVER_CONFIG": str(project / "quiver.yaml")})
    assert with_env.exit_code == 0, with_env.output
    assert load_config(None).project == "default"  # library callers outside a project keep the defaults
    monkeypatch.setenv("QUIVER_CONFIG", str(project))
    assert load_config(None).project == "found"
    assert list(empty.iterdir()) == []


def test_library_callers_refuse_only_when_asked(empty: Path) -> None:
    from quiver.config import NoProjectError, project_required

    assert load_config().root == empty  # defaults, as before
    with project_required(), pytest.raises(NoProjectError, match=r"no quiver\.yaml in"):
        load_config()
    with pytest.raises(NoProjectError):
        load_config(require_project=True)
    with project_required():
        assert load_config(require_project=False).project == "default"


def test_commands_whose_job_it_is_still_work_without_a_project(runner: CliRunner, empty: Path) -> None:
    result = runner.invoke(app, ["init", "newproj", "--project", "fresh"])
    assert result.exit_code == 0, result.output
    assert (empty / "newproj" / "quiver.yaml").exists()
    data = runner.invoke(app, ["demo-data", "--out", "events", "--days", "1", "--users", "20",
                               "--transactions-per-day", "50"])
    assert data.exit_code == 0, data.output
    assert not (empty / ".quiver").exists()


def test_drift_of_two_files_needs_no_project_but_recording_it_does(runner: CliRunner, empty: Path) -> None:
    for name, shift in (("ref", 0.0), ("cur", 0.5)):
        pq.write_table(pa.table({"x": [float(i % 97) + shift for i in range(2_000)]}), empty / f"{name}.parquet")
    files = ["drift", "--reference", "ref.parquet", "--current", "cur.parquet", "-f", "x"]
    result = runner.invoke(app, files, env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    recorded = runner.invoke(app, [*files, "--record"], env={"COLUMNS": "300"})
    assert recorded.exit_code == 2 and "no quiver.yaml in" in recorded.output
    assert sorted(p.name for p in empty.iterdir()) == ["cur.parquet", "ref.parquet"]
