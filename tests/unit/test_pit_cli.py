"""`quiver training-set`: a real project on disk (config, catalog files, offline store), run through the CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import typer
from typer.testing import CliRunner

from quiver.cli import training as training_cli
from tests.unit.test_pit_reference import World, assert_same, make_world, reference_features

CATALOG = '''
from quiver import Aggregation, Entity, FeatureService, FeatureView, Field, Float64, Int64, Source, String

user = Entity("user", ["user_id"], dtype=Int64)
tx = Source("tx", path="events/tx", timestamp_field="event_ts")
user_last_tx = FeatureView("user_last_tx", [user], tx, ttl="1h",
                           schema=[Field("last_amount", Float64, column="amount"), Field("category", String)])
user_spend = FeatureView("user_spend", [user], tx, tile="10m",
                         aggregations=[Aggregation("amount", "sum", "30m"), Aggregation("amount", "count", "2h")])
svc = FeatureService("svc", features=[user_last_tx, "user_spend:amount_sum_30m"])
'''


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, World]:
    root = tmp_path_factory.mktemp("cli")
    world = make_world(root, seed=4)
    (root / "defs").mkdir()
    (root / "defs" / "features.py").write_text(CATALOG)
    (root / "quiver.yaml").write_text("project: cli\ncatalog: defs\noffline_root: offline\n")
    world.labels.to_parquet(root / "labels.parquet", index=False)
    return root, world


def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("noop")(lambda: None)  # a second command keeps typer from flattening the group
    training_cli.register(app)
    return app


def test_training_set_writes_the_point_in_time_features(project: tuple[Path, World]) -> None:
    root, world = project
    out = root / "out" / "train.parquet"
    result = CliRunner().invoke(_app(), ["training-set", str(root / "labels.parquet"), "--out", str(out),
                                         "--features", "user_spend:amount_sum_30m, user_last_tx:category",
                                         "--config", str(root / "quiver.yaml")])
    assert result.exit_code == 0, result.output
    assert f"{len(world.labels):,} rows × {len(world.labels.columns) + 2} columns" in result.output
    assert "amount_sum_30m" in result.output  # the first rows are printed
    written = pq.read_table(out).to_pandas()
    expected = reference_features(world, ["user_spend:amount_sum_30m", "user_last_tx:category"])
    assert list(written.columns) == list(expected.columns)
    assert_same(written, expected, ["amount_sum_30m", "category"])


def test_training_set_from_a_service(project: tuple[Path, World]) -> None:
    root, _ = project
    out = root / "svc.parquet"
    result = CliRunner().invoke(_app(), ["training-set", str(root / "labels.parquet"), "--out", str(out),
                                         "--service", "svc", "--config", str(root / "quiver.yaml"),
                                         "--full-feature-names"])
    assert result.exit_code == 0, result.output
    columns = pq.read_schema(out).names
    assert columns[-3:] == ["user_last_tx__last_amount", "user_last_tx__category", "user_spend__amount_sum_30m"]


def test_user_errors_exit_2_and_leave_the_old_output(project: tuple[Path, World]) -> None:
    root, _ = project
    out = root / "keep.parquet"
    out.write_bytes(b"old")
    runner = CliRunner()
    args = ["training-set", str(root / "labels.parquet"), "--out", str(out), "--config", str(root / "quiver.yaml")]
    bad = runner.invoke(_app(), [*args, "--features", "user_spend:nope"])
    assert bad.exit_code == 2
    assert "has no feature 'nope'" in bad.output
    assert out.read_bytes() == b"old"
    both = runner.invoke(_app(), [*args, "--features", "user_spend:amount_sum_30m", "--service", "svc"])
    assert both.exit_code == 2 and "exactly one of" in both.output


def test_quiver_cli_registers_the_command() -> None:
    result = subprocess.run([sys.executable, "-c", "import sys; from quiver.cli import main; sys.argv = "
                             "['quiver', '--help']; main()"], capture_output=True, text=True)
    assert "training-set" in result.stdout, result.stdout + result.stderr
