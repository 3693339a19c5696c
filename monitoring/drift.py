"""Per-feature drift between a reference sample (the training window) and a current one (serving logs).

`compute_drift` scores every feature with the configured methods — PSI and KS by default for numerical
features, PSI for categorical ones; Wasserstein, Jensen–Shannon, chi-square, Z and Evidently's own per-column
default ("auto") on request — and decides with one of two rules (`DriftConfig.decision`):

* `"bounded"` (the default; `quiver.monitoring.drift_decision`): a feature drifts when the lower confidence
  bound of its effect (Kolmogorov distance for numerical features, total variation for categorical ones)
  exceeds its minimum effect (`min_effect`, 0.1); the dataset drifts when any feature does. The confidence
  is set so that steady traffic gets at most `false_alarms_per_90_days` (0.5) false dataset alerts per 90
  days in expectation, at any daily volume. The scores below are still computed, shown and stored; a feature
  that the thresholds would alert on but whose effect is not shown beyond the minimum is a warning.
* `"thresholds"` (the previous rule, Evidently's levels), where each feature is judged with `Thresholds`:

* PSI ≥ 0.1 warns, PSI ≥ 0.2 alerts; PSI is only judged when enough data backs it: its expected value on
  undrifted data, (bins − 1)·(1/n_ref + 1/n_cur), must stay below half the warn level.
* KS alerts only when p < 0.05 *and* D ≥ 0.1, so that a million rows do not alarm on a 0.3% wobble.
* Wasserstein (normed) and Jensen–Shannon alert at ≥ 0.1; chi-square and Z at p < 0.05 (Evidently's levels).
* A null share that moves by more than 0.1 warns. NaN/None/±inf values are dropped and counted first.
* Fewer than `min_samples` non-null values on either side: scores are still computed (when possible) and
  stored, but the feature is `insufficient_data` and never alarms.

Under `"thresholds"` a feature "drifts" when its status is `alert`; the dataset drifts when the drifted share
of the judged features reaches `drift_share` (0.5, Evidently's default); under `"bounded"` `drift_share` is
reported only. `engine="fast"` uses `quiver.monitoring.stats`;
`engine="evidently"` asks Evidently itself for the same numbers (slower; the reference implementation).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypeAlias

import numpy as np
import pandas as pd
import pyarrow as pa

from quiver.monitoring.drift_decision import (
    DEFAULT_FALSE_ALARMS_PER_90_DAYS,
    DEFAULT_MAX_CATEGORIES,
    DEFAULT_MIN_EFFECT,
    BoundedEffect,
    bounded_effect,
    daily_alpha,
    feature_alpha,
)
from quiver.monitoring.stats import (
    CATEGORICAL,
    NUMERICAL,
    CategoricalPair,
    NumericPair,
    clean_categorical,
    clean_numeric,
    evidently_default_method,
    jensenshannon_from_shares,
    psi_from_shares,
    refuse_misapplied_methods,
)

DECISIONS = ("bounded", "thresholds")
METHODS = ("psi", "ks", "wasserstein", "jensenshannon", "chisquare", "z", "auto")
STATUS_ORDER = {"ok": 0, "warn": 1, "alert": 2}
Frame: TypeAlias = pd.DataFrame | pa.Table


@dataclass(frozen=True)
class Thresholds:
    """When a feature's scores warn or alert (see the module docstring)."""

    psi_warn: float = 0.1
    psi_alert: float = 0.2
    ks_pvalue: float = 0.05
    ks_min_statistic: float = 0.1
    wasserstein: float = 0.1
    jensenshannon: float = 0.1
    chisquare_pvalue: float = 0.05
    z_pvalue: float = 0.05
    min_samples: int = 500  # below this KS at α=0.05 alone would decide, and PSI is mostly noise
    psi_max_noise: float = 0.5  # judge PSI only when its no-drift expectation ≤ this × psi_warn
    max_null_share_delta: float = 0.1


@dataclass(frozen=True)
class DriftConfig:
    """Which methods run, how they are judged, and when the whole dataset counts as drifted."""

    numerical_methods: tuple[str, ...] = ("psi", "ks")
    categorical_methods: tuple[str, ...] = ("psi",)
    thresholds: Thresholds = field(default_factory=Thresholds)
    per_feature: Mapping[str, Thresholds] = field(default_factory=dict)
    kinds: Mapping[str, str] = field(default_factory=dict)  # force numerical / categorical per feature
    drift_share: float = 0.5
    # The decision (see the module docstring): "bounded" (default) or "thresholds" (the previous rule).
    decision: str = "bounded"
    min_effect: float = DEFAULT_MIN_EFFECT  # smallest Kolmogorov distance / total variation worth an alert
    min_effects: Mapping[str, float] = field(default_factory=dict)  # per feature
    false_alarms_per_90_days: float = DEFAULT_FALSE_ALARMS_PER_90_DAYS  # expected, on steady traffic
    max_categories: int = DEFAULT_MAX_CATEGORIES  # categorical cells for total variation (rest pooled)

    def __post_init__(self) -> None:
        if self.decision not in DECISIONS:
            raise ValueError(f"unknown drift decision {self.decision!r}; known: {', '.join(DECISIONS)}")
        for feature, effect in {"": self.min_effect, **self.min_effects}.items():
            if not 0 <= effect < 1:
                raise ValueError(f"min_effect{' of ' + feature if feature else ''} must lie in [0, 1), got {effect}")
        daily_alpha(self.false_alarms_per_90_days)  # raises when out of range
        if self.max_categories < 2:
            raise ValueError(f"max_categories must be at least 2, got {self.max_categories}")
        for method in (*self.numerical_methods, *self.categorical_methods):
            if method not in METHODS:
                raise ValueError(f"unknown drift method {method!r}; known: {', '.join(METHODS)}")
        refuse_misapplied_methods(self.numerical_methods, self.categorical_methods)  # one rule, both engines

    def thresholds_for(self, feature: str) -> Thresholds:
        return self.per_feature.get(feature, self.thresholds)

    def methods_for(self, kind: str) -> tuple[str, ...]:
        return self.numerical_methods if kind == NUMERICAL else self.categorical_methods

    def min_effect_for(self, feature: str) -> float:
        return self.min_effects.get(feature, self.min_effect)

    @property
    def daily_alpha(self) -> float:
        """δ_day: the allowed chance of a false dataset alert on one day (bounded decision)."""
        return daily_alpha(self.false_alarms_per_90_days)


@dataclass(frozen=True)
class FeatureDrift:
    """Drift of one feature: scores by name, the judgement and the sample sizes behind it."""

    feature: str
    kind: str
    status: str  # ok | warn | alert | insufficient_data | skipped
    scores: dict[str, float]
    n_ref: int
    n_cur: int
    nulls_ref: int
    nulls_cur: int
    reasons: tuple[str, ...] = ()
    details: dict[str, Any] = field(default_factory=dict)
    # The bounded decision's evidence (None under "thresholds" or when skipped): the effect (Kolmogorov D or
    # total variation), its lower confidence bound and the smallest true effect flaggable at these sizes.
    effect_metric: str | None = None
    effect: float | None = None
    effect_lower: float | None = None
    detectable_effect: float | None = None

    @property
    def drifted(self) -> bool:
        return self.status == "alert"

    @property
    def judged(self) -> bool:
        return self.status in STATUS_ORDER

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["reasons"] = list(self.reasons)
        out["drifted"] = self.drifted
        return out


@dataclass(frozen=True)
class DriftReport:
    """All features of one comparison plus the dataset-level verdict."""

    features: tuple[FeatureDrift, ...]
    drift_share_threshold: float
    engine: str
    elapsed_s: float
    decision: str = "thresholds"
    false_alarms_per_90_days: float | None = None  # the bounded decision's promise (None under thresholds)

    @property
    def judged(self) -> list[FeatureDrift]:
        return [f for f in self.features if f.judged]

    @property
    def drifted(self) -> list[FeatureDrift]:
        return [f for f in self.features if f.drifted]

    @property
    def drift_share(self) -> float:
        judged = self.judged
        return len(self.drifted) / len(judged) if judged else 0.0

    @property
    def dataset_drift(self) -> bool:
        if self.decision == "bounded":  # family-wise: any feature shown beyond its minimum effect
            return bool(self.drifted)
        return bool(self.judged) and self.drift_share >= self.drift_share_threshold

    @property
    def rule(self) -> str:
        """The dataset verdict's rule in words, for summaries and alert bodies (replaces "share X, threshold Y",
        which is not what decides under the bounded decision)."""
        if self.decision == "bounded":
            return (f"share {self.drift_share:.0%}; drifted = effect shown above its minimum effect, at most "
                    f"{self.false_alarms_per_90_days:g} false alerts per 90 days on steady traffic")
        return f"share {self.drift_share:.0%}, threshold {self.drift_share_threshold:.0%}"

    def feature(self, name: str) -> FeatureDrift:
        for f in self.features:
            if f.feature == name:
                return f
        raise KeyError(name)

    def to_frame(self) -> pd.DataFrame:
        rows = []
        for f in self.features:
            row: dict[str, Any] = {"feature": f.feature, "kind": f.kind, "status": f.status, "n_ref": f.n_ref,
                                   "n_cur": f.n_cur, "nulls_ref": f.nulls_ref, "nulls_cur": f.nulls_cur}
            row.update(f.scores)
            if f.effect is not None:
                row.update({"effect_metric": f.effect_metric, "effect": f.effect, "effect_lower": f.effect_lower,
                            "detectable_effect": f.detectable_effect})
            row["reasons"] = "; ".join(f.reasons)
            rows.append(row)
        return pd.DataFrame(rows)

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "elapsed_s": self.elapsed_s, "drift_share": self.drift_share,
                "drift_share_threshold": self.drift_share_threshold, "dataset_drift": self.dataset_drift,
                "decision": self.decision, "false_alarms_per_90_days": self.false_alarms_per_90_days,
                "rule": self.rule,
                "n_drifted": len(self.drifted), "n_judged": len(self.judged),
                "features": [f.to_dict() for f in self.features]}


def infer_kind(values: pd.Series | np.ndarray) -> str | None:
    """numerical for ints and floats, categorical for strings, bools and categories, None for the rest."""
    dtype = values.dtype
    if isinstance(dtype, pd.CategoricalDtype) or pd.api.types.is_bool_dtype(dtype):
        return CATEGORICAL
    if pd.api.types.is_numeric_dtype(dtype):
        return NUMERICAL
    if pd.api.types.is_string_dtype(dtype) or pd.api.types.is_object_dtype(dtype):
        return CATEGORICAL
    return None


def column(data: Frame, name: str) -> pd.Series:
    """One column as a Series (Arrow nulls become NaN/None)."""
    if isinstance(data, pa.Table):
        return data.column(name).to_pandas()
    return data[name]


def column_names(data: Frame) -> list[str]:
    return list(data.column_names) if isinstance(data, pa.Table) else [str(c) for c in data.columns]


def compute_drift(reference: Frame, current: Frame, features: Sequence[str] | None = None,
                  config: DriftConfig | None = None, *, engine: str = "fast",
                  workers: int | None = None) -> DriftReport:
    """Drift of `features` (default: columns present in both) from `reference` to `current`."""
    config = config or DriftConfig()
    started = time.perf_counter()
    names = list(features) if features else [c for c in column_names(reference) if c in set(column_names(current))]
    missing = [n for n in names if n not in column_names(reference) or n not in column_names(current)]
    if missing:
        raise ValueError(f"feature(s) missing from reference or current: {', '.join(missing)}")
    # Bonferroni over every feature asked for (skipped ones included): fixed before any data is seen.
    alpha = feature_alpha(config.daily_alpha, len(names))
    if engine == "fast":
        def one(name: str) -> FeatureDrift:
            return _fast_feature(name, column(reference, name), column(current, name), config, alpha)

        workers = workers or min(len(names), os.cpu_count() or 1, 4) or 1
        if workers > 1:
            # numpy releases the GIL in the bucketing passes, so columns overlap on several cores.
            with ThreadPoolExecutor(workers) as pool:
                results = list(pool.map(one, names))
        else:
            results = [one(name) for name in names]
    elif engine == "evidently":
        results = _evidently_features(reference, current, names, config, alpha)
    else:
        raise ValueError(f"unknown drift engine {engine!r} (fast or evidently)")
    bounded = config.decision == "bounded"
    return DriftReport(tuple(results), config.drift_share, engine, time.perf_counter() - started,
                       config.decision, config.false_alarms_per_90_days if bounded else None)


# ----------------------------------------------------------------------------------------------------------


def prepare(name: str, ref_raw: pd.Series, cur_raw: pd.Series, config: DriftConfig) -> (
        tuple[str | None, NumericPair | CategoricalPair | None, FeatureDrift | None]):
    """(kind, cleaned pair, or a finished `skipped` result when there is nothing to compare)."""
    kind = config.kinds.get(name) or infer_kind(ref_raw)
    if kind not in (NUMERICAL, CATEGORICAL):
        return kind, None, _skipped(name, str(kind), ref_raw, cur_raw, f"unsupported dtype {ref_raw.dtype}")
    if kind == NUMERICAL:
        if not (pd.api.types.is_numeric_dtype(ref_raw.dtype) and pd.api.types.is_numeric_dtype(cur_raw.dtype)):
            return kind, None, _skipped(name, kind, ref_raw, cur_raw, "numerical feature with non-numeric values")
        ref, nulls_ref = clean_numeric(ref_raw.to_numpy())
        cur, nulls_cur = clean_numeric(cur_raw.to_numpy())
        integer = ref_raw.dtype.kind in "iu" and cur_raw.dtype.kind in "iu"
        sizes = (int(ref.size), int(cur.size))
        if all(sizes):
            return kind, NumericPair(ref, cur, integer=integer), None
    else:
        ref_s, nulls_ref = clean_categorical(ref_raw)
        cur_s, nulls_cur = clean_categorical(cur_raw)
        sizes = (len(ref_s), len(cur_s))
        if all(sizes):
            return kind, CategoricalPair(ref_s, cur_s), None
    side = "reference" if not sizes[0] else "current"
    return kind, None, FeatureDrift(name, kind, "skipped", {}, sizes[0], sizes[1], nulls_ref, nulls_cur,
                                    (f"no non-null values in {side}",))


def _skipped(name: str, kind: str, ref: pd.Series, cur: pd.Series, reason: str) -> FeatureDrift:
    return FeatureDrift(name, kind, "skipped", {}, len(ref), len(cur), int(ref.isna().sum()),
                        int(cur.isna().sum()), (reason,))


def resolve_methods(kind: str, pair: NumericPair | CategoricalPair, methods: Iterable[str]) -> list[str]:
    """Methods to run, with "auto" replaced by Evidently's choice for this column."""
    out: list[str] = []
    for method in methods:
        if method == "auto":
            n_ref = pair.ref.size if isinstance(pair, NumericPair) else len(pair.ref)
            method = evidently_default_method(kind, n_ref, _n_unique_combined(pair))
        if method not in out:
            out.append(method)
    return out


def _n_unique_combined(pair: NumericPair | CategoricalPair) -> int:
    if isinstance(pair, NumericPair):
        return int(np.unique(np.concatenate([pair.ref, pair.cur])).size)
    return len(pair.counts()[0])


def _fast_feature(name: str, ref_raw: pd.Series, cur_raw: pd.Series, config: DriftConfig,
                  alpha: float) -> FeatureDrift:
    kind, pair, done = prepare(name, ref_raw, cur_raw, config)
    if done is not None or pair is None or kind is None:
        assert done is not None
        return done
    scores: dict[str, float] = {}
    for method in resolve_methods(kind, pair, config.methods_for(kind)):
        if method in ("psi", "jensenshannon"):
            ref_shares, cur_shares = pair.binned_shares()
            if method == "psi":
                scores["psi"] = psi_from_shares(ref_shares, cur_shares)
                scores["psi_bins"] = float(ref_shares.size)
            else:
                scores["jensenshannon"] = jensenshannon_from_shares(ref_shares, cur_shares)
        elif method == "ks" and isinstance(pair, NumericPair):
            scores["ks_statistic"], scores["ks_pvalue"] = pair.ks()
        elif method == "wasserstein" and isinstance(pair, NumericPair):
            scores["wasserstein"] = pair.wasserstein_norm()
        elif method == "chisquare":
            scores["chisquare_pvalue"] = _as_categorical(pair).chisquare()
        elif method == "z":
            scores["z_pvalue"] = _as_categorical(pair).z_test()
    return judge(name, kind, scores, pair, len(ref_raw), len(cur_raw), config, alpha)


def _evidently_features(reference: Frame, current: Frame, names: Sequence[str], config: DriftConfig,
                        alpha: float) -> list[FeatureDrift]:
    """`engine="evidently"`: every score from Evidently (`quiver.monitoring.evidently_ref`), judged by the same rules."""
    from scipy.stats import ks_2samp

    from quiver.monitoring.evidently_ref import evidently_scores, to_pandas

    score_key = {"psi": "psi", "ks": "ks_pvalue", "wasserstein": "wasserstein", "jensenshannon": "jensenshannon",
                 "chisquare": "chisquare_pvalue", "z": "z_pvalue"}
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
            scores[score_key[method]] = value
            if method == "ks" and isinstance(pair, NumericPair):
                scores["ks_statistic"] = float(ks_2samp(pair.ref, pair.cur).statistic)
            if method == "psi":
                scores["psi_bins"] = float(pair.binned_shares()[0].size)
        results[name] = judge(name, kind, scores, pair, len(ref_df), len(cur_df), config, alpha)
    return [results[name] for name in names]


def _as_categorical(pair: NumericPair | CategoricalPair) -> CategoricalPair:
    if isinstance(pair, CategoricalPair):
        return pair
    return CategoricalPair(pd.Series(pair.ref), pd.Series(pair.cur))


def judge(name: str, kind: str, scores: dict[str, float], pair: NumericPair | CategoricalPair,
          rows_ref: int, rows_cur: int, config: DriftConfig, alpha: float | None = None) -> FeatureDrift:
    """Apply the configured decision to a feature's scores; `alpha` is δ_feature of the bounded decision
    (default: the day's whole budget, as for a single feature)."""
    t = config.thresholds_for(name)
    n_ref = int(pair.ref.size) if isinstance(pair, NumericPair) else len(pair.ref)
    n_cur = int(pair.cur.size) if isinstance(pair, NumericPair) else len(pair.cur)
    nulls_ref, nulls_cur = rows_ref - n_ref, rows_cur - n_cur
    status, reasons = "ok", []

    def raise_to(level: str, reason: str) -> None:
        nonlocal status
        reasons.append(reason)
        if STATUS_ORDER[level] > STATUS_ORDER[status]:
            status = level

    details: dict[str, Any] = {}
    if "psi" in scores:
        noise = (scores["psi_bins"] - 1) * (1 / n_ref + 1 / n_cur)
        details["psi_noise"] = noise
        psi = scores["psi"]
        if noise > t.psi_max_noise * t.psi_warn:
            if psi >= t.psi_warn:
                reasons.append(f"PSI {psi:.3f} not judged: {n_ref}/{n_cur} values are too few for "
                               f"{int(scores['psi_bins'])} bins (noise ≈ {noise:.3f})")
        elif psi >= t.psi_alert:
            raise_to("alert", f"PSI {psi:.3f} ≥ {t.psi_alert}")
        elif psi >= t.psi_warn:
            raise_to("warn", f"PSI {psi:.3f} ≥ {t.psi_warn}")
    if "ks_pvalue" in scores:
        d, p = scores["ks_statistic"], scores["ks_pvalue"]
        if p < t.ks_pvalue and d >= t.ks_min_statistic:
            raise_to("alert", f"KS D={d:.3f} ≥ {t.ks_min_statistic}, p={p:.2g} < {t.ks_pvalue}")
    for key, limit in (("wasserstein", t.wasserstein), ("jensenshannon", t.jensenshannon)):
        if key in scores and scores[key] >= limit:
            raise_to("alert", f"{key} {scores[key]:.3f} ≥ {limit}")
    for key, limit in (("chisquare_pvalue", t.chisquare_pvalue), ("z_pvalue", t.z_pvalue)):
        if key in scores and scores[key] < limit:
            raise_to("alert", f"{key.replace('_pvalue', '')} p={scores[key]:.2g} < {limit}")
    share_ref = nulls_ref / rows_ref if rows_ref else 0.0
    share_cur = nulls_cur / rows_cur if rows_cur else 0.0
    if abs(share_cur - share_ref) > t.max_null_share_delta:
        raise_to("warn", f"null share moved {share_ref:.1%} → {share_cur:.1%}")
    if isinstance(pair, NumericPair):
        details["constant_ref"] = bool(pair.ref.min() == pair.ref.max())
        details["constant_cur"] = bool(pair.cur.min() == pair.cur.max())
    if config.decision == "bounded":
        bound = bounded_effect(pair, config.min_effect_for(name), config.daily_alpha if alpha is None else alpha,
                               config.max_categories)
        status = _bounded_status(status, bound, reasons)
        details["bounded"] = bound.to_dict()  # the radii and δ behind the decision, kept with the run's record
        return FeatureDrift(name, kind, status, scores, n_ref, n_cur, nulls_ref, nulls_cur, tuple(reasons), details,
                            bound.metric, bound.effect, bound.lower, bound.detectable)
    if min(n_ref, n_cur) < t.min_samples:
        reasons.insert(0, f"only {min(n_ref, n_cur)} non-null values (< {t.min_samples}): not judged")
        status = "insufficient_data"
    return FeatureDrift(name, kind, status, scores, n_ref, n_cur, nulls_ref, nulls_cur, tuple(reasons), details)


def _bounded_status(thresholds_status: str, bound: BoundedEffect, reasons: list[str]) -> str:
    """The bounded decision's status: alert only when the effect is shown beyond the minimum; what the
    thresholds would alert on otherwise stays visible as a warning (evidence, not a decision)."""
    reasons.insert(0, bound.reason())
    if bound.drifted:
        return "alert"
    if not bound.decidable:
        reasons.insert(0, "too few values to show any effect: not judged")
        return "insufficient_data"
    return "warn" if thresholds_status in ("warn", "alert") else "ok"


def with_thresholds(config: DriftConfig, **overrides: Any) -> DriftConfig:
    """A copy of `config` with some default thresholds changed."""
    return replace(config, thresholds=replace(config.thresholds, **overrides))
