"""Quiver: register ML features once in Python; compute them in Spark, Flink and DuckDB; serve from Redis.

The public API is re-exported here; `tests/unit/test_public_api.py` pins `__all__`.
Heavy engines (pyspark, duckdb, torch, …) are imported lazily by the functions that need them.
"""

from quiver.catalog.definitions import (
    Aggregation,
    Entity,
    FeatureService,
    FeatureView,
    Field,
    Source,
    StreamBinding,
)
from quiver.catalog.errors import CatalogError, QuiverError
from quiver.catalog.ir import Catalog
from quiver.catalog.loader import load_catalog
from quiver.catalog.types import Bool, Float64, Int64, String, Timestamp
from quiver.config import Config, load_config

__version__ = "0.1.0"

__all__ = [
    "Aggregation",
    "Bool",
    "Catalog",
    "CatalogError",
    "Config",
    "Entity",
    "FeatureService",
    "FeatureView",
    "Field",
    "Float64",
    "Int64",
    "QuiverError",
    "Source",
    "StreamBinding",
    "String",
    "Timestamp",
    "load_catalog",
    "load_config",
]
