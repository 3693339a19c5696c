"""Training sets beyond the driver on a real local Spark: labels read by the executors from Parquet files (a
folder, a glob, a Spark DataFrame), the join finalized on the executors, the result kept in Spark or written to
a folder under one manifest; equal to the embedded engine on every value. The cluster and S3 version is in
test_offline_object_store_cluster.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from quiver.catalog.errors import QuiverError
from quiver.offline.backfill import backfill
from quiver.offline.engines import spark_session, stop_spark
from quiver.offline.pit import get_historical_features
from quiver.offline.spark_training_sets import (
    read_training_set,
    spark_historical_features,
    training_set_files,
    write_historical_features,
)
from tests.integration.test_pit_backfill import FIRST, LAST, _demo_project

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any, pd.DataFrame, Path]]:
    root = tmp_path_factory.mktemp("training")
    config, catalog, labels, _ = _demo_project(root)
    backfill(config, catalog, FIRST, LAST, engine="duckdb")
    folder = root / "labels_in"  # the labels as three Parquet files, as a job upstream would leave them
    folder.mkdir()
    table = pa.Table.from_pandas(labels, preserve_index=False)
    step = -(-len(labels) // 3)
    for i in range(3):
        pq.write_table(table.slice(i * step, step), folder / f"part-{i}.parquet")
    yield config, catalog, labels, folder
    stop_spark()


def _expected(project: tuple[Any, Any, pd.DataFrame, Path]) -> pd.DataFrame:
    config, catalog, labels, _ = project
    return get_historical_features(labels, "fraud_model", catalog=catalog, config=config, full_feature_names=True)


def _in_label_order(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.sort_values("label_row", kind="stable").reset_index(drop=True)


def _assert_equal(got: pd.DataFrame, expected: pd.DataFrame) -> None:
    columns = [c for c in expected.columns if "__" in c]
    assert len(columns) >= 15 and len(got) == len(expected)
    assert got["label_row"].is_monotonic_increasing and got["label_row"].is_unique
    for column in columns:  # dtypes differ by design (Arrow's nullable ints against the documented pandas ones)
        left = pd.Series(got[column].to_numpy(dtype=object))
        right = pd.Series(expected[column].to_numpy(dtype=object))
        assert left.isna().equals(right.isna()), column
        both = left.notna()
        if pd.api.types.is_float_dtype(expected[column].dtype):
            assert ((left[both].astype(float) - right[both].astype(float)).abs()
                    <= 1e-9 * right[both].astype(float).abs().clip(lower=1)).all(), column
        else:
            assert list(left[both]) == list(right[both]), column


def test_labels_from_a_folder_stay_in_spark_and_equal_the_embedded_engine(project: Any) -> None:
    config, catalog, labels, folder = project
    frame = spark_historical_features(str(folder), "fraud_model", catalog=catalog, config=config,
                                      full_feature_names=True)
    plan = frame._jdf.queryExecution().executedPlan().toString()
    assert "LocalTableScan" not in plan and "Scan parquet" in plan  # the labels come from the files
    got = _in_label_order(frame.toPandas())
    assert list(got.columns[:len(labels.columns)]) == list(labels.columns)
    _assert_equal(got, _expected(project))


def test_a_glob_and_a_spark_dataframe_are_labels_too(project: Any) -> None:
    config, catalog, _, folder = project
    expected = _expected(project)
    by_glob = spark_historical_features(f"{folder}/part-*.parquet", "fraud_model", catalog=catalog, config=config,
                                        full_feature_names=True)
    _assert_equal(_in_label_order(by_glob.toPandas()), expected)
    spark = spark_session(config.spark_master)
    given = spark.read.parquet(f"file://{folder}")
    by_frame = spark_historical_features(given, "fraud_model", catalog=catalog, config=config,
                                         full_feature_names=True)
    _assert_equal(_in_label_order(by_frame.toPandas()), expected)


def test_written_by_the_executors_under_one_manifest(project: Any, tmp_path: Path) -> None:
    config, catalog, _, folder = project
    out = tmp_path / "training" / "fraud_v3"
    written = write_historical_features(str(folder), "fraud_model", out, catalog=catalog, config=config,
                                        full_feature_names=True)
    expected = _expected(project)
    assert written.rows == len(expected) and written.files >= 1
    names = sorted(p.name for p in out.iterdir())
    assert "_manifest.json" in names and not [n for n in names if n.startswith((".staging", ".part"))], names
    table = read_training_set(out)
    _assert_equal(_in_label_order(table.to_pandas()), expected)
    assert len(training_set_files(out)) == written.files
    with pytest.raises(QuiverError, match="already holds a training set; pass overwrite=True"):
        write_historical_features(str(folder), "fraud_model", out, catalog=catalog, config=config)
    again = write_historical_features(str(folder), ["user_spend:amount_count_24h"], out, catalog=catalog,
                                      config=config, overwrite=True)
    assert again.rows == len(expected)
    assert "amount_count_24h" in read_training_set(out).column_names
    assert len([p for p in out.iterdir() if p.suffix == ".parquet"]) == again.files  # the old files are gone


def test_bad_labels_are_named_before_any_join(project: Any, tmp_path: Path) -> None:
    config, catalog, labels, _ = project
    bad = labels.drop(columns=["user_id"]).assign(amount_count_24h=1)
    bad["event_ts"] = bad["event_ts"].astype("int64")
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pandas(bad, preserve_index=False), path)
    with pytest.raises(QuiverError) as caught:
        spark_historical_features(str(path), ["user_spend:amount_count_24h"], catalog=catalog, config=config)
    message = str(caught.value)
    assert "lacks join key 'user_id'" in message
    assert "'event_ts' must hold timestamps, got long" in message
    assert "'amount_count_24h'" in message and "clash" in message
    with pytest.raises(QuiverError, match="do not exist"):
        spark_historical_features(str(tmp_path / "nowhere"), ["user_spend:amount_count_24h"], catalog=catalog,
                                  config=config)
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(QuiverError, match="not a training set; choose a new folder"):
        write_historical_features(str(path), ["user_spend:amount_count_24h"], out, catalog=catalog, config=config)
    assert (out / "notes.txt").read_text() == "mine"


def test_the_cli_on_spark_reads_a_label_folder_and_writes_a_folder(project: Any, tmp_path: Path) -> None:
    from tests.cli_runs import quiver
    from tests.integration.test_pit_backfill import REPO

    config, _, labels, folder = project
    (config.root / "quiver.yaml").write_text(f"project: training\noffline_root: data/offline\nengine: spark\n"
                                             f"registry_url: sqlite:///{config.root}/registry.db\n")
    out = tmp_path / "fraud_v3"
    args = ["training-set", str(folder), "--service", "fraud_model", "--out", str(out), "--full-feature-names",
            "--catalog", str(REPO / "feature_defs")]
    run = quiver(*args, cwd=config.root)
    assert run.returncode == 0, run.stderr
    assert f"{len(labels):,} rows" in run.stdout and "_manifest.json" in run.stdout
    _assert_equal(_in_label_order(read_training_set(out).to_pandas()), _expected(project))
    again = quiver(*args, cwd=config.root)
    assert again.returncode == 2 and "pass --overwrite to replace it" in again.stderr, again.stderr
    assert quiver(*args, "--overwrite", cwd=config.root).returncode == 0


def test_get_historical_features_on_spark_reads_a_label_folder_on_the_executors(project: Any) -> None:
    """The pandas API with labels as files (engine spark): the same frame as the embedded engine's — label
    order, a fresh index, the documented dtypes — with the labels read by the executors."""
    config, catalog, _, folder = project
    got = get_historical_features(str(folder), "fraud_model", catalog=catalog, config=config, engine="spark",
                                  full_feature_names=True)
    expected = _expected(project)
    assert list(got.columns) == list(expected.columns)
    pd.testing.assert_frame_equal(got, expected, check_exact=False, rtol=1e-9)


def test_last_values_are_final_in_the_plan_and_only_windows_run_python(project: Any) -> None:
    """Last values need no merge: their plan has no Python step (a Python worker per task costs more than the
    join of a small view); window partials are finalized by the executors' Python, pit_merge's code."""
    config, catalog, _, folder = project
    last = spark_historical_features(str(folder), ["user_last_transaction:last_amount"], catalog=catalog,
                                     config=config)
    windows = spark_historical_features(str(folder), ["user_spend:amount_count_24h"], catalog=catalog,
                                        config=config)
    assert "MapInArrow" not in last._jdf.queryExecution().executedPlan().toString()
    assert "MapInArrow" in windows._jdf.queryExecution().executedPlan().toString()
    assert last.count() == windows.count() == len(project[2])
