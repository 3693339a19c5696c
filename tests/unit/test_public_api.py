"""The public API changes only on purpose: `quiver.__all__` is pinned here."""

from __future__ import annotations

import subprocess
import sys
import types

import quiver

PUBLIC = [
    "Aggregation",
    "Bool",
    "Catalog",
    "CatalogError",
    "Check",
    "Config",
    "Contract",
    "Entity",
    "FeatureService",
    "FeatureStore",
    "FeatureView",
    "Field",
    "Float64",
    "Int64",
    "KAFKA_TIMESTAMP",
    "OnDemandFeatureView",
    "QuiverError",
    "RequestSource",
    "Source",
    "StreamBinding",
    "String",
    "Timestamp",
    "backfill",
    "get_historical_features",
    "get_logged_features",
    "load_catalog",
    "load_config",
    "materialize",
    "read_training_set",
    "spark_historical_features",
    "write_historical_features",
]

HEAVY = ("pyspark", "duckdb", "feast", "evidently", "torch", "airflow", "fastapi", "great_expectations")


def test_all_is_pinned_and_sorted() -> None:
    assert quiver.__all__ == PUBLIC
    assert sorted(quiver.__all__) == quiver.__all__


def test_all_lists_every_public_name() -> None:
    public = {name for name, value in vars(quiver).items()
              if not name.startswith("_") and not isinstance(value, types.ModuleType)}
    assert public | set(quiver._LAZY) == set(quiver.__all__)


def test_every_public_name_resolves_and_callables_are_documented() -> None:
    for name in quiver.__all__:
        value = getattr(quiver, name)
        if callable(value):
            assert (value.__doc__ or "").strip(), f"quiver.{name} has no docstring"


def test_type_names_are_the_logical_dtypes() -> None:
    assert (quiver.Int64, quiver.Float64, quiver.String, quiver.Bool, quiver.Timestamp) == (
        "int64", "float64", "string", "bool", "timestamp")


def test_importing_quiver_and_its_cli_loads_no_heavy_engine() -> None:
    # The streaming venv has none of these; the light core must import without them.
    code = ("import sys, quiver, quiver.cli, quiver.registry, quiver.catalog.validate; "
            f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
