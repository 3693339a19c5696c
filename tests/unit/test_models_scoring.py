"""Input encoding, metrics and the baseline: pure numpy/pandas/sklearn, no registry, no files."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from quiver.catalog.errors import QuiverError
from quiver.models import data, metrics
from quiver.models.scoring import CLIP, NULL_INDEX, OOV_INDEX, Preprocessor, encode_categorical


def frame() -> pd.DataFrame:
    return pd.DataFrame({
        "amount": [1.0, 2.0, np.nan, 4.0, 5.0, 6.0],
        "all_null": [np.nan] * 6,
        "constant": [3.0] * 6,
        "count": pd.array([1, None, 3, 4, 5, 6], dtype="Int64"),
        "country": ["US", "US", None, "DE", "US", "DE"],
        "merchant_id": pd.array([7, 7, 7, 8, None, 9], dtype="Int64"),
    })


def test_kinds_strings_and_integer_ids_are_categorical() -> None:
    numeric, categorical = data.infer_kinds(frame(), list(frame().columns))
    assert numeric == ["amount", "all_null", "constant", "count"]
    assert categorical == ["country", "merchant_id"]
    with pytest.raises(QuiverError, match="not among the features"):
        data.infer_kinds(frame(), ["amount"], categorical=["country"])


def test_fit_uses_training_stats_and_all_null_or_constant_columns_give_no_nan() -> None:
    train = frame()
    prep = data.fit_preprocessor(train, ["amount", "all_null", "constant", "count"], ["country", "merchant_id"],
                                 min_count=2)
    assert prep.mean_[0] == pytest.approx(np.mean([1, 2, 4, 5, 6]))
    assert prep.std_[1] == 1.0 and prep.mean_[1] == 0.0  # all null
    assert prep.std_[2] == 1.0  # constant
    assert prep.vocab_ == (("US", "DE"), (7,))  # most frequent first; rarer than min_count → OOV
    numeric, categorical = prep.transform(train)
    assert np.isfinite(numeric).all()
    assert numeric.shape == (6, 8) and categorical.shape == (6, 2)
    assert numeric[2, 1] == 1.0 and numeric[2, 0] == 0.0  # null → indicator 1, value filled with the mean
    assert (numeric[:, 3] == 1.0).all()  # the all-null column is null everywhere
    assert (numeric[:, 4] == 0.0).all()  # a constant column standardizes to 0, not 0/0
    assert categorical[:, 0].tolist() == [2, 2, NULL_INDEX, 3, 2, 3]
    assert categorical[:, 1].tolist() == [2, 2, 2, OOV_INDEX, NULL_INDEX, OOV_INDEX]


def test_serving_values_never_seen_in_training_are_oov_and_extremes_are_clipped() -> None:
    prep = Preprocessor(("x",), ("c",), (0.0,), (1.0,), (("a", "b"),))
    numeric, categorical = prep.transform({"x": np.array([1e300, -np.inf, 0.5]), "c": np.array(["zzz", None, "b"],
                                                                                              dtype=object)})
    assert numeric[:, 0].tolist() == [CLIP, 0.0, 0.5]
    assert numeric[:, 1].tolist() == [0.0, 1.0, 0.0]
    assert categorical[:, 0].tolist() == [OOV_INDEX, NULL_INDEX, 3]
    assert encode_categorical(pd.Series([5.0, np.nan]), (5,)).tolist() == [2, NULL_INDEX]  # 5.0 from a float store
    with pytest.raises(QuiverError, match="lacks feature column"):
        prep.transform({"x": np.zeros(2)})


def test_preprocessor_round_trips_through_json_dict() -> None:
    prep = data.fit_preprocessor(frame(), ["amount"], ["country"], min_count=1)
    assert Preprocessor.from_dict(prep.to_dict()) == prep


def test_time_split_puts_the_newest_rows_in_validation_and_keeps_ties_together() -> None:
    ts = pd.to_datetime(["2026-11-01", "2026-11-02", "2026-11-03", "2026-11-03", "2026-11-04"], utc=True)
    frame_ = pd.DataFrame({"event_ts": ts[::-1], "y": [0, 1, 0, 1, 0]})
    split = data.time_split(frame_, "event_ts", 0.4)
    assert split.boundary == pd.Timestamp("2026-11-03", tz="UTC")
    assert split.train["event_ts"].max() < split.valid["event_ts"].min()
    assert len(split.valid) == 3  # both rows at the boundary
    with pytest.raises(QuiverError, match="empty"):
        data.time_split(frame_.assign(event_ts=ts[0]), "event_ts", 0.2)


def test_labels_must_be_zero_or_one() -> None:
    prep = data.fit_preprocessor(frame(), ["amount"], [], min_count=1)
    with pytest.raises(QuiverError, match="must hold 0/1; 1 row"):
        data.to_tensors(frame().assign(y=[0, 1, 2, 0, 1, 0]), prep, "y")


def test_metrics_match_hand_computed_values() -> None:
    y = np.array([0, 0, 1, 1])
    p = np.array([0.1, 0.4, 0.35, 0.8])
    m = metrics.classification_metrics(y, p, bins=2)
    assert m["roc_auc"] == pytest.approx(0.75)
    assert m["brier"] == pytest.approx(np.mean((p - y) ** 2))
    assert m["log_loss"] == pytest.approx(-np.mean(np.log([0.9, 0.6, 0.35, 0.8])))
    # bins [0, .5): p = .1 .4 .35, rate 1/3; [.5, 1]: p = .8, rate 1
    assert m["ece"] == pytest.approx((3 * abs(np.mean([0.1, 0.4, 0.35]) - 1 / 3) + abs(0.8 - 1)) / 4)
    assert metrics.expected_calibration_error(np.array([1.0]), np.array([1.0])) == 0.0  # p = 1 is in the last bin
    with pytest.raises(QuiverError, match="only negatives"):
        metrics.classification_metrics(np.zeros(3), np.full(3, 0.5))


def test_baseline_learns_a_linear_signal_from_numeric_and_one_hot_inputs() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4000, 2)).astype(np.float32)
    c = rng.integers(0, 4, size=(4000, 1))
    y = (rng.random(4000) < 1 / (1 + np.exp(-(2 * x[:, 0] + (c[:, 0] == 3) * 2 - 1)))).astype(np.float32)
    model = metrics.fit_baseline(x, c, (4,), y)
    auc = metrics.classification_metrics(y, metrics.baseline_scores(model, x, c))["roc_auc"]
    assert auc > 0.8


def test_long_tailed_non_negative_columns_are_standardized_on_the_log_scale() -> None:
    rng = np.random.default_rng(0)
    amounts = np.exp(rng.normal(3.5, 1.0, 2_000))  # log-normal: a long right tail
    train = pd.DataFrame({"amount": amounts, "count": rng.poisson(0.5, 2_000) * rng.integers(1, 30, 2_000),
                          "share": rng.random(2_000), "flag": (rng.random(2_000) < 0.05).astype(float),
                          "ratio": rng.normal(size=2_000) ** 3})  # long-tailed but negative: not log-scaled
    prep = data.fit_preprocessor(train, list(train.columns), [])
    assert dict(zip(prep.numeric, prep.log_, strict=True)) == {"amount": True, "count": True, "share": False,
                                                               "flag": False, "ratio": False}
    assert prep.mean_[0] == pytest.approx(np.log1p(amounts).mean())
    numeric, _ = prep.transform(train)
    assert numeric[:, 0] == pytest.approx((np.log1p(amounts) - prep.mean_[0]) / prep.std_[0], abs=1e-5)
    # On the raw scale the largest amounts sat ~20 stds out and everything else near 0; on the log scale
    # the column spreads like a normal one.
    assert np.abs(numeric[:, 0]).max() < 5
    # Serving: a negative value of a log-scaled column reads as 0 (the training minimum's side), a NaN is
    # still a null, and an artifact written before log scaling (no "log" key) encodes as it always did.
    served, _ = prep.transform({**{c: np.zeros(2) for c in train.columns}, "amount": np.array([-5.0, np.nan])})
    assert served[0, 0] == pytest.approx((0 - prep.mean_[0]) / prep.std_[0], abs=1e-5)
    assert served[1, 0] == 0.0 and served[1, 1] == 1.0
    assert Preprocessor.from_dict(prep.to_dict()) == prep
    old = {k: v for k, v in prep.to_dict().items() if k != "log"}
    assert Preprocessor.from_dict(old).log_ == ()
    assert Preprocessor.from_dict(old).transform(train)[0][0, 0] == \
        pytest.approx((amounts[0] - prep.mean_[0]) / prep.std_[0], abs=1e-4)
    with pytest.raises(ValueError, match="flags"):
        Preprocessor(("x", "y"), (), (0.0, 0.0), (1.0, 1.0), (), (True,))


def test_the_online_block_is_not_changed_by_log_scaling() -> None:
    from quiver.online.base import ColumnBlock

    prep = Preprocessor(("amount", "count"), (), (1.0, 0.0), (2.0, 1.0), (), (True, False))
    values = np.array([[10.0, 3.0], [np.inf, -1.0]])
    block = ColumnBlock(("amount", "count"), values.copy())
    numeric, _ = prep.transform(block)
    assert np.array_equal(block.array, values)  # the caller's (the online read's) array, untouched
    assert numeric[0, 0] == pytest.approx((np.log1p(10.0) - 1.0) / 2.0) and numeric[1, :2].tolist() == [0.0, 1.0]
    assert numeric[:, 2].tolist() == [3.0, -1.0]
