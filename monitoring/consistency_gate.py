"""The canary's consistency gate: may `model:version` start a rollout, or its rollout take the next step?

A canary judges a model on what serving fed it. If serving fed values other than the ones the model was
trained on, the judgement is about the wrong thing, so the gate asks the consistency job
(`quiver.monitoring.consistency_job`, recorded by `consistency_records`) and fails closed: without evidence
that the model's features were served right, the step waits. It passes only when, for the window judged,

1. a consistency run of the model (subject "model NAME", with or without a service) **covers** it by data
   time: the run's serving-log window overlaps [start, moment judged] — for a running canary from the
   rollout's start, for a canary about to start the `max_age` before it;
2. the newest covering run is **fresh**: its window ends at most `max_age` (monitoring.yaml
   `consistency_max_age_hours`, 26 h: a daily check is enough) before the moment judged;
3. for every feature the version reads, the newest fresh covering run made under the project's thresholds
   (`consistency_threshold`, `consistency_thresholds`; runs are chosen by window, then by run id, never by
   insertion order alone) **compared** at least `min_rows` rows of it (`consistency_min_rows`, 100) and found
   it **consistent** (within its threshold and, where its view states one, its freshness objective);
4. no run made under a **looser** threshold than the project's (an operator's `quiver consistency
   --threshold 0.5`) of a window at least as new measured a feature over the project's threshold. Such a run
   is recorded and may hold the gate, but it never clears it.

No run, an empty run, an old run or a run of another window holds, and the verdict says which in plain words.
At the start, a feature the serving champion does not read can only be checked on the canary's own rows:
it is not required there, and every canary step requires it like any other. The gate only stops a canary
from growing: `pipelines/loop_rollout.py` still takes a step the judge would roll back or halt.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select

from quiver.registry import Registry
from quiver.registry.consistency_tables import consistency_results, consistency_runs

_SHOWN = 4  # features named in a reason before "and N more"
_LOOSER = 1e-12  # a stored threshold above the project's by more than float noise is looser


@dataclass(frozen=True)
class GateRules:
    """What the gate asks of a consistency check (monitoring.yaml; see docs/consistency.md)."""

    max_age: timedelta = timedelta(hours=26)
    min_rows: int = 100
    threshold: float = 0.001
    thresholds: Mapping[str, float] = field(default_factory=dict)  # view:feature → its own threshold

    def threshold_of(self, feature: str) -> float:
        return float(self.thresholds.get(feature, self.threshold))

    @classmethod
    def of_settings(cls, settings: Any) -> GateRules:
        """The rules of a project's `MonitoringSettings`."""
        return cls(max_age=timedelta(hours=settings.consistency_max_age_hours),
                   min_rows=int(settings.consistency_min_rows), threshold=settings.consistency_threshold,
                   thresholds=dict(settings.consistency_thresholds))


@dataclass(frozen=True)
class GateVerdict:
    """The gate's answer. `reason` is plain words either way; `runs` the consistency runs it rests on (the
    deciding run of each feature, or the newest run it found too old or off the window); `blocked` one line per
    feature that holds it; `key` names the cause without the moment, so a hold is recorded once while its cause
    stays the same."""

    passed: bool
    reason: str
    runs: tuple[int, ...] = ()
    blocked: tuple[str, ...] = ()
    key: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, "reason": self.reason, "runs": list(self.runs), "blocked": list(self.blocked)}


def gate_verdict(registry: Registry, model: str, version: int, features: Sequence[str], *, start: datetime,
                 moment: datetime, rules: GateRules, first_served: Iterable[str] = ()) -> GateVerdict:
    """The gate for `model:version` (reading `features`) judged at `moment` over [start, moment] (see the
    module docstring). `first_served`: features no version serving now reads, not required (a canary's
    start)."""
    label = f"{model}:{version}"
    start, moment = _utc(start), _utc(moment)
    window = f"{_when(start)} → {_when(moment)}"
    runs = [r for r in _runs_of(registry, model) if r["window_start"] < moment]
    covering = [r for r in runs if r["window_end"] > start]
    if not covering:
        newest = f"newest: {_run(runs[0], moment)}" if runs else f"none recorded for model {model}"
        return GateVerdict(False, f"no consistency check covers {window} for {label} ({newest})",
                           (runs[0]["id"],) if runs else (), key=f"uncovered:{runs[0]['id'] if runs else 0}")
    fresh = [r for r in covering if moment - r["window_end"] <= rules.max_age]
    if not fresh:
        old = covering[0]
        return GateVerdict(False, f"the newest consistency check covering {window} for {label} is too old: "
                                  f"{_run(old, moment)}, at most {_hours(rules.max_age)} allowed",
                           (old["id"],), key=f"old:{old['id']}")
    skipped = set(first_served)
    required = [f for f in dict.fromkeys(features) if f not in skipped]
    results = _results_of(registry, [r["id"] for r in fresh])
    loose = {r["id"] for r in fresh if any(x["threshold"] > rules.threshold_of(x["feature"]) + _LOOSER
                                           for x in results.get(r["id"], []))}
    project_runs = [r for r in fresh if r["id"] not in loose]
    if not project_runs:
        return GateVerdict(False, f"only consistency checks with a looser threshold than the project's cover "
                                  f"{window} for {label} ({', '.join(_run(r, moment) for r in fresh[:3])}): "
                                  f"recorded, but they never clear the gate",
                           tuple(r["id"] for r in fresh), key="loose:" + ",".join(str(r["id"]) for r in fresh))
    deciding = project_runs[0]  # the newest window's newest run made under the project's thresholds
    if deciding["rows_compared"] == 0:
        return GateVerdict(False, f"the newest consistency check covering {window} for {label} compared no rows: "
                                  f"{_run(deciding, moment)}, status {deciding['status']}", (deciding["id"],),
                           key=f"empty:{deciding['id']}")
    blocked: list[str] = []
    causes: list[str] = []
    used: dict[int, None] = {deciding["id"]: None}
    for feature in required:
        found = _result(results.get(deciding["id"], []), feature)
        if found is not None and found["status"] != "ok":
            what, limit = _why_not_ok(found)
            blocked.append(f"{found['feature']} ({what} in consistency run #{deciding['id']}, {limit})")
            causes.append(f"{feature}:wrong:{deciding['id']}")
            continue
        if found is None or found["compared"] < rules.min_rows:
            compared = found["compared"] if found is not None else 0
            blocked.append(f"{feature} ({compared:,} rows compared in consistency run #{deciding['id']}, at least "
                           f"{rules.min_rows:,} needed)")
            causes.append(f"{feature}:rows:{deciding['id']}")
            continue
        threshold = rules.threshold_of(found["feature"])
        for run in fresh:  # newest first: a looser run of a window at least as new may still hold
            if run["id"] not in loose or run["window_end"] < deciding["window_end"]:
                continue
            other = _result(results.get(run["id"], []), feature)
            if other is not None and other["wrong_rate"] > threshold:
                blocked.append(f"{other['feature']} ({other['wrong_rate']:.2%} wrong in consistency run #{run['id']}, "
                               f"a run with a looser threshold, over the project's {threshold:.2%})")
                causes.append(f"{feature}:loose:{run['id']}")
                used[run["id"]] = None
                break
    if blocked:
        shown = ", ".join(blocked[:_SHOWN]) + (f" and {len(blocked) - _SHOWN} more" if len(blocked) > _SHOWN else "")
        return GateVerdict(False, f"{label} reads {shown}: the newest consistency check covering {window} does not clear it",
                           tuple(used), tuple(blocked), key="features:" + ",".join(causes))
    note = f"; not required before the canary serves them: {', '.join(sorted(skipped & set(features)))}" \
        if skipped & set(features) else ""
    return GateVerdict(True, f"consistency check {_run(deciding, moment)} covers {window}: each of {label}'s "
                             f"{len(required)} features compared on at least {rules.min_rows:,} rows and consistent"
                             f"{note}", tuple(used), key=f"passed:{','.join(str(i) for i in used)}")


def gate_off() -> GateVerdict:
    """The verdict of a project that set `consistency_gate: false`."""
    return GateVerdict(True, "the consistency gate is off (consistency_gate: false in monitoring.yaml)", key="off")


def _runs_of(registry: Registry, model: str) -> list[dict[str, Any]]:
    """The model's consistency runs, newest window first (then the newest run of a window first)."""
    subject = consistency_runs.c.subject
    query = (select(consistency_runs.c.id, consistency_runs.c.subject, consistency_runs.c.window_start,
                    consistency_runs.c.window_end, consistency_runs.c.rows_compared, consistency_runs.c.status)
             .where(consistency_runs.c.project == registry.project)
             .where((subject == f"model {model}") | subject.startswith(f"model {model} service ", autoescape=True)))
    with registry.engine.connect() as connection:
        rows = [dict(r._mapping) for r in connection.execute(query)]
    for row in rows:
        row["window_start"], row["window_end"] = _utc(row["window_start"]), _utc(row["window_end"])
    return sorted(rows, key=lambda r: (r["window_end"], r["id"]), reverse=True)


def _why_not_ok(result: dict[str, Any]) -> tuple[str, str]:
    """("2.00% wrong", "threshold 0.10%"), or, for a feature within its threshold but served staler than its
    view's freshness objective, ("p99 lag 3600 s", "freshness objective 600 s")."""
    import json

    freshness = json.loads(result.get("detail_json") or "{}").get("freshness") or {}
    if freshness.get("status") == "over" and result["wrong_rate"] <= result["threshold"]:
        return f"p99 lag {freshness['lag_p99_s']:g} s", f"freshness objective {freshness['objective_s']:g} s"
    return f"{result['wrong_rate']:.2%} wrong", f"threshold {result['threshold']:.2%}"


def _results_of(registry: Registry, run_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
    columns = [consistency_results.c[name] for name in ("run_id", "feature", "status", "compared", "wrong_rate",
                                                        "threshold", "detail_json")]
    out: dict[int, list[dict[str, Any]]] = {}
    with registry.engine.connect() as connection:
        for row in connection.execute(select(*columns).where(consistency_results.c.run_id.in_(run_ids))):
            out.setdefault(row.run_id, []).append(dict(row._mapping))
    return out


def _result(results: list[dict[str, Any]], feature: str) -> dict[str, Any] | None:
    """The result of `feature` (view:feature, or a model's bare input name) in one run; of several views'
    features of that bare name, the one that compared the fewest rows (the gate takes the weaker evidence)."""
    matching = [r for r in results if r["feature"] == feature or r["feature"].rsplit(":", 1)[-1] == feature]
    ordered = [r for r in matching if r["status"] != "ok"] or sorted(matching, key=lambda r: int(r["compared"]))
    return ordered[0] if ordered else None


def _utc(moment: datetime) -> datetime:
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _when(moment: datetime) -> str:
    return f"{moment:%Y-%m-%d %H:%M}"


def _hours(span: timedelta) -> str:
    return f"{round(span.total_seconds() / 3600, 1):g} h"


def _run(run: Mapping[str, Any], moment: datetime) -> str:
    """Run #id of its window, and its age at `moment` by data time."""
    age = max(moment - run["window_end"], timedelta(0))
    return (f"run #{run['id']} of {run['window_start']:%m-%d %H:%M} → {run['window_end']:%m-%d %H:%M}, "
            f"{_hours(age)} old")
