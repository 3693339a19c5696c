"""A serving-log folder is one dataset with one schema: pandas, pyarrow.dataset, DuckDB and Spark read it as it
is, and agree with `read_serving_logs` — even when a flush held only nulls for a column (before, a one-row file
stored such a column with Arrow's `null` type and `pd.read_parquet` on the folder failed) — on logs written
here flush by flush and on what the real prediction service wrote (`operator_world`)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from quiver.config import Config
from quiver.serving.logs import ServingLogger, log_schema, read_serving_logs
from tests.integration.test_request_features import odfv_catalog

pytestmark = pytest.mark.integration
T0 = datetime(2026, 11, 3, 10, tzinfo=UTC)
F0, AMOUNT, PRODUCT = "feature.stats:f0", "request.amount", "feature.ctx:amount_x_f0"


def _us(t: datetime) -> int:
    return int(t.timestamp() * 1_000_000)


def write_logs(root: Path) -> pd.DataFrame:
    """Three flushes in three hours: one row with every feature missing, a batch with values, and rows of a
    model that reads no request field. Returns what was logged, as the readers should see it."""
    with ServingLogger(root, schema=log_schema(odfv_catalog())) as logger:
        logger.log_batch(["r0"], {"user_id": np.array([7])}, {"stats:f0": [None], "stats:category": [None]},
                         "m:1", predictions=np.array([np.nan]), ts_us=_us(T0), error="refused", request={"amount": [None]})
        logger.flush()
        logger.log_batch(["r1", "r2"], {"user_id": np.array([1, 2])},
                         {"stats:f0": np.array([0.5, -1.0]), "stats:category": ["a", None],
                          "ctx:amount_x_f0": np.array([5.0, np.nan])}, "m:2", predictions=np.array([0.1, 0.2]),
                         ts_us=_us(T0 + timedelta(hours=1)), request={"amount": np.array([10.0, 3.0])})
        logger.flush()
        logger.log_batch(["r3"], {"user_id": np.array([3])}, {"stats:f1": np.array([2.0])}, "m:3",
                         predictions=np.array([0.3]), ts_us=_us(T0 + timedelta(hours=2)))
    return pd.DataFrame({"request_id": ["r0", "r1", "r2", "r3"], F0: [None, 0.5, -1.0, None],
                         AMOUNT: [None, 10.0, 3.0, None], PRODUCT: [None, 5.0, None, None]})


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, pd.DataFrame]:
    root = tmp_path_factory.mktemp("logs")
    return root / "serving_logs", write_logs(root)


def _check(frame: pd.DataFrame, expected: pd.DataFrame) -> None:
    got = frame.sort_values("request_id").reset_index(drop=True)[list(expected.columns)]
    def plain(f: pd.DataFrame) -> pd.DataFrame:
        return f.astype(object).where(f.notna(), None)

    pd.testing.assert_frame_equal(plain(got), plain(expected), check_dtype=False)


def test_every_file_has_the_catalogs_columns_typed(logs: tuple[Path, pd.DataFrame]) -> None:
    folder, _ = logs
    schemas = [pq.read_schema(p) for p in sorted(folder.rglob("part-*.parquet"))]
    assert len(schemas) == 3 and all(s.equals(schemas[0]) for s in schemas)
    assert not [f.name for f in schemas[0] if f.type == pa.null()]
    types = {f.name: f.type for f in schemas[0]}
    assert types[F0] == pa.float64() and types[AMOUNT] == pa.float64() and types["request.channel"] == pa.string()
    assert types["key.user_id"] == pa.int64() and types["feature.stats:category"] == pa.string()


def test_pandas_reads_the_folder(logs: tuple[Path, pd.DataFrame]) -> None:
    folder, expected = logs
    _check(pd.read_parquet(folder), expected)


def test_pyarrow_dataset_reads_the_folder(logs: tuple[Path, pd.DataFrame]) -> None:
    folder, expected = logs
    _check(ds.dataset(folder, format="parquet", partitioning="hive").to_table().to_pandas(), expected)
    _check(read_serving_logs(folder.parent).to_pandas(), expected)


def test_duckdb_reads_the_folder(logs: tuple[Path, pd.DataFrame]) -> None:
    import duckdb

    folder, expected = logs
    frame = duckdb.sql(f"SELECT * FROM read_parquet('{folder}/**/*.parquet', hive_partitioning = true)").df()
    _check(frame, expected)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from pyspark.sql import SparkSession

    from quiver.offline import pit_spark

    existed = SparkSession.getActiveSession() is not None
    session = pit_spark.session(Config(spark_master="local[2]"))
    yield session
    if not existed:
        session.stop()


def test_spark_reads_the_folder(logs: tuple[Path, pd.DataFrame], spark: Any) -> None:
    folder, expected = logs
    table = spark.read.parquet(str(folder))
    assert table.count() == 4
    names = list(expected.columns)
    rows = table.select(*[f"`{n}`" for n in names]).collect()
    _check(pd.DataFrame([list(r) for r in rows], columns=names), expected)


def _served_int_logs(redis_url: str, root: Path) -> tuple[Path, pa.Schema]:
    """The real prediction service over a view with an Int64 feature that some users lack (as in the demo's
    `last_merchant_id`): four hours of requests, one flush each, two hours holding nulls. Returns the log
    folder and the catalog's log schema."""
    from quiver.artifacts import ArtifactStore
    from quiver.catalog.definitions import Entity, FeatureView, Field, Source
    from quiver.catalog.validate import build_catalog
    from quiver.offline.layout import last_values_schema
    from quiver.online.redis_store import RedisOnlineStore
    from quiver.registry.models import ModelRegistry
    from quiver.registry.repository import Registry
    from quiver.serving.prediction import PredictionService
    from quiver.serving.store import FeatureStore
    from tests.integration.test_prediction_service import BEAT_BASELINE, MODEL, save_model

    columns = {"user_id": "int64", "event_ts": "timestamp", "f0": "float64", "f1": "float64", "n": "int64",
               "category": "string"}
    user = Entity("user", ["user_id"])
    source = Source("tx", "unused")
    stats = FeatureView("stats", [user], source, ttl="30d", schema=[
        Field("f0", "float64"), Field("f1", "float64"), Field("n", "int64"), Field("category", "string")])
    catalog = build_catalog([user, source, stats], schema_reader=lambda s: columns)
    config = Config(root=root, project="logtypes", redis_url=redis_url, registry_url=f"sqlite:///{root}/reg.db",
                    offline_root=str(root / "offline"))
    users = 40
    lacking = {3, 17}  # these users have no `n` yet: a null in an Int64 feature
    frame = pd.DataFrame({"user_id": np.arange(users, dtype=np.int64), "f0": np.linspace(-1, 1, users),
                          "f1": np.linspace(1, -1, users),
                          "n": pd.array([None if u in lacking else 1000 + u for u in range(users)], "Int64"),
                          "category": ["a", "b"] * (users // 2)})
    online = RedisOnlineStore(redis_url, "logtypes", timeout_s=2.0)
    view = catalog.views["stats"]
    table = pa.Table.from_pandas(frame.assign(event_ts=pd.Timestamp(T0 - timedelta(days=1))), preserve_index=False)
    online.write_last_values(view, table.select(last_values_schema(view).names).cast(last_values_schema(view)))
    registry = Registry(config.registry, project="logtypes")
    models = ModelRegistry(registry, ArtifactStore.from_config(config))  # root: <root>/.quiver
    folder, sha = save_model(root / ".quiver" / "models", 1, numeric=("f0", "n"))
    version = models.register(MODEL, artifact_path=str(folder), sha256=sha, metrics=BEAT_BASELINE,
                              window_start=T0 - timedelta(days=7), cutoff=T0, features=["f0", "n", "category"],
                              catalog_version=None, label_column="label", lineage={},
                              reference_path=str(folder / "reference.parquet")).version
    models.set_alias(MODEL, "champion", version, expected=None, reason="test")
    schema = log_schema(catalog)
    with FeatureStore(config=config, catalog=catalog, online_store=online) as store, \
            ServingLogger(config.offline_dir, schema=schema, flush_interval_s=3_600) as logger, \
            PredictionService(store, MODEL, models=models, logger=logger) as service:
        for hour, who in enumerate(([0, 1, 2], [3, 4, 5], [6, 7, 8], [16, 17, 18])):
            at = T0 + timedelta(hours=hour)
            service.predict([{"request_id": f"h{hour}-{u}", "entities": {"user_id": u}, "at": at} for u in who])
            logger.flush()
    registry.close()
    return Path(config.offline_dir) / "serving_logs", schema


def test_served_integer_features_with_nulls_read_as_one_dataset(redis_url: str, tmp_path: Path, spark: Any) -> None:
    """Before: the hours whose requests met a missing Int64 feature were written as double (NaN for the
    null), and pyarrow.dataset failed on the folder ("Float value nan was truncated converting to int64")."""
    import duckdb

    folder, schema = _served_int_logs(redis_url, tmp_path)
    files = sorted(folder.rglob("part-*.parquet"))
    assert len(files) == 4
    for file in files:
        assert pq.read_schema(file).field("feature.n").type == pa.int64(), file
    declared = {f.name: f.type for f in schema}
    table = ds.dataset(folder, format="parquet", partitioning="hive").to_table()
    assert table.num_rows == 12
    for field in table.schema:  # every column the catalog types has its type
        if field.name in declared:
            assert field.type == declared[field.name], field
    n = dict(zip(table["request_id"].to_pylist(), table["feature.n"].to_pylist(), strict=True))
    assert n["h1-3"] is None and n["h3-17"] is None and n["h1-4"] == 1004 and n["h0-0"] == 1000
    with duckdb.connect() as db:
        got = dict(db.execute(f"select request_id, \"feature.n\" from read_parquet('{folder}/**/*.parquet', "
                              f"hive_partitioning = true)").fetchall())
        kind = db.execute(f"select distinct typeof(\"feature.n\") from read_parquet('{folder}/**/*.parquet', "
                          f"hive_partitioning = true)").fetchall()
    assert got == n and kind == [("BIGINT",)]
    logs = spark.read.parquet(str(folder))
    assert dict(logs.dtypes)["feature.n"] == "bigint"
    assert {r["request_id"]: r["feature.n"] for r in logs.select("request_id", "`feature.n`").collect()} == n


def test_a_logger_without_a_catalog_keeps_the_types_already_in_the_folder(tmp_path: Path) -> None:
    """Another process, no declared schema: an all-null column takes the type the dataset already has."""
    with ServingLogger(tmp_path) as first:
        first.log_batch(["a"], {"user_id": np.array([1])}, {"v:x": np.array([1.5])}, ts_us=_us(T0))
    with ServingLogger(tmp_path) as second:
        second.log_batch(["b"], {"user_id": np.array([2])}, {"v:x": [None]}, ts_us=_us(T0 + timedelta(hours=1)))
    schemas = [pq.read_schema(p) for p in sorted((tmp_path / "serving_logs").rglob("part-*.parquet"))]
    assert [s.field("feature.v:x").type for s in schemas] == [pa.float64(), pa.float64()]
    values = pd.read_parquet(tmp_path / "serving_logs").sort_values("request_id")["feature.v:x"].tolist()
    assert values[0] == 1.5 and pd.isna(values[1]) and len(values) == 2


def test_the_served_folder_reads_the_same_with_every_reader(operator_world: Any) -> None:
    """What the prediction service wrote (champion, shadow, canary and paired rows over several flushes)."""
    import duckdb

    folder = Path(operator_world.config.offline_dir) / "serving_logs"
    files = sorted(folder.glob("date=*/hour=*/part-*.parquet"))
    assert len(files) >= 2, files
    for file in files:  # one typed schema whatever each flush held (the service declares the catalog's)
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

    from quiver.offline.engines import spark_session

    # The project's own session settings (UTC, loopback); the run's shared local session, left running.
    spark: Any = spark_session("local[2]")
    logs = spark.read.option("mergeSchema", "true").parquet(str(folder))
    by_arm = {r["arm"]: r["count"] for r in logs.groupBy("arm").count().collect()}
    assert by_arm == arms
    assert dict(logs.dtypes)["feature.f0"] == "double"
