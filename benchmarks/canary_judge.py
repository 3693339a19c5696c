"""Canary judge on clustered traffic: false rollbacks of A/A rollouts and detection of worse canaries.

Every simulated rollout drives the real decision code (`quiver.monitoring.canary_stats`: `StepStats` fed
batch by batch, `judge` after every `--look-every` requests) the way `judge_step` feeds it from serving logs.
The world is drawn the way production traffic comes, not the way a test assumes:

* entities with their own risk (logit offset ~ N(0, risk_sd)) and activity (lognormal weights, so some
  users come back many times); routing sends whole entities to an arm (a fixed uniform per entity < share);
* requests of `rows_per_request` entities, one model call per arm per request (a failed call fails all its
  rows, as the serving path logs it), one latency per call (lognormal with a heavy tail);
* labels drawn from the true risk, per row or one per request (`shared_label`), arriving after a random
  delay (exponential, mean `label_delay` requests); a base rate drifting over the rollout;
* the champion is a noisy model (logit noise, part per entity and part per row); an A/A canary is an
  *equivalent* model — independent noise of the same size, so paired differences are not zero and are
  correlated within entities; a worse canary has more noise, solved so that its expected log loss is worse by
  k × `log_loss_floor`; a better canary has less; the champion scores every canary row off the request path
  (paired rows) — or, with pairing off on the serving path, the judge replays it from the rows' logged inputs
  (`quiver.monitoring.canary_replay`): the same scores, so the same evidence.

Regimes (A/A, ≥ 300 rollouts each in the full run): `independent` (1 entity per request, no repeat users),
`shared_label` (10-row requests sharing one label and one call), `many_entities` (20 entities per request),
`repeat_users` (30 rows per entity on average, per-entity risk and noise), `clustered` (all at once: 20
entities per request, shared labels, repeat users), `champion_outage` (20 entities per request, the champion's
call raising in 1.5 % of requests: its rows fail, the canary's rows are logged as not run; `--drop-not-run`
replays the old serving path that never logged them), `repeat_unpaired` (repeat users and no champion score of
any canary row: what the judge meets only when it cannot replay them — the champion's artifact unreadable, its
inputs not logged; no interval valid at every look promotes 95 % there, so that target is reported, not
checked: docs/prediction.md), `unpaired` (400k users of lognormal activity, no paired champion scores),
`latency_drift` (both arms' latency rising ×e over the rollout's first 150k requests, the base rate with it),
`error_drift` (both arms' call error rate rising from 0.2 % to 3.2 % over 150k requests), `daily_wave`
(latency ×e^±0.4 and the base rate's logit ±0.4 on a 60k-request period), `row_failures` (20 entities per
request, a call failing with each of its rows' chance 0.05 %: a 19-row champion call fails ~19× as often as a
1-row canary call), and five worlds of 20-user requests where the champion's failed call fails the request (its
canary rows logged as not run): `call_failures_0.5`, `_1.5` and `_5` (both arms' calls failing at 0.5, 1.5 and
5 % of their own, whatever their rows), `row_failures_blocking` (each row breaks its call 0.05 % of the time)
and `mixed_failures` (1 % per call and 0.03 % per row: p(s) = 1 − (1 − a)(1 − b)^s). Canaries worse by ½, 1
and 2 log-loss floors, a better canary, error-rate / latency canaries and score shifts of ½, 1 and 2
score-shift floors (the champion's own scores moved; no labels, so the score shift is judged alone) run in
the `clustered` world; a canary whose rows fail one floor more often (per row) runs in `row_failures`; a
canary whose calls fail 1 point more (`call_failures_1.5`), one whose calls fail 1 % of their own where the
champion's rows break its calls (`row_failures_blocking`) and one whose rows break calls 1 point more
(`mixed_failures`) run there; canaries worse by ½ and 1 floor run in `unpaired` too (½ floor rolled back by a
guardrail ≤ 5 % is a target there; detecting 1 floor is reported, not a target: without pairing it can take
more than the 1.5M requests a simulated rollout is given). Reported per case: outcomes, the rate of rollbacks
(+ halts + timeouts) with a 95 % Wilson interval, false rollbacks, halts, timeouts and promotions (Wilson
intervals in the JSON), median requests to a decision.

    python benchmarks/canary_judge.py [--quick] [--runs N] [--look-every N]
Last line: RESULT canary_judge ratio=<0.05 / Wilson upper bound of the worst A/A false-rollback rate>
           quiver=<worst A/A rate %>% peer=<target 5>%   (no peer: the ratio is to the target; it does not
           saturate, since zero false rollbacks still leave an upper bound above 0)
Exits non-zero when a target is missed: every A/A rate ≤ 5 % and promoted ≥ 95 % (reported only in
`repeat_unpaired`), detection ≥ 95 % at 1 and 2 floors (score shift included), a canary worse (or shifted)
by ½ floor rolled back by a failed guardrail or halted at most 5 % (the issue's false rollbacks; a canary
that no guardrail decided within `max_canary_calls` is rolled back too, and counted apart as a timeout: at
½ a floor worse, it is no false rollback of a healthy canary).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]
RESULTS = ROOT / "benchmarks" / "results"

from quiver.monitoring.canary_stats import JudgeSettings, StepStats, judge  # noqa: E402
from quiver.monitoring.evaluation import log_losses  # noqa: E402
from quiver.pipelines.loop_rollout import judge_overrides  # noqa: E402

BASE_LOGIT = -2.5


@dataclass(frozen=True)
class World:
    """How traffic is drawn (see the module docstring)."""

    name: str
    entities: int = 400_000
    rows_per_request: int = 1
    activity_sd: float = 0.0  # lognormal sd of activity weights (0: every entity equally likely)
    risk_sd: float = 0.8
    shared_label: bool = False
    error_rate: float = 0.002  # per model call
    label_delay: float = 3_000.0  # mean, in requests
    drift: float = 0.6  # base-rate logit drift over `drift_span` requests
    drift_span: float = 400_000.0
    model_noise: float = 0.6  # champion's logit noise sd
    entity_noise_share: float = 0.5  # share of the model noise variance that is per entity
    champion_failure: float = 0.0  # per request: the champion's call raises, the canary's rows never run
    paired: bool = True  # the champion scores the canary's rows (off the request path, or the judge replays)
    promote_target: bool = True  # an A/A canary must be promoted ≥ 95 % (else reported only; see the docstring)
    latency_drift: float = 0.0  # both arms' log latency rises by this over `drift_span` requests
    wave: float = 0.0  # daily wave: log latency and base-rate logit ± this, period `wave_period` requests
    wave_period: float = 100_000.0
    row_hazard: float = 0.0  # per row: a call fails with 1 − (1 − error_rate)(1 − h)^rows (each row may break it)
    champion_blocks: bool = False  # the champion's failed call fails the request: its canary rows never run
    error_drift: float = 0.0  # both arms' per-call error rate rises by this over `drift_span` requests


@dataclass(frozen=True)
class Canary:
    """What the canary is, relative to the champion."""

    name: str
    log_loss_floors: float = 0.0  # expected log loss worse by this many floors (negative: better)
    error_rate: float | None = None  # per call; None = the world's
    latency_factor: float = 1.0
    score_shift: float = 0.0  # canary scores moved up by this many score-shift floors (labels not used)
    row_hazard: float | None = None  # per row; None = the world's
    world: str = "clustered"  # the world an effect case runs in


WORLDS = {w.name: w for w in (
    World("independent", entities=2_000_000, risk_sd=0.0, entity_noise_share=0.0),
    World("shared_label", rows_per_request=10, shared_label=True),
    World("many_entities", rows_per_request=20),
    World("repeat_users", entities=20_000, activity_sd=1.0),
    World("clustered", entities=200_000, rows_per_request=20, activity_sd=1.0, shared_label=True),
    World("champion_outage", entities=2_000_000, rows_per_request=20, champion_failure=0.015),
    World("repeat_unpaired", entities=20_000, activity_sd=1.0, paired=False, promote_target=False),
    World("unpaired", entities=400_000, activity_sd=1.0, paired=False),
    World("latency_drift", entities=2_000_000, latency_drift=1.0, drift_span=150_000.0),
    World("daily_wave", entities=2_000_000, wave=0.4, wave_period=60_000.0),
    World("row_failures", entities=2_000_000, rows_per_request=20, error_rate=0.0, row_hazard=0.0005),
    World("error_drift", entities=2_000_000, error_drift=0.03, drift_span=150_000.0),
    # Issue 57: both arms' calls fail at a rate of their own (or their rows break them), and the champion's
    # failure fails the request, its canary rows logged as not run.
    World("call_failures_0.5", entities=2_000_000, rows_per_request=20, error_rate=0.005, champion_blocks=True),
    World("call_failures_1.5", entities=2_000_000, rows_per_request=20, error_rate=0.015, champion_blocks=True),
    World("call_failures_5", entities=2_000_000, rows_per_request=20, error_rate=0.05, champion_blocks=True),
    World("row_failures_blocking", entities=2_000_000, rows_per_request=20, error_rate=0.0, row_hazard=0.0005,
          champion_blocks=True),
    World("mixed_failures", entities=2_000_000, rows_per_request=20, error_rate=0.01, row_hazard=0.0003,
          champion_blocks=True),
)}
AA = Canary("A/A")
EFFECTS = (Canary("worse by ½ floor", 0.5), Canary("worse by 1 floor", 1.0), Canary("worse by 2 floors", 2.0),
           Canary("better by 1 floor", -1.0), Canary("errors +1 floor", error_rate=0.012),
           Canary("latency ×3", latency_factor=3.0), Canary("score shift ½ floor", score_shift=0.5),
           Canary("score shift 1 floor", score_shift=1.0), Canary("score shift 2 floors", score_shift=2.0),
           Canary("row errors +1 floor", row_hazard=0.0105, world="row_failures"),
           Canary("calls fail +1 pp", error_rate=0.025, world="call_failures_1.5"),
           Canary("calls fail +1 pp, rows break them", error_rate=0.01, world="row_failures_blocking"),
           Canary("rows break calls +1 pp", row_hazard=1 - 0.9997 * 0.99, world="mixed_failures"),
           Canary("unpaired, worse by ½ floor", 0.5, world="unpaired"),
           Canary("unpaired, worse by 1 floor", 1.0, world="unpaired"))


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def noise_for(world: World, floors: float, floor: float, rng: np.random.Generator, n: int = 400_000) -> float:
    """Canary logit-noise sd whose expected log loss differs from the champion's by floors × floor."""
    z = BASE_LOGIT + world.risk_sd * rng.normal(0, 1, n)
    y = (rng.random(n) < sigmoid(z)).astype(np.float64)
    eps = rng.normal(0, 1, n)
    champion = log_losses(sigmoid(z + world.model_noise * rng.normal(0, 1, n)), y).mean()
    target = champion + floors * floor
    lo, hi = 0.0, 4.0
    for _ in range(50):
        mid = (lo + hi) / 2
        if log_losses(sigmoid(z + mid * eps), y).mean() < target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def latencies(rng: np.random.Generator, n: int, factor: float = 1.0) -> np.ndarray:
    base = rng.lognormal(np.log(3.0), 0.3, n)
    slow = rng.random(n) < 0.01  # a heavy tail: 1 % of calls take ~4× longer
    return np.where(slow, base * 4.0, base) * factor


class Run:
    """One rollout's world state: entities, their risk, noise and routing."""

    def __init__(self, world: World, canary: Canary, canary_noise: float, rng: np.random.Generator):
        self.world, self.canary, self.rng = world, canary, rng
        e = world.entities
        weights = rng.lognormal(0.0, world.activity_sd, e) if world.activity_sd else np.ones(e)
        self.cumulative = np.cumsum(weights) / weights.sum()
        self.risk = world.risk_sd * rng.normal(0, 1, e)
        self.route = rng.random(e)
        share = world.entity_noise_share
        self.champion_entity = math.sqrt(share) * world.model_noise * rng.normal(0, 1, e)
        self.canary_entity = math.sqrt(share) * canary_noise * rng.normal(0, 1, e)
        self.champion_row_sd = math.sqrt(1 - share) * world.model_noise
        self.canary_row_sd = math.sqrt(1 - share) * canary_noise
        self.requests = 0
        self.shift_floor = 0.05

    def batch(self, requests: int, fraction: float) -> dict[str, np.ndarray]:
        """`requests` new requests' rows: arm, scores, labels, label arrival, calls, errors, latencies."""
        w, rng, m = self.world, self.rng, self.world.rows_per_request
        n = requests * m
        request = self.requests + np.repeat(np.arange(requests), m)
        entity = np.minimum(np.searchsorted(self.cumulative, rng.random(n)), w.entities - 1)
        drift = w.drift * np.minimum(request / w.drift_span, 1.0)
        wave = w.wave * np.sin(2 * np.pi * request / w.wave_period)
        z = BASE_LOGIT + drift + wave + self.risk[entity]
        if w.shared_label:
            p_request = sigmoid(z).reshape(requests, m).mean(axis=1)
            label = np.repeat((rng.random(requests) < p_request).astype(np.float64), m)
        else:
            label = (rng.random(n) < sigmoid(z)).astype(np.float64)
        champion = sigmoid(z + self.champion_entity[entity] + self.champion_row_sd * rng.normal(0, 1, n))
        canary_score = sigmoid(z + self.canary_entity[entity] + self.canary_row_sd * rng.normal(0, 1, n))
        if self.canary.score_shift:  # the champion's own scores moved: W1 = the shift (clipping aside)
            canary_score = np.clip(champion + self.canary.score_shift * self.shift_floor, 0.0, 1.0)
        on_canary = self.route[entity] < fraction
        call = 2 * request + on_canary  # one model call per arm per request
        error_rate = np.where(on_canary, self.canary.error_rate if self.canary.error_rate is not None
                              else w.error_rate, w.error_rate) + w.error_drift * np.minimum(request / w.drift_span, 1)
        failed_draw = rng.random(n)
        # One draw per call: the first row of each call decides for all its rows.
        codes, first, inverse, size = np.unique(call, return_index=True, return_inverse=True, return_counts=True)
        hazard = np.where(on_canary, self.canary.row_hazard if self.canary.row_hazard is not None
                          else w.row_hazard, w.row_hazard)
        error_rate = 1 - (1 - error_rate) * (1 - hazard) ** size[inverse]  # a call's own rate, and its rows'
        call_failed = failed_draw[first] < error_rate[first]
        failed = call_failed[inverse]
        # The champion's call raising fails the request: its rows fail, the canary's rows never run.
        outage = np.repeat(rng.random(requests) < w.champion_failure, m)
        if w.champion_blocks:
            champion_failed = np.bincount(request - self.requests, weights=failed & ~on_canary, minlength=requests)
            outage |= np.repeat(champion_failed > 0, m)
        ran = ~(outage & on_canary)
        failed = (failed & ran) | (outage & ~on_canary)
        call_latency = np.where(on_canary[first], latencies(rng, len(codes), self.canary.latency_factor),
                                latencies(rng, len(codes)))
        call_latency *= np.exp(w.latency_drift * np.minimum(request[first] / w.drift_span, 1.0) + wave[first])
        delay = np.repeat(rng.exponential(w.label_delay, requests), m)
        self.requests += requests
        score = np.where(on_canary, canary_score, champion)
        return {"entity": entity, "call": call, "on_canary": on_canary, "score": np.where(failed, np.nan, score),
                "failed": failed, "latency": call_latency[inverse], "label": label,
                "arrival": request + delay, "ran": ran,
                "paired": np.where(on_canary & w.paired, champion, np.nan)}


def simulate(world: World, canary: Canary, settings: JudgeSettings, runs: int, look_every: int,
             max_requests: int, threshold: float, seed: int, drop_not_run: bool = False) -> list[dict[str, Any]]:
    """`drop_not_run`: the serving path before issue 30, which never logged the canary rows of a request
    whose champion call failed."""
    rng = np.random.default_rng(seed)
    noise = world.model_noise if canary.log_loss_floors == 0 else \
        noise_for(world, canary.log_loss_floors, settings.log_loss_floor, rng)
    if canary.score_shift:  # the score shift alone: no labels, so the quality guardrails do not wait on them
        settings = replace(settings, require_labels=False)
    out = []
    for _ in range(runs):
        run = Run(world, canary, noise, rng)
        run.shift_floor = settings.score_shift_floor
        step, stats, pending = 0, StepStats(settings, threshold), None
        outcome, reason = "undecided", ""
        while run.requests < max_requests:
            fraction = settings.steps[step]
            rows = run.batch(look_every, fraction)
            if drop_not_run:
                rows = {k: v[rows["ran"]] for k, v in rows.items()}
            stats.add_served(rows["entity"], rows["call"], rows["on_canary"], rows["score"], rows["failed"],
                             rows["latency"], rows["paired"], rows["ran"])
            ok = ~rows["failed"] & rows["ran"] & (canary.score_shift == 0)  # shift cases: no labels
            pending = _concat(pending, {k: v[ok] for k, v in rows.items()})
            ready = pending["arrival"] <= run.requests
            if ready.any():
                order = np.argsort(pending["arrival"][ready], kind="stable")
                got = {k: v[ready][order] for k, v in pending.items()}
                stats.add_labelled(got["entity"], got["call"], got["on_canary"], got["score"], got["label"],
                                   got["paired"])
                pending = {k: v[~ready] for k, v in pending.items()}
            verdict = judge(stats, fraction)
            if verdict.outcome == "advance":  # rows (and labels) of the old step stay with the old step
                step, stats, pending = step + 1, StepStats(settings, threshold), None
            elif verdict.outcome != "hold":
                outcome, reason = verdict.outcome, verdict.reason
                break
        out.append({"outcome": outcome, "requests": run.requests, "final_step": step,
                    "timeout": reason.startswith("timeout"),
                    "failed": _failed_guardrails(reason) if outcome in ("rollback", "halt") else []})
    return out


def _failed_guardrails(reason: str) -> list[str]:
    """Guardrails named in a rollback reason; a timeout names the ones still waiting."""
    if reason.startswith("timeout: "):
        return ["timeout(" + name.strip() + ")" for name in reason[9:].split(" still undecided")[0].split(",")]
    return sorted({part.split(":")[0] for part in reason.split("; ")})


def _concat(pending: dict[str, np.ndarray] | None, rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if pending is None:
        return rows
    return {k: np.concatenate([pending[k], rows[k]]) for k in rows}


def wilson(k: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    counts: dict[str, int] = {}
    failed: dict[str, int] = {}
    for r in results:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
        for name in r["failed"]:
            failed[name] = failed.get(name, 0) + 1
    stopped = sum(r["outcome"] in ("rollback", "halt") for r in results)
    decided = [r["requests"] for r in results if r["outcome"] != "undecided"]
    timeouts = sum(r["timeout"] for r in results)
    halts = counts.get("halt", 0)
    promoted = counts.get("promote", 0)
    n = len(results)
    return {"runs": n, "outcomes": counts, "rollback_rate": stopped / n,
            "rollback_wilson95": wilson(stopped, n), "by_guardrail": failed,
            "timeouts": timeouts, "timeout_wilson95": wilson(timeouts, n),
            "guardrail_rollbacks": stopped - halts - timeouts, "halts": halts, "halt_wilson95": wilson(halts, n),
            "promoted_rate": promoted / n, "promoted_wilson95": wilson(promoted, n),
            "median_requests_to_decision": float(np.median(decided)) if decided else None}


def reference_threshold(settings: JudgeSettings, rng: np.random.Generator) -> float:
    """The champion's reference p99 (pre-rollout calls) + the latency floor, as `start_canary` fixes it."""
    from quiver.monitoring.canary_stats import latency_threshold

    threshold = latency_threshold(latencies(rng, 20_000), settings)
    assert threshold is not None
    return threshold


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rollouts and regimes, under a minute")
    parser.add_argument("--runs", type=int, default=None, help="rollouts per case (default 300; 20 quick)")
    parser.add_argument("--look-every", type=int, default=None, help="requests per look (default 500)")
    parser.add_argument("--max-requests", type=int, default=1_500_000, help="cap on requests per rollout")
    parser.add_argument("--regimes", default="", help="comma-separated A/A regimes (default all)")
    parser.add_argument("--no-effects", action="store_true", help="A/A regimes only")
    parser.add_argument("--effects", default="", help="only effect cases whose name contains this (default all)")
    parser.add_argument("--judge", default="", help="judge settings to override, name=value,… (as loop_canary_judge)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--drop-not-run", action="store_true",
                        help="the old serving path: canary rows of a request whose champion failed never logged")
    parser.add_argument("--out", default=str(RESULTS / "canary_judge.json"))
    args = parser.parse_args()
    runs = args.runs or (20 if args.quick else 300)
    look_every = args.look_every or (2_000 if args.quick else 500)
    settings = JudgeSettings(**judge_overrides(args.judge)) if args.judge else JudgeSettings()
    threshold = reference_threshold(settings, np.random.default_rng(args.seed))
    names = [n for n in args.regimes.split(",") if n] or (["independent", "clustered"] if args.quick
                                                          else list(WORLDS))
    cases: list[tuple[str, World, Canary]] = [("aa", WORLDS[n], AA) for n in names]
    if not args.no_effects:
        cases += [("effect", WORLDS[c.world], c) for c in EFFECTS if args.effects in c.name]
    report: dict[str, Any] = {"quick": args.quick, "runs": runs, "look_every": look_every,
                              "drop_not_run": args.drop_not_run,
                              "max_requests": args.max_requests, "settings": settings.to_dict(),
                              "latency_threshold_ms": threshold, "cases": []}
    began = time.perf_counter()
    for i, (kind, world, canary) in enumerate(cases):
        t = time.perf_counter()
        results = simulate(world, canary, settings, runs, look_every, args.max_requests, threshold,
                           args.seed + 101 * (i + 1), args.drop_not_run)
        summary = {"kind": kind, "world": asdict(world), "canary": asdict(canary), **summarize(results),
                   "seconds": round(time.perf_counter() - t, 1)}
        report["cases"].append(summary)
        lo, hi = summary["rollback_wilson95"]
        print(f"{kind:6} {world.name:15} {canary.name:20} rollback {summary['rollback_rate']:6.1%} "
              f"[{lo:.1%}, {hi:.1%}]  guardrail rollbacks {summary['guardrail_rollbacks']:3}  "
              f"halts {summary['halts']:3}  "
              f"timeouts {summary['timeouts']:3}  promoted {summary['promoted_rate']:6.1%}  median requests "
              f"{summary['median_requests_to_decision']}  {summary['outcomes']}  {summary['by_guardrail']}",
              flush=True)
    aa = [c for c in report["cases"] if c["kind"] == "aa"]
    worst = max(aa, key=lambda c: c["rollback_rate"])
    effects = {c["canary"]["name"]: c for c in report["cases"] if c["kind"] == "effect"}
    checks = {f"A/A {c['world']['name']} ≤ 5 %": c["rollback_rate"] <= 0.05 for c in aa}
    checks.update({f"A/A {c['world']['name']} promoted ≥ 95 %": c["promoted_rate"] >= 0.95 for c in aa
                   if c["world"]["promote_target"]})
    reported = {f"A/A {c['world']['name']} promoted (reported)": c["promoted_rate"] for c in aa
                if not c["world"]["promote_target"]}
    for name in ("worse by 1 floor", "worse by 2 floors", "errors +1 floor", "latency ×3", "score shift 1 floor",
                 "score shift 2 floors", "row errors +1 floor", "calls fail +1 pp",
                 "calls fail +1 pp, rows break them", "rows break calls +1 pp"):
        if name in effects:
            checks[f"{name} detected ≥ 95 %"] = effects[name]["rollback_rate"] >= 0.95
    for name in ("worse by ½ floor", "score shift ½ floor", "unpaired, worse by ½ floor"):
        if name in effects:
            case = effects[name]
            checks[f"{name} rolled back by a guardrail ≤ 5 %"] = \
                (case["guardrail_rollbacks"] + case["halts"]) / case["runs"] <= 0.05
    report.update(checks=checks, reported=reported, worst_aa=worst["world"]["name"],
                  seconds=round(time.perf_counter() - began, 1), load_average=os.getloadavg(),
                  note="rates depend on the seed and the simulated world, not on the machine's speed")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=float))
    for name, ok in checks.items():
        print(f"{'ok  ' if ok else 'MISS'} {name}")
    for name, rate in reported.items():
        print(f"     {name}: {rate:.1%}")
    upper = worst["rollback_wilson95"][1]
    print(f"RESULT canary_judge ratio={0.05 / upper:.2f} quiver={100 * worst['rollback_rate']:.1f}% peer=5.0%")
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
