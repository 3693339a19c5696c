"""CLI habits a newcomer expects: -h and --version, no value types on flags, help on every option, one way to
pick views, `describe` for every kind of definition, `versions` with real diffs, project-relative paths."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import typer
from typer.testing import CliRunner

from quiver import __version__
from quiver.cli import _register_optional_commands, app
from tests.unit.catalogs.builders import TX_SCHEMA, transactions, write_parquet

REPO = Path(__file__).resolve().parents[2]
DEFS = '''\
from quiver import Aggregation, Entity, FeatureService, FeatureView, Field, Float64, Source, StreamBinding, String

user = Entity("user", ["user_id"], description="a card holder")
tx = Source("tx", "data/tx", description="card transactions",
            stream=StreamBinding(path="data/stream/tx"))
user_last = FeatureView("user_last", [user], tx, schema=[Field("category", String)], ttl="1d")
user_spend = FeatureView("user_spend", [user], tx, aggregations=[Aggregation("amount", "sum", "{window}")])
fraud = FeatureService("fraud", [user_last, user_spend])
'''


@pytest.fixture(scope="module")
def runner() -> CliRunner:
    _register_optional_commands()
    return CliRunner()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    schema = pa.schema([f for f in TX_SCHEMA if f.name != "tags"])
    write_parquet(tmp_path / "data" / "tx" / "part-0.parquet", transactions(6, schema))
    (tmp_path / "quiver.yaml").write_text("project: habits\n")
    (tmp_path / "feature_defs").mkdir()
    (tmp_path / "feature_defs" / "defs.py").write_text(DEFS.format(window="1h"))
    return tmp_path


def run(runner: CliRunner, project: Path, *args: str, code: int = 0) -> str:
    result = runner.invoke(app, [*args, "--config", str(project / "quiver.yaml")], env={"COLUMNS": "200"})
    assert result.exit_code == code, result.output
    return result.output


def commands() -> Iterator[tuple[list[str], Any]]:
    _register_optional_commands()

    def walk(cmd: Any, path: list[str]) -> Iterator[tuple[list[str], Any]]:
        yield path, cmd
        if hasattr(cmd, "commands"):  # a group (Typer vendors its own click, so no isinstance here)
            for name, sub in sorted(cmd.commands.items()):
                yield from walk(sub, [*path, name])

    yield from walk(typer.main.get_command(app), [])


def test_version_and_short_help(runner: CliRunner) -> None:
    assert runner.invoke(app, ["--version"]).output.strip() == f"quiver {__version__}"
    for path, _ in commands():
        result = runner.invoke(app, [*path, "-h"], env={"COLUMNS": "200"})
        assert result.exit_code == 0 and "Usage:" in result.output, path
        assert "<bool>" not in result.output, f"`quiver {' '.join(path)} -h` shows a value type on a flag"


def test_every_option_and_argument_says_what_it_is() -> None:
    missing = [f"quiver {' '.join(path)} {param.name}" for path, cmd in commands() for param in cmd.params
               if not getattr(param, "help", None) and param.name != "help"]
    assert not missing, missing
    [demo] = [c for path, c in commands() if path == ["demo-data"]]  # the walk reaches the commands
    assert {p.name for p in demo.params} >= {"days", "seed", "users", "transactions_per_day", "late_fraction",
                                             "malformed_fraction"}


def test_one_way_to_pick_views() -> None:
    by_path = {tuple(path): cmd for path, cmd in commands()}
    for name in ("backfill", "materialize", "stream"):
        [option] = [p for p in by_path[(name,)].params if p.name in ("views", "view")]
        assert option.opts == ["--view", "--views"] and option.multiple, name


def test_describe_views_services_entities_and_sources(runner: CliRunner, project: Path) -> None:
    view = run(runner, project, "describe", "user_spend")
    assert "feature view" in view and "sum(amount) over 1h" in view
    service = run(runner, project, "describe", "fraud")
    assert "feature service" in service and "user_last" in service and "join keys: user_id" in service
    entity = run(runner, project, "describe", "user")
    assert "join keys: user_id int64" in entity and "user_last, user_spend" in entity
    source = run(runner, project, "describe", "tx")
    assert "event time: event_ts" in source and "amount" in source and "data/stream/tx" in source
    unknown = run(runner, project, "describe", "nope", code=2)
    assert "no definition named 'nope'" in unknown and "services: fraud" in unknown


def test_describe_says_which_a_stream_binding_reads(runner: CliRunner, project: Path) -> None:
    """A binding naming files and a topic: `describe` says what `quiver stream` will read, files until brokers
    are set, then the topic (StreamSpec.reads_kafka), not both as if either might be read."""
    defs = project / "feature_defs" / "defs.py"
    defs.write_text(defs.read_text().replace('StreamBinding(path="data/stream/tx")',
                                             'StreamBinding(path="data/stream/tx", kafka_topic="tx-events")'))
    files = run(runner, project, "describe", "tx")
    assert "stream: json files at data/stream/tx (Kafka topic tx-events once kafka_bootstrap is set)" in files
    (project / "quiver.yaml").write_text("project: habits\nkafka_bootstrap: broker-1:9092\n")
    kafka = run(runner, project, "describe", "tx")
    assert "stream: Kafka topic tx-events at broker-1:9092 (files at data/stream/tx when no brokers are set)" in kafka


def test_versions_show_real_diffs(runner: CliRunner, project: Path) -> None:
    run(runner, project, "apply")
    (project / "feature_defs" / "defs.py").write_text(DEFS.format(window="2h"))
    run(runner, project, "apply")
    out = run(runner, project, "versions")
    assert "+ feature view user_spend" in out and "+ entity user" in out
    assert "~ feature view user_spend" in out and "1h" in out and "2h" in out  # what changed, not just "c:"
    assert "a:user" not in out and "c:user_spend" not in out


def test_flink_compile_prints_project_relative_paths(runner: CliRunner, project: Path) -> None:
    out = run(runner, project, "compile", "--target", "flink", "--plain")
    assert "'path' = '.quiver/stream/" in out
    assert str(project) not in out and "file://" not in out


def test_demo_runs_the_cli_through_its_own_interpreter(tmp_path: Path) -> None:
    """pipelines/demo/run.py starts `quiver stream` as `sys.executable -m quiver.cli`, which works wherever the venv
    lives (replacing "python" in the interpreter path broke on paths like /home/python/...)."""
    from quiver.pipelines.demo.run import stream_job_command

    tree = ast.parse((REPO / "pipelines" / "demo" / "run.py").read_text())
    calls = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.Call) and "subprocess.run" in ast.unparse(n.func)]
    assert calls and all(("sys.executable, '-m', 'quiver.cli'" in c or "stream_job_command()" in c)
                         and ".replace(" not in c for c in calls), calls
    assert stream_job_command()[:3] == [sys.executable, "-m", "quiver.cli"]
    out = subprocess.run([sys.executable, "-m", "quiver.cli", "--version"], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert out.strip() == f"quiver {__version__}"


def test_materialize_progress_counts_entities_like_its_summary() -> None:
    from quiver.online import materialize as mat

    class CountingStore:
        def write_tiles(self, spec: object, chunk: pa.Table) -> int:
            return len(set(chunk.column("user_id").to_pylist()))

    ticks: list[tuple[int, int]] = []
    spec = _tiles_spec()
    table = pa.table({"user_id": [1, 1, 1, 2, 2, 3], "tile_start": [0, 1, 2, 0, 1, 0]})
    old = mat._CHUNK_ROWS
    mat._CHUNK_ROWS = 2  # entity 1 spans two chunks: it still counts once
    try:
        written = mat._write(CountingStore(), spec, table, lambda view, done, total: ticks.append((done, total)))
    finally:
        mat._CHUNK_ROWS = old
    assert written == 3 and ticks[-1] == (3, 3) and {total for _, total in ticks} == {3}


def _tiles_spec() -> object:
    from quiver.catalog.ir import AggSpec, ViewSpec

    return ViewSpec(name="v", entities=("user",), keys=(("user_id", "int64"),), source="tx",
                    timestamp_field="event_ts", aggregations=(AggSpec("amount_sum_1h", "amount", "sum",
                                                                     3_600_000_000, "float64"),),
                    tile_us=300_000_000)
