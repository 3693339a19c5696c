"""The fast scoring path (one numeric block, cached vocabulary lookups) encodes exactly as the general one.

`reference_transform` is the straightforward per-column pandas encoding the fast path replaced; every input
kind (numpy, pandas nullable, lists with None, object arrays, a DataFrame) must give bit-identical arrays.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from quiver.catalog.errors import QuiverError
from quiver.models.artifact import Scorer
from quiver.models.network import NetworkConfig, TabularNet
from quiver.models.scoring import CLIP, FIRST_WORD, NULL_INDEX, OOV_INDEX, Preprocessor, VocabLookup, as_float


def reference_transform(prep: Preprocessor, columns: Any) -> tuple[np.ndarray, np.ndarray]:
    n = len(columns[prep.features[0]])
    numeric = np.empty((n, 2 * len(prep.numeric)), dtype=np.float32)
    for i, name in enumerate(prep.numeric):
        raw = columns[name]
        series = raw if isinstance(raw, pd.Series) else pd.Series(np.asarray(raw))
        values = np.asarray(pd.to_numeric(series).to_numpy(dtype=np.float64, na_value=np.nan))
        null = ~np.isfinite(values)
        z = (np.where(null, prep.mean_[i], values) - prep.mean_[i]) / prep.std_[i]
        numeric[:, 2 * i] = np.clip(z, -CLIP, CLIP)
        numeric[:, 2 * i + 1] = null
    categorical = np.empty((n, len(prep.categorical)), dtype=np.int64)
    for j, name in enumerate(prep.categorical):
        raw = columns[name]
        objects = np.asarray(raw.to_numpy(dtype=object) if isinstance(raw, pd.Series) else raw, dtype=object)
        codes = pd.Index(list(prep.vocab_[j]), dtype=object).get_indexer(objects)
        index = np.where(codes >= 0, codes + FIRST_WORD, OOV_INDEX).astype(np.int64)
        index[pd.isna(objects)] = NULL_INDEX
        categorical[:, j] = index
    return numeric, categorical


PREP = Preprocessor(("amount", "count", "flag"), ("country", "merchant"), (10.0, 2.5, 0.3), (4.0, 1.5, 0.5),
                    (("US", "DE", "FR"), (7, 8, 3)))


def columns_of(rows: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    amount = rng.normal(10, 5, rows)
    amount[rng.random(rows) < 0.2] = np.nan
    amount[rng.random(rows) < 0.05] = np.inf
    amount[rng.random(rows) < 0.02] = 1e300  # clipped
    count = rng.integers(0, 6, rows)
    flag = rng.random(rows) < 0.4
    country = rng.choice(np.array(["US", "DE", "FR", "XX", None], dtype=object), rows)  # XX: out of vocabulary
    merchant = rng.choice(np.array([7, 8, 3, 99, None, 8.0, np.nan], dtype=object), rows)  # 8.0 finds 8
    return {"amount": amount, "count": count, "flag": flag, "country": country, "merchant": merchant}


def variants(columns: dict[str, Any]) -> dict[str, Any]:
    """The same values as numpy, a DataFrame with nullable dtypes, and plain lists with None for nulls."""
    amount = columns["amount"]
    frame = pd.DataFrame({
        "amount": amount,
        "count": pd.array(columns["count"], dtype="Int64"),
        "flag": columns["flag"],
        "country": columns["country"],
        "merchant": pd.Series(columns["merchant"], dtype=object),
    })
    lists = {"amount": [None if np.isnan(v) else float(v) for v in amount], "count": columns["count"].tolist(),
             "flag": columns["flag"].tolist(), "country": columns["country"].tolist(),
             "merchant": columns["merchant"].tolist()}
    return {"numpy": columns, "pandas": frame, "lists": lists}


@pytest.mark.parametrize("rows", [1, 3, 100, 257, 2000])  # either side of the dict / get_indexer switch
def test_fast_transform_equals_the_general_path(rows: int) -> None:
    columns = columns_of(rows, seed=rows)
    expected_numeric, expected_categorical = reference_transform(PREP, columns)
    assert (expected_categorical == NULL_INDEX).any() or rows < 10  # the data does exercise nulls and OOV
    for kind, given in variants(columns).items():
        numeric, categorical = PREP.transform(given)
        assert numeric.dtype == np.float32 and categorical.dtype == np.int64, kind
        np.testing.assert_array_equal(numeric, expected_numeric, err_msg=kind)
        np.testing.assert_array_equal(categorical, expected_categorical, err_msg=kind)
        ref_numeric, ref_categorical = reference_transform(PREP, given)
        np.testing.assert_array_equal(numeric, ref_numeric, err_msg=kind)
        np.testing.assert_array_equal(categorical, ref_categorical, err_msg=kind)


def test_nulls_oov_and_float_ids_encode_as_before() -> None:
    numeric, categorical = PREP.transform({"amount": [None, 14.0], "count": [1, None], "flag": [True, None],
                                           "country": ["XX", None], "merchant": [8.0, np.int64(3)]})
    assert numeric[:, 1].tolist() == [1.0, 0.0] and numeric[0, 0] == 0.0  # null → mean → 0, indicator 1
    assert numeric[:, 2].tolist() == [pytest.approx((1 - 2.5) / 1.5), 0.0] and numeric[:, 3].tolist() == [0.0, 1.0]
    assert categorical.tolist() == [[OOV_INDEX, FIRST_WORD + 1], [NULL_INDEX, FIRST_WORD + 2]]


def test_vocab_lookup_small_and_large_batches_agree() -> None:
    lookup = VocabLookup(("a", 5, 2.5))
    values = np.array(["a", 5.0, np.str_("a"), "b", None, np.nan, 2.5, np.int64(5)], dtype=object)
    small = lookup.encode(values)
    large = lookup.encode(np.tile(values, 100))[: len(values)]  # > 256 rows: pandas get_indexer
    assert small.tolist() == large.tolist() == [2, 3, 2, OOV_INDEX, NULL_INDEX, NULL_INDEX, 4, 3]


def test_bad_numeric_input_still_names_the_column() -> None:
    with pytest.raises(QuiverError, match="'amount' must be numeric"):
        as_float(np.array(["1.0", "abc"], dtype=object), "amount")
    assert as_float(np.array([1, None, 2.5], dtype=object)).tolist()[::2] == [1.0, 2.5]
    assert np.isnan(as_float(pd.array([1, None], dtype="Int64"))[1])


def test_scorer_predict_is_identical_to_scoring_the_reference_inputs() -> None:
    torch.manual_seed(0)
    net = TabularNet(NetworkConfig(n_numeric=3, cardinalities=PREP.cardinalities, hidden=(16,), dropout=0.0))
    scorer = Scorer(net, PREP, {"features": PREP.features, "feature_refs": []}, path=None,  # type: ignore[arg-type]
                    sha256="", version_label="t:1")
    columns = columns_of(300, seed=5)
    numeric, categorical = reference_transform(PREP, columns)
    with torch.inference_mode():
        expected = torch.sigmoid(net(torch.from_numpy(numeric), torch.from_numpy(categorical)).double()).numpy()
    for kind, given in variants(columns).items():
        np.testing.assert_array_equal(scorer.predict(given), expected, err_msg=kind)
    # A row scores the same alone as in a batch, up to float32 matmul rounding (BLAS picks kernels by shape).
    one_row = {k: v[:1] for k, v in columns.items()}
    np.testing.assert_allclose(scorer.predict(one_row), expected[:1], rtol=0, atol=1e-6)
