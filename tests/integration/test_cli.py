"""`quiver` catalog commands against throwaway projects: in process for their messages and exit codes; the
installed console script once, end to end (init, and its user errors)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from quiver.registry import Registry
from tests.cli_runs import quiver, quiver_process
from tests.unit.catalogs.builders import line_of, transactions, write_catalog, write_parquet

pytestmark = pytest.mark.integration

ENTITIES = 'from quiver import Entity\nuser = Entity("user", ["user_id"])\n'
VIEWS = '''\
from entities import user
from quiver import Aggregation, FeatureService, FeatureView, Field, Float64, Source, String

tx = Source("tx", "data/tx", description="card transactions")
user_last = FeatureView("user_last", [user], tx, schema=[Field("amount", Float64), Field("category", String)],
                        ttl="{ttl}", owner="fraud-team")
user_spend = FeatureView("user_spend", [user], tx, aggregations=[Aggregation("amount", "sum", "1h"),
                                                                 Aggregation("amount", "count", "24h")])
fraud = FeatureService("fraud", [user_last, user_spend])
'''


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result.stdout


def user_error(result: subprocess.CompletedProcess[str]) -> list[str]:
    """The stderr lines of a command that must fail as a user error: exit 2, no traceback."""
    assert result.returncode == 2, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.splitlines()
    assert lines and all(line.startswith("error: ") for line in lines), result.stderr
    return lines


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    out = ok(quiver("init", str(root), "--project", "demo", cwd=tmp_path))
    assert "created" in out
    write_parquet(root / "data/tx/part-0.parquet", transactions())
    write_catalog(root / "feature_defs", {"entities.py": ENTITIES, "views.py": VIEWS.format(ttl="1d")})
    return root


def test_init_creates_a_project_and_refuses_to_overwrite(tmp_path: Path) -> None:
    # The installed executable, end to end: entry point, exit codes and stderr of a real process.
    ok(quiver_process("init", "p", "--project", "shop", cwd=tmp_path))
    assert "project: shop" in (tmp_path / "p/quiver.yaml").read_text()
    assert (tmp_path / "p/feature_defs").is_dir()
    [line] = user_error(quiver_process("init", "p", cwd=tmp_path))
    assert "already exists" in line
    [line] = user_error(quiver_process("init", "q", "--project", "bad-name", cwd=tmp_path))
    assert "must be a plain identifier" in line and not (tmp_path / "q/quiver.yaml").exists()


def test_plan_apply_list_describe_versions(project: Path) -> None:
    planned = ok(quiver("plan", cwd=project))
    assert "+ feature view user_last (features: amount, category)" in planned
    assert "+ feature service fraud" in planned
    assert "would store catalog version 1 of project 'demo'" in planned
    registry_file = project / ".quiver/registry.db"
    assert Registry(f"sqlite:///{registry_file}", project="demo").count_versions() == 0  # plan wrote nothing

    applied = ok(quiver("apply", "--author", "ana", cwd=project))
    assert "+ entity user" in applied and "+ source tx" in applied
    assert "+ feature view user_spend (features: amount_sum_1h, amount_count_24h)" in applied
    assert "applied catalog version 1 of project 'demo'" in applied

    assert "no changes; catalog version 1 is current" in ok(quiver("apply", cwd=project))
    assert ok(quiver("plan", cwd=project)).strip() == "no changes"

    write_catalog(project / "feature_defs", {"views.py": VIEWS.format(ttl="3d")})
    changed = ok(quiver("apply", cwd=project))
    assert "~ feature view user_last (ttl: 1d → 3d)" in changed
    assert "applied catalog version 2" in changed

    listed = ok(quiver("list", cwd=project))
    for text in ("user_last", "user_spend", "fraud-team", "tile 5m", "3d", "service fraud: 4 features"):
        assert text in listed

    described = ok(quiver("describe", "user_spend", cwd=project))
    assert "views.py:" in described
    assert "amount_sum_1h" in described and "sum(amount) over 1h, tile 5m" in described
    assert "user_id int64" in described
    as_json = json.loads(ok(quiver("describe", "user_last", "--json", cwd=project)))
    assert as_json["ttl_us"] == 3 * 86_400_000_000 and [f["name"] for f in as_json["fields"]] == ["amount", "category"]

    versions = ok(quiver("versions", cwd=project))
    rows = [line for line in versions.splitlines() if line.startswith("│") and line.split("│")[1].strip()]
    assert [row.split("│")[1].strip() for row in rows] == ["1", "2"]
    assert "ana" in rows[0] and "~ feature view user_last (ttl: 1d → 3d)" in rows[1]  # the diff, not "c:x"

    [line] = user_error(quiver("describe", "nope", cwd=project))
    assert line == ("error: no definition named 'nope' (views: user_last, user_spend; services: fraud; "
                    "entities: user; sources: tx)")


def test_user_errors_print_one_line_per_problem_and_exit_2(project: Path) -> None:
    path = write_catalog(project / "feature_defs", {"views.py": VIEWS.format(ttl="soon") + (
        'bad = FeatureView("bad", [user], tx, aggregations=[Aggregation("amount", "median", "1h")])  # <-\n'
        'svc = FeatureService("svc", ["nope:x"])\n')})["views.py"]
    lines = user_error(quiver("apply", cwd=project))
    assert len(lines) == 3, lines
    marker = line_of(path)
    bad_ttl = f"views.py:{line_of(path, 'user_last = ')}: feature view 'user_last': ttl: not a duration"
    assert any(bad_ttl in x for x in lines)
    assert any(f"views.py:{marker}: feature view 'bad': aggregation fn 'median' is unknown" in x for x in lines)
    assert any(f"views.py:{marker + 1}: feature service 'svc': feature 'nope:x' names unknown view" in x
               for x in lines)
    assert not (project / ".quiver/registry.db").exists() or Registry(
        f"sqlite:///{project}/.quiver/registry.db", project="demo").count_versions() == 0


def test_python_error_in_a_catalog_file_is_one_located_line(project: Path) -> None:
    write_catalog(project / "feature_defs", {"broken.py": "from quiver import Field\n\nx = Field('a', Flaot64)\n"})
    [line] = user_error(quiver("plan", cwd=project))
    assert "broken.py:3: catalog file 'broken.py': NameError: name 'Flaot64' is not defined" in line


def test_markup_like_names_are_printed_literally(project: Path) -> None:
    write_catalog(project / "feature_defs", {"odd.py": ENTITIES.replace('"user"', '"[/red] [bold]x"')})
    lines = user_error(quiver("plan", cwd=project))
    assert any("entity '[/red] [bold]x': name must be a plain identifier" in line for line in lines), lines


def test_catalog_and_config_options_are_honoured(project: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # --config from an unrelated directory: paths resolve against the config file, not the cwd.
    out = ok(quiver("apply", "--config", str(project / "quiver.yaml"), cwd=elsewhere))
    assert "applied catalog version 1 of project 'demo'" in out
    assert (project / ".quiver/registry.db").exists() and not (elsewhere / ".quiver").exists()
    # --catalog points at another definitions folder (same data root).
    write_catalog(tmp_path / "other_defs", {"entities.py": ENTITIES, "views.py": VIEWS.format(ttl="2d")})
    out = ok(quiver("plan", "--config", str(project / "quiver.yaml"), "--catalog", str(tmp_path / "other_defs"),
                    cwd=elsewhere))
    assert "~ feature view user_last (ttl: 1d → 2d)" in out
    described = ok(quiver("describe", "user_last", "--catalog", str(tmp_path / "other_defs"), cwd=project))
    assert "ttl 2d" in described
    [line] = user_error(quiver("plan", "--catalog", str(tmp_path / "missing"), cwd=project))
    assert "missing does not exist" in line
    [line] = user_error(quiver("plan", "--config", str(tmp_path / "nope.yaml"), cwd=project))
    assert "nope.yaml does not exist" in line


def test_registry_url_environment_override(project: Path, tmp_path: Path) -> None:
    other = tmp_path / "env-registry.db"
    env = {"QUIVER_REGISTRY_URL": f"sqlite:///{other}"}
    assert "applied catalog version 1" in ok(quiver("apply", cwd=project, env=env))
    assert Registry(f"sqlite:///{other}", project="demo").count_versions() == 1
    assert not (project / ".quiver/registry.db").exists()  # the file's registry_url was overridden
    assert "applied catalog version 1" in ok(quiver("apply", cwd=project))  # and is still used without it


def test_registry_url_environment_override_to_postgres(project: Path, pg_url: str) -> None:
    out = ok(quiver("apply", cwd=project, env={"QUIVER_REGISTRY_URL": pg_url}))
    assert "applied catalog version 1" in out
    registry = Registry(pg_url, project="demo")
    assert [v.version for v in registry.versions()] == [1]
    registry.close()
    versions = ok(quiver("versions", cwd=project, env={"QUIVER_REGISTRY_URL": pg_url}))
    assert [row.split("│")[1].strip() for row in versions.splitlines()
            if row.startswith("│") and row.split("│")[1].strip()] == ["1"]  # one version; its diff spans lines


def test_bad_config_and_unreachable_registry_are_user_errors(project: Path) -> None:
    config = project / "quiver.yaml"
    config.write_text(config.read_text() + "colour: blue\n")
    [line] = user_error(quiver("list", cwd=project))
    assert "unknown setting(s) colour" in line
    config.write_text(config.read_text().replace("colour: blue\n", ""))
    env = {"QUIVER_REGISTRY_URL": "postgresql+psycopg://quiver:hunter2@127.0.0.1:1/quiver"}
    [line] = user_error(quiver("apply", cwd=project, env=env))
    assert "cannot open registry" in line and "hunter2" not in line
