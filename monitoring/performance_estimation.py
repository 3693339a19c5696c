"""Label-free performance estimation of a binary classifier (CBPE, confidence-based performance estimation).

When a model's scores are calibrated, a row scored p is a positive with probability p, so the metrics a day
of traffic *will* show once its labels arrive can be estimated the day it is served:

* ROC-AUC: the expected ROC curve. At each distinct score t (the model's thresholds, highest first) the
  expected true positives are Σ p over rows scored ≥ t and the expected false positives Σ (1 − p); their
  ratios to Σ p and Σ (1 − p) give the expected TPR / FPR, and the trapezoid area under them is the estimate.
  This is NannyML's CBPE estimator (0.13: rows ordered by the model's score, probabilities from the
  calibrated one); it differs only in grouping tied scores into one threshold, as `roc_curve` does.
* log loss and Brier of the served scores q under the probability p: −mean(p·log q + (1 − p)·log(1 − q)) and
  mean((q − p)² + p(1 − p)) (with no recalibration p = q).
* precision, recall, F1 and accuracy at the model's decision threshold (score ≥ threshold is positive; Quiver
  stores no per-model threshold, so 0.5 unless the caller says otherwise) from the expected confusion matrix
  (TP = Σ p over predicted positives, ...), as NannyML does.

The band is a prediction interval for the value the labels will show: labels are simulated y ~ Bernoulli(p)
`draws` times (seeded) and the metric's central `coverage` quantiles taken. Every metric here is a function
of a few sums linear in y (the rank sum of the positives for AUC, Σ y·log-odds, Σ y·q, TP), so each draw
costs one matrix-vector product and a day is simulated in chunks without sorting again. With at least
`GAUSSIAN_MIN_CLASS` expected labels of each class the sums are drawn from their normal limit instead (their
mean and covariance are exact: independent Bernoulli labels), one pass over the rows: 0.9 s for a 1M-row day
where simulating took 2.5 s. Simulation is
used rather than an analytic bound because AUC's and the ratio metrics' sampling distributions are skewed
near their limits and a normal bound misstates them at small volumes. The band assumes the calibration
holds on the day. When the scores are mapped (below), it also carries the map's own uncertainty: the map is
refitted on bootstrap resamples of the held-out rows and the estimate's movement is added draw by draw (with
a few dozen held-out positives this part is the larger one).

**Calibration first.** `check_calibration` judges held-out labelled rows of the version: its test window
(the stored drift reference has no labels; `pipelines.loop_retrain.rows_of_test_window` rebuilds the test
rows from the version's lineage, scored by the version). The expected calibration error (10 equal-width
bins) is compared with what perfectly calibrated scores would show at that sample size (its (1 − alpha)
quantile, simulated the same way) and with a tolerance that matters (`ECE_TOLERANCE`). The model is refused
("uncalibrated", the reason in words) when its ECE exceeds both: evidence and effect, so a large test set
does not refuse a harmless 0.3 % miscalibration. A small test set cannot see a small miscalibration, and the
band does not hold that bias: the check says how large an ECE it could have missed (`ece_bound`).
Spiegelhalter's z is reported beside it. With `recalibrate=True` (what the loop uses) the scores are mapped by
an isotonic fit on the held-out rows whenever the cross-fitted (2-fold) mapped scores pass the check, as
NannyML maps them whenever the map lowers the ECE: a check that passes on a few dozen positives cannot see a
miscalibration that still moves the ROC-AUC estimate by a few hundredths. Raw scores that pass are kept only
when the map would not pass. The map changes the probabilities used, never the model's ranking or decisions,
and log loss / Brier stay those of the served scores.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from quiver.catalog.errors import QuiverError

FloatArray = npt.NDArray[np.float64]
Calibrator = Callable[[FloatArray], FloatArray]

METRICS = ("roc_auc", "log_loss", "brier", "precision", "recall", "f1", "accuracy")
LOWER_IS_BETTER = frozenset({"log_loss", "brier"})
DEFAULT_THRESHOLD = 0.5  # Quiver keeps no per-model decision threshold
ECE_BINS = 10
# Estimates are about as biased as the scores' ECE (on NannyML's car-loan data an ECE of 0.016 biased the
# ROC-AUC estimate by 0.017 and F1's by 0.035), so the tolerance is small; smaller test sets are bound by chance
ECE_TOLERANCE = 0.005
MIN_CHECK_ROWS = 200
MIN_CHECK_CLASS = 10  # positives and negatives each, for the check to see both ends of the scale
_EPS = 1e-7  # the clip of quiver.models.metrics, so realized values equal the version's recorded ones
_CHUNK_ELEMENTS = 4_000_000  # simulated labels per chunk (32 MB of float64)
CALIBRATION_DRAWS = 40  # bootstrap refits of the isotonic map behind the band's calibration part
CALIBRATION_SAMPLE = 50_000  # served rows the calibration part is computed on (its spread does not need more)
GAUSSIAN_MIN_CLASS = 2_000  # expected positives and negatives each, above which the sums' normal limit is drawn


@dataclass(frozen=True)
class MetricEstimate:
    """One metric of one window: the estimate, its band, and the same metric on the labelled held-out rows."""

    metric: str
    estimate: float
    lower: float
    upper: float
    reference: float | None = None

    @property
    def drop(self) -> float | None:
        """Quality lost against the reference, in the metric's units; positive = worse (for a loss the rise)."""
        if self.reference is None or not math.isfinite(self.estimate):
            return None
        return self.estimate - self.reference if self.metric in LOWER_IS_BETTER else self.reference - self.estimate

    @property
    def drop_band(self) -> tuple[float, float] | None:
        """The drop's (least, most) over the band: "worse with confidence" is `drop_band[0] > tolerance`."""
        if self.reference is None:
            return None
        if self.metric in LOWER_IS_BETTER:
            return self.lower - self.reference, self.upper - self.reference
        return self.reference - self.upper, self.reference - self.lower

    def to_dict(self) -> dict[str, Any]:
        return {"metric": self.metric, "estimate": _finite(self.estimate), "lower": _finite(self.lower),
                "upper": _finite(self.upper), "reference": _finite(self.reference), "drop": _finite(self.drop)}


@dataclass(frozen=True)
class CalibrationCheck:
    """Whether held-out labelled scores are calibrated enough to estimate from, and the metrics they show."""

    calibrated: bool
    reason: str
    rows: int
    positives: int
    ece: float
    ece_bound: float  # the (1 − alpha) quantile of the ECE of perfectly calibrated scores at this size
    tolerance: float
    spiegelhalter_z: float
    spiegelhalter_p: float
    threshold: float
    source: str = ""  # which rows were judged, e.g. "test window of fraud_model:2"
    reference: Mapping[str, float] = field(default_factory=dict)  # realized metrics of those rows
    calibrator: Calibrator | None = field(default=None, repr=False, compare=False)
    # The same map fitted on bootstrap resamples of the held-out rows: how far the estimate moves with the
    # calibration itself (its spread joins the band; a few dozen positives pin a map down only loosely).
    calibrator_draws: tuple[Calibrator, ...] = field(default=(), repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {"calibrated": self.calibrated, "reason": self.reason, "rows": self.rows, "positives": self.positives,
                "ece": self.ece, "ece_bound": self.ece_bound, "tolerance": self.tolerance,
                "spiegelhalter_z": self.spiegelhalter_z, "spiegelhalter_p": self.spiegelhalter_p,
                "threshold": self.threshold, "source": self.source, "recalibrated": self.calibrator is not None,
                "reference": {k: _finite(v) for k, v in self.reference.items()}}


@dataclass(frozen=True)
class WindowEstimate:
    """A window's estimates: status "estimated" (metrics filled) or "uncalibrated" (none, `reason` says why)."""

    status: str
    rows: int
    metrics: Mapping[str, MetricEstimate]
    reason: str
    threshold: float = DEFAULT_THRESHOLD
    coverage: float = 0.95
    calibration: CalibrationCheck | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "rows": self.rows, "reason": self.reason, "threshold": self.threshold,
                "coverage": self.coverage,
                "metrics": {name: m.to_dict() for name, m in self.metrics.items()},
                "calibration": self.calibration.to_dict() if self.calibration else None}


# ----- realized metrics (labels known) -----


def realized_metrics(scores: npt.ArrayLike, labels: npt.ArrayLike,
                     threshold: float = DEFAULT_THRESHOLD) -> dict[str, float]:
    """The metrics of `METRICS` from labels, with the same definitions the estimates use (NaN where a ratio
    has no denominator, e.g. precision with no predicted positive)."""
    q = _scores(scores, "realized metrics")
    y = np.asarray(labels, dtype=np.float64)
    if len(y) != len(q):
        raise QuiverError(f"realized metrics: {len(y)} labels but {len(q)} scores")
    if not np.isin(y, (0.0, 1.0)).all():
        raise QuiverError("realized metrics: labels must be 0 or 1")
    positives = int(y.sum())
    if positives in (0, len(y)):
        raise QuiverError(f"realized metrics: all {len(y):,} labels are {'negative' if positives == 0 else 'positive'}"
                          "; ROC-AUC needs both classes (a longer window has them)")
    sums = _linear_sums(q, y[None, :], threshold)
    return {k: float(v[0]) for k, v in _metrics_from_sums(sums, q, threshold).items()}


# ----- calibration -----


def check_calibration(scores: npt.ArrayLike, labels: npt.ArrayLike, *, threshold: float = DEFAULT_THRESHOLD,
                      tolerance: float = ECE_TOLERANCE, alpha: float = 0.01, draws: int = 500, seed: int = 0,
                      source: str = "", recalibrate: bool = False) -> CalibrationCheck:
    """Judge held-out labelled rows (see the module docstring). Too few rows, or too few of either class, are
    refused: calibration that cannot be shown is not assumed."""
    q = _scores(scores, "calibration check")
    y = np.asarray(labels, dtype=np.float64)
    if len(y) != len(q):
        raise QuiverError(f"calibration check: {len(y)} labels but {len(q)} scores")
    positives, negatives = int(y.sum()), int(len(y) - y.sum())
    reference = realized_metrics(q, y, threshold)  # raises on one class
    z, z_p = _spiegelhalter(q, y)
    ece = _ece(q, y)
    bound = _ece_bound(q, alpha, draws, seed)
    where = f" ({source})" if source else ""

    def verdict(calibrated: bool, reason: str, calibrator: Calibrator | None = None) -> CalibrationCheck:
        draws_of_map = _bootstrap_calibrators(q, y, seed) if calibrator is not None else ()
        return CalibrationCheck(calibrated, reason, len(y), positives, ece, bound, tolerance, z, z_p, threshold,
                                source, reference, calibrator, draws_of_map)

    if len(y) < MIN_CHECK_ROWS or min(positives, negatives) < MIN_CHECK_CLASS:
        return verdict(False, f"calibration cannot be shown on {len(y):,} held-out rows{where} with {positives:,} "
                       f"positive(s): the check needs {MIN_CHECK_ROWS:,} rows and {MIN_CHECK_CLASS} of each class")
    passed = f"calibrated: ECE {ece:.4f} on {len(y):,} held-out rows{where} is within {max(bound, tolerance):.4f} " \
        f"(chance at this size {bound:.4f}, tolerance {tolerance})"
    if not recalibrate and (ece <= bound or ece <= tolerance):
        return verdict(True, passed)
    beyond = f"both what calibrated scores show by chance at this size ({bound:.4f}, {1 - alpha:.0%}) and the " \
        f"tolerance {tolerance}" if ece > tolerance else f"what calibrated scores show by chance ({bound:.4f})"
    refusal = (f"scores are not calibrated: ECE {ece:.4f} on {len(y):,} held-out rows{where} exceeds {beyond}; "
               f"mean score {q.mean():.4f} vs positive rate {y.mean():.4f} (Spiegelhalter z {z:+.1f}); estimates "
               "would be biased")
    if not recalibrate:
        return verdict(False, refusal)
    # Recalibrate whenever asked, as NannyML does: a check that passes on a few dozen positives cannot see a
    # miscalibration that still biases the ROC-AUC estimate by a few hundredths (the demo's story: raw scores
    # passed and overestimated by 0.035 on average, the isotonic map by 0.013).
    crossed = _cross_fitted(q, y, seed)
    crossed_ece, crossed_bound = _ece(crossed, y), _ece_bound(crossed, alpha, draws, seed)
    if crossed_ece > max(crossed_bound, tolerance):
        if ece <= bound or ece <= tolerance:
            return verdict(True, f"{passed}; an isotonic map would not pass (cross-fitted ECE {crossed_ece:.4f})")
        return verdict(False, f"{refusal}; isotonic recalibration does not fix it (cross-fitted ECE "
                       f"{crossed_ece:.4f})")
    return verdict(True, f"recalibrated: raw ECE {ece:.4f} on {len(y):,} held-out rows{where}; an isotonic map "
                   f"fitted on them brings it to {crossed_ece:.4f} (cross-fitted)", fit_isotonic(q, y))


def _bootstrap_calibrators(q: FloatArray, y: FloatArray, seed: int) -> tuple[Calibrator, ...]:
    """`CALIBRATION_DRAWS` isotonic maps fitted on bootstrap resamples of the held-out rows."""
    rng = np.random.default_rng(seed + 1)
    picks = (rng.integers(0, len(q), len(q)) for _ in range(CALIBRATION_DRAWS))
    return tuple(fit_isotonic(q[rows], y[rows]) for rows in picks)


def fit_isotonic(scores: npt.ArrayLike, labels: npt.ArrayLike) -> Calibrator:
    """A monotone map score → probability fitted on labelled rows (NannyML's IsotonicCalibrator)."""
    from sklearn.isotonic import IsotonicRegression

    regression = IsotonicRegression(out_of_bounds="clip", increasing=True, y_min=0.0, y_max=1.0)
    regression.fit(np.asarray(scores, dtype=np.float64), np.asarray(labels, dtype=np.float64))

    def calibrate(values: FloatArray) -> FloatArray:
        return np.asarray(regression.predict(np.asarray(values, dtype=np.float64)), dtype=np.float64)

    return calibrate


# ----- estimation -----


def estimate_performance(scores: npt.ArrayLike, calibration: CalibrationCheck, *, coverage: float = 0.95,
                         draws: int = 400, seed: int = 0) -> WindowEstimate:
    """CBPE estimates of a window's served `scores` (no labels), each with its band and the reference from
    `calibration` (the held-out rows' realized metrics). Refuses ("uncalibrated") when the check did."""
    q = _scores(scores, "performance estimate")
    threshold = calibration.threshold
    if not calibration.calibrated:
        return WindowEstimate("uncalibrated", len(q), {}, calibration.reason, threshold, coverage, calibration)
    if not 0 < coverage < 1:
        raise QuiverError(f"performance estimate: coverage must be in (0, 1), got {coverage}")
    p = np.clip(calibration.calibrator(q), 0.0, 1.0) if calibration.calibrator else q
    if p.sum() <= 0 or p.sum() >= len(p):
        raise QuiverError(f"performance estimate: all {len(q):,} scores are {'0' if p.sum() <= 0 else '1'}; they "
                          "imply one class only, and ROC-AUC needs both")
    point = _expected_metrics(q, p, threshold)
    simulated = _simulate(q, p, threshold, draws, seed)
    if calibration.calibrator_draws:  # the map's own uncertainty, added draw by draw to the labels' spread
        moved = _calibration_spread(q, calibration, threshold, seed)
        simulated = {name: values + np.resize(moved[name], len(values)) for name, values in simulated.items()}
    tail = (1 - coverage) / 2
    metrics = {}
    for name in METRICS:
        values = simulated[name][np.isfinite(simulated[name])]
        lower, upper = (np.quantile(values, [tail, 1 - tail]) if len(values) else (math.nan, math.nan))
        metrics[name] = MetricEstimate(name, point[name], float(lower), float(upper),
                                       calibration.reference.get(name))
    reason = f"estimated from {len(q):,} scored rows; {calibration.reason}"
    return WindowEstimate("estimated", len(q), metrics, reason, threshold, coverage, calibration)


def _calibration_spread(q: FloatArray, calibration: CalibrationCheck, threshold: float,
                        seed: int) -> dict[str, FloatArray]:
    """Per metric, how far the point estimate moves when the map is refitted on bootstrap resamples of the
    held-out rows (deviations from the fitted map's estimate), on at most `CALIBRATION_SAMPLE` served rows."""
    assert calibration.calibrator is not None
    if len(q) > CALIBRATION_SAMPLE:
        q = np.random.default_rng(seed).choice(q, CALIBRATION_SAMPLE, replace=False)
    central = _expected_metrics(q, np.clip(calibration.calibrator(q), 0.0, 1.0), threshold)
    refits = [_expected_metrics(q, np.clip(refit(q), 0.0, 1.0), threshold) for refit in calibration.calibrator_draws]
    return {name: np.array([r[name] - central[name] for r in refits]) for name in METRICS}


def expected_roc_auc(scores: npt.ArrayLike, probabilities: npt.ArrayLike | None = None) -> float:
    """The area under the expected ROC curve: thresholds at the distinct `scores` (ties are one threshold),
    positives expected from `probabilities` (the scores themselves by default)."""
    q = np.asarray(scores, dtype=np.float64)
    p = q if probabilities is None else np.asarray(probabilities, dtype=np.float64)
    order = np.argsort(-q, kind="stable")
    q, p = q[order], p[order]
    last_of_tie = np.r_[q[1:] != q[:-1], True]
    tps = np.r_[0.0, np.cumsum(p)[last_of_tie]]
    fps = np.r_[0.0, np.cumsum(1 - p)[last_of_tie]]
    if tps[-1] <= 0 or fps[-1] <= 0:
        return math.nan
    return float(np.trapezoid(tps / tps[-1], fps / fps[-1]))


def _expected_metrics(q: FloatArray, p: FloatArray, threshold: float) -> dict[str, float]:
    qc = np.clip(q, _EPS, 1 - _EPS)
    predicted = q >= threshold
    tp, fp = float(p[predicted].sum()), float((1 - p[predicted]).sum())
    fn, tn = float(p[~predicted].sum()), float((1 - p[~predicted]).sum())
    return {
        "roc_auc": expected_roc_auc(q, p),
        "log_loss": float(-np.mean(p * np.log(qc) + (1 - p) * np.log1p(-qc))),
        "brier": float(np.mean((q - p) ** 2 + p * (1 - p))),
        "precision": _ratio(tp, tp + fp),
        "recall": _ratio(tp, tp + fn),
        "f1": _ratio(2 * tp, 2 * tp + fp + fn),
        "accuracy": (tp + tn) / len(q),
    }


def _simulate(q: FloatArray, p: FloatArray, threshold: float, draws: int, seed: int) -> dict[str, FloatArray]:
    """Each metric on `draws` label sets y ~ Bernoulli(p), chunked so memory stays bounded. With thousands of
    expected positives and negatives the sums are drawn from their normal limit instead (`_gaussian_sums`)."""
    rng = np.random.default_rng(seed)
    design = _design(q, threshold)
    if min(float(p.sum()), float((1 - p).sum())) >= GAUSSIAN_MIN_CLASS:
        return _metrics_from_sums(_gaussian_sums(design, p, draws, rng), q, threshold)
    p32 = p.astype(np.float32)  # float32 uniforms: half the time, and 2⁻²⁴ is far below any band's width
    per_chunk = max(1, _CHUNK_ELEMENTS // max(len(p), 1))
    sums = []
    for start in range(0, draws, per_chunk):
        y = rng.random((min(per_chunk, draws - start), len(p)), dtype=np.float32) < p32
        sums.append(y.astype(np.float64) @ design)
    return _metrics_from_sums(np.concatenate(sums), q, threshold)


def _gaussian_sums(design: FloatArray, p: FloatArray, draws: int, rng: np.random.Generator) -> FloatArray:
    """Draws of the label sums y @ design from their normal limit: y's entries are independent Bernoulli(p), so
    the sums have mean p @ design and covariance designᵀ·diag(p(1 − p))·design, exactly; with thousands of
    expected labels of each class they are normal to far below a band's width (the simulation's own noise at
    400 draws is larger). One pass over the rows instead of `draws`: a 1M-row day in a fraction of a second."""
    mean = p @ design
    covariance = design.T @ (design * (p * (1 - p))[:, None])
    return rng.multivariate_normal(mean, covariance, size=draws, method="eigh")


def _linear_sums(q: FloatArray, y: FloatArray, threshold: float) -> FloatArray:
    """Per label set (rows of y): positives, rank sum of positives, Σ y·log-odds(q), Σ y·q, true positives."""
    return np.asarray(y @ _design(q, threshold), dtype=np.float64)


def _design(q: FloatArray, threshold: float) -> FloatArray:
    from scipy.stats import rankdata

    qc = np.clip(q, _EPS, 1 - _EPS)
    return np.column_stack([np.ones_like(q), rankdata(q), np.log(qc) - np.log1p(-qc), q,
                            (q >= threshold).astype(np.float64)])


def _metrics_from_sums(sums: FloatArray, q: FloatArray, threshold: float) -> dict[str, FloatArray]:
    n = float(len(q))
    qc = np.clip(q, _EPS, 1 - _EPS)
    positives, rank_sum, log_odds, score_sum, tp = sums.T
    predicted = float((q >= threshold).sum())
    fp, fn = predicted - tp, positives - tp
    with np.errstate(divide="ignore", invalid="ignore"):
        return {
            "roc_auc": (rank_sum - positives * (positives + 1) / 2) / (positives * (n - positives)),
            "log_loss": -(log_odds + np.log1p(-qc).sum()) / n,
            "brier": (float((q ** 2).sum()) - 2 * score_sum + positives) / n,
            "precision": tp / (tp + fp),
            "recall": tp / positives,
            "f1": 2 * tp / (2 * tp + fp + fn),
            "accuracy": (n - fp - fn) / n,
        }


# ----- calibration statistics -----


def _ece(q: FloatArray, y: FloatArray) -> float:
    which = np.minimum((q * ECE_BINS).astype(np.int64), ECE_BINS - 1)
    gap = np.bincount(which, weights=q - y, minlength=ECE_BINS)
    return float(np.abs(gap).sum() / len(q))


def _ece_bound(q: FloatArray, alpha: float, draws: int, seed: int) -> float:
    """The (1 − alpha) quantile of the ECE of these scores when they are calibrated (labels drawn from them)."""
    which = np.minimum((q * ECE_BINS).astype(np.int64), ECE_BINS - 1)
    onehot = np.zeros((len(q), ECE_BINS))
    onehot[np.arange(len(q)), which] = 1.0
    expected = q @ onehot
    rng = np.random.default_rng(seed + 1)
    per_chunk = max(1, _CHUNK_ELEMENTS // max(len(q), 1))
    eces = []
    for start in range(0, draws, per_chunk):
        y = (rng.random((min(per_chunk, draws - start), len(q)), dtype=np.float32) < q.astype(np.float32))
        eces.append(np.abs(y.astype(np.float64) @ onehot - expected).sum(axis=1) / len(q))
    return float(np.quantile(np.concatenate(eces), 1 - alpha))


def _spiegelhalter(q: FloatArray, y: FloatArray) -> tuple[float, float]:
    from scipy.stats import norm

    variance = float(((1 - 2 * q) ** 2 * q * (1 - q)).sum())
    if variance <= 0:
        return math.nan, math.nan
    z = float(((y - q) * (1 - 2 * q)).sum() / math.sqrt(variance))
    return z, float(2 * norm.sf(abs(z)))


def _cross_fitted(q: FloatArray, y: FloatArray, seed: int) -> FloatArray:
    """Isotonic-recalibrated scores, each row mapped by a fit on the other half (so the check is honest)."""
    fold = np.random.default_rng(seed).permutation(len(q)) % 2
    out = np.empty_like(q)
    for k in (0, 1):
        out[fold == k] = fit_isotonic(q[fold != k], y[fold != k])(q[fold == k])
    return np.clip(out, 0.0, 1.0)


# ----- helpers -----


def _scores(scores: npt.ArrayLike, what: str) -> FloatArray:
    q = np.asarray(scores, dtype=np.float64).ravel()
    if len(q) == 0:
        raise QuiverError(f"{what}: no scored rows in the window")
    if not np.isfinite(q).all():
        raise QuiverError(f"{what}: {int((~np.isfinite(q)).sum()):,} score(s) are not finite")
    if q.min() < 0 or q.max() > 1:
        raise QuiverError(f"{what}: scores must be probabilities in [0, 1]; got [{q.min():.4g}, {q.max():.4g}]")
    return q


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else math.nan


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
