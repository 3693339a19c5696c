"""Evidently 0.7 as the reference implementation of our drift scores, and as the HTML report.

Scores come from Evidently's public Report API (`ValueDrift(column, method)`), which runs its legacy
`get_one_column_drift` (drops NaN/±inf, picks a default method when none is given). Evidently reports only
the KS p-value; the statistic D comes from `scipy.stats.ks_2samp`, the function Evidently calls.
Importing Evidently costs ~5 s, so nothing here is imported until used.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from monitoring.drift import DriftConfig, FeatureDrift, Frame, column, judge, prepare
from monitoring.stats import NUMERICAL, CategoricalPair, NumericPair

EVIDENTLY_NAMES = ("psi", "ks", "wasserstein", "jensenshannon", "chisquare", "z")
_SCORE_KEY = {"psi": "psi", "ks": "ks_pvalue", "wasserstein": "wasserstein", "jensenshannon": "jensenshannon",
              "chisquare": "chisquare_pvalue", "z": "z_pvalue"}


def to_pandas(data: Frame, names: Sequence[str]) -> pd.DataFrame:
    if isinstance(data, pd.DataFrame):
        return data[list(names)].reset_index(drop=True)
    return pd.DataFrame({name: column(data, name) for name in names})


def evidently_scores(reference: pd.DataFrame, current: pd.DataFrame, kinds: dict[str, str],
                     methods: dict[str, list[str | None]]) -> dict[tuple[str, str], float]:
    """{(feature, method): Evidently's value}; a None method lets Evidently choose (key: the method it chose)."""
    from evidently import DataDefinition, Dataset, Report
    from evidently.metrics import ValueDrift

    numerical = [f for f, k in kinds.items() if k == NUMERICAL]
    categorical = [f for f, k in kinds.items() if k != NUMERICAL]
    definition = DataDefinition(numerical_columns=numerical, categorical_columns=categorical)
    metrics = [ValueDrift(column=f, method=m) for f, ms in methods.items() for m in ms]
    if not metrics:
        return {}
    snapshot = Report(metrics).run(Dataset.from_pandas(current, data_definition=definition),
                                   Dataset.from_pandas(reference, data_definition=definition))
    names = _display_names()
    out: dict[tuple[str, str], float] = {}
    for metric in snapshot.dict()["metrics"]:
        config = metric["config"]
        method = names.get(config["method"], config["method"])
        out[(config["column"], method)] = float(metric["value"])
    return out


def _display_names() -> dict[str, str]:
    from evidently.legacy.calculations.stattests.registry import _registered_stat_tests

    return {test.display_name: name for name, by_type in _registered_stat_tests.items()
            for test in by_type.values()}


def evidently_features(reference: Frame, current: Frame, names: Sequence[str],
                       config: DriftConfig) -> list[FeatureDrift]:
    """`compute_drift(..., engine="evidently")`: every score from Evidently, judged by the same rules."""
    from scipy.stats import ks_2samp

    ref_df, cur_df = to_pandas(reference, names), to_pandas(current, names)
    prepared: dict[str, tuple[str, NumericPair | CategoricalPair]] = {}
    results: dict[str, FeatureDrift] = {}
    for name in names:
        kind, pair, done = prepare(name, ref_df[name], cur_df[name], config)
        if done is not None:
            results[name] = done
        elif pair is not None and kind is not None:
            prepared[name] = (kind, pair)
    methods = {name: [None if m == "auto" else m for m in config.methods_for(kind)]
               for name, (kind, _) in prepared.items()}
    values = evidently_scores(ref_df, cur_df, {n: k for n, (k, _) in prepared.items()}, methods)
    for name, (kind, pair) in prepared.items():
        scores: dict[str, float] = {}
        for (feature, method), value in values.items():
            if feature != name:
                continue
            scores[_SCORE_KEY[method]] = value
            if method == "ks" and isinstance(pair, NumericPair):
                scores["ks_statistic"] = float(ks_2samp(pair.ref, pair.cur).statistic)
            if method == "psi":
                scores["psi_bins"] = float(pair.binned_shares()[0].size)
        results[name] = judge(name, kind, scores, pair, len(ref_df), len(cur_df), config)
    return [results[name] for name in names]


def evidently_html(reference: Frame, current: Frame, names: Sequence[str], path: str | Path,
                   config: DriftConfig | None = None) -> Path:
    """Evidently's drift report (per-feature distributions and scores) as one HTML file."""
    from evidently import DataDefinition, Dataset, Report
    from evidently.metrics import ValueDrift
    from evidently.presets import DataDriftPreset

    config = config or DriftConfig()
    ref_df, cur_df = to_pandas(reference, names), to_pandas(current, names)
    kinds: dict[str, str] = {}
    for name in names:
        kind, pair, _ = prepare(name, ref_df[name], cur_df[name], config)
        if pair is not None and kind is not None:
            kinds[name] = kind
    numerical = [f for f, k in kinds.items() if k == NUMERICAL]
    categorical = [f for f, k in kinds.items() if k != NUMERICAL]
    first_num = _first(config.numerical_methods)
    first_cat = _first(config.categorical_methods)
    metrics: list[Any] = [DataDriftPreset(columns=list(kinds), num_method=first_num, cat_method=first_cat,
                                          drift_share=config.drift_share)]
    for name in numerical:
        metrics += [ValueDrift(column=name, method=m) for m in config.numerical_methods[1:] if m != "auto"]
    for name in categorical:
        metrics += [ValueDrift(column=name, method=m) for m in config.categorical_methods[1:] if m != "auto"]
    definition = DataDefinition(numerical_columns=numerical, categorical_columns=categorical)
    snapshot = Report(metrics).run(Dataset.from_pandas(cur_df[list(kinds)], data_definition=definition),
                                   Dataset.from_pandas(ref_df[list(kinds)], data_definition=definition))
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    snapshot.save_html(str(target))
    return target


def _first(methods: Sequence[str]) -> str | None:
    return None if not methods or methods[0] == "auto" else methods[0]
