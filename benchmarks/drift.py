"""Drift check speed: Quiver's vectorised PSI + KS vs Evidently 0.7.23 on the same data, same answers.

50 numeric features × N rows (1M; 100k with --quick) in reference and current: 35 undrifted, 5 with a mild
shift (0.02 sd — the KS p-value then falls in scipy's slow exact-smirnov band), 5 moderate (0.1 sd), 5 strong
(0.5 sd); a mix of normal, lognormal, uniform, exponential and integer (Poisson) columns.

* quiver: `quiver.monitoring.drift.compute_drift(ref, cur, workers=1)` — PSI and KS per feature, judged, on one
  thread, like Evidently: the headline ratio is single-thread against single-thread (`quiver_threads: 1`).
  The default (up to 4 threads over columns) is timed too and reported on its own line, never in RESULT.
* evidently: Evidently's own stattest functions per feature (`psi_stat_test`, `ks_stat_test`), i.e. the
  computation only, without its Report machinery — the stricter comparison and the headline ratio.
* evidently_report: the same two metrics through Evidently's public `Report([ValueDrift(...)])` API,
  which is how users run it (includes its per-column histograms for the widgets); timed once with
  --report-api (measured here: 12–32 s at 100k rows, ~5 minutes at 1M).

Systems run in rounds (7 by default), the order alternating; each side's figure per round is the time per call
of calls in a row lasting at least 0.4 s (Quiver makes about 3, Evidently 1); the ratio is the median of the
per-round ratios, taken on a shared 2-core machine. Every PSI and KS p-value of Quiver must equal
Evidently's to 1e-9 (absolute for values ≤ 1, relative above). Peak extra memory is measured in separate,
untimed runs with tracemalloc (numpy buffers are traced).

    python benchmarks/drift.py [--quick]
Last line: RESULT drift ratio=<evidently / quiver> quiver=<median>s peer=<median>s
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "platform")]
RESULTS = ROOT / "benchmarks" / "results"
F = 50
SAMPLE_S = 0.4


def make_data(rows: int, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame, dict[str, str]]:
    rng = np.random.default_rng(seed)
    ref: dict[str, np.ndarray] = {}
    cur: dict[str, np.ndarray] = {}
    plan: dict[str, str] = {}
    for i in range(F):
        shift = 0.0 if i < 35 else 0.02 if i < 40 else 0.1 if i < 45 else 0.5
        plan[f"f{i:02d}"] = {0.0: "none", 0.02: "mild", 0.1: "moderate", 0.5: "strong"}[shift]
        kind = i % 5
        if kind == 0:
            r, c = rng.normal(0, 1, rows), rng.normal(shift, 1, rows)
        elif kind == 1:
            r, c = rng.lognormal(3, 0.8, rows), rng.lognormal(3 + shift * 0.8, 0.8, rows)
        elif kind == 2:
            r, c = rng.uniform(0, 1, rows), rng.uniform(0, 1, rows) + shift * 0.29
        elif kind == 3:
            r, c = rng.exponential(2.0, rows), rng.exponential(2.0, rows) + shift * 2.0
        else:
            r, c = rng.poisson(30, rows), rng.poisson(30 + shift * 5.5, rows)
        ref[f"f{i:02d}"], cur[f"f{i:02d}"] = r, c
    return pd.DataFrame(ref), pd.DataFrame(cur), plan


def run_quiver(ref: pd.DataFrame, cur: pd.DataFrame, workers: int | None = 1) -> dict[str, tuple[float, float, float]]:
    """Quiver's drift scores; `workers=1` is one thread (the headline), None its default thread pool."""
    from quiver.monitoring.drift import compute_drift

    report = compute_drift(ref, cur, workers=workers)
    return {f.feature: (f.scores["psi"], f.scores["ks_pvalue"], f.scores["ks_statistic"]) for f in report.features}


def run_evidently(ref: pd.DataFrame, cur: pd.DataFrame) -> dict[str, tuple[float, float]]:
    from evidently.legacy.calculations.stattests import ks_stat_test, psi_stat_test
    from evidently.legacy.core import ColumnType

    out = {}
    for name in ref.columns:
        r, c = ref[name], cur[name]
        out[name] = (float(psi_stat_test(r, c, ColumnType.Numerical, None).drift_score),
                     float(ks_stat_test(r, c, ColumnType.Numerical, None).drift_score))
    return out


def run_evidently_report(ref: pd.DataFrame, cur: pd.DataFrame) -> dict[str, tuple[float, float]]:
    from evidently import DataDefinition, Dataset, Report
    from evidently.metrics import ValueDrift

    definition = DataDefinition(numerical_columns=list(ref.columns))
    metrics = [ValueDrift(column=c, method=m) for c in ref.columns for m in ("psi", "ks")]
    snapshot = Report(metrics).run(Dataset.from_pandas(cur, data_definition=definition),
                                   Dataset.from_pandas(ref, data_definition=definition))
    values: dict[tuple[str, str], float] = {}
    for metric in snapshot.dict()["metrics"]:
        values[(metric["config"]["column"], metric["config"]["method"])] = float(metric["value"])
    return {c: (values[(c, "psi")], values[(c, "ks")]) for c in ref.columns}


def timed(fn: Any, *args: Any) -> tuple[float, Any]:
    started = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - started, result


def per_call(fn: Any) -> tuple[float, Any]:
    """Seconds per call of `fn`, called in a row until SAMPLE_S has passed (at least once), and its answer."""
    calls, started = 0, time.perf_counter()
    while not calls or time.perf_counter() - started < SAMPLE_S:
        answer = fn()
        calls += 1
    return (time.perf_counter() - started) / calls, answer


def peak_memory(fn: Any, *args: Any) -> float:
    """Peak bytes allocated (beyond what existed) while `fn` runs, in MiB."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    fn(*args)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return (peak - base) / 2**20


def worst_difference(ours: dict[str, tuple[float, ...]], theirs: dict[str, tuple[float, float]]) -> float:
    worst = 0.0
    for name, (psi, p) in theirs.items():
        for a, b in ((ours[name][0], psi), (ours[name][1], p)):
            worst = max(worst, abs(a - b) / max(1.0, abs(b)))
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="100k rows (< 60 s)")
    parser.add_argument("--rows", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--report-api", action="store_true", help="also time Evidently's Report API (slow)")
    args = parser.parse_args()
    rows = args.rows or (100_000 if args.quick else 1_000_000)
    rounds = args.rounds or 7
    ref, cur, plan = make_data(rows)
    print(f"data: {F} features × {rows:,} rows per side ({ref.memory_usage().sum() / 2**20:.0f} MiB each)")

    run_quiver(ref.iloc[:2_000], cur.iloc[:2_000])  # imports and warm-up, untimed
    run_quiver(ref.iloc[:2_000], cur.iloc[:2_000], None)
    run_evidently(ref.iloc[:2_000], cur.iloc[:2_000])
    threads = min(F, os.cpu_count() or 1, 4)  # what compute_drift's default pool uses
    quiver_times, evidently_times, threaded_times = [], [], []
    for i in range(rounds):
        # The order alternates, so neither side always runs on the heels of the other. Both sides follow one
        # rule: calls in a row until SAMPLE_S has passed, the time per call (one 0.1 s call is at the mercy
        # of the scheduler; Evidently's 1.4 s call is one call).
        for side in (("quiver", "evidently") if i % 2 == 0 else ("evidently", "quiver")):
            if side == "quiver":
                t, ours = per_call(lambda: run_quiver(ref, cur, 1))
                quiver_times.append(t)
            else:
                t, theirs = per_call(lambda: run_evidently(ref, cur))
                evidently_times.append(t)
        t, ours_threaded = timed(run_quiver, ref, cur, None)
        threaded_times.append(t)
        print(f"round {i + 1}: quiver (1 thread) {quiver_times[-1]:.3f} s   evidently {evidently_times[-1]:.2f} s   "
              f"quiver ({threads} threads) {threaded_times[-1]:.2f} s")
    report_time: float | None = None
    diff_report = 0.0
    if args.report_api:
        report_time, report_values = timed(run_evidently_report, ref, cur)
        diff_report = worst_difference(ours, report_values)
        print(f"evidently Report API (once): {report_time:.2f} s")

    diff_core = worst_difference(ours, theirs)
    diff_threaded = worst_difference(ours_threaded, theirs)
    same = diff_core <= 1e-9 and diff_report <= 1e-9 and diff_threaded <= 1e-9
    quiver_mem = peak_memory(run_quiver, ref, cur)
    evidently_mem = peak_memory(run_evidently, ref, cur)
    q, e = float(np.median(quiver_times)), float(np.median(evidently_times))
    ratio = float(np.median(np.array(evidently_times) / np.array(quiver_times)))  # paired by round
    qt = float(np.median(threaded_times))
    drifted = {name: (ours[name][1] < 0.05 and ours[name][2] >= 0.1) or ours[name][0] >= 0.2 for name in ours}
    summary = {
        "rows": rows, "features": F, "rounds": rounds, "quick": args.quick,
        "note": "busy machine shared with other jobs",
        "quiver_threads": 1, "evidently_threads": 1,
        "quiver_s": quiver_times, "evidently_s": evidently_times, "evidently_report_s": report_time,
        "quiver_median_s": q, "evidently_median_s": e, "ratio": ratio,
        "ratio_note": "median over rounds of evidently's time / quiver's time in the same round",
        "threaded": {"quiver_threads": threads, "quiver_s": threaded_times, "quiver_median_s": qt,
                     "ratio": e / qt, "worst_difference_vs_evidently": diff_threaded},
        "ratio_vs_report": report_time / q if report_time else None,
        "worst_difference_vs_evidently": diff_core, "worst_difference_vs_report": diff_report, "same_answers": same,
        "quiver_peak_extra_mib": quiver_mem, "evidently_peak_extra_mib": evidently_mem,
        "input_mib_per_side": float(ref.memory_usage().sum() / 2**20),
        "process_max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "target_5s_met": q <= 5.0, "target_10x_met": ratio >= 10.0,
        "alerting_features_by_planned_shift": {kind: sum(drifted[n] for n, k in plan.items() if k == kind)
                                               for kind in ("none", "mild", "moderate", "strong")},
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "drift.json").write_text(json.dumps(summary, indent=2))
    print(f"same answers: {same} (worst difference {max(diff_core, diff_report, diff_threaded):.2e})")
    print(f"quiver with {threads} threads (not the headline): median {qt:.2f} s, {e / qt:.1f}× evidently's one thread")
    print(f"peak extra memory: quiver {quiver_mem:.0f} MiB, evidently {evidently_mem:.0f} MiB "
          f"(inputs {summary['input_mib_per_side']:.0f} MiB per side)")
    versus_report = f"; vs Report API {report_time / q:.1f}×" if report_time else ""
    print(f"targets: ≤ 5 s {'met' if q <= 5 else 'MISSED'}; ≥ 10× {'met' if ratio >= 10 else 'MISSED'}"
          f"{versus_report}")
    if not same:
        print("ERROR: Quiver and Evidently disagree", file=sys.stderr)
        sys.exit(1)
    print("headline: quiver on 1 thread vs evidently on 1 thread")
    print(f"RESULT drift ratio={ratio:.1f} quiver={q:.3f}s peer={e:.2f}s")


if __name__ == "__main__":
    main()
