"""Canary judge: false rollbacks on A/A rollouts and detection of a bad canary, by simulation.

Every simulated rollout runs the real decision function (`quiver.monitoring.canary_judge.judge`) with the default
`JudgeSettings`, looking after *every* batch of `--batch` requests, exactly as a judge DAG would:

* labels are drawn from a known model: logit z ~ N(-2.5, 1.2), p = sigmoid(z), label ~ Bernoulli(p);
  every request is labelled (label delay does not change the statistics, only when they become available);
* the champion scores p (the true model); an A/A canary scores p too; a *bad* canary scores
  sigmoid(z + ε), ε ~ N(0, s²), with s solved so that its expected log loss is worse by exactly the
  configured floor (`log_loss_floor`);
* latency ~ lognormal (median 3 ms, σ 0.3) and a 0.2 % error rate in both arms; each request is a new entity,
  routed to the canary with probability = the step's fraction.

A rollout ends at promote, rollback or halt, or undecided after `--max-rows` requests. A rollback is either a
guardrail failure (significant and beyond its floor) or a step timeout (`max_canary_rows` canary rows without
every guardrail passing: a canary that cannot be shown within its floors does not ship); the JSON counts the
timeouts apart. Reported: false_rollback_rate = (rollbacks + halts) / A/A runs (target ≤ 5 %),
detection_rate = rollbacks of the bad canary / bad runs (target ≥ 95 %), and the median requests to a
decision. The figures depend on the seed and the simulated model, not on the machine's speed.

    python benchmarks/canary_judge.py [--quick]
Last line: RESULT canary_judge ratio=<0.05 / false_rollback_rate, the rate floored at one run>
           quiver=<false_rollback_rate %>% peer=<target 5>%   (there is no peer: the ratio is to the target)
The script exits non-zero when either target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]
RESULTS = ROOT / "benchmarks" / "results"

from quiver.monitoring.canary_judge import ArmStats, JudgeSettings, judge, score_edges_from  # noqa: E402
from quiver.monitoring.evaluation import log_losses  # noqa: E402

MU, SIGMA = -2.5, 1.2
ERROR_RATE = 0.002


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def noise_for_floor(floor: float, rng: np.random.Generator, n: int = 1_000_000) -> float:
    """s such that scoring sigmoid(z + N(0, s²)) costs `floor` more log loss than sigmoid(z) (bisection,
    common random numbers)."""
    z = rng.normal(MU, SIGMA, n)
    y = (rng.random(n) < sigmoid(z)).astype(np.float64)
    eps = rng.normal(0, 1, n)
    base = log_losses(sigmoid(z), y).mean()
    lo, hi = 0.0, 3.0
    for _ in range(40):
        mid = (lo + hi) / 2
        if log_losses(sigmoid(z + mid * eps), y).mean() - base < floor:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def simulate(runs: int, bad: bool, settings: JudgeSettings, noise: float, batch: int, max_rows: int,
             edges: np.ndarray, seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    step = np.zeros(runs, dtype=np.int64)
    rows = np.zeros(runs, dtype=np.int64)
    outcome: list[str | None] = [None] * runs
    decided_at = np.zeros(runs, dtype=np.int64)
    reasons = [""] * runs
    stats = [[ArmStats(), ArmStats()] for _ in range(runs)]
    active = np.arange(runs)
    while len(active):
        a = len(active)
        z = rng.normal(MU, SIGMA, (a, batch))
        p = sigmoid(z)
        y = (rng.random((a, batch)) < p).astype(np.float64)
        fraction = np.array([settings.steps[step[r]] for r in active])
        canary = rng.random((a, batch)) < fraction[:, None]
        canary_scores = sigmoid(z + noise * rng.normal(0, 1, (a, batch))) if bad else p
        scores = np.where(canary, canary_scores, p)
        latency = rng.lognormal(np.log(3.0), 0.3, (a, batch))
        errors = rng.random((a, batch)) < ERROR_RATE
        scores = np.where(errors, np.nan, scores)
        still = []
        for i, r in enumerate(active):
            for arm, mask in ((0, ~canary[i]), (1, canary[i])):
                add = ArmStats.from_arrays(scores[i, mask], y[i, mask], latency[i, mask], errors[i, mask],
                                           int(mask.sum()), edges)
                stats[r][arm] = stats[r][arm].merge(add)
            rows[r] += batch
            verdict = judge(stats[r][0], stats[r][1], settings.steps[step[r]], settings)
            reasons[r] = verdict.reason
            if verdict.outcome == "advance":
                step[r] += 1
                stats[r] = [ArmStats(), ArmStats()]
            elif verdict.outcome in ("promote", "rollback", "halt"):
                outcome[r], decided_at[r] = verdict.outcome, rows[r]
                continue
            if rows[r] >= max_rows:
                outcome[r], decided_at[r] = "undecided", rows[r]
                continue
            still.append(r)
        active = np.array(still, dtype=np.int64)
    return [{"outcome": o, "rows": int(n), "final_step": int(s), "timeout": why.startswith("timeout")}
            for o, n, s, why in zip(outcome, decided_at, step, reasons, strict=True)]


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for r in results:
        counts[str(r["outcome"])] = counts.get(str(r["outcome"]), 0) + 1
    decided = [r["rows"] for r in results if r["outcome"] != "undecided"]
    return {"runs": len(results), "outcomes": counts,
            "rollbacks_by_timeout": sum(r["outcome"] == "rollback" and r["timeout"] for r in results),
            "median_rows_to_decision": float(np.median(decided)) if decided else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rollouts, under a minute")
    parser.add_argument("--runs", type=int, default=None, help="rollouts per scenario (default 500; 60 quick)")
    parser.add_argument("--batch", type=int, default=None, help="requests per look (default 2000; 10000 quick)")
    parser.add_argument("--max-rows", type=int, default=10_000_000, help="cap on requests per rollout")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    runs = args.runs or (60 if args.quick else 500)
    batch = args.batch or (10_000 if args.quick else 2_000)
    settings = JudgeSettings()
    rng = np.random.default_rng(args.seed)
    noise = noise_for_floor(settings.log_loss_floor, rng)
    edges = score_edges_from(sigmoid(rng.normal(MU, SIGMA, 200_000)), settings.score_bins)
    began = time.perf_counter()
    aa = simulate(runs, False, settings, noise, batch, args.max_rows, edges, args.seed + 1)
    t_aa = time.perf_counter() - began
    bad = simulate(runs, True, settings, noise, batch, args.max_rows, edges, args.seed + 2)
    t_bad = time.perf_counter() - began - t_aa
    false_rollbacks = sum(r["outcome"] in ("rollback", "halt") for r in aa)
    detected = sum(r["outcome"] == "rollback" for r in bad)
    report: dict[str, Any] = {
        "quick": args.quick, "runs_per_scenario": runs, "batch": batch, "max_rows": args.max_rows,
        "settings": settings.to_dict(), "bad_canary_noise_sd": noise,
        "false_rollback_rate": false_rollbacks / runs, "detection_rate": detected / runs,
        "aa": summarize(aa), "bad": summarize(bad), "seconds": {"aa": t_aa, "bad": t_bad},
        "targets": {"false_rollback_rate_max": 0.05, "detection_rate_min": 0.95},
        "load_average": os.getloadavg(),
        "note": "simulated on a busy shared 2-core machine; rates do not depend on speed",
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "canary_judge.json").write_text(json.dumps(report, indent=2))
    print(f"A/A: {report['aa']['outcomes']}  median rows to decision {report['aa']['median_rows_to_decision']}")
    print(f"bad: {report['bad']['outcomes']}  median rows to decision {report['bad']['median_rows_to_decision']}")
    print(f"false_rollback_rate {report['false_rollback_rate']:.3f} (target ≤ 0.05), "
          f"detection_rate {report['detection_rate']:.3f} (target ≥ 0.95), {runs} rollouts each")
    ok = report["false_rollback_rate"] <= 0.05 and report["detection_rate"] >= 0.95
    ratio = 0.05 / max(report["false_rollback_rate"], 1 / runs)
    print(f"RESULT canary_judge ratio={ratio:.1f} quiver={100 * report['false_rollback_rate']:.1f}% peer=5.0%")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
