"""OnlineResult: feature values for a batch of entities, as numpy, pandas, Arrow or JSON-ready lists.

Values stay in the read's blocks (one 2-D array per run of same-typed features of a view) until a
conversion asks for them, and conversions work a block at a time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import chain
from typing import Any

import numpy as np
import pyarrow as pa

from quiver.online.base import Batch, Column, ColumnBlock, FieldStatus, Key

_ARROW = {"int64": pa.int64(), "float64": pa.float64(), "bool": pa.bool_(), "string": pa.string(),
          "timestamp": pa.timestamp("us", tz="UTC")}
_NAT = np.iinfo(np.int64).min
_STATUS_NAMES = np.array(["INVALID", *(s.name for s in FieldStatus)], dtype=object)
_PRESENT, _NULL = np.uint8(FieldStatus.PRESENT), np.uint8(FieldStatus.NULL_VALUE)
_Run = tuple[int, str, Sequence[str], Sequence[int] | None]  # see OnlineResult._runs
_RUNS: dict[tuple[int, ...], tuple[Any, tuple[Any, ...], list[_Run]]] = {}
_RUNS_KEPT = 1024  # request shapes remembered (a server sees a handful)
_PLANS: dict[tuple[int, tuple[str, ...]], tuple[list[_Run], _Plan | None]] = {}  # see _block_plan
_FEW_VALUES = 256


class OnlineResult:
    """Entity key columns plus one column per requested feature, in request order."""

    def __init__(self, entities: Mapping[str, np.ndarray], batch: Batch, outputs: Sequence[tuple[str, Key]],
                 at: int | np.ndarray):
        self.entities = dict(entities)
        self.batch = batch
        self.outputs = outputs  # (column name, (view, feature))
        self.at = at
        self._blocks: dict[tuple[str, ...], ColumnBlock | None] = {}  # `block`'s answers: scoring and logging ask

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
        out: dict[str, Any] = dict(self.entities)
        batch = self.batch
        blocks = batch.blocks
        out.update(self._by_output(lambda number, _: _block_columns(*blocks[number], batch.all_valid(number))))
        return out

    def block(self, names: Sequence[str]) -> ColumnBlock | None:
        """The float64 features `names` as one ColumnBlock, valued as `to_dict` gives them (NaN for nulls), when
        every one of them is float64 (the usual case: numbers of one view, an on-demand view's numbers beside
        them); else None. Zero-copy when they are one block's columns in order; else one numpy join. Read-only."""
        key = tuple(names)
        if key not in self._blocks:
            self._blocks[key] = self._block(key)
        return self._blocks[key]

    def _block(self, names: tuple[str, ...]) -> ColumnBlock | None:
        runs = self._runs()
        if len(runs) == 1:
            number, _, run_names, positions = runs[0]
            if positions is None and tuple(run_names) == names:
                plain = self._float_block(number)
                return None if plain is None else ColumnBlock(names, plain)
        plan = _block_plan(runs, names, self.batch.layout is not None)
        if plan is None:
            return None
        parts = [self._float_block(number) for number in plan.numbers]
        if any(part is None for part in parts):
            return None
        blocks: list[np.ndarray] = parts  # type: ignore[assignment]
        joined = blocks[0] if len(blocks) == 1 else np.concatenate(blocks, axis=1)
        columns = plan.columns(tuple(part.shape[1] for part in blocks))
        return ColumnBlock(names, joined if columns is None else joined[:, columns])

    def _float_block(self, number: int) -> np.ndarray | None:
        """Block `number` as a 2-D float64 array with NaN for nulls; None when it is not float64."""
        values, valid, dtype = self.batch.blocks[number]
        if dtype != "float64":
            return None
        plain = _numpy_block(values, valid, dtype, self.batch.all_valid(number))[0]
        return plain if plain.ndim == 2 else plain[:, None]

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
        return self._by_output(lambda number, view: list(self._status_codes(number, view).T))

    def all_present(self) -> bool:
        """True when every value is PRESENT (no null, nothing missing or too old): the usual case, which a
        caller can then skip per-feature statuses for. One check per block, not per feature."""
        blocks = {number: view for number, view, _, _ in self._runs()}
        return all(self._all_present(number, view) for number, view in blocks.items())

    def status_lists(self) -> dict[str, list[str]]:
        """`statuses()` as status names, JSON-ready (the HTTP server's `status` member)."""
        def names(number: int, view: str) -> list[list[str]]:
            if self._all_present(number, view):  # the usual case: no numpy at all
                valid = self.batch.blocks[number][1]
                return [["PRESENT"] * len(valid) for _ in range(valid.shape[1] if valid.ndim == 2 else 1)]
            names_: list[list[str]] = _STATUS_NAMES[self._status_codes(number, view)].T.tolist()
            return names_

        return self._by_output(names)

    def not_found(self) -> dict[str, int]:
        """Per view read, how many entities the store held nothing for (NOT_FOUND), and nothing else."""
        out: dict[str, int] = {}
        for view in dict.fromkeys(key[0] for _, key in self.outputs):
            codes = self.batch.view_status(view)
            if codes is not None:
                out[view] = int(np.count_nonzero(codes == FieldStatus.NOT_FOUND))
        return out

    def _by_output(self, convert: Callable[[int, str], Sequence[Any]]) -> dict[str, Any]:
        """{output name: its column} in output order, converting each block once: `convert(block number,
        view)` gives one item per column of the block (a 1-D block has one, which position -1 picks)."""
        out: dict[str, Any] = {}
        for number, view, names, positions in self._runs():
            columns = convert(number, view)
            out.update(zip(names, columns if positions is None else [columns[p] for p in positions], strict=True))
        return out

    def _runs(self) -> list[_Run]:
        """The outputs as runs of consecutive outputs from one block: (block, view, names, positions, None
        when they are the block's columns in order). Worked out once per request shape: a request reads the
        same blocks every time, and a loop over 50 outputs costs more than the rest of a small conversion."""
        layout = self.batch.layout
        key = None if layout is None else (id(self.outputs), *map(id, layout))
        if key is not None:
            cached = _RUNS.get(key)
            if cached is not None and cached[0] is self.outputs and cached[1] == layout:
                return cached[2]
        index, blocks = self.batch.index, self.batch.blocks
        runs: list[tuple[int, str, list[str], list[int]]] = []
        for name, key_ in self.outputs:
            number, position = index[key_]
            if runs and runs[-1][0] == number:
                runs[-1][2].append(name)
                runs[-1][3].append(position)
            else:
                runs.append((number, key_[0], [name], [position]))
        plain: list[_Run] = [
            (number, view, tuple(names), None if positions == list(range(_width(blocks[number][0]))) else
             tuple(positions)) for number, view, names, positions in runs]
        if key is not None and layout is not None:
            if len(_RUNS) >= _RUNS_KEPT:
                _RUNS.clear()
            _RUNS[key] = (self.outputs, layout, plain)  # holds what the ids name, so no id is reused meanwhile
        return plain

    def _all_present(self, number: int, view: str) -> bool:
        codes = self.batch.view_status(view)
        if not self.batch.all_valid(number):
            return False
        if codes is None:
            return True
        return bool(codes[0] == _PRESENT) if len(codes) == 1 else not (codes != _PRESENT).any()

    def _status_codes(self, number: int, view: str) -> np.ndarray:
        """FieldStatus codes of a block, entities × columns (2-D, also for a 1-D block)."""
        valid = self.batch.blocks[number][1]
        valid = valid if valid.ndim == 2 else valid[:, None]
        view_codes = self.batch.view_status(view)
        if view_codes is None:  # a store that does not say: a null is all we know
            view_codes = np.full(len(valid), _PRESENT, dtype=np.uint8)
        rows = view_codes[:, None]
        return np.where(valid, rows, np.where(rows == _PRESENT, _NULL, rows)).astype(np.uint8)

    def to_lists(self) -> dict[str, list[Any]]:
        """JSON-ready columns: None for nulls (and non-finite floats), ISO-8601 strings for timestamps."""
        out: dict[str, list[Any]] = {k: v.tolist() for k, v in self.entities.items()}
        batch = self.batch
        blocks = batch.blocks
        out.update(self._by_output(lambda number, _: _plain_block(*blocks[number], batch.all_valid(number))))
        return out


def _block_plan(runs: list[_Run], names: Sequence[str], cache: bool) -> _Plan | None:
    """Where `names` sit in the runs: the blocks to join, in order, and per name (which of those, its column
    there); None when a name is not among them. Kept per request shape and names when `cache` (a server asks
    the same few questions every call)."""
    key = (id(runs), tuple(names))
    cached = _PLANS.get(key)
    if cached is not None and cached[0] is runs:
        return cached[1]
    where: dict[str, tuple[int, int]] = {}
    for number, _, run_names, positions in runs:
        for name, position in zip(run_names, range(len(run_names)) if positions is None else positions, strict=True):
            where.setdefault(name, (number, max(position, 0)))  # a 1-D block is one column, at -1
    plan: _Plan | None = None
    if all(name in where for name in names):
        numbers = list(dict.fromkeys(where[name][0] for name in names))
        order = {number: i for i, number in enumerate(numbers)}
        plan = _Plan(numbers, [(order[where[name][0]], where[name][1]) for name in names])
    if cache:
        if len(_PLANS) >= _RUNS_KEPT:
            _PLANS.clear()
        _PLANS[key] = (runs, plan)  # holds `runs`, so its id is not reused meanwhile
    return plan


class _Plan:
    """`_block_plan`'s answer, and the joined array's columns to take per widths of the blocks joined."""

    def __init__(self, numbers: list[int], places: list[tuple[int, int]]):
        self.numbers, self.places = numbers, places
        self._columns: dict[tuple[int, ...], np.ndarray | None] = {}

    def columns(self, widths: tuple[int, ...]) -> np.ndarray | None:
        """The joined array's columns, in the order asked; None when the join is exactly that."""
        if widths not in self._columns:
            starts = np.concatenate([[0], np.cumsum(widths)[:-1]]).astype(np.int64)
            columns = np.array([starts[part] + column for part, column in self.places], dtype=np.int64)
            self._columns[widths] = None if np.array_equal(columns, np.arange(sum(widths))) else columns
        return self._columns[widths]


def _numpy_block(values: np.ndarray, valid: np.ndarray, dtype: str,
                 whole: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """(values with nulls filled where the dtype allows, or as is; a fallback for columns holding nulls).
    `whole`: the block holds no null."""
    if whole:
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


def _block_columns(values: np.ndarray, valid: np.ndarray, dtype: str, whole: bool) -> list[np.ndarray]:
    """The arrays `to_dict` returns for a block, one per column (row views of its transpose: one numpy call,
    not one per column); a column holding a null gets its null-filled fallback."""
    plain, fallback = _numpy_block(values, valid, dtype, whole)
    if values.ndim == 1:
        return [fallback if fallback is not None else plain]
    columns = list(plain.T)
    if fallback is not None:
        for position in np.flatnonzero(~valid.all(axis=0)).tolist():
            columns[position] = fallback[:, position]
    return columns


def _plain_block(values: np.ndarray, valid: np.ndarray, dtype: str, whole: bool) -> list[list[Any]]:
    """Per column, a list with None for nulls and non-finite floats; one tolist() per block, then only those
    are patched."""
    two_d = values.ndim == 2
    columns: list[list[Any]] = values.T.tolist() if two_d else [values.tolist()]
    if dtype == "timestamp":
        columns = [[_iso(v) for v in column] for column in columns]
    if dtype == "float64":
        if whole and values.size <= _FEW_VALUES and all(map(math.isfinite, chain.from_iterable(columns))):
            return columns  # a small block without nulls: one pass in Python beats three numpy calls
        finite = np.isfinite(values)
        bad = ~finite if whole else ~(valid & finite)
    elif whole:
        return columns
    else:
        bad = ~valid
    rows, cols = np.nonzero(bad) if two_d else (np.flatnonzero(bad), np.zeros(int(bad.sum()), dtype=np.int64))
    for r, c in zip(rows.tolist(), cols.tolist(), strict=True):
        columns[c][r] = None
    return columns


def _iso(us: int) -> str | None:
    value = np.datetime64(us, "us").item()
    return value.isoformat() + "Z" if hasattr(value, "isoformat") else None


def _width(values: np.ndarray) -> int:
    """Columns of a block (a 1-D block is one column, at position -1)."""
    return values.shape[1] if values.ndim == 2 else -1
