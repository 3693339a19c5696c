"""Serving logs are a plain Parquet dataset anyone can read: pyarrow.dataset, pandas, DuckDB and Spark read
the folder the prediction service wrote (`operator_world`: champion, shadow, canary and paired rows over
several flushes) directly, see the same rows, and the feature columns keep their types.

These logs hold no flush whose column is null in every row. A flush like that (one shadow row, say) is the
lead's item "one stable schema per log dataset, typed columns even when a flush is all null"; once the
writer types such columns, this test covers it too by adding such a flush here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.integration


def test_the_serving_log_folder_reads_the_same_with_every_reader(operator_world: Any) -> None:
    import duckdb
    import pandas as pd
    import pyarrow.dataset as ds

    from quiver.monitoring.serving_log import read_serving_logs

    folder = Path(operator_world.config.offline_dir) / "serving_logs"
    files = sorted(folder.glob("date=*/hour=*/part-*.parquet"))
    assert len(files) >= 2, files
    for file in files:  # the precondition this test is written for (see the module docstring)
        assert not [f.name for f in pq.read_schema(file) if pa.types.is_null(f.type)], file
    expected = read_serving_logs(operator_world.config.offline_dir)
    arms = expected.to_pandas()["arm"].value_counts().to_dict()
    assert {"champion", "canary", "shadow", "paired"} <= set(arms)

    dataset = ds.dataset(folder, format="parquet", partitioning="hive").to_table()
    frame = pd.read_parquet(folder)
    with duckdb.connect() as db:
        counts = dict(db.execute(f"select arm, count(*) from read_parquet('{folder}/**/*.parquet', "
                                 f"hive_partitioning = true, union_by_name = true) group by arm").fetchall())
        f0_type = db.execute(f"select typeof(\"feature.f0\") from read_parquet('{folder}/**/*.parquet', "
                             f"union_by_name = true) limit 1").fetchall()[0][0]
    assert dataset.num_rows == len(frame) == expected.num_rows == sum(counts.values())
    assert counts == arms and frame["arm"].value_counts().to_dict() == arms
    assert pa.types.is_floating(dataset.schema.field("feature.f0").type) and f0_type == "DOUBLE"
    assert frame["feature.f0"].dtype.kind == "f" and frame["feature.category"].dropna().isin(["a", "b", "c"]).all()

    from quiver.offline.engines import spark_session, stop_spark

    spark: Any = spark_session("local[1]")  # the project's own session settings (UTC, loopback)
    try:
        logs = spark.read.option("mergeSchema", "true").parquet(str(folder))
        by_arm = {r["arm"]: r["count"] for r in logs.groupBy("arm").count().collect()}
        assert by_arm == arms
        assert dict(logs.dtypes)["feature.f0"] == "double"
    finally:
        stop_spark()
