"""A training set's feature columns as pandas: the documented dtypes, and the on-demand features computed on
the label rows. Shared by the embedded join (`quiver.offline.pit`) and the executor-side one
(`quiver.offline.spark_training_sets`), so both hand back the same columns."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from quiver.catalog.ir import Catalog, ViewSpec
from quiver.catalog.references import FeatureRef, input_column

_NEVER_NULL = ("count", "sum")


def on_demand_columns(catalog: Catalog, expanded: Any, refs: list[FeatureRef], frame: pd.DataFrame,
               columns: dict[str, Any], timestamp_column: str) -> dict[str, Any]:
    """The requested on-demand features, computed on the label rows (request fields = label columns) with the
    same function, input typing and output typing as online (`quiver.compile.on_demand`)."""
    from quiver.compile.on_demand_modes import compute

    n = len(frame)
    out: dict[str, Any] = {}
    for name in expanded.on_demand:
        spec = catalog.on_demand[name]
        given = {field: frame[field].to_numpy(object) for field, _ in spec.request_fields}
        for view, feature in spec.inputs:
            given[feature] = columns[input_column(expanded, refs, view, feature)]
        computed = compute(spec, given, frame[timestamp_column], n)
        for ref in refs:
            if ref.view == name:
                out[ref.column] = computed[ref.feature].array  # nullable dtypes kept, as stored features
    return out


def nullable_feature(view: ViewSpec, feature: str) -> bool:
    """Whether a training set's column of `feature` can hold nulls (counts and sums of empty windows are 0)."""
    return not any(a.name == feature and a.fn in _NEVER_NULL for a in view.aggregations)


def to_pandas(array: pa.Array, dtype: str, nullable: bool = True) -> Any:
    """An Arrow feature column as pandas values with the documented dtype for `dtype`."""
    if dtype == "float64":
        return array.to_numpy(zero_copy_only=False).astype(np.float64)
    if dtype in ("int64", "bool") and not nullable and not array.null_count:
        return array.to_numpy(zero_copy_only=False)
    if dtype == "int64":
        return pd.array(array.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get), dtype="Int64")
    if dtype == "bool":
        return pd.array(array.to_pandas(types_mapper={pa.bool_(): pd.BooleanDtype()}.get), dtype="boolean")
    if dtype == "timestamp":
        return array.cast(pa.timestamp("us", tz="UTC")).to_pandas()
    return array.to_pandas().to_numpy(dtype=object)
