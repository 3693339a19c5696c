"""Evidently 0.7 as the reference implementation of our drift scores, and as the HTML report.

Scores: `evidently_scores` asks Evidently's public Report API (`ValueDrift(column, method)`), which runs its
legacy `get_one_column_drift` (drops NaN/±inf, picks a default method when none is given). Evidently reports
only the KS p-value; the caller takes the statistic D from `scipy.stats.ks_2samp`, the function Evidently
calls. `quiver.monitoring.drift.compute_drift(engine="evidently")` judges these numbers by Quiver's rules.

HTML: `evidently_html` draws Evidently's drift report with **Quiver's verdict** per column: each column gets
its own registered stat test whose score, threshold and "drift detected" are the ones Quiver judged on all
rows (`ColumnVerdict`), so the report and Quiver's summary cannot disagree. Evidently's charts are drawn
from a random sample of at most `sample_rows` rows per side (stated in the result), which keeps the report
to seconds on any input size; the verdicts are not recomputed on that sample.

This module imports nothing of `quiver.monitoring.drift` (the arrow points from drift to here). Importing Evidently
costs ~5 s, so it is imported only inside the functions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from quiver.monitoring.stats import NUMERICAL

DEFAULT_SAMPLE_ROWS = 20_000
EVIDENTLY_NAMES = ("psi", "ks", "wasserstein", "jensenshannon", "chisquare", "z")


def to_pandas(data: pd.DataFrame | pa.Table, names: Sequence[str]) -> pd.DataFrame:
    """The `names` columns of a DataFrame or Arrow table as a DataFrame with a fresh index."""
    if isinstance(data, pd.DataFrame):
        return data[list(names)].reset_index(drop=True)
    return pd.DataFrame({name: data.column(name).to_pandas() for name in names})


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


@dataclass(frozen=True)
class ColumnVerdict:
    """Quiver's judgement of one column, as Evidently's report shows it."""

    kind: str  # numerical | categorical
    method: str  # what decided, e.g. "PSI" or "KS D (p < 0.05)"
    score: float
    threshold: float
    drifted: bool


@dataclass(frozen=True)
class EvidentlyReport:
    """The HTML file, what Evidently counted as drifted, and the sample the charts were drawn from."""

    path: Path
    drifted: tuple[str, ...]
    dataset_drift: bool
    sample_ref: int
    sample_cur: int
    rows_ref: int
    rows_cur: int
    seconds: float


def sample_rows(frame: pd.DataFrame, limit: int, seed: int = 0) -> pd.DataFrame:
    """At most `limit` rows, drawn uniformly without replacement (all rows when there are fewer)."""
    if limit <= 0 or len(frame) <= limit:
        return frame
    picked = np.sort(np.random.default_rng(seed).choice(len(frame), size=limit, replace=False))
    return frame.iloc[picked].reset_index(drop=True)


def evidently_html(reference: pd.DataFrame | pa.Table, current: pd.DataFrame | pa.Table,
                   verdicts: Mapping[str, ColumnVerdict], path: str | Path, *, drift_share: float = 0.5,
                   max_rows: int = DEFAULT_SAMPLE_ROWS, seed: int = 0) -> EvidentlyReport:
    """Evidently's drift report over the judged columns in `verdicts`, with Quiver's verdicts (see above)."""
    import time

    from evidently import DataDefinition, Dataset, Report
    from evidently.legacy.calculations.stattests.registry import StatTest, register_stattest
    from evidently.legacy.core import ColumnType
    from evidently.presets import DataDriftPreset

    started = time.perf_counter()
    names = list(verdicts)
    rows_ref, rows_cur = _rows(reference), _rows(current)
    ref_df = sample_rows(to_pandas(reference, names), max_rows, seed)
    cur_df = sample_rows(to_pandas(current, names), max_rows, seed + 1)
    methods: dict[str, str] = {}
    thresholds: dict[str, float] = {}
    for name, verdict in verdicts.items():
        test_name = f"quiver_verdict[{name}]"
        register_stattest(StatTest(name=test_name, display_name=f"Quiver: {verdict.method}",
                                   allowed_feature_types=[ColumnType.Numerical, ColumnType.Categorical],
                                   default_threshold=verdict.threshold),
                          _fixed_verdict(verdict))
        methods[name], thresholds[name] = test_name, verdict.threshold
    numerical = [n for n, v in verdicts.items() if v.kind == NUMERICAL]
    categorical = [n for n, v in verdicts.items() if v.kind != NUMERICAL]
    definition = DataDefinition(numerical_columns=numerical, categorical_columns=categorical)
    preset = DataDriftPreset(columns=names, drift_share=drift_share, per_column_method=methods,
                             per_column_threshold=thresholds)
    snapshot = Report([preset]).run(Dataset.from_pandas(cur_df, data_definition=definition),
                                    Dataset.from_pandas(ref_df, data_definition=definition))
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    snapshot.save_html(str(target))
    drifted = tuple(n for n, v in verdicts.items() if v.drifted)
    count = _drifted_count(snapshot.dict())
    if count is not None and count != len(drifted):  # the stat tests above make this impossible
        raise RuntimeError(f"Evidently counted {count} drifted columns, Quiver {len(drifted)}")
    share = len(drifted) / len(names) if names else 0.0
    return EvidentlyReport(target, drifted, bool(names) and share >= drift_share, len(ref_df), len(cur_df),
                           rows_ref, rows_cur, time.perf_counter() - started)


def _fixed_verdict(verdict: ColumnVerdict) -> Any:
    def test(reference: pd.Series, current: pd.Series, feature_type: Any, threshold: float) -> tuple[float, bool]:
        # The verdict was judged on every row; the sample only feeds Evidently's charts.
        return verdict.score, verdict.drifted

    return test


def _drifted_count(snapshot: dict[str, Any]) -> int | None:
    for metric in snapshot.get("metrics", []):
        value = metric.get("value")
        if isinstance(value, dict) and "count" in value and "share" in value:
            return int(value["count"])
    return None


def _rows(data: pd.DataFrame | pa.Table) -> int:
    return int(data.num_rows) if isinstance(data, pa.Table) else len(data)
