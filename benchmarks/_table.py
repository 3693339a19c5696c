"""`make bench-quick`: every quick benchmark's ratios in one table, beside their goals and a recorded baseline.

Each row is a figure that a benchmark writes to `benchmarks/results/<bench>.json` (a dotted path), with its
goal and the direction that is better. `benchmarks/baseline.json` (committed) holds each figure as recorded
in one quiet sitting: the median of several runs and its noise band (the largest distance of a run from that
median, relative, never below `MIN_BAND`), with the machine it came from. It changes only when someone
records on purpose (`--record`). A figure worse than its baseline by more than its band is flagged
(REGRESSED), and the run exits non-zero, as it does when a benchmark fails (different answers, a crash). A
missed goal is shown, not failed on: some goals are not met today, and a table that always fails is not read.

Ratios are quoted because they are what a machine's speed cancels out of; a baseline from another machine
kind is shown but says so in the table's heading.

    python benchmarks/_table.py                         # each benchmark --quick once (what `make bench-quick` runs)
    python benchmarks/_table.py --runs 5                # five runs each, interleaved: medians and spreads
    python benchmarks/_table.py --runs 5 --record --machine polyglot   # ... and write them as the baseline
    python benchmarks/_table.py --only drift,pit_join   # a subset
    python benchmarks/_table.py --no-run                # the table of the results already on disk
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
BASELINE = HERE / "baseline.json"
MIN_BAND = 0.05  # no figure is judged finer than ±5 %, however steady its recorded runs were


@dataclass(frozen=True)
class Row:
    bench: str
    path: str  # dotted path into results/<bench>.json
    label: str
    goal: float | None
    higher_is_better: bool

    @property
    def key(self) -> str:
        return f"{self.bench}:{self.path}"


ROWS: tuple[Row, ...] = (
    Row("pit_join", "ratio_feast_over_quiver_last_values", "Feast / Quiver, 5 last values", 15, True),
    Row("pit_join", "ratio_quiver_lv_over_read_floor", "Quiver last values / read floor", 0.6, False),
    Row("pit_join", "ratio_quiver_all_over_read_floor", "Quiver all 8 features / read floor", 1.5, False),
    Row("drift", "ratio", "Evidently / Quiver, PSI + KS, 1 thread", 10, True),
    Row("drift_alarms", "worst_quiver_per_90_days", "false dataset-drift alerts / 90 steady days", 0.5, False),
    Row("drift_alarms", "check_1m_rows.ratio", "bounded / thresholds drift check time, 1M rows", 1.5, False),
    Row("http_server", "ratios.1_connections.rps_vs_floor", "Quiver / bare ASGI req/s, 1 conn", 0.85, True),
    Row("http_server", "ratios.4_connections.rps_vs_floor", "Quiver / bare ASGI req/s, 4 conn", 0.85, True),
    Row("http_server", "ratios.4_connections.rps_vs_feast", "Quiver / Feast req/s, 4 conn", 5, True),
    # A 1-entity call takes ~0.2 ms: one scheduler hiccup in a quick run moves its p99 by half (measured), so
    # the quick sentinel there is the median; the p99 targets are `make bench`'s. Feast gets 300 calls.
    Row("online_read", "sizes.1.p50_ratio_quiver_over_raw", "SDK / raw MGET p50, 1 entity", 1.2, False),
    Row("online_read", "sizes.100.p99_ratio_quiver_over_raw", "SDK / raw MGET p99, 100 entities", 1.2, False),
    Row("online_read", "sizes.1.p50_ratio_feast_over_quiver", "Feast / Quiver p50, 1 entity", 3, True),
    Row("materialize", "ratio", "Quiver / Feast rows/s, materialize", 10, True),
    Row("predict", "ratio_rps_shadow_vs_peer.1_rows", "Quiver / peer req/s, 1 row, with shadow", 3, True),
    Row("serving_log_store", "serving.rps_ratio", "log on S3 / on a folder, req/s", 0.95, True),
    Row("serving_log_store", "serving.p99_ratio", "log on S3 / on a folder, p99 1 row", 1.05, False),
    Row("backfill", "ratio_spark_over_duckdb", "DuckDB / Spark engine events/s, backfill", None, True),
    Row("streaming", "routes.files.ratio_to_blackhole", "files route / blackhole", 0.8, True),
)


# Arguments besides --quick. To stay within 10 minutes the table reads part 1 of serving_log_store (part 2,
# compaction on moto, takes two minutes) and the file route of streaming; `make bench` runs everything.
# --no-targets: the goal column judges the figures here, so a benchmark's exit status means what it means
# for every benchmark, that it failed (different answers, a crash), not that a quick figure missed a target.
EXTRA_ARGS = {"serving_log_store": ["--serving-only", "--no-targets"], "streaming": ["--sources", "files"],
              "http_server": ["--no-targets"], "online_read": ["--no-targets"], "predict": ["--no-targets"]}


def figure(results: dict[str, Any], path: str) -> float | None:
    """The number at `path` ("a.b.c") of a results document, or None when it is not there."""
    node: Any = results
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return float(node) if isinstance(node, int | float) and not isinstance(node, bool) else None


def noise_band(runs: list[float]) -> float:
    """The largest relative distance of a run from the runs' median, at least MIN_BAND."""
    middle = statistics.median(runs)
    if not middle:
        return MIN_BAND
    return max(MIN_BAND, max(abs(r - middle) for r in runs) / abs(middle))


@dataclass(frozen=True)
class Verdict:
    value: float | None
    base: float | None
    band: float | None
    met: bool | None  # the goal; None when the row has none or no value
    regressed: bool  # worse than the baseline by more than its band

    def change(self, higher_is_better: bool) -> float | None:
        """Relative change against the baseline, signed so that positive is better."""
        if self.value is None or not self.base:
            return None
        moved = self.value / self.base - 1
        return moved if higher_is_better else -moved


def judge(row: Row, value: float | None, baseline: dict[str, Any] | None) -> Verdict:
    entry = (baseline or {}).get("figures", {}).get(row.key)
    base = entry["median"] if entry else None
    band = entry["band"] if entry else None
    met = None
    if value is not None and row.goal is not None:
        met = value >= row.goal if row.higher_is_better else value <= row.goal
    regressed = False
    if value is not None and base is not None and band is not None:
        regressed = value < base * (1 - band) if row.higher_is_better else value > base * (1 + band)
    return Verdict(value, base, band, met, regressed)


def render(rows: tuple[Row, ...] | list[Row], values: dict[str, list[float]], baseline: dict[str, Any] | None,
           failed: dict[str, str]) -> tuple[str, bool]:
    """The table as text, and whether anything is wrong (a regression or a failed benchmark)."""
    machine = (baseline or {}).get("machine", {})
    here = machine_facts()
    same = bool(machine) and machine.get("cpu") == here["cpu"] and machine.get("cores") == here["cores"]
    lines = [f"baseline: {machine.get('label', 'none')} ({machine.get('cpu', '?')}, {machine.get('cores', '?')} "
             f"cores), {(baseline or {}).get('recorded', 'never')} at {(baseline or {}).get('commit', '?')}"
             + ("" if same or not baseline else f" — ANOTHER MACHINE than this one ({here['cpu']}, "
                                                 f"{here['cores']} cores): compare with care"),
             "",
             f"| {'benchmark':<17} | {'figure':<40} | {'goal':>7} | {'now':>7} | {'runs':<24} | "
             f"{'baseline':>13} | {'change':>7} | verdict |",
             f"|{'-' * 19}|{'-' * 42}|{'-' * 9}|{'-' * 9}|{'-' * 26}|{'-' * 15}|{'-' * 9}|---------|"]
    wrong = bool(failed)
    for row in rows:
        runs = values.get(row.key, [])
        value = statistics.median(runs) if runs else None
        verdict = judge(row, value, baseline)
        wrong |= verdict.regressed
        goal = "" if row.goal is None else ("≥ " if row.higher_is_better else "≤ ") + f"{row.goal:g}"
        base = "" if verdict.base is None else f"{verdict.base:.3g} ± {100 * (verdict.band or 0):.0f}%"
        change = verdict.change(row.higher_is_better)
        words = "REGRESSED" if verdict.regressed else \
            ("goal met" if verdict.met else "goal missed" if verdict.met is False else "ok")
        if row.bench in failed:
            words = f"FAILED: {failed[row.bench]}" if value is None else f"{words}; {failed[row.bench]}"
        elif value is None:  # the benchmark ran but its results lack the figure: the table is out of date
            words, wrong = f"NO FIGURE: results/{row.bench}.json has no {row.path}", True
        lines.append(f"| {row.bench:<17} | {row.label:<40} | {goal:>7} | "
                     f"{'—' if value is None else f'{value:.3g}':>7} | "
                     f"{', '.join(f'{r:.3g}' for r in runs):<24} | {base:>13} | "
                     f"{'' if change is None else f'{100 * change:+.0f}%':>7} | {words} |")
    return "\n".join(lines), wrong


def machine_facts() -> dict[str, Any]:
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version()}


def run_once(bench: str) -> tuple[dict[str, Any] | None, str | None]:
    """Run `<bench>.py --quick`; (its results document, None) or (whatever it wrote, why it failed)."""
    out_file = RESULTS / f"{bench}.json"
    started = time.time()
    log = RESULTS / f"{bench}.quick.log"
    RESULTS.mkdir(exist_ok=True)
    with log.open("w") as sink:
        rc = subprocess.run([sys.executable, str(HERE / f"{bench}.py"), "--quick", *EXTRA_ARGS.get(bench, [])],
                            stdout=sink,
                            stderr=subprocess.STDOUT, cwd=HERE.parent).returncode
    fresh = out_file.exists() and out_file.stat().st_mtime >= started
    results = json.loads(out_file.read_text()) if fresh else None
    if rc:
        lines = log.read_text().strip().splitlines() or ["no output"]
        said = [ln for ln in lines if any(w in ln for w in ("TARGET MISSED", "FAIL", "MISMATCH", "Error"))]
        return results, f"exit {rc}: {(said or lines[-1:])[0][:90]} (log {log.relative_to(HERE.parent)})"
    return results, None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1, help="runs of each benchmark, interleaved (default 1)")
    parser.add_argument("--only", help="comma-separated benchmarks (default: every one in the table)")
    parser.add_argument("--no-run", action="store_true", help="tabulate results/*.json as they are")
    parser.add_argument("--record", action="store_true", help="write these figures as the new baseline")
    parser.add_argument("--machine", default=os.environ.get("QUIVER_MACHINE_KIND", "unnamed"),
                        help="the machine kind's name, written with --record")
    args = parser.parse_args()
    benches = list(dict.fromkeys(r.bench for r in ROWS))
    if args.only:
        wanted = args.only.split(",")
        unknown = sorted(set(wanted) - set(benches))
        if unknown:
            parser.error(f"no table rows for {unknown}; known: {', '.join(benches)}")
        benches = [b for b in benches if b in wanted]
    rows = [r for r in ROWS if r.bench in benches]
    values: dict[str, list[float]] = {r.key: [] for r in rows}
    failed: dict[str, str] = {}
    began = time.perf_counter()
    for round_no in range(1 if args.no_run else args.runs):
        for bench in benches:  # round by round, so a slow stretch of the machine touches every benchmark
            if args.no_run:
                path = RESULTS / f"{bench}.json"
                results, why = (json.loads(path.read_text()), None) if path.exists() else (None, "no results")
            else:
                print(f"[{time.perf_counter() - began:6.0f} s] run {round_no + 1}/{args.runs}: {bench} --quick",
                      flush=True)
                results, why = run_once(bench)
            if why:
                failed[bench] = why
            for row in rows:
                if row.bench == bench and results is not None and (v := figure(results, row.path)) is not None:
                    values[row.key].append(v)
    baseline = json.loads(BASELINE.read_text()) if BASELINE.exists() else None
    table, wrong = render(rows, values, baseline, failed)
    print(table)
    print(f"\n{len(benches)} benchmarks, {args.runs} run(s) each, {time.perf_counter() - began:.0f} s")
    if args.record:
        short = [key for key, v in values.items() if len(v) < args.runs]
        if short:  # a run that missed a target still measured; one that wrote no figure did not
            print(f"not recorded: no figure from every run for {short}")
            return 1
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=HERE.parent).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=HERE.parent).stdout.strip()
        commit += "+uncommitted changes" if dirty else ""
        today = datetime.now(UTC).strftime("%Y-%m-%d")
        figures = {key: {"median": statistics.median(v), "band": noise_band(v), "runs": v, "commit": commit,
                         "recorded": today} for key, v in values.items() if v}
        # Recording a subset keeps the other benchmarks' figures (and the commit each was measured at).
        old = {k: v for k, v in (baseline or {}).get("figures", {}).items() if k.split(":")[0] not in benches}
        document = {"recorded": today, "commit": commit,
                    "machine": {"label": args.machine, **machine_facts()},
                    "note": "medians of quiet runs on the named machine; band = largest relative distance of a "
                            f"run from the median, at least {MIN_BAND:.0%}; each figure names the commit whose "
                            "code it measured",
                    "figures": {**old, **figures}}
        BASELINE.write_text(json.dumps(document, indent=2) + "\n")
        print(f"baseline written: {BASELINE.relative_to(HERE.parent)}")
        return 0
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
