"""`quiver evaluate`: served predictions against delayed labels, per arm and version, with 95 % intervals and
the window the numbers cover.

Rows are not independent: a model call scores several rows together and an entity (the routing unit) comes
back many times. So every interval treats the unit that was randomised as the unit: the error rate is a
share of **calls** (Wilson interval); log loss and Brier get the two-way (entity × call) cluster-robust
variance of `quiver.monitoring.clustered`; AUC a bootstrap that resamples whole entities (seeded, so a rerun
prints the same interval). These are fixed-sample intervals for one look, not the sequential ones the judge
uses when it looks again and again.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from quiver.catalog.errors import NoRowsError, QuiverError
from quiver.monitoring.evaluation import ArmMetrics, arm_metrics, brier_losses, join_labels, log_losses
from quiver.offline.store import store_for

if TYPE_CHECKING:
    from quiver.config import Config

Z95 = 1.959963984540054
BOOTSTRAP_DRAWS = 200


@dataclass(frozen=True)
class ArmEvaluation:
    """One (arm, version): its figures, their 95 % intervals, and the served rows' time span."""

    metrics: ArmMetrics
    intervals: dict[str, tuple[float, float]]
    calls: int
    failed_calls: int
    entities: int
    first_served: str | None
    last_served: str | None

    @property
    def call_error_rate(self) -> float:
        """Share of model calls with a failed row (the unit the interval is over)."""
        return self.failed_calls / self.calls if self.calls else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {**self.metrics.to_dict(), "intervals": {k: list(v) for k, v in self.intervals.items()},
                "calls": self.calls, "failed_calls": self.failed_calls, "call_error_rate": self.call_error_rate,
                "entities": self.entities, "first_served": self.first_served, "last_served": self.last_served}


@dataclass(frozen=True)
class Evaluation:
    """What `quiver evaluate` prints: the asked window, what the rows actually span, the labels' moment."""

    model: str | None
    start: str | None
    end: str | None
    labels_as_of: str | None
    rows: int
    first_served: str | None
    last_served: str | None
    arms: list[ArmEvaluation] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["arms"] = [a.to_dict() for a in self.arms]
        return out


def wilson(successes: int, n: int) -> tuple[float, float]:
    """95 % Wilson score interval of a share (NaNs when n is 0)."""
    if n == 0:
        return float("nan"), float("nan")
    p = successes / n
    centre = (p + Z95 ** 2 / (2 * n)) / (1 + Z95 ** 2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95 ** 2 / (4 * n * n)) / (1 + Z95 ** 2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _clustered(values: npt.NDArray[np.float64], entity: npt.NDArray[np.int64],
               call: npt.NDArray[np.int64]) -> tuple[float, float]:
    from quiver.monitoring.clustered import ClusteredMean

    if len(values) < 2:
        return float("nan"), float("nan")
    mean = ClusteredMean().extend(values, entity, call)
    variance = mean.variance()
    if not math.isfinite(variance):
        return float("nan"), float("nan")
    half = Z95 * math.sqrt(max(variance, 0.0))
    return mean.mean - half, mean.mean + half


def entity_bootstrap_auc(scores: npt.NDArray[np.float64], labels: npt.NDArray[np.float64],
                         entity: npt.NDArray[np.int64], draws: int = BOOTSTRAP_DRAWS,
                         seed: int = 0) -> tuple[float, float]:
    """95 % percentile interval of AUC over bootstrap resamples of whole entities (O(rows) per draw)."""
    y = labels > 0.5
    if len(y) < 2 or y.all() or not y.any():
        return float("nan"), float("nan")
    order = np.argsort(scores, kind="stable")
    sorted_scores = scores[order]
    group = np.concatenate([[0], np.cumsum(sorted_scores[1:] != sorted_scores[:-1])])
    groups = int(group[-1]) + 1
    y_sorted, entity_sorted = y[order].astype(np.float64), entity[order]
    units = int(entity.max()) + 1
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(draws):
        weight = np.bincount(rng.integers(0, units, units), minlength=units)[entity_sorted].astype(np.float64)
        pos = np.bincount(group, weight * y_sorted, minlength=groups)
        neg = np.bincount(group, weight * (1 - y_sorted), minlength=groups)
        total_pos, total_neg = pos.sum(), neg.sum()
        if total_pos == 0 or total_neg == 0:
            continue
        below = np.cumsum(neg) - neg
        out.append(float(np.sum(pos * (below + neg / 2)) / (total_pos * total_neg)))
    if not out:
        return float("nan"), float("nan")
    return float(np.quantile(out, 0.025)), float(np.quantile(out, 0.975))


def _codes(frame: pd.DataFrame) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    keys = [c for c in frame.columns if c.startswith("key.")]
    entity = pd.factorize(frame[keys].astype(str).agg("|".join, axis=1))[0] if keys else np.arange(len(frame))
    calls = frame["call_id"].fillna("").astype(str) if "call_id" in frame else pd.Series([""] * len(frame),
                                                                                          index=frame.index)
    calls = calls.where(calls != "", "row:" + frame["request_id"].astype(str))
    return np.asarray(entity, np.int64), np.asarray(pd.factorize(calls)[0], np.int64)


def _iso(value: Any) -> str | None:
    if value is None or (isinstance(value, float) and math.isnan(value)) or pd.isna(value):
        return None
    return pd.Timestamp(value).isoformat()


def arm_evaluations(joined: pd.DataFrame) -> list[ArmEvaluation]:
    """Figures and intervals per (arm, version) of joined serving-log rows (`join_labels`)."""
    out = []
    by_arm = {(m.arm, m.model_version): m for m in arm_metrics(joined)}
    for (arm, version), group in joined.groupby(["arm", "model_version"], sort=True):
        entity, call = _codes(group)
        failed = ((group["error"] != "") | group["prediction"].isna()).to_numpy()
        per_call = pd.Series(failed).groupby(call).max()
        labelled = ~failed & group["label"].notna().to_numpy()
        p = group["prediction"].to_numpy(np.float64)[labelled]
        y = group["label"].to_numpy(np.float64)[labelled]
        e, c = entity[labelled], call[labelled]
        intervals = {"error_rate_calls": wilson(int(per_call.sum()), len(per_call)),
                     "log_loss": _clustered(log_losses(p, y), e, c), "brier": _clustered(brier_losses(p, y), e, c),
                     "auc": entity_bootstrap_auc(p, y, pd.factorize(e)[0].astype(np.int64)) if len(y) else
                     (float("nan"), float("nan"))}
        ts = group["ts"] if "ts" in group else pd.Series(dtype="datetime64[ns, UTC]")
        out.append(ArmEvaluation(by_arm[(str(arm), str(version))], intervals, len(per_call), int(per_call.sum()),
                                 len(np.unique(entity)), _iso(ts.min()), _iso(ts.max())))
    return out


def evaluate_window(config: Config, model_name: str | None = None, *, start: datetime | None = None,
                    end: datetime | None = None, as_of: datetime | None = None) -> Evaluation:
    """Serving logs of [start, end) ⋈ labels known at `as_of`, per arm and model version (one model's rows
    when named; an unknown model is an error naming the closest one)."""
    from quiver.monitoring.evaluation import _model_rows
    from quiver.monitoring.labels import read_labels
    from quiver.serving.logs import read_serving_logs

    if model_name is not None:
        from quiver.registry import Registry
        from quiver.registry.models import ModelRegistry

        ModelRegistry(Registry(config.registry, project=config.project)).require(model_name)
    if start is not None and end is not None and end <= start:
        raise QuiverError(f"the window is empty: --end {end.isoformat()} is not after --start {start.isoformat()}")
    logs = _model_rows(read_serving_logs(store_for(config), start, end), model_name)
    if logs.num_rows == 0:  # an evaluation of nothing is not evidence: say where the rows are instead
        from quiver.serving.logs.read import span_hint

        asked = f"[{start.isoformat() if start else 'first log'}, {end.isoformat() if end else 'last log'})"
        raise NoRowsError(f"no rows evaluated: no serving-log rows{' of ' + repr(model_name) if model_name else ''} "
                          f"in {asked}; {span_hint(store_for(config))}")
    joined = join_labels(logs, read_labels(store_for(config), as_of))
    arms = arm_evaluations(joined) if len(joined) else []
    ts = joined["ts"] if "ts" in joined and len(joined) else None
    return Evaluation(model_name, start.isoformat() if start else None, end.isoformat() if end else None,
                      as_of.isoformat() if as_of else None, len(joined),
                      _iso(ts.min()) if ts is not None else None, _iso(ts.max()) if ts is not None else None, arms)
