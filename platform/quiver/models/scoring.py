"""Feature columns → model inputs, the same way at training and at serving time.

The statistics are fitted once on the training split (see quiver.models.data.fit_preprocessor) and kept
in the artifact; nothing here ever refits them.

* numeric: non-finite values count as null; each feature becomes two inputs, the standardized value
  (nulls filled with the training mean, i.e. 0 after standardizing) and a 0/1 null indicator. A column that
  was all null or constant in training gets std 1, so it can never produce a NaN. A long-tailed column that
  was never negative in training (amounts, counts: `log_` marks it) is standardized as log(1 + x), x < 0
  read as 0: on the raw scale a few huge amounts set the scale and everything else sits near 0.
* categorical: index 0 = null, 1 = out of vocabulary (unseen or rare in training), 2.. = the vocabulary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeAlias

import numpy as np
import pandas as pd

from quiver.catalog.errors import QuiverError
from quiver.online.base import ColumnBlock

Columns: TypeAlias = Mapping[str, Any] | pd.DataFrame
NULL_INDEX, OOV_INDEX, FIRST_WORD = 0, 1, 2
# Standardized inputs are clipped: a wild serving value (1e300) must not turn activations into inf/NaN.
CLIP = 50.0
# Up to this many rows a dict lookup per value beats pandas' vectorized get_indexer (which costs ~20 µs a call).
_DICT_LOOKUP_ROWS = 256
# What pandas' infer_dtype calls object columns that numpy can turn into float64 by itself (None → NaN).
_PLAIN_NUMBERS = frozenset({"floating", "integer", "mixed-integer-float", "empty"})


@dataclass(frozen=True)
class Preprocessor:
    """Fitted input encoding: numeric means and stds, categorical vocabularies (fitted attrs end in `_`)."""

    numeric: tuple[str, ...]
    categorical: tuple[str, ...]
    mean_: tuple[float, ...]
    std_: tuple[float, ...]
    vocab_: tuple[tuple[Any, ...], ...]
    log_: tuple[bool, ...] = ()  # per numeric feature: standardize log(1 + x); () = none (older artifacts)

    def __post_init__(self) -> None:
        if self.log_ and len(self.log_) != len(self.numeric):
            raise ValueError(f"log_ has {len(self.log_)} flags for {len(self.numeric)} numeric features")

    @property
    def features(self) -> list[str]:
        return [*self.numeric, *self.categorical]

    @property
    def cardinalities(self) -> tuple[int, ...]:
        return tuple(len(v) + FIRST_WORD for v in self.vocab_)

    def transform(self, columns: Columns) -> tuple[np.ndarray, np.ndarray]:
        """(numeric float32 [n, 2·len(numeric)], categorical int64 [n, len(categorical)])."""
        if isinstance(columns, ColumnBlock) and columns.names == self.numeric and not self.categorical and \
                columns.array.dtype == np.float64:
            return self._encode(columns.array, columns)  # the online read's block, as it is: no copy
        try:
            raw = [columns[name] for name in self.numeric]
        except KeyError:
            raw = []
        if len(raw) != len(self.numeric) or not all(name in columns for name in self.categorical):
            missing = [f for f in self.features if f not in columns]
            raise QuiverError(f"input lacks feature column(s) {', '.join(map(repr, missing))}; the model needs "
                              f"{', '.join(self.features)}")
        n = _length(columns, self.features)
        # All numeric features at once: one [n, k] float64 block, then a handful of whole-block numpy calls
        # (per-column numpy calls cost ~10 µs each, which is most of a 1-row request).
        if raw and all(type(r) is np.ndarray and r.ndim == 1 and r.dtype.kind in "fiub" for r in raw):
            # What the online store returns. One np.array of the columns (then its transpose, a view): 3x
            # cheaper than np.stack, which expands each column in Python first.
            values = np.array(raw, dtype=np.float64).T
        else:
            values = np.empty((n, len(self.numeric)), dtype=np.float64)
            for i, name in enumerate(self.numeric):
                values[:, i] = as_float(raw[i], name)
        return self._encode(values, columns)

    def _encode(self, values: np.ndarray, columns: Columns) -> tuple[np.ndarray, np.ndarray]:
        """The model's inputs from the numeric block (rows × numeric features, float64) and the columns."""
        n = len(values)
        mean, std = self._stats
        null = ~np.isfinite(values)
        logged = self._logged
        if logged is not None:
            values = values.copy()  # the caller's block (the online store's) stays as it was
            with np.errstate(invalid="ignore"):  # NaN stays NaN (null); it is replaced below
                values[:, logged] = np.log1p(np.maximum(values[:, logged], 0.0))
        z = (np.where(null, mean, values) - mean) / std
        np.clip(z, -CLIP, CLIP, out=z)
        numeric = np.empty((n, 2 * len(self.numeric)), dtype=np.float32)
        numeric[:, 0::2] = z
        numeric[:, 1::2] = null
        categorical = np.empty((n, len(self.categorical)), dtype=np.int64)
        for j, name in enumerate(self.categorical):
            categorical[:, j] = self._lookups[j].encode(columns[name])
        return numeric, categorical

    # Fitted state derived once per Preprocessor (the artifact keeps only the tuples above).
    @cached_property
    def _stats(self) -> tuple[np.ndarray, np.ndarray]:
        return np.asarray(self.mean_, dtype=np.float64), np.asarray(self.std_, dtype=np.float64)

    @cached_property
    def _logged(self) -> np.ndarray | None:
        """Column positions of the log-scaled features, or None when there are none."""
        return np.flatnonzero(self.log_) if any(self.log_) else None

    @cached_property
    def _lookups(self) -> tuple[VocabLookup, ...]:
        return tuple(VocabLookup(v) for v in self.vocab_)

    def to_dict(self) -> dict[str, Any]:
        return {"numeric": list(self.numeric), "categorical": list(self.categorical), "mean": list(self.mean_),
                "std": list(self.std_), "vocab": [list(v) for v in self.vocab_], "log": list(self.log_)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Preprocessor:
        return cls(tuple(data["numeric"]), tuple(data["categorical"]), tuple(map(float, data["mean"])),
                   tuple(map(float, data["std"])), tuple(tuple(v) for v in data["vocab"]),
                   tuple(map(bool, data.get("log", ()))))


def as_float(values: Any, name: str = "") -> np.ndarray:
    """Any numeric column (numpy, pandas nullable, lists with None) as float64 with NaN for null."""
    if isinstance(values, pd.Series | pd.Index):
        if isinstance(values.dtype, np.dtype) and values.dtype.kind in "fiub":
            return np.asarray(values.to_numpy(dtype=np.float64))
        series = values
    else:
        array = np.asarray(values)
        if array.dtype.kind in "fiub":
            return array.astype(np.float64)
        if array.dtype == object and array.ndim == 1 and \
                pd.api.types.infer_dtype(array, skipna=True) in _PLAIN_NUMBERS:
            try:  # plain Python numbers and None: numpy alone gives what pandas would (None → NaN)
                return array.astype(np.float64)
            except (TypeError, ValueError):  # pd.NA and friends: pandas decides
                pass
        series = pd.Series(array)
    try:
        return np.asarray(pd.to_numeric(series).to_numpy(dtype=np.float64, na_value=np.nan))
    except (TypeError, ValueError) as exc:
        raise QuiverError(f"feature column {name!r} must be numeric: {exc}") from None


def encode_categorical(values: Any, vocab: Sequence[Any]) -> np.ndarray:
    """Indices into the embedding table: 0 null, 1 out of vocabulary, 2 + position in `vocab`."""
    return VocabLookup(vocab).encode(values)


class VocabLookup:
    """`encode_categorical` for one fitted vocabulary, with its lookup tables built once."""

    def __init__(self, vocab: Sequence[Any]):
        self.vocab = tuple(vocab)
        self._positions: dict[Any, int] = {}
        for position, word in enumerate(self.vocab):
            self._positions.setdefault(word, position + FIRST_WORD)
        self._index: pd.Index | None = None

    def encode(self, values: Any) -> np.ndarray:
        """Indices of `values` (numpy, pandas, list): 0 null, 1 out of vocabulary, 2 + position in the vocab."""
        objects = np.asarray(values.to_numpy(dtype=object) if isinstance(values, pd.Series | pd.Index)
                             else values, dtype=object)
        index: np.ndarray | None = None
        if len(objects) <= _DICT_LOOKUP_ROWS and objects.ndim == 1:
            positions = self._positions
            try:  # == and hash as pandas' object hash table uses them: 5.0 finds 5, np.str_ finds str
                index = np.fromiter((positions.get(v, OOV_INDEX) for v in objects.tolist()), dtype=np.int64,
                                    count=len(objects))
            except TypeError:  # an unhashable value: pandas says what is wrong
                index = None
        if index is None:
            if self._index is None:
                self._index = pd.Index(list(self.vocab), dtype=object)
            codes = self._index.get_indexer(objects)
            index = np.where(codes >= 0, codes + FIRST_WORD, OOV_INDEX).astype(np.int64)
        index[pd.isna(objects)] = NULL_INDEX
        return index


def _length(columns: Columns, names: Sequence[str]) -> int:
    first = len(columns[names[0]])
    if any(len(columns[name]) != first for name in names):
        lengths = {name: len(columns[name]) for name in names}
        raise QuiverError(f"feature columns differ in length: {lengths}")
    return first
