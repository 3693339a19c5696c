"""Drift methods only defined for one kind of feature are refused, with one clear error, on both engines."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from quiver.monitoring.drift import DriftConfig, compute_drift


@pytest.mark.parametrize("method", ["chisquare", "z"])
def test_categorical_only_methods_on_numerical_features_are_refused(method: str) -> None:
    # Before: the fast engine scored the numbers as categories and returned a p-value, while
    # engine="evidently" raised from inside Evidently. Now the config refuses it for both engines.
    with pytest.raises(ValueError, match=rf"{method} only apply to categorical features, not to numerical ones.*"
                                         r"use psi, ks, wasserstein, jensenshannon, auto"):
        DriftConfig(numerical_methods=("psi", method))


def test_evidently_itself_refuses_chisquare_on_a_numerical_column() -> None:
    """The rule mirrors Evidently's: its chisquare stattest accepts categorical features only."""
    from evidently.legacy.calculations.stattests import chi_stat_test
    from evidently.legacy.core import ColumnType

    rng = np.random.default_rng(0)
    ref, cur = pd.Series(rng.integers(0, 3, 200).astype(float)), pd.Series(rng.integers(0, 3, 200).astype(float))
    assert ColumnType.Numerical not in chi_stat_test.allowed_feature_types
    assert ColumnType.Categorical in chi_stat_test.allowed_feature_types
    chi_stat_test(ref, cur, ColumnType.Categorical, None)  # fine as categories


@pytest.mark.parametrize("engine", ["fast", "evidently"])
def test_auto_may_still_pick_chisquare_for_few_valued_numbers(engine: str) -> None:
    rng = np.random.default_rng(1)
    ref = pd.DataFrame({"x": rng.integers(0, 3, 300).astype(float)})
    cur = pd.DataFrame({"x": rng.integers(0, 3, 300).astype(float)})
    report = compute_drift(ref, cur, config=DriftConfig(numerical_methods=("auto",)), engine=engine)
    assert "chisquare_pvalue" in report.feature("x").scores  # Evidently's own default for ≤ 1000 rows
