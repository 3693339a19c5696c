"""One schema per serving-log dataset: a null in an integer, boolean or text feature stays a null in the
catalog's type (the prediction service hands such a column over as floats with NaN, and files had turned
double in the hours that held one); a value the dataset's type cannot hold is refused, never written as a file
of another schema; a folder already holding such double files reads back in the catalog's types."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from quiver.catalog.definitions import Entity, FeatureView, Field, Source
from quiver.catalog.validate import build_catalog
from quiver.serving.logs import ServingLogger, log_schema, read_quarantine, read_serving_logs

T0 = datetime(2026, 11, 8, 10, tzinfo=UTC)
COLUMNS = {"user_id": "int64", "event_ts": "timestamp", "merchant_id": "int64", "online": "bool",
           "category": "string", "amount": "float64"}


def catalog() -> Any:
    user = Entity("user", ["user_id"])
    source = Source("tx", "unused")
    last = FeatureView("last", [user], source, ttl="7d",
                       schema=[Field("last_merchant_id", "int64", column="merchant_id"),
                               Field("last_online", "bool", column="online"),
                               Field("last_category", "string", column="category"),
                               Field("last_amount", "float64", column="amount")])
    return build_catalog([user, source, last], schema_reader=lambda s: COLUMNS)


def _us(t: datetime) -> int:
    return int(t.timestamp() * 1_000_000)


def _files(root: Path) -> list[Path]:
    return sorted((root / "serving_logs").rglob("part-*.parquet"))


def served(n: int, null_at: int | None) -> dict[str, np.ndarray]:
    """A request's inputs as the prediction service passes them: numbers as float64 with NaN for a missing
    value once a column holds one (ints stay ints when every value is present)."""
    merchant = np.arange(100, 100 + n, dtype=np.int64)
    online = np.arange(n) % 2 == 0
    category = np.array(["a"] * n, dtype=object)
    if null_at is None:
        return {"last_merchant_id": merchant, "last_online": online, "last_category": category,
                "last_amount": merchant * 0.5}
    floats, flags = merchant.astype(np.float64), online.astype(np.float64)
    floats[null_at] = flags[null_at] = np.nan
    category[null_at] = None
    return {"last_merchant_id": floats, "last_online": flags, "last_category": category,
            "last_amount": merchant * 0.5}


def test_a_null_in_an_integer_feature_keeps_the_catalogs_type(tmp_path: Path) -> None:
    schema = log_schema(catalog())
    with ServingLogger(tmp_path, schema=schema) as logger:
        for hour, null_at in enumerate((None, 1, None, 0)):
            logger.log_batch([f"r{hour}-{i}" for i in range(3)], {"user_id": np.array([1, 2, 3])},
                             served(3, null_at), "m:1", predictions=np.full(3, 0.5),
                             ts_us=_us(T0 + timedelta(hours=hour)))
            logger.flush()
    files = _files(tmp_path)
    assert len(files) == 4
    for file in files:
        types = {f.name: f.type for f in pq.read_schema(file)}
        assert types["feature.last_merchant_id"] == pa.int64(), file
        assert types["feature.last_online"] == pa.bool_() and types["feature.last_category"] == pa.string()
        assert types["feature.last_amount"] == pa.float64()
    table = ds.dataset(tmp_path / "serving_logs", format="parquet", partitioning="hive").to_table()
    rows = table.sort_by("request_id").to_pydict()
    at = rows["request_id"].index("r1-1")
    assert rows["feature.last_merchant_id"][at] is None and rows["feature.last_online"][at] is None
    assert rows["feature.last_category"][at] is None
    assert rows["feature.last_merchant_id"][at - 1] == 100 and table["feature.last_merchant_id"].null_count == 2


def test_a_value_the_datasets_type_cannot_hold_is_refused(tmp_path: Path) -> None:
    """1.5 is no Int64: the request's rows go to the quarantine with why; the hour's other rows are written in
    the dataset's schema."""
    with ServingLogger(tmp_path, schema=log_schema(catalog())) as logger:
        logger.log_batch(["good"], {"user_id": np.array([1])}, served(1, None), ts_us=_us(T0))
        bad = served(1, None) | {"last_merchant_id": np.array([1.5])}
        logger.log_batch(["bad"], {"user_id": np.array([2])}, bad, ts_us=_us(T0))
    files = _files(tmp_path)
    assert len(files) == 1 and pq.read_schema(files[0]).field("feature.last_merchant_id").type == pa.int64()
    assert pq.read_table(files[0])["request_id"].to_pylist() == ["good"]
    quarantined = read_quarantine(tmp_path).to_pydict()
    assert quarantined["request_id"] == ["bad"]
    assert "feature.last_merchant_id" in quarantined["quarantine_reason"][0]
    assert "int64" in quarantined["quarantine_reason"][0]


def test_without_a_catalog_later_files_keep_the_first_files_types(tmp_path: Path) -> None:
    """No declared schema: a column keeps the type it was first written with (a NaN in ints is a null)."""
    with ServingLogger(tmp_path) as logger:
        logger.log_batch(["a"], {"user_id": np.array([1])}, {"n": np.array([4])}, ts_us=_us(T0))
        logger.flush()
        logger.log_batch(["b", "c"], {"user_id": np.array([1, 2])}, {"n": np.array([np.nan, 5.0])},
                         ts_us=_us(T0 + timedelta(hours=1)))
    types = {pq.read_schema(f).field("feature.n").type for f in _files(tmp_path)}
    assert types == {pa.int64()}
    assert read_serving_logs(tmp_path)["feature.n"].to_pylist() == [4, None, 5]


def test_a_folder_with_double_files_reads_in_the_catalogs_types(tmp_path: Path) -> None:
    """Logs written before: some hours double (NaN for the null), most int64. `read_serving_logs` reads them
    as int64 with a null, as the catalog says, with or without the catalog's schema at hand."""
    folder = tmp_path / "serving_logs"
    stamps = [T0, T0 + timedelta(hours=1), T0 + timedelta(hours=2)]
    values: list[pa.Array] = [pa.array([7, 8]), pa.array([np.nan, 9.0]), pa.array([10, 11])]
    for i, (at, merchant) in enumerate(zip(stamps, values, strict=True)):
        part = folder / f"date={at:%Y-%m-%d}" / f"hour={at:%H}"
        part.mkdir(parents=True)
        table = pa.table({"ts": pa.array([at, at], pa.timestamp("us", tz="UTC")),
                          "request_id": [f"r{i}a", f"r{i}b"], "feature.last_merchant_id": merchant})
        pq.write_table(table, part / f"part-{i}.parquet")
    for schema in (None, log_schema(catalog())):
        table = read_serving_logs(tmp_path, schema=schema)
        column = table["feature.last_merchant_id"]
        assert column.type == pa.int64(), schema
        assert column.to_pylist() == [7, 8, None, 9, 10, 11]


def test_a_float_column_with_fractions_is_not_made_integer_by_the_reader(tmp_path: Path) -> None:
    folder = tmp_path / "serving_logs"
    for i, values in enumerate((pa.array([1, 2]), pa.array([1.5, np.nan]))):
        part = folder / "date=2026-11-08" / f"hour={10 + i:02d}"
        part.mkdir(parents=True)
        at = T0 + timedelta(hours=i)
        pq.write_table(pa.table({"ts": pa.array([at, at], pa.timestamp("us", tz="UTC")), "request_id": ["x", "y"],
                                 "feature.v": values}), part / "part-0.parquet")
    column = read_serving_logs(tmp_path)["feature.v"]
    assert pa.types.is_floating(column.type) and column.to_pylist()[2] == 1.5


def test_the_names_the_service_logs_are_declared() -> None:
    """The columns the prediction service logs (the features' own names) are declared with the catalog's type,
    beside the `view:feature` names."""
    schema = log_schema(catalog())
    assert schema.field("feature.last_merchant_id").type == pa.int64()
    assert schema.field("feature.last:last_merchant_id").type == pa.int64()
    assert schema.field("feature.last_online").type == pa.bool_()
