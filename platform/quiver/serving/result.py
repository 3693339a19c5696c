"""OnlineResult: feature values for a batch of entities, as numpy, pandas, Arrow or JSON-ready lists."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from quiver.online.base import Column

_ARROW = {"int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_(), "string": pa.string(),
          "timestamp": pa.timestamp("us", tz="UTC")}


class OnlineResult:
    """Entity key columns plus one column per requested feature ("view:feature"), in request order."""

    def __init__(self, entities: Mapping[str, np.ndarray], columns: Mapping[str, Column], at: int | np.ndarray):
        self.entities = dict(entities)
        self.columns = dict(columns)
        self.at = at

    @property
    def feature_names(self) -> list[str]:
        return list(self.columns)

    def __len__(self) -> int:
        first = next(iter(self.entities.values()), None)
        return 0 if first is None else len(first)

    def __getitem__(self, name: str) -> Column:
        return self.columns[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.columns)

    def to_dict(self) -> dict[str, np.ndarray]:
        """Entity keys and features as numpy arrays. Nulls: NaN in float columns (int columns that hold a
        null become float64), NaT in timestamps, None in string and bool columns (object dtype)."""
        out: dict[str, np.ndarray] = dict(self.entities)
        for name, col in self.columns.items():
            out[name] = _numpy(col)
        return out

    def to_arrow(self) -> pa.Table:
        """An Arrow table with real nulls (exact types, ints stay ints)."""
        arrays: dict[str, pa.Array] = {k: pa.array(v) for k, v in self.entities.items()}
        for name, col in self.columns.items():
            arrays[name] = _arrow(col)
        return pa.table(arrays)

    def to_pandas(self) -> Any:
        """A pandas DataFrame (via Arrow; nullable ints become float64 with NaN, as pandas does)."""
        return self.to_arrow().to_pandas()

    def to_lists(self) -> dict[str, list[Any]]:
        """JSON-ready columns: None for nulls (and non-finite floats), ISO-8601 strings for timestamps."""
        out: dict[str, list[Any]] = {k: v.tolist() for k, v in self.entities.items()}
        for name, col in self.columns.items():
            out[name] = _plain(col)
        return out


def _numpy(col: Column) -> np.ndarray:
    if col.dtype == "float64":
        return np.where(col.valid, col.values, np.nan)
    if col.dtype == "timestamp":
        return np.where(col.valid, col.values, np.iinfo(np.int64).min).astype("datetime64[us]")
    if col.dtype == "int64":
        return col.values if col.valid.all() else np.where(col.valid, col.values, np.nan)
    if col.valid.all():
        return col.values
    out = np.asarray(col.values, dtype=object).copy()
    out[~col.valid] = None
    return out


def _arrow(col: Column) -> pa.Array:
    mask = ~col.valid
    if col.dtype == "string":
        return pa.array(col.values.tolist(), type=pa.string(), mask=mask)
    return pa.array(col.values, type=_ARROW[col.dtype], mask=mask)


def _plain(col: Column) -> list[Any]:
    values: list[Any] = col.values.tolist()
    if col.dtype == "timestamp":
        values = [_iso(v) for v in values]
    bad = ~(col.valid & np.isfinite(col.values)) if col.dtype == "float64" else ~col.valid
    for i in np.flatnonzero(bad).tolist():
        values[i] = None
    return values


def _iso(us: int) -> str | None:
    value = np.datetime64(us, "us").item()
    return value.isoformat() + "Z" if hasattr(value, "isoformat") else None
