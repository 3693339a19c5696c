"""Evaluation of served predictions against delayed labels: per arm, and champion vs shadow on the same requests.

Serving logs (`platform/quiver/serving/logs/writer.py`) are joined with delayed labels (`monitoring/labels.py`) on
`request_id`. A shadow row carries the request_id of the champion row it mirrors, so the comparison is
*paired*: both models scored the very same feature vector, and per-request differences cancel the noise of
which requests happened to come in.

Shadow verdict, on the primary metric (log loss by default; lower is better), from the paired difference
d = loss(shadow) − loss(champion) and its (1 − α) **confidence sequence** [lo, hi], against the
non-inferiority margin m:

    better       hi < 0                      (significantly better)
    not worse    hi < m                      (non-inferior: at most m worse, with confidence)
    worse        lo > f·m                    (the whole interval beyond f = `fail_fraction` of the margin)
    inconclusive otherwise, or fewer than `min_pairs` labelled pairs

The shadow is judged again every day until it is not inconclusive, so the interval must stay valid however
often it is read: it is the normal-mixture confidence sequence (`quiver.monitoring.sequential`) with τ = m on
the mean paired difference (run at τ, 10τ and 100τ, each at α/3, and intersected, so a challenger far worse
than the margin is caught quickly too), whose variance is cluster-robust over entities and calls
(`quiver.monitoring.clustered`) — a request's rows share a label and a user's requests share their risk, so
rows are not independent. AUC comes with a paired bootstrap interval (resampling requests, seeded, so a
rerun gives the same numbers), as information, not as the verdict.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa

from quiver.offline.store import store_for

if TYPE_CHECKING:
    from quiver.config import Config

FloatArray = npt.NDArray[np.float64]
_EPS = float(np.finfo(np.float64).eps)
VERDICTS = ("better", "not worse", "worse", "inconclusive")


# ----- per-row losses and whole-sample metrics -----


def log_losses(scores: FloatArray, labels: FloatArray) -> FloatArray:
    """Per-row binary log loss, scores clipped to [eps, 1 − eps] as scikit-learn does."""
    p = np.clip(np.asarray(scores, dtype=np.float64), _EPS, 1 - _EPS)
    y = np.asarray(labels, dtype=np.float64)
    return -(y * np.log(p) + (1 - y) * np.log1p(-p))


def brier_losses(scores: FloatArray, labels: FloatArray) -> FloatArray:
    return (np.asarray(scores, dtype=np.float64) - np.asarray(labels, dtype=np.float64)) ** 2


def auc(scores: FloatArray, labels: FloatArray) -> float:
    """ROC AUC via the Mann–Whitney rank sum (ties get mid-ranks); NaN when one class is absent."""
    from scipy.stats import rankdata

    y = np.asarray(labels) > 0.5
    positives = int(y.sum())
    negatives = len(y) - positives
    if positives == 0 or negatives == 0:
        return float("nan")
    ranks = rankdata(scores)
    return float((ranks[y].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def _bootstrap_auc(scores_a: FloatArray, scores_b: FloatArray, labels: FloatArray, draws: int,
                   seed: int) -> FloatArray:
    """AUC(a) − AUC(b) on `draws` paired resamples of the rows (the same rows for both models)."""
    from scipy.stats import rankdata

    rng = np.random.default_rng(seed)
    n = len(labels)
    y = np.asarray(labels) > 0.5
    out = np.empty(draws)
    for i in range(draws):
        idx = rng.integers(0, n, n)
        yy = y[idx]
        pos = int(yy.sum())
        neg = n - pos
        if pos == 0 or neg == 0:
            out[i] = np.nan
            continue
        ra = rankdata(scores_a[idx])
        rb = rankdata(scores_b[idx])
        base = pos * (pos + 1) / 2
        out[i] = ((ra[yy].sum() - base) - (rb[yy].sum() - base)) / (pos * neg)
    return out


def calibration(scores: FloatArray, labels: FloatArray, bins: int = 10) -> dict[str, Any]:
    """Expected calibration error over `bins` equal-width bins, plus the reliability table."""
    p = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    which = np.minimum((p * bins).astype(np.int64), bins - 1)
    counts = np.bincount(which, minlength=bins)
    mean_score = np.bincount(which, weights=p, minlength=bins)
    positives = np.bincount(which, weights=y, minlength=bins)
    filled = counts > 0
    ece = float(np.sum(np.abs(positives[filled] - mean_score[filled])) / max(len(p), 1))
    table = [{"bin": int(b), "count": int(counts[b]), "mean_score": float(mean_score[b] / counts[b]),
              "positive_rate": float(positives[b] / counts[b])} for b in np.flatnonzero(filled)]
    return {"ece": ece, "mean_score": float(p.mean()) if len(p) else float("nan"),
            "positive_rate": float(y.mean()) if len(y) else float("nan"), "bins": table}


# ----- joining logs and labels -----


def join_labels(logs: pa.Table, labels: pa.Table) -> pd.DataFrame:
    """Serving-log rows with their label (NaN when none arrived yet) and its `arrived_at`, one row per logged
    row; entity key columns (`key.*`) are kept, feature columns are not."""
    wanted = ["ts", "request_id", "call_id", "model_version", "arm", "latency_ms", "prediction", "error",
              "rollout_id", "rollout_step", "canary_fraction", *(c for c in logs.column_names if c.startswith("key."))]
    present = [c for c in wanted if c in logs.column_names]
    frame = logs.select(present).to_pandas()
    if "error" not in frame:
        frame["error"] = ""
    frame["error"] = frame["error"].fillna("")
    label_frame = labels.select([c for c in ("request_id", "label", "arrived_at")
                                 if c in labels.column_names]).to_pandas()
    if label_frame["request_id"].duplicated().any():
        raise ValueError("labels must hold one row per request_id (use quiver.monitoring.labels.read_labels)")
    return frame.merge(label_frame, on="request_id", how="left")


@dataclass(frozen=True)
class ArmMetrics:
    """Quality and service figures of one (arm, model version) over the joined rows."""

    arm: str
    model_version: str
    rows: int
    errors: int
    labeled: int
    error_rate: float
    log_loss: float
    brier: float
    auc: float
    ece: float
    mean_score: float
    positive_rate: float
    latency_p50_ms: float
    latency_p99_ms: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def arm_metrics(joined: pd.DataFrame, calibration_bins: int = 10) -> list[ArmMetrics]:
    """ArmMetrics per (arm, model_version), sorted by arm then version."""
    out = []
    for (arm, version), group in joined.groupby(["arm", "model_version"], sort=True):
        failed = (group["error"] != "") | group["prediction"].isna()
        ok = group[~failed]
        labeled = ok[ok["label"].notna()]
        p = labeled["prediction"].to_numpy(np.float64)
        y = labeled["label"].to_numpy(np.float64)
        nan = float("nan")
        latency = group["latency_ms"].to_numpy(np.float64)
        out.append(ArmMetrics(
            arm=str(arm), model_version=str(version), rows=len(group), errors=int(failed.sum()),
            labeled=len(labeled), error_rate=float(failed.mean()),
            log_loss=float(log_losses(p, y).mean()) if len(y) else nan,
            brier=float(brier_losses(p, y).mean()) if len(y) else nan,
            auc=auc(p, y) if len(y) else nan,
            ece=calibration(p, y, calibration_bins)["ece"] if len(y) else nan,
            mean_score=float(ok["prediction"].mean()) if len(ok) else nan,
            positive_rate=float(y.mean()) if len(y) else nan,
            latency_p50_ms=float(np.percentile(latency, 50)) if len(latency) else nan,
            latency_p99_ms=float(np.percentile(latency, 99)) if len(latency) else nan,
        ))
    return out


def evaluate(config: Config, model_name: str | None = None, *, start: datetime | None = None,
             end: datetime | None = None, as_of: datetime | None = None) -> list[ArmMetrics]:
    """`quiver evaluate`: serving logs ⋈ labels per arm and model version (optionally one model's rows)."""
    from quiver.monitoring.labels import read_labels
    from quiver.serving.logs import read_serving_logs

    logs = _model_rows(read_serving_logs(store_for(config), start, end), model_name)
    return arm_metrics(join_labels(logs, read_labels(store_for(config), as_of)))


def _model_rows(logs: pa.Table, model_name: str | None) -> pa.Table:
    if model_name is None or logs.num_rows == 0:
        return logs
    import pyarrow.compute as pc

    return logs.filter(pc.starts_with(logs["model_version"], f"{model_name}:"))


# ----- champion vs shadow -----


@dataclass(frozen=True)
class ShadowSettings:
    """How a shadow is judged: primary metric, non-inferiority margin, confidence, bootstrap draws."""

    metric: str = "log_loss"  # or "brier"
    margin: float = 0.01  # in units of the metric: how much worse still counts as "not worse"
    fail_fraction: float = 0.5  # "worse" = the whole interval beyond this share of the margin
    alpha: float = 0.05
    min_pairs: int = 200
    bootstrap: int = 1000
    seed: int = 0
    calibration_bins: int = 10

    def __post_init__(self) -> None:
        if self.metric not in ("log_loss", "brier"):
            raise ValueError(f"shadow metric must be log_loss or brier, got {self.metric!r}")
        if self.margin < 0 or not 0 < self.alpha < 1 or self.min_pairs < 2 or self.bootstrap < 0:
            raise ValueError("need margin >= 0, 0 < alpha < 1, min_pairs >= 2, bootstrap >= 0")
        if not 0 < self.fail_fraction <= 1:
            raise ValueError("fail_fraction must lie in (0, 1]")


@dataclass(frozen=True)
class PairedDifference:
    """Mean of per-row differences (shadow − champion) with an anytime-valid confidence sequence."""

    n: int
    champion: float
    shadow: float
    difference: float
    lower: float
    upper: float
    entities: int = 0
    calls: int = 0

    @classmethod
    def of(cls, shadow: FloatArray, champion: FloatArray, alpha: float, *, tau: float,
           entity: npt.NDArray[np.int64] | None = None, call: npt.NDArray[np.int64] | None = None) -> PairedDifference:
        """`entity` / `call`: cluster codes per row (default: every row its own unit)."""
        from quiver.monitoring.clustered import ClusteredMean
        from quiver.monitoring.sequential import mixture_interval

        d = shadow - champion
        n = len(d)
        nan = float("nan")
        if n < 2:
            return cls(n, float(champion.mean()) if n else nan, float(shadow.mean()) if n else nan,
                       float(d.mean()) if n else nan, nan, nan)
        rows = np.arange(n, dtype=np.int64)
        mean = ClusteredMean().extend(d, rows if entity is None else entity, rows if call is None else call)
        variance = mean.variance()
        lower = upper = nan
        if math.isfinite(variance):
            cs = mixture_interval(mean.mean, variance, tau=tau, alpha=alpha, scales=3)
            lower, upper = cs.lower, cs.upper
        return cls(n, float(champion.mean()), float(shadow.mean()), mean.mean, lower, upper, mean.entities,
                   mean.calls)


@dataclass(frozen=True)
class ShadowEvaluation:
    """Champion vs shadow on the same requests, with the verdict and every number behind it."""

    model: str
    champion_version: str
    shadow_version: str
    verdict: str
    settings: ShadowSettings
    pairs: int  # requests scored by both (labelled or not)
    labeled_pairs: int
    log_loss: PairedDifference
    brier: PairedDifference
    auc: dict[str, float]
    calibration: dict[str, Any]
    latency: dict[str, float]
    errors: dict[str, Any]
    reason: str = ""
    decision_id: int | None = field(default=None, compare=False)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("decision_id")
        return dict(_finite_json(out))


def verdict_of(diff: PairedDifference, margin: float, min_pairs: int,
               fail_fraction: float = 0.5) -> tuple[str, str]:
    """(verdict, reason) from a paired difference of a lower-is-better metric (see the module docstring)."""
    if diff.n < min_pairs or not math.isfinite(diff.upper):
        return "inconclusive", f"{diff.n} labelled pairs, need {min_pairs}"
    if diff.upper < 0:
        return "better", f"upper bound {diff.upper:.5g} < 0"
    if diff.upper < margin:
        return "not worse", f"upper bound {diff.upper:.5g} < margin {margin:g}"
    if diff.lower > fail_fraction * margin:
        return "worse", (f"lower bound {diff.lower:.5g} > {fail_fraction:g} × margin {margin:g} "
                         f"(difference {diff.difference:.5g})")
    return "inconclusive", f"interval [{diff.lower:.5g}, {diff.upper:.5g}] straddles the decision bounds"


def compare_shadow(champion_scores: FloatArray, shadow_scores: FloatArray, labels: FloatArray, *,
                   settings: ShadowSettings | None = None, model: str = "", champion_version: str = "",
                   shadow_version: str = "", champion_latency_ms: FloatArray | None = None,
                   shadow_latency_ms: FloatArray | None = None, errors: dict[str, Any] | None = None,
                   pairs: int | None = None, entity: npt.NDArray[np.int64] | None = None,
                   call: npt.NDArray[np.int64] | None = None) -> ShadowEvaluation:
    """The paired comparison on aligned arrays (row i = the same request in both); labels NaN = not yet in.
    `entity` / `call`: each row's routing unit and model call, for the clustered variance."""
    settings = settings or ShadowSettings()
    champion = np.asarray(champion_scores, dtype=np.float64)
    shadow = np.asarray(shadow_scores, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    if not (len(champion) == len(shadow) == len(y)):
        raise ValueError("champion scores, shadow scores and labels must be aligned (same length)")
    has = ~np.isnan(y)
    c, s, yl = champion[has], shadow[has], y[has]
    units = {"entity": None if entity is None else np.asarray(entity, np.int64)[has],
             "call": None if call is None else np.asarray(call, np.int64)[has]}
    tau = settings.margin or 0.01
    ll = PairedDifference.of(log_losses(s, yl), log_losses(c, yl), settings.alpha, tau=tau, **units)
    br = PairedDifference.of(brier_losses(s, yl), brier_losses(c, yl), settings.alpha, tau=tau, **units)
    auc_c, auc_s = auc(c, yl), auc(s, yl)
    auc_stats = {"champion": auc_c, "shadow": auc_s, "difference": auc_s - auc_c,
                 "lower": float("nan"), "upper": float("nan")}
    if settings.bootstrap and len(yl) >= 2 and math.isfinite(auc_c):
        draws = _bootstrap_auc(s, c, yl, settings.bootstrap, settings.seed)
        draws = draws[np.isfinite(draws)]
        if len(draws):
            auc_stats["lower"] = float(np.quantile(draws, settings.alpha / 2))
            auc_stats["upper"] = float(np.quantile(draws, 1 - settings.alpha / 2))
    primary = ll if settings.metric == "log_loss" else br
    verdict, reason = verdict_of(primary, settings.margin, settings.min_pairs, settings.fail_fraction)
    latency: dict[str, float] = {}
    for arm, values in (("champion", champion_latency_ms), ("shadow", shadow_latency_ms)):
        if values is not None and len(values):
            latency[f"{arm}_p50_ms"] = float(np.percentile(values, 50))
            latency[f"{arm}_p99_ms"] = float(np.percentile(values, 99))
    return ShadowEvaluation(
        model=model, champion_version=champion_version, shadow_version=shadow_version, verdict=verdict,
        settings=settings, pairs=len(y) if pairs is None else pairs, labeled_pairs=int(has.sum()), log_loss=ll,
        brier=br, auc=auc_stats,
        calibration={"champion": calibration(c, yl, settings.calibration_bins),
                     "shadow": calibration(s, yl, settings.calibration_bins)} if len(yl) else {},
        latency=latency, errors=errors or {}, reason=reason)


def shadow_pairs(joined: pd.DataFrame, champion_version: str, shadow_version: str) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Aligned champion/shadow rows by request_id, and the error/coverage counts of the shadow arm."""
    champ = joined[(joined["arm"] == "champion") & (joined["model_version"] == champion_version)]
    shadow = joined[(joined["arm"] == "shadow") & (joined["model_version"] == shadow_version)]
    shadow_failed = (shadow["error"] != "") | shadow["prediction"].isna()
    champ_ok = champ[(champ["error"] == "") & champ["prediction"].notna()].drop_duplicates("request_id")
    shadow_ok = shadow[~shadow_failed].drop_duplicates("request_id")
    pairs = champ_ok.merge(shadow_ok[["request_id", "prediction", "latency_ms"]], on="request_id",
                           suffixes=("_champion", "_shadow"))
    errors = {"shadow_rows": len(shadow), "shadow_errors": int(shadow_failed.sum()),
              "shadow_error_rate": float(shadow_failed.mean()) if len(shadow) else float("nan"),
              "champion_rows": len(champ),
              "champion_rows_without_shadow": int(len(champ_ok) - len(pairs))}
    return pairs.sort_values("request_id", kind="stable").reset_index(drop=True), errors


def evaluate_shadow(config: Config, model_name: str, *, champion_version: int | None = None,
                    shadow_version: int | None = None, start: datetime | None = None,
                    end: datetime | None = None, as_of: datetime | None = None,
                    settings: ShadowSettings | None = None, record: bool = True) -> ShadowEvaluation:
    """Champion vs shadow of `model_name` from serving logs ⋈ labels, recorded in the registry.

    Versions default to the current `champion` and `shadow` aliases. `as_of` (default: now) fixes which labels
    count, so the same call replayed later gives the same numbers; recording is idempotent on
    (model, versions, window, as_of, settings).
    """
    from datetime import UTC

    from quiver.monitoring.labels import read_labels
    from quiver.serving.logs import read_serving_logs

    settings = settings or ShadowSettings()
    as_of = as_of or datetime.now(UTC)
    registry = None
    if champion_version is None or shadow_version is None:
        registry = _model_registry(config)
        aliases = registry.aliases(model_name)
        champion_version = champion_version if champion_version is not None else aliases.get("champion")
        shadow_version = shadow_version if shadow_version is not None else aliases.get("shadow")
        if champion_version is None or shadow_version is None:
            from quiver.catalog.errors import QuiverError

            raise QuiverError(f"model {model_name!r} needs a champion and a shadow alias to evaluate a shadow "
                              f"(aliases now: {aliases or 'none'})")
    end = end or as_of
    logs = _model_rows(read_serving_logs(store_for(config), start, end), model_name)
    joined = join_labels(logs, read_labels(store_for(config), as_of))
    champion_label, shadow_label = f"{model_name}:{champion_version}", f"{model_name}:{shadow_version}"
    pairs, errors = shadow_pairs(joined, champion_label, shadow_label)
    if not int(pairs["label"].notna().sum()):  # a verdict over no labelled pairs is not evidence: never recorded
        from quiver.catalog.errors import NoRowsError
        from quiver.serving.logs.read import span_hint

        raise NoRowsError(f"no rows compared: {len(pairs):,} requests scored by both {champion_label} and "
                          f"{shadow_label} before {end.isoformat()}, none labelled as of {as_of.isoformat()}; "
                          f"{span_hint(store_for(config))}")
    entity, call = _units(pairs)
    result = compare_shadow(
        pairs["prediction_champion"].to_numpy(np.float64), pairs["prediction_shadow"].to_numpy(np.float64),
        pairs["label"].to_numpy(np.float64), settings=settings, model=model_name,
        champion_version=champion_label, shadow_version=shadow_label,
        champion_latency_ms=pairs["latency_ms_champion"].to_numpy(np.float64),
        shadow_latency_ms=pairs["latency_ms_shadow"].to_numpy(np.float64), errors=errors, entity=entity, call=call)
    if not record:
        return result
    from quiver.registry import rollouts

    window = {"start": start.isoformat() if start else None, "end": end.isoformat(), "as_of": as_of.isoformat()}
    stats = {**result.to_dict(), "window": window}
    key = idempotency_key("shadow", model_name, champion_label, shadow_label, window, asdict(settings))
    decision = rollouts.record_decision(_registry(config), model_name, kind="shadow_evaluation",
                                        outcome=result.verdict, statistics=stats, idempotency_key=key,
                                        champion_version=champion_label, candidate_version=shadow_label)
    return _with_decision(result, decision.id)


def _units(pairs: pd.DataFrame) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Cluster codes of paired rows: the entity (the first key logged: the online read's first join key, which
    canary routing also hashes) and the champion's call."""
    keys = [c for c in pairs.columns if c.startswith("key.")]
    entity = pd.factorize(pairs[keys[0]].astype(str))[0] if keys else np.arange(len(pairs))
    calls = pairs["call_id"].fillna("").astype(str) if "call_id" in pairs else pd.Series([""] * len(pairs))
    calls = calls.where(calls != "", "row:" + pairs["request_id"].astype(str))
    return np.asarray(entity, np.int64), np.asarray(pd.factorize(calls)[0], np.int64)


def _with_decision(result: ShadowEvaluation, decision_id: int) -> ShadowEvaluation:
    from dataclasses import replace

    return replace(result, decision_id=decision_id)


def idempotency_key(*parts: Any) -> str:
    """A stable digest of what a decision was computed from: the same inputs give the same key."""
    blob = json.dumps(parts, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def _finite_json(value: Any) -> Any:
    # NaN/inf are not JSON; store null so every database and reader agrees.
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite_json(v) for v in value]
    if isinstance(value, np.floating | np.integer):
        return _finite_json(value.item())
    return value


def _registry(config: Config) -> Any:
    from quiver.registry import Registry

    return Registry(config.registry, project=config.project)


def _model_registry(config: Config) -> Any:
    from quiver.artifacts import ArtifactStore
    from quiver.registry.models import ModelRegistry

    return ModelRegistry(_registry(config), ArtifactStore.from_config(config))
