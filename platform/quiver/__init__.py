"""Quiver: register ML features once in Python; compute them in Spark, Flink and DuckDB; serve from Redis.

The public API is re-exported here; `tests/unit/test_public_api.py` pins `__all__`.
Heavy engines (pyspark, duckdb, torch, …) are imported lazily by the functions that need them.
"""

import typing as _typing

from quiver.catalog.definitions import (
    KAFKA_TIMESTAMP,
    Aggregation,
    Check,
    Contract,
    Entity,
    FeatureService,
    FeatureView,
    Field,
    OnDemandFeatureView,
    RequestSource,
    Source,
    StreamBinding,
)
from quiver.catalog.errors import CatalogError, QuiverError
from quiver.catalog.ir import Catalog
from quiver.catalog.loader import load_catalog
from quiver.catalog.types import Bool, Float64, Int64, String, Timestamp
from quiver.config import Config, load_config

if _typing.TYPE_CHECKING:
    from quiver.monitoring.logged_features import get_logged_features
    from quiver.offline.backfill import backfill
    from quiver.offline.pit import get_historical_features
    from quiver.offline.spark_training_sets import (
        read_training_set,
        spark_historical_features,
        write_historical_features,
    )
    from quiver.online.materialize import materialize
    from quiver.serving.store import FeatureStore

# Engine-backed entry points import on first use, so `import quiver` stays light (the Flink venv has no
# pyspark or duckdb) and fast.
_LAZY = {
    "FeatureStore": "quiver.serving.store",
    "backfill": "quiver.offline.backfill",
    "get_historical_features": "quiver.offline.pit",
    "get_logged_features": "quiver.monitoring.logged_features",
    "materialize": "quiver.online.materialize",
    "read_training_set": "quiver.offline.spark_training_sets",
    "spark_historical_features": "quiver.offline.spark_training_sets",
    "write_historical_features": "quiver.offline.spark_training_sets",
}


def __getattr__(name: str) -> _typing.Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'quiver' has no attribute {name!r}")

__version__ = "0.1.0"

__all__ = [  # noqa: RUF022  (plain sorted order, pinned by tests/unit/test_public_api.py)
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
