"""quiver.yaml: defaults, environment overrides, unknown keys, types and path resolution."""

from __future__ import annotations

from pathlib import Path

import pytest

from quiver import Config, QuiverError, load_config
from quiver.config import DEFAULT_CONFIG_TEXT


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # A developer's QUIVER_* variables must not leak into these tests.
    import os

    for key in list(os.environ):
        if key.startswith("QUIVER_"):
            monkeypatch.delenv(key)


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_default_config_text_loads_with_defaults(tmp_path: Path) -> None:
    config = load_config(_write(tmp_path / "quiver.yaml", DEFAULT_CONFIG_TEXT.format(project="demo")))
    assert config.project == "demo"
    assert config.root == tmp_path
    assert config.catalog_dir == tmp_path / "feature_defs"
    assert config.offline_dir == tmp_path / "data/offline"
    assert config.registry == f"sqlite:///{tmp_path}/.quiver/registry.db"
    assert (config.engine, config.spark_master, config.redis_url) == ("duckdb", "local[2]", "")


def test_repo_example_config_loads() -> None:
    repo = Path(__file__).resolve().parents[2]
    config = load_config(repo / "quiver.yaml")
    assert config.project == "fraud" and config.catalog_dir == repo / "feature_defs"


def test_relative_paths_resolve_against_the_config_files_directory(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "proj"
    _write(project / "quiver.yaml", "catalog: defs\noffline_root: ../shared/offline\n"
                                    "registry_url: sqlite:///state/reg.db\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    config = load_config(Path("..") / "proj" / "quiver.yaml")
    assert config.root == project
    assert config.catalog_dir == project / "defs"
    assert config.offline_dir.resolve() == tmp_path / "shared" / "offline"
    assert config.registry == f"sqlite:///{project}/state/reg.db"


@pytest.mark.parametrize(("url", "expected"), [
    ("sqlite:////abs/reg.db", "sqlite:////abs/reg.db"),
    ("sqlite+pysqlite:///reg.db", "sqlite+pysqlite:///{root}/reg.db"),
    ("sqlite:///:memory:", "sqlite:///:memory:"),
    ("sqlite://", "sqlite://"),
    ("postgresql+psycopg://u@db:5432/quiver", "postgresql+psycopg://u@db:5432/quiver"),
])
def test_registry_url_forms(tmp_path: Path, url: str, expected: str) -> None:
    config = Config(root=tmp_path, registry_url=url)
    assert config.registry == expected.format(root=tmp_path)


def test_absolute_and_home_paths_are_kept(tmp_path: Path) -> None:
    config = Config(root=tmp_path, catalog="/abs/defs", offline_root="~/offline")
    assert config.catalog_dir == Path("/abs/defs")
    assert config.offline_dir == Path.home() / "offline"


def test_environment_overrides_file_values(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path / "quiver.yaml", "project: fromfile\nredis_url: redis://file:6379/0\n")
    monkeypatch.setenv("QUIVER_REDIS_URL", "redis://env:6379/1")
    monkeypatch.setenv("QUIVER_REGISTRY_URL", "sqlite:///env.db")
    monkeypatch.setenv("QUIVER_REDIS_TIMEOUT_S", "2.5")
    monkeypatch.setenv("QUIVER_AUTHOR", "not a setting, must be ignored")
    config = load_config(path)
    assert config.project == "fromfile"
    assert config.redis_url == "redis://env:6379/1"
    assert config.registry == f"sqlite:///{tmp_path}/env.db"
    assert config.redis_timeout_s == 2.5


def test_environment_alone_without_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QUIVER_PROJECT", "envonly")
    config = load_config()
    assert config.project == "envonly" and config.root == tmp_path


def test_directory_path_means_its_quiver_yaml(tmp_path: Path) -> None:
    _write(tmp_path / "quiver.yaml", "project: indir\n")
    assert load_config(tmp_path).project == "indir"


def test_unknown_keys_are_errors(tmp_path: Path) -> None:
    path = _write(tmp_path / "quiver.yaml", "project: p\nregistry: sqlite:///x.db\nroot: /etc\n")
    with pytest.raises(QuiverError, match=r"unknown setting\(s\) registry, root; known: .*catalog, engine"):
        load_config(path)


@pytest.mark.parametrize(("text", "message"), [
    ("engine: flink\n", "engine must be duckdb or spark"),
    ("project: my-project\n", "must be a plain identifier"),
    ("project: 123\n", "project must be a string, got 123"),
    ("catalog: [a, b]\n", "catalog must be a string"),
    ("redis_timeout_s: soon\n", "redis_timeout_s must be a number, got 'soon'"),
    ("redis_timeout_s: true\n", "redis_timeout_s must be a number"),
    ("redis_timeout_s: 0\n", "redis_timeout_s must be positive"),
    ("- a\n- b\n", "expected a mapping of settings"),
    ("project: [unclosed\n", "not valid YAML"),
])
def test_bad_values_are_clear_errors(tmp_path: Path, text: str, message: str) -> None:
    path = _write(tmp_path / "quiver.yaml", text)
    with pytest.raises(QuiverError, match=message.replace("(", r"\(").replace("[", r"\[")) as info:
        load_config(path)
    assert str(path) in str(info.value)  # the message names the file to fix


def test_bad_environment_value_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUIVER_REDIS_TIMEOUT_S", "fast")
    with pytest.raises(QuiverError, match="redis_timeout_s must be a number, got 'fast'"):
        load_config(_write(tmp_path / "quiver.yaml", ""))


def test_null_values_mean_empty(tmp_path: Path) -> None:
    assert load_config(_write(tmp_path / "quiver.yaml", "redis_url:\n")).redis_url == ""


def test_missing_explicit_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(QuiverError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
