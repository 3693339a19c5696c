"""The canary judge: advance, hold, promote, roll back or halt a rollout, one step at a time.

A rollout moves the canary's traffic share through `steps` (default 5 % → 25 % → 50 % → 100 %). Each call
judges the *current* step on the traffic logged since it began, comparing the two arms that ran side by side
(concurrent traffic, so time-of-day and feature drift hit both alike):

* sample-ratio mismatch — distinct entities per arm against the configured split, by the anytime-valid
  multinomial test (the chi-square statistic is reported too). A mismatch means routing or logging is broken
  and every other number is suspect: the rollout **halts** (canary removed, alert).
* guardrails, canary − champion, each with a floor of practical difference:
  error rate; p99 latency (the share of canary rows slower than the champion's p99, which is 1 % when they are
  alike); score distribution shift (PSI over the champion's score deciles); once labels are in, log loss and
  Brier. Differences of means use the mixture SPRT of `quiver.monitoring.sequential`, whose confidence sequence stays
  valid when the judge looks after every batch. The rollout's α is split evenly over guardrails × judged steps.

A guardrail **fails** only when the difference is significant (its confidence sequence lies above 0) *and*
its estimate is beyond the floor; it **passes** when the confidence sequence shows the canary at most `floor`
worse (PSI, which has no confidence sequence, passes once both arms have `min_rows` and the shift is below
its floor); otherwise it **waits**. No data is never a pass. Outcome: any failure → rollback; all pass →
advance (promote when the next step is 100 %); still waiting after `max_canary_rows` canary rows → rollback
(a canary that cannot be shown within its floors does not ship); else hold.

`judge(...)` is the pure decision on per-arm sufficient statistics (`ArmStats`), used as-is by
`benchmarks/canary_judge.py`; `judge_step(config, model_name)` reads the registry and the logs, decides,
records the decision (idempotently) and applies it.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from quiver.catalog.errors import QuiverError
from quiver.monitoring.sequential import mean_var, mixture_difference, multinomial_sequential, proportion_var
from quiver.registry import Registry, rollouts
from quiver.registry.rollouts import Decision, Rollout

if TYPE_CHECKING:
    import pandas as pd

    from quiver.config import Config

FloatArray = npt.NDArray[np.float64]
# Log-spaced latency bins, 0.01 ms … 100 s, ~6 % wide: p99 and exceedance counts from mergeable counts.
LATENCY_EDGES_MS = np.geomspace(0.01, 100_000.0, 281)
OUTCOMES = ("advance", "hold", "promote", "rollback", "halt")
GUARDRAILS = ("error_rate", "latency_p99", "score_psi", "log_loss", "brier")


@dataclass(frozen=True)
class JudgeSettings:
    """Steps, error budget and floors of one rollout (stored with it, so every step judges alike)."""

    steps: tuple[float, ...] = (0.05, 0.25, 0.5, 1.0)
    alpha: float = 0.05  # false-rollback budget of a whole rollout
    srm_alpha: float = 0.001
    min_rows: int = 500  # per arm and step before any guardrail may pass
    min_labels: int = 200  # labelled rows per arm and step before log loss / Brier may pass
    # A step still undecided when its canary has this many rows (labelled rows, when labels are required)
    # rolls back: the canary could not be shown to be within its floors.
    max_canary_rows: int = 120_000
    require_labels: bool = True
    error_rate_floor: float = 0.01
    latency_exceedance_floor: float = 0.01  # share of canary rows above the champion's p99, beyond its 1 %
    latency_p99_floor_ms: float = 2.0
    psi_floor: float = 0.2
    log_loss_floor: float = 0.02
    brier_floor: float = 0.01
    score_bins: int = 10

    def __post_init__(self) -> None:
        steps = tuple(float(s) for s in self.steps)
        object.__setattr__(self, "steps", steps)
        rising = all(0 < a < b for a, b in itertools.pairwise(steps))
        if len(steps) < 2 or steps[-1] != 1.0 or steps[0] <= 0 or not rising:
            raise ValueError(f"steps must rise strictly from above 0 to 1.0, got {list(steps)}")
        if not 0 < self.alpha < 1 or not 0 < self.srm_alpha < 1:
            raise ValueError("alpha and srm_alpha must lie in (0, 1)")
        if self.min_rows < 2 or self.min_labels < 2 or self.score_bins < 2 or self.max_canary_rows < self.min_rows:
            raise ValueError("min_rows, min_labels and score_bins must be at least 2")
        for name in ("error_rate_floor", "latency_exceedance_floor", "latency_p99_floor_ms", "psi_floor",
                     "log_loss_floor", "brier_floor"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")

    @property
    def test_alpha(self) -> float:
        """α of one guardrail test: the rollout's budget over guardrails × steps with a champion to compare."""
        return self.alpha / (len(GUARDRAILS) * (len(self.steps) - 1))

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["steps"] = list(self.steps)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JudgeSettings:
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown judge settings {sorted(unknown)}; known: {sorted(known)}")
        values = dict(data)
        if "steps" in values:
            values["steps"] = tuple(values["steps"])
        return cls(**values)


@dataclass
class ArmStats:
    """Mergeable sufficient statistics of one arm in one step."""

    rows: int = 0
    entities: int = 0  # distinct routing units (entity keys): the unit of the sample-ratio check
    errors: int = 0
    labeled: int = 0
    log_loss_sum: float = 0.0
    log_loss_sq: float = 0.0
    brier_sum: float = 0.0
    brier_sq: float = 0.0
    latency_counts: npt.NDArray[np.int64] = field(
        default_factory=lambda: np.zeros(len(LATENCY_EDGES_MS) + 1, dtype=np.int64))
    score_counts: npt.NDArray[np.int64] | None = None

    @classmethod
    def from_arrays(cls, scores: FloatArray, labels: FloatArray, latency_ms: FloatArray,
                    errors: npt.NDArray[np.bool_], entities: int, score_edges: FloatArray) -> ArmStats:
        """Statistics of rows: `scores` NaN where the model failed, `labels` NaN where none arrived yet.
        `latency_ms` holds one value per request (rows scored together share one latency), so it may be
        shorter than `scores`."""
        from quiver.monitoring.evaluation import brier_losses, log_losses

        scores = np.asarray(scores, dtype=np.float64)
        labels = np.asarray(labels, dtype=np.float64)
        failed = np.asarray(errors, dtype=bool) | np.isnan(scores)
        ok = ~failed
        scored = scores[ok]
        use = ok & ~np.isnan(labels)
        ll = log_losses(scores[use], labels[use])
        br = brier_losses(scores[use], labels[use])
        which = np.searchsorted(LATENCY_EDGES_MS, np.asarray(latency_ms, dtype=np.float64), side="right")
        return cls(rows=len(scores), entities=int(entities), errors=int(failed.sum()), labeled=int(use.sum()),
                   log_loss_sum=float(ll.sum()), log_loss_sq=float((ll * ll).sum()), brier_sum=float(br.sum()),
                   brier_sq=float((br * br).sum()),
                   latency_counts=np.bincount(which, minlength=len(LATENCY_EDGES_MS) + 1).astype(np.int64),
                   score_counts=np.bincount(np.searchsorted(score_edges, scored, side="right"),
                                            minlength=len(score_edges) + 1).astype(np.int64))

    def merge(self, other: ArmStats) -> ArmStats:
        if self.score_counts is None:
            scores = other.score_counts
        elif other.score_counts is None:
            scores = self.score_counts
        else:
            scores = self.score_counts + other.score_counts
        return ArmStats(self.rows + other.rows, self.entities + other.entities, self.errors + other.errors,
                        self.labeled + other.labeled, self.log_loss_sum + other.log_loss_sum,
                        self.log_loss_sq + other.log_loss_sq, self.brier_sum + other.brier_sum,
                        self.brier_sq + other.brier_sq, self.latency_counts + other.latency_counts, scores)

    def latency_quantile_bin(self, q: float) -> int:
        cumulative = np.cumsum(self.latency_counts)
        return int(np.searchsorted(cumulative, q * cumulative[-1], side="left"))

    def summary(self) -> dict[str, Any]:
        return {"rows": self.rows, "entities": self.entities, "errors": self.errors, "labeled": self.labeled}


def latency_bin_upper(index: int) -> float:
    """Upper edge (ms) of a latency bin; the overflow bin reports +inf."""
    return float(LATENCY_EDGES_MS[index]) if index < len(LATENCY_EDGES_MS) else math.inf


def score_edges_from(scores: FloatArray, bins: int) -> FloatArray:
    """Inner bin edges at the quantiles of `scores` (the champion's reference), duplicates removed."""
    finite = np.asarray(scores, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    if len(finite) == 0:
        return np.linspace(0, 1, bins + 1)[1:-1]
    return np.unique(np.quantile(finite, np.linspace(0, 1, bins + 1)[1:-1]))


@dataclass(frozen=True)
class GuardrailResult:
    name: str
    status: str  # pass | fail | wait
    reason: str
    statistics: dict[str, Any]


@dataclass(frozen=True)
class StepVerdict:
    """The judge's decision on one look at one step, with every number behind it."""

    outcome: str
    reason: str
    fraction: float
    next_fraction: float | None
    srm: dict[str, Any]
    guardrails: tuple[GuardrailResult, ...]
    champion: dict[str, Any]
    canary: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        from quiver.monitoring.evaluation import _finite_json

        return dict(_finite_json({
            "outcome": self.outcome, "reason": self.reason, "fraction": self.fraction,
            "next_fraction": self.next_fraction, "srm": self.srm, "champion": self.champion,
            "canary": self.canary, "guardrails": [asdict(g) for g in self.guardrails]}))


def _difference_guardrail(name: str, mean_c: float, var_c: float, n_c: int, mean_0: float, var_0: float,
                          n_0: int, floor: float, alpha: float, extra_fail: bool = True) -> GuardrailResult:
    result = mixture_difference(mean_c, var_c, n_c, mean_0, var_0, n_0, tau=floor, alpha=alpha)
    stats = {**result.to_dict(), "floor": floor, "canary": mean_c, "champion": mean_0, "n_canary": n_c,
             "n_champion": n_0}
    if result.lower > 0 and result.estimate > floor and extra_fail:
        return GuardrailResult(name, "fail", f"canary worse by {result.estimate:.4g} (> floor {floor:g}), "
                                             f"significant: lower bound {result.lower:.4g} > 0", stats)
    if result.upper < floor:
        return GuardrailResult(name, "pass", f"at most {result.upper:.4g} worse (< floor {floor:g})", stats)
    return GuardrailResult(name, "wait", f"confidence sequence [{result.lower:.4g}, {result.upper:.4g}] "
                                         f"not yet decisive against floor {floor:g}", stats)


def _wait(name: str, reason: str, **stats: Any) -> GuardrailResult:
    return GuardrailResult(name, "wait", reason, stats)


def guardrails(champion: ArmStats, canary: ArmStats, settings: JudgeSettings) -> list[GuardrailResult]:
    """Every guardrail on one step's statistics."""
    alpha = settings.test_alpha
    out: list[GuardrailResult] = []
    n_c, n_0 = canary.rows, champion.rows
    if min(n_c, n_0) < settings.min_rows:
        for name in ("error_rate", "latency_p99", "score_psi"):
            out.append(_wait(name, f"{n_c} canary / {n_0} champion rows, need {settings.min_rows} per arm",
                             n_canary=n_c, n_champion=n_0))
    else:
        e_c, v_c = proportion_var(canary.errors, n_c)
        e_0, v_0 = proportion_var(champion.errors, n_0)
        out.append(_difference_guardrail("error_rate", e_c, v_c, n_c, e_0, v_0, n_0, settings.error_rate_floor,
                                         alpha))
        out.append(_latency(champion, canary, settings, alpha))
        out.append(_psi(champion, canary, settings, alpha))
    l_c, l_0 = canary.labeled, champion.labeled
    for name, floor, sums in (("log_loss", settings.log_loss_floor, "log_loss"),
                              ("brier", settings.brier_floor, "brier")):
        if min(l_c, l_0) < settings.min_labels:
            if settings.require_labels:
                out.append(_wait(name, f"{l_c} canary / {l_0} champion labelled rows, need {settings.min_labels}",
                                 labeled_canary=l_c, labeled_champion=l_0))
            else:
                out.append(GuardrailResult(name, "pass", "labels not required by this rollout",
                                           {"labeled_canary": l_c, "labeled_champion": l_0}))
            continue
        m_c, var_c = mean_var(getattr(canary, f"{sums}_sum"), getattr(canary, f"{sums}_sq"), l_c)
        m_0, var_0 = mean_var(getattr(champion, f"{sums}_sum"), getattr(champion, f"{sums}_sq"), l_0)
        out.append(_difference_guardrail(name, m_c, var_c, l_c, m_0, var_0, l_0, floor, alpha))
    return out


def _latency(champion: ArmStats, canary: ArmStats, settings: JudgeSettings, alpha: float) -> GuardrailResult:
    k = champion.latency_quantile_bin(0.99)
    threshold = latency_bin_upper(k)
    p99_0 = threshold
    p99_c = latency_bin_upper(canary.latency_quantile_bin(0.99))
    above_c = int(canary.latency_counts[k + 1:].sum())
    above_0 = int(champion.latency_counts[k + 1:].sum())
    n_c, n_0 = int(canary.latency_counts.sum()), int(champion.latency_counts.sum())
    if min(n_c, n_0) < 2:
        return _wait("latency_p99", "fewer than 2 requests timed in an arm", n_canary=n_c, n_champion=n_0)
    s_c, v_c = proportion_var(above_c, n_c)
    s_0, v_0 = proportion_var(above_0, n_0)
    slower = p99_c - p99_0 > settings.latency_p99_floor_ms
    result = _difference_guardrail("latency_p99", s_c, v_c, n_c, s_0, v_0, n_0,
                                   settings.latency_exceedance_floor, alpha, extra_fail=slower)
    stats = {**result.statistics, "champion_p99_ms": p99_0, "canary_p99_ms": p99_c,
             "p99_floor_ms": settings.latency_p99_floor_ms}
    return GuardrailResult(result.name, result.status, result.reason, stats)


def _psi(champion: ArmStats, canary: ArmStats, settings: JudgeSettings, alpha: float) -> GuardrailResult:
    from quiver.monitoring.stats import psi_from_shares

    assert champion.score_counts is not None and canary.score_counts is not None
    c0 = champion.score_counts.astype(np.float64)
    cc = canary.score_counts.astype(np.float64)
    if c0.sum() == 0 or cc.sum() == 0:
        return _wait("score_psi", "an arm has no scored rows")
    psi = psi_from_shares(c0 / c0.sum(), cc / cc.sum())
    pooled = (c0 + cc + 0.5) / (c0.sum() + cc.sum() + 0.5 * len(c0))
    test = multinomial_sequential(canary.score_counts.tolist(), (pooled / pooled.sum()).tolist(), alpha=alpha)
    stats = {"psi": psi, "floor": settings.psi_floor, **test.to_dict()}
    if test.significant and psi > settings.psi_floor:
        return GuardrailResult("score_psi", "fail", f"score distribution shifted: PSI {psi:.3g} > floor "
                                                    f"{settings.psi_floor:g}, significant", stats)
    if psi <= settings.psi_floor:
        return GuardrailResult("score_psi", "pass", f"PSI {psi:.3g} ≤ floor {settings.psi_floor:g}", stats)
    return GuardrailResult("score_psi", "wait", f"PSI {psi:.3g} > floor but not (yet) significant", stats)


def sample_ratio(champion: ArmStats, canary: ArmStats, fraction: float, alpha: float) -> dict[str, Any]:
    """Sample-ratio mismatch test on distinct routing units per arm."""
    test = multinomial_sequential([champion.entities, canary.entities], [1 - fraction, fraction], alpha=alpha)
    return {"expected_fraction": fraction,
            "observed_fraction": canary.entities / max(champion.entities + canary.entities, 1), **test.to_dict()}


def judge(champion: ArmStats, canary: ArmStats, fraction: float, settings: JudgeSettings) -> StepVerdict:
    """The decision on one step (see the module docstring)."""
    if fraction not in settings.steps[:-1]:
        raise ValueError(f"fraction {fraction} is not a judged step of {list(settings.steps)}")
    following = settings.steps[settings.steps.index(fraction) + 1]
    srm = sample_ratio(champion, canary, fraction, settings.srm_alpha)
    arms = {"champion": champion.summary(), "canary": canary.summary()}
    if champion.rows + canary.rows == 0:
        return StepVerdict("hold", "no traffic logged in this step yet", fraction, None, srm, (), **arms)
    if srm["significant"]:
        return StepVerdict("halt", f"sample-ratio mismatch: canary share {srm['observed_fraction']:.4f} vs "
                                   f"{fraction:g} expected (chi-square p={srm['chi2_pvalue']:.2g})",
                           fraction, 0.0, srm, (), **arms)
    results = tuple(guardrails(champion, canary, settings))
    failed = [g for g in results if g.status == "fail"]
    if failed:
        return StepVerdict("rollback", "; ".join(f"{g.name}: {g.reason}" for g in failed), fraction, 0.0, srm,
                           results, **arms)
    waiting = [g.name for g in results if g.status != "pass"]
    spent = canary.labeled if settings.require_labels else canary.rows
    if waiting and spent >= settings.max_canary_rows:
        return StepVerdict("rollback", f"timeout: {', '.join(waiting)} still undecided after {spent} canary "
                                       f"rows (max_canary_rows {settings.max_canary_rows})", fraction, 0.0, srm,
                           results, **arms)
    if waiting:
        return StepVerdict("hold", f"waiting on {', '.join(waiting)}", fraction, None, srm, results, **arms)
    outcome = "promote" if following == 1.0 else "advance"
    return StepVerdict(outcome, f"every guardrail passed at {fraction:g}", fraction, following, srm, results,
                       **arms)


# ----- from serving logs -----


def stats_from_rows(frame: pd.DataFrame, score_edges: FloatArray, entity_columns: list[str]) -> ArmStats:
    """ArmStats of joined serving-log rows (columns ts, prediction, label, latency_ms, error, key.*).

    The rows one request scored on one arm share one latency (a float timed to the nanosecond: two requests
    practically never share one): latency counts once per distinct value, since counting it once per row
    would treat one slow request as hundreds of independent slow observations."""
    scores = frame["prediction"].to_numpy(np.float64, na_value=np.nan)
    failed = (frame["error"] != "").to_numpy()
    if entity_columns:
        entities = int(frame[entity_columns].astype(str).drop_duplicates().shape[0])
    else:
        entities = int(frame["request_id"].nunique())
    return ArmStats.from_arrays(scores, frame["label"].to_numpy(np.float64, na_value=np.nan),
                                _request_latencies(frame), failed, entities, score_edges)


def _request_latencies(frame: pd.DataFrame) -> FloatArray:
    return np.asarray(frame["latency_ms"].drop_duplicates().to_numpy(np.float64), dtype=np.float64)


# ----- the rollout in the registry -----


@dataclass(frozen=True)
class JudgeOutcome:
    """What one `judge_step` did: the verdict, its decision record (`created` False on a repeat), the actions
    applied, and the rollout afterwards."""

    verdict: StepVerdict
    decision: Decision
    actions: tuple[str, ...]
    rollout: Rollout


def judge_step(config: Config, model_name: str, *, as_of: datetime | None = None, apply: bool = True,
               by: str = "canary-judge") -> JudgeOutcome:
    """Judge the running rollout of `model_name` on serving logs and labels up to `as_of` (default now),
    record the decision (judging the same step on the same data again records nothing new) and apply it:
    advance the fraction, promote (champion ← canary; the old champion stays as `previous`), or roll back /
    halt (canary alias removed, all traffic to the champion, alert)."""
    from quiver.monitoring.evaluation import idempotency_key, join_labels
    from quiver.monitoring.labels import read_labels
    from quiver.monitoring.serving_log import KEY_PREFIX, read_serving_logs

    as_of = as_of or datetime.now(UTC)
    registry, models = _registries(config)
    rollout = rollouts.active_rollout(registry, model_name)
    if rollout is None:
        raise QuiverError(f"model {model_name!r} has no running rollout; start one with `quiver canary start`")
    settings = JudgeSettings.from_dict(rollout.settings)
    champion_label = f"{model_name}:{rollout.champion_version}"
    canary_label = f"{model_name}:{rollout.canary_version}"
    logs = read_serving_logs(config.offline_dir, rollout.step_started_at, as_of)
    joined = join_labels(logs, read_labels(config.offline_dir, as_of))
    champion = joined[(joined["arm"] == "champion") & (joined["model_version"] == champion_label)]
    canary = joined[(joined["arm"] == "canary") & (joined["model_version"] == canary_label)]
    keys = _routing_columns(config, models, model_name, rollout.champion_version,
                            [c for c in joined.columns if c.startswith(KEY_PREFIX)])
    edges = _reference_edges(models, model_name, rollout.champion_version, settings.score_bins)
    if edges is None:
        edges = score_edges_from(champion["prediction"].to_numpy(np.float64, na_value=np.nan), settings.score_bins)
    verdict = judge(stats_from_rows(champion, edges, keys), stats_from_rows(canary, edges, keys),
                    rollout.fraction, settings)
    statistics = verdict.to_dict()
    key = idempotency_key("canary_step", rollout.id, rollout.step, statistics)
    statistics["window"] = {"start": rollout.step_started_at.isoformat(), "as_of": as_of.isoformat()}
    decision = rollouts.record_decision(
        registry, model_name, kind="canary_step", outcome=verdict.outcome, statistics=statistics,
        idempotency_key=key, rollout_id=rollout.id, step=rollout.step, fraction=rollout.fraction,
        champion_version=champion_label, candidate_version=canary_label, by=by, at=as_of)
    actions = apply_decision(config, rollout, decision, by=by, at=as_of) if apply else ()
    return JudgeOutcome(verdict, decision, actions, rollouts.get_rollout(registry, rollout.id))


def apply_decision(config: Config, rollout: Rollout, decision: Decision, *, by: str = "canary-judge",
                   at: datetime | None = None) -> tuple[str, ...]:
    """Carry out a recorded canary decision. Every action is compare-and-set on the state the decision saw,
    so applying twice (a retried task) does nothing the second time."""
    registry, models = _registries(config)
    at = at or datetime.now(UTC)
    outcome, model = decision.outcome, rollout.model
    actions: list[str] = []
    if outcome == "advance":
        following = decision.statistics["next_fraction"]
        if rollouts.advance_rollout(registry, rollout.id, from_step=rollout.step, fraction=following, at=at):
            actions.append(f"fraction {rollout.fraction:g} → {following:g}")
    elif outcome == "promote":
        reason = f"canary promoted by decision #{decision.id}: {decision.statistics['reason']}"
        if models.aliases(model).get("champion") == rollout.champion_version:
            models.set_alias(model, "champion", rollout.canary_version, expected=rollout.champion_version,
                             reason=reason, by=by, decision_id=decision.id)
            actions.append(f"champion → {model}:{rollout.canary_version}")
        actions += _remove_canary(models, rollout, reason, by, decision.id)
        if rollouts.finish_rollout(registry, rollout.id, rollouts.PROMOTED, fraction=1.0, at=at):
            actions.append("rollout promoted")
    elif outcome in ("rollback", "halt"):
        reason = f"{outcome} by decision #{decision.id}: {decision.statistics['reason']}"
        actions += _remove_canary(models, rollout, reason, by, decision.id)
        status = rollouts.ROLLED_BACK if outcome == "rollback" else rollouts.HALTED
        if rollouts.finish_rollout(registry, rollout.id, status, fraction=0.0, at=at):
            actions.append(f"rollout {status}")
            _alert(config, registry, rollout, decision, outcome)
    return tuple(actions)


def _remove_canary(models: Any, rollout: Rollout, reason: str, by: str, decision_id: int) -> list[str]:
    if models.aliases(rollout.model).get("canary") != rollout.canary_version:
        return []
    models.set_alias(rollout.model, "canary", None, expected=rollout.canary_version, reason=reason, by=by,
                     decision_id=decision_id)
    return ["canary alias removed"]


def _alert(config: Config, registry: Registry, rollout: Rollout, decision: Decision, outcome: str) -> None:
    from quiver.monitoring.alerts import AlertManager, sinks_from_config
    from quiver.monitoring.settings import load_settings

    manager = AlertManager(registry, sinks_from_config(load_settings(config).alert_sinks))
    kind = "canary_rollback" if outcome == "rollback" else "canary_halted"
    manager.raise_alert(kind, f"{rollout.model}:{rollout.canary_version}", "critical",
                        f"canary {rollout.model}:{rollout.canary_version} {'rolled back' if outcome == 'rollback' else 'halted'} "
                        f"at {rollout.fraction:g}", str(decision.statistics.get("reason", "")),
                        {"decision_id": decision.id, "rollout_id": rollout.id})


def start_canary(config: Config, model_name: str, version: int, *, settings: JudgeSettings | None = None,
                 by: str = "", reason: str = "", at: datetime | None = None) -> Rollout:
    """Point alias `canary` at `version` and start a rollout at the first step (needs a champion). The first
    step begins at `at` (default now; replays of simulated time pass theirs); later steps begin at the
    `as_of` of the judgement that advanced them."""
    registry, models = _registries(config)
    settings = settings or JudgeSettings()
    current = models.aliases(model_name)
    champion = current.get("champion")
    if champion is None:
        raise QuiverError(f"model {model_name!r} has no champion to compare a canary with")
    if rollouts.active_rollout(registry, model_name) is not None:
        raise QuiverError(f"model {model_name!r} already has a running rollout")
    if current.get("canary") != version:
        models.set_alias(model_name, "canary", version, expected=current.get("canary"),
                         reason=reason or f"canary rollout of {model_name}:{version}", by=by)
    return rollouts.start_rollout(registry, model_name, champion_version=champion, canary_version=version,
                                  fraction=settings.steps[0], settings=settings.to_dict(), by=by, now=at)


def rollback(config: Config, model_name: str, *, reason: str, by: str = "") -> tuple[Decision, tuple[str, ...]]:
    """Manual rollback: end the running rollout (canary removed) or, with none running, champion ← previous."""
    from quiver.monitoring.evaluation import idempotency_key

    registry, models = _registries(config)
    rollout = rollouts.active_rollout(registry, model_name)
    aliases = models.aliases(model_name)
    stats = {"reason": reason, "aliases_before": aliases}
    if rollout is not None:
        decision = rollouts.record_decision(
            registry, model_name, kind="manual_rollback", outcome="rollback", statistics=stats,
            idempotency_key=idempotency_key("manual_rollback", rollout.id), rollout_id=rollout.id,
            step=rollout.step, fraction=rollout.fraction, champion_version=f"{model_name}:{rollout.champion_version}",
            candidate_version=f"{model_name}:{rollout.canary_version}", by=by)
        return decision, apply_decision(config, rollout, decision, by=by)
    if aliases.get("previous") is None:
        raise QuiverError(f"model {model_name!r} has no running rollout and no previous champion to roll back to")
    decision = rollouts.record_decision(
        registry, model_name, kind="manual_rollback", outcome="rollback", statistics=stats,
        idempotency_key=idempotency_key("manual_rollback", model_name, aliases, datetime.now(UTC)),
        champion_version=f"{model_name}:{aliases.get('champion')}",
        candidate_version=f"{model_name}:{aliases['previous']}", by=by)
    move = models.rollback(model_name, reason=reason, by=by, decision_id=decision.id,
                           expected=aliases.get("champion"))
    return decision, (f"champion {move.from_version} → {move.to_version}",)


def _registries(config: Config) -> tuple[Registry, Any]:
    from quiver.registry.models import ModelRegistry

    registry = Registry(config.registry, project=config.project)
    from quiver.artifacts import ArtifactStore

    return registry, ModelRegistry(registry, ArtifactStore.from_config(config))


def _routing_columns(config: Config, models: Any, model: str, version: int, keys: list[str]) -> list[str]:
    """The serving-log column of the key the split hashed (rows of one user share an arm, so counting
    user × merchant pairs would see a mismatch that is not there); every key column when it is unknown."""
    import json

    from quiver.models.artifact import MODEL_FILE
    from quiver.monitoring.serving_log import KEY_PREFIX
    from quiver.registry.repository import load_applied_catalog
    from quiver.serving.arms import routing_key_for

    try:
        found = models.get(model, version)
        meta = json.loads((models.artifacts.local_dir(found.artifact_path) / MODEL_FILE).read_text())
        column = KEY_PREFIX + routing_key_for(load_applied_catalog(config).catalog, meta["feature_refs"])
    except (OSError, KeyError, ValueError, QuiverError):
        return keys
    return [column] if column in keys else keys


def _reference_edges(models: Any, model: str, version: int, bins: int) -> FloatArray | None:
    """Score bins from the champion's validation scores (its reference Parquet), when it has one."""
    try:
        found = models.get(model, version)
        if not found.reference_path:
            return None
        table = models.artifacts.read_reference(found.artifact_path, found.reference_path, found.sha256,
                                                columns=["score"])
        scores = table["score"].to_numpy(zero_copy_only=False)
    except (OSError, KeyError, ValueError, QuiverError):
        return None
    return score_edges_from(np.asarray(scores, dtype=np.float64), bins)
