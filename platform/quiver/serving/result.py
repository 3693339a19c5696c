"""OnlineResult: feature values for a batch of entities, as numpy, pandas, Arrow or JSON-ready lists.

Values stay in the read's blocks (one 2-D array per run of same-typed features of a view) until a
conversion asks for them, and conversions work a block at a time.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from quiver.online.base import Batch, Column, FieldStatus, Key

_ARROW = {"int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_(), "string": pa.string(),
          "timestamp": pa.timestamp("us", tz="UTC")}
_NAT = np.iinfo(np.int64).min
_STATUS_NAMES = np.array(["INVALID", *(s.name for s in FieldStatus)], dtype=object)
_PRESENT, _NULL = np.uint8(FieldStatus.PRESENT), np.uint8(FieldStatus.NULL_VALUE)


class OnlineResult:
    """Entity key columns plus one column per requested feature, in request order."""

    def __init__(self, entities: Mapping[str, np.ndarray], batch: Batch, outputs: Sequence[tuple[str, Key]],
                 at: int | np.ndarray):
        self.entities = dict(entities)
        self.batch = batch
        self.outputs = outputs  # (column name, (view, feature))
        self.at = at

    @property
    def feature_names(self) -> list[str]:
        return [name for name, _ in self.outputs]

    @property
    def columns(self) -> dict[str, Column]:
        """Every feature as a Column (values + validity mask)."""
        return {name: self.batch[key] for name, key in self.outputs}

    def __len__(self) -> int:
        first = next(iter(self.entities.values()), None)
        return 0 if first is None else len(first)

    def __getitem__(self, name: str) -> Column:
        for output, key in self.outputs:
            if output == name:
                return self.batch[key]
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.feature_names)

    def to_dict(self) -> dict[str, np.ndarray]:
        """Entity keys and features as numpy arrays. Nulls: NaN in float columns (int columns that hold a
        null become float64), NaT in timestamps, None in string and bool columns (object dtype)."""
        out: dict[str, np.ndarray] = dict(self.entities)
        index, blocks = self.batch.index, self.batch.blocks
        split: dict[int, tuple[list[np.ndarray], list[np.ndarray] | None, list[bool]]] = {}
        for name, key in self.outputs:
            number, position = index[key]
            if position < 0:
                plain, fallback = _numpy_block(*blocks[number])
                out[name] = fallback if fallback is not None else plain
                continue
            if number not in split:
                split[number] = _split_block(*blocks[number])
            columns, fallbacks, has_null = split[number]
            out[name] = fallbacks[position] if fallbacks is not None and has_null[position] else columns[position]
        return out

    def to_arrow(self) -> pa.Table:
        """An Arrow table with real nulls (exact types, ints stay ints)."""
        arrays: dict[str, pa.Array] = {k: pa.array(v) for k, v in self.entities.items()}
        for name, key in self.outputs:
            col = self.batch[key]
            values = col.values.tolist() if col.dtype == "string" else col.values
            arrays[name] = pa.array(values, type=_ARROW[col.dtype], mask=~col.valid)
        return pa.table(arrays)

    def to_pandas(self) -> Any:
        """A pandas DataFrame (via Arrow; nullable ints become float64 with NaN, as pandas does)."""
        return self.to_arrow().to_pandas()

    def to_df(self) -> Any:
        """`to_pandas()` under Feast's name."""
        return self.to_pandas()

    def statuses(self) -> dict[str, np.ndarray]:
        """Per feature, a FieldStatus code (uint8) per entity: PRESENT, NULL_VALUE, NOT_FOUND (no value for the
        entity, e.g. an unknown id, a flushed store) or OUTSIDE_MAX_AGE (older than the TTL at `at`).
        Compare with `quiver.online.base.FieldStatus`; an aggregation over an empty window is PRESENT."""
        return {name: codes for name, codes in self._status_blocks(lambda codes: list(np.atleast_2d(codes.T)))}

    def all_present(self) -> bool:
        """True when every value is PRESENT (no null, nothing missing or too old): the usual case, which a
        caller can then skip per-feature statuses for. One check per block, not per feature."""
        checked: set[int] = set()
        for _, key in self.outputs:
            number = self.batch.index[key][0]
            if number in checked:
                continue
            checked.add(number)
            codes = self.batch.view_status(key[0])
            if not self.batch.blocks[number][1].all() or (codes is not None and (codes != _PRESENT).any()):
                return False
        return True

    def status_lists(self) -> dict[str, list[str]]:
        """`statuses()` as status names, JSON-ready (the HTTP server's `status` member)."""
        return dict(self._status_blocks(lambda codes: _STATUS_NAMES[codes].T.tolist(),
                                        lambda rows, cols: [["PRESENT"] * rows for _ in range(cols)]))

    def not_found(self) -> dict[str, int]:
        """Per view read, how many entities the store held nothing for (NOT_FOUND), and nothing else."""
        out: dict[str, int] = {}
        for view in dict.fromkeys(key[0] for _, key in self.outputs):
            codes = self.batch.view_status(view)
            if codes is not None:
                out[view] = int(np.count_nonzero(codes == FieldStatus.NOT_FOUND))
        return out

    def _status_blocks(self, convert: Any, all_present: Any = None) -> Iterator[tuple[str, Any]]:
        """(output name, converted per-column status) with one numpy pass per block; `all_present(rows,
        columns)`, when given, converts a block whose values are all PRESENT (the usual case) without numpy."""
        converted: dict[int, Any] = {}
        for name, key in self.outputs:
            number, position = self.batch.index[key]
            if number not in converted:
                _, valid, _ = self.batch.blocks[number]
                view_codes = self.batch.view_status(key[0])
                whole = valid.all() and (view_codes is None or (view_codes == _PRESENT).all())
                if whole and all_present is not None:
                    converted[number] = all_present(len(valid), valid.shape[1] if valid.ndim == 2 else 1)
                elif whole:  # one cheap broadcast
                    converted[number] = convert(np.full(valid.shape if valid.ndim == 2 else (len(valid), 1),
                                                        _PRESENT, np.uint8))
                else:
                    if view_codes is None:  # a store that does not say: a null is all we know
                        view_codes = np.full(len(valid), _PRESENT, dtype=np.uint8)
                    rows = view_codes[:, None] if valid.ndim == 2 else view_codes
                    codes = np.where(valid, rows, np.where(rows == _PRESENT, _NULL, rows)).astype(np.uint8)
                    converted[number] = convert(codes if codes.ndim == 2 else codes[:, None])
            yield name, converted[number][max(position, 0)]

    def to_lists(self) -> dict[str, list[Any]]:
        """JSON-ready columns: None for nulls (and non-finite floats), ISO-8601 strings for timestamps."""
        out: dict[str, list[Any]] = {k: v.tolist() for k, v in self.entities.items()}
        converted: dict[int, list[list[Any]]] = {}
        for name, key in self.outputs:
            number, position = self.batch.index[key]
            if number not in converted:
                converted[number] = _plain_block(*self.batch.blocks[number])
            out[name] = converted[number][max(position, 0)]
        return out


def _numpy_block(values: np.ndarray, valid: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray | None]:
    """(values with nulls filled where the dtype allows, or as is; a fallback for columns holding nulls)."""
    if valid.all():
        if dtype == "timestamp":
            return values.astype("datetime64[us]"), None
        return values, None
    if dtype == "float64":
        return np.where(valid, values, np.nan), None
    if dtype == "timestamp":
        return np.where(valid, values, _NAT).astype("datetime64[us]"), None
    if dtype == "int64":
        return values, np.where(valid, values, np.nan)
    filled = np.asarray(values, dtype=object).copy()
    filled[~valid] = None
    return values, filled


def _split_block(values: np.ndarray, valid: np.ndarray,
                 dtype: str) -> tuple[list[np.ndarray], list[np.ndarray] | None, list[bool]]:
    """Per-column arrays of a 2-D block (row views of its transpose: one numpy call, not one per column),
    the null-holding fallbacks, and which columns hold a null."""
    plain, fallback = _numpy_block(values, valid, dtype)
    if fallback is None:
        return list(plain.T), None, []
    has_null = [bool(x) for x in np.atleast_1d(~valid.all(axis=0))]
    return list(plain.T), list(fallback.T), has_null


def _plain_block(values: np.ndarray, valid: np.ndarray, dtype: str) -> list[list[Any]]:
    """Per column, a list with None for nulls; one tolist() per block, then only the nulls are patched."""
    bad = ~(valid & np.isfinite(values)) if dtype == "float64" else ~valid
    two_d = values.ndim == 2
    columns: list[list[Any]] = values.T.tolist() if two_d else [values.tolist()]
    if dtype == "timestamp":
        columns = [[_iso(v) for v in column] for column in columns]
    rows, cols = np.nonzero(bad) if two_d else (np.flatnonzero(bad), np.zeros(int(bad.sum()), dtype=np.int64))
    for r, c in zip(rows.tolist(), cols.tolist(), strict=True):
        columns[c][r] = None
    return columns


def _iso(us: int) -> str | None:
    value = np.datetime64(us, "us").item()
    return value.isoformat() + "Z" if hasattr(value, "isoformat") else None
