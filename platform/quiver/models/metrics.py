"""Validation metrics of a binary classifier, and the logistic-regression baseline it must not fall behind."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from quiver.catalog.errors import QuiverError

ECE_BINS = 10
_EPS = 1e-7


def classification_metrics(labels: np.ndarray, scores: np.ndarray, bins: int = ECE_BINS) -> dict[str, float]:
    """ROC-AUC, PR-AUC (average precision), log loss, Brier score and ECE over `bins` equal-width bins."""
    from sklearn.metrics import average_precision_score, roc_auc_score

    y = np.asarray(labels, dtype=np.float64)
    p = np.clip(np.asarray(scores, dtype=np.float64), 0.0, 1.0)
    if len(y) != len(p):
        raise QuiverError(f"{len(y)} labels but {len(p)} scores")
    if not np.isfinite(p).all():
        raise QuiverError(f"{int((~np.isfinite(p)).sum())} score(s) are not finite")
    positives = int(y.sum())
    if positives in (0, len(y)):
        raise QuiverError(f"the validation split has only {'negatives' if positives == 0 else 'positives'} "
                          f"({len(y)} rows); widen the window or move the cutoff")
    clipped = np.clip(p, _EPS, 1 - _EPS)
    return {
        "roc_auc": float(roc_auc_score(y, p)),
        "pr_auc": float(average_precision_score(y, p)),
        "log_loss": float(-np.mean(y * np.log(clipped) + (1 - y) * np.log(1 - clipped))),
        "brier": float(np.mean((p - y) ** 2)),
        "ece": expected_calibration_error(y, p, bins),
        "rows": float(len(y)),
        "positive_rate": positives / len(y),
    }


def expected_calibration_error(labels: np.ndarray, scores: np.ndarray, bins: int = ECE_BINS) -> float:
    """Σ_b (n_b / n) · |mean score_b − positive rate_b| over equal-width bins of [0, 1]."""
    y = np.asarray(labels, dtype=np.float64)
    p = np.asarray(scores, dtype=np.float64)
    which = np.minimum((p * bins).astype(np.int64), bins - 1)  # p == 1.0 belongs to the last bin
    count = np.bincount(which, minlength=bins)
    mean_p = np.bincount(which, weights=p, minlength=bins)
    mean_y = np.bincount(which, weights=y, minlength=bins)
    used = count > 0
    return float(np.sum(np.abs(mean_p[used] - mean_y[used])) / len(p))


def score_latency_ms(score: Callable[[Any], np.ndarray], columns: Any, n_rows: int,
                     batch_sizes: Sequence[int] = (1, 100, 1_000), repeats: int = 20) -> dict[str, float]:
    """Median milliseconds to score one batch of each size (after one warm-up), from the first rows."""
    import pandas as pd

    out = {}
    for size in batch_sizes:
        size = min(size, n_rows)
        batch = columns.iloc[:size] if isinstance(columns, pd.DataFrame) else {k: v[:size] for k, v in columns.items()}
        score(batch)
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            score(batch)
            times.append(time.perf_counter() - started)
        out[f"latency_ms_batch_{size}"] = float(np.median(times) * 1e3)
    return out


def fit_baseline(numeric: np.ndarray, categorical: np.ndarray, cardinalities: Sequence[int], labels: np.ndarray,
                 *, seed: int = 0) -> Any:
    """Logistic regression on the same inputs the network gets: standardized numerics + null indicators
    and one-hot categoricals (the same vocabularies). Returns a fitted sklearn model; score with
    `baseline_scores`."""
    from sklearn.linear_model import LogisticRegression

    model = LogisticRegression(max_iter=2_000, C=1.0, random_state=seed)
    model.fit(_baseline_design(numeric, categorical, cardinalities), labels)
    model.cardinalities_ = tuple(cardinalities)
    return model


def baseline_weights(model: Any, n_numeric_columns: int) -> tuple[np.ndarray, list[np.ndarray], float]:
    """A fitted baseline's weights in the network's wide form: (per numeric input column, per category value
    of each categorical feature, intercept)."""
    coef = np.asarray(model.coef_[0], dtype=np.float64)
    edges = np.cumsum([n_numeric_columns, *model.cardinalities_])
    return coef[:n_numeric_columns], [coef[a:b] for a, b in itertools.pairwise(edges)], float(model.intercept_[0])


def baseline_scores(model: Any, numeric: np.ndarray, categorical: np.ndarray) -> np.ndarray:
    return np.asarray(model.predict_proba(_baseline_design(numeric, categorical, model.cardinalities_))[:, 1])


def _baseline_design(numeric: np.ndarray, categorical: np.ndarray, cardinalities: Sequence[int]) -> Any:
    from scipy import sparse

    n = len(numeric)
    offsets = np.concatenate([[0], np.cumsum(cardinalities)[:-1]]).astype(np.int64)
    cols = (categorical + offsets).ravel()
    rows = np.repeat(np.arange(n), categorical.shape[1])
    onehot = sparse.csr_matrix((np.ones(len(cols)), (rows, cols)), shape=(n, int(sum(cardinalities))))
    return sparse.hstack([sparse.csr_matrix(numeric.astype(np.float64)), onehot], format="csr")
