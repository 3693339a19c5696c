"""The operator's CLI on the demo-like project (`operator_world`), run as the `quiver` command:
decisions with their evidence, models described with aliases, decisions and why, every rollout's status,
evaluation with intervals and its window, drift of a model's reference against its serving logs, unknown
names answered with the closest one, traffic shares as fractions, and `serve-model` saying what it serves
and every swap. (Labels have their own module: they write.) Commands run in process; `serve-model` is a
server, so it runs as the installed `quiver` command."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cli_runs import QUIVER, done, quiver

pytestmark = pytest.mark.integration


def failed(result: subprocess.CompletedProcess[str]) -> str:
    """The stderr of a run refused as a user error (exit 2, one line, no traceback)."""
    assert result.returncode == 2, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    assert "Traceback" not in result.stderr
    return " ".join(result.stderr.split())


def test_decisions_show_prints_the_guardrail_table_and_json_has_every_number(operator_world: Any) -> None:
    world = operator_world
    promote = world.decisions["promote"]
    text = done(quiver("decisions", "show", str(promote), cwd=world.root))
    assert f"decision #{promote}" in text and "promote" in text and "every guardrail passed at 0.5" in text
    for header in ("guardrail", "verdict", "confidence sequence", "floor", "fails above"):
        assert header in text
    for name in ("error_rate", "latency_p99", "score_shift", "log_loss", "brier"):
        assert name in text
    assert "champion → fraud_model:3" in text  # what applying it did
    assert re.search(r"[1-9][\d,]* paired while serving, 0 replayed by the judge .* 0 unpaired", text)
    record = json.loads(done(quiver("decisions", "show", str(promote), "--json", cwd=world.root)))
    assert record["id"] == promote and record["outcome"] == "promote" and record["kind"] == "canary_step"
    assert {g["name"] for g in record["guardrails"]} == {"error_rate", "latency_p99", "score_shift", "log_loss",
                                                        "brier"}
    for g in record["guardrails"]:
        assert g["status"] == "pass" and g["lower"] <= g["estimate"] <= g["upper"] < g["floor"], g
    shadow = json.loads(done(quiver("decisions", "show", str(world.decisions["shadow"]), "--json", cwd=world.root)))
    assert [r["metric"] for r in shadow["intervals"]] == ["log_loss", "brier", "auc"]
    assert all(r["lower"] is not None and r["upper"] is not None for r in shadow["intervals"][:2])
    assert "no decision #999 " in failed(quiver("decisions", "show", "999", cwd=world.root))
    listed = done(quiver("decisions", "list", "fraud_model", cwd=world.root))
    assert all(f"#{i}" in listed for i in world.decisions.values())


def test_models_describe_shows_aliases_decisions_and_why(operator_world: Any) -> None:
    world = operator_world
    text = done(quiver("models", "describe", "fraud_model", "3", cwd=world.root))
    assert "why: registered" in text and f"canary promoted by decision #{world.decisions['promote']}" in text
    assert "aliases of this version: champion" in text and "previous → 1" in text
    assert f"#{world.decisions['promote']}" in text and "shadow verdict" in text  # its decisions, listed
    record = json.loads(done(quiver("models", "describe", "fraud_model", "--json", cwd=world.root)))
    assert record["version"] == 3 and record["aliases"] == ["champion"]  # the default ref: the champion
    assert {d["id"] for d in record["decisions"]} >= {world.decisions["shadow"], world.decisions["promote"]}
    rejected = done(quiver("models", "describe", "fraud_model", "2", cwd=world.root))
    assert "rejected by the offline gate" in rejected and "baseline" in rejected


def test_unknown_model_version_or_alias_is_an_error_with_the_closest_name(operator_world: Any) -> None:
    root = operator_world.root
    # Before: `models list fraud_modl` printed an empty table and exited 0.
    for args in (("models", "list", "fraud_modl"), ("models", "describe", "fraud_modl"),
                 ("models", "history", "fraud_modl"), ("canary", "status", "fraud_modl"),
                 ("evaluate", "fraud_modl"), ("decisions", "list", "fraud_modl"),
                 ("drift", "--model", "fraud_modl")):
        assert "unknown model 'fraud_modl' (did you mean 'fraud_model'?)" in failed(quiver(*args, cwd=root)), args
    assert "no alias 'champoin' (did you mean 'champion'?)" in failed(
        quiver("models", "describe", "fraud_model", "champoin", cwd=root))
    assert "has no version 9 (its versions: 1, 2, 3)" in failed(quiver("models", "describe", "fraud_model", "9",
                                                                        cwd=root))
    assert "unknown arm 'shadoww' (did you mean 'shadow'?)" in failed(
        quiver("drift", "--model", "fraud_model", "--arm", "shadoww", cwd=root))


def test_canary_status_covers_every_rollout_in_fractions(operator_world: Any) -> None:
    world = operator_world
    text = done(quiver("canary", "status", cwd=world.root))
    assert f"#{world.rollout_id}" in text and "watching" in text
    # Before: a promoted rollout read "step 0, 100%".
    assert "promoted (watch running) after step 1 of 1 (canary share 0.5); share now 1" in text
    assert "%" not in text
    data = json.loads(done(quiver("canary", "status", "--json", cwd=world.root)))
    assert [r["id"] for r in data["rollouts"]] == [world.rollout_id]
    assert str(world.rollout_id) in data["decisions"]  # the latest decisions of the watched rollout
    # Traffic shares are fractions everywhere; percentages get the fractions they meant.
    refused = failed(quiver("canary", "start", "fraud_model", "--version", "2", "--steps", "5,25,50,100",
                            cwd=world.root))
    assert "fractions of 1, not percentages: did you mean 0.05,0.25,0.5,1?" in refused


def test_evaluate_prints_intervals_and_the_window_it_covered(operator_world: Any) -> None:
    world = operator_world
    text = done(quiver("evaluate", "fraud_model", cwd=world.root))
    assert "window asked [first log, last log); rows served 20" in text and "labels known by now" in text
    assert "log loss [95 %]" in text and "AUC [95 %]" in text
    data = json.loads(done(quiver("evaluate", "fraud_model", "--json", cwd=world.root)))
    arms = {(a["arm"], a["model_version"]): a for a in data["arms"]}
    assert ("canary", "fraud_model:3") in arms and ("champion", "fraud_model:1") in arms
    canary = arms[("canary", "fraud_model:3")]
    lower, upper = canary["intervals"]["log_loss"]
    assert lower < canary["log_loss"] < upper and canary["calls"] > 100 and canary["entities"] > 50
    assert data["first_served"] <= canary["first_served"] <= canary["last_served"] <= data["last_served"]


def test_drift_of_a_models_reference_against_its_serving_logs(operator_world: Any, tmp_path: Path) -> None:
    world = operator_world
    # Before: `quiver drift` needed two files, and serving-log columns (`feature.*`) matched no reference column.
    text = done(quiver("drift", "--model", "fraud_model", "--no-record", "--report",
                       str(tmp_path / "drift.html"), cwd=world.root))
    assert "fraud_model:3's training reference" in text and "on arm 'champion'" in text
    rows = {line.split("│")[1].strip() for line in text.splitlines() if line.startswith("│")}
    assert {"f0", "f1", "category", "score"} <= rows, text  # the score is compared too
    page = (tmp_path / "drift.summary.html").read_text()
    assert "Drift of fraud_model:3 (champion arm)" in page and "serving logs [" in page and "UTC" in page
    canary = done(quiver("drift", "--model", "fraud_model", "--arm", "canary", "--version", "3", "--no-record",
                         cwd=world.root))
    assert "rows it scored on arm 'canary'" in canary
    empty = failed(quiver("drift", "--model", "fraud_model", "--start", "2020-01-01", "--end", "2020-01-02",
                          cwd=world.root))
    assert "no serving-log rows of fraud_model:3 on arm 'champion'" in empty


def test_serve_model_says_what_it_serves_and_every_swap(operator_world: Any) -> None:
    from quiver.registry.models import ModelRegistry
    from quiver.registry.repository import Registry
    from tests.harness import free_port

    world = operator_world
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUIVER_")} | {"COLUMNS": "250"}
    proc = subprocess.Popen([str(QUIVER), "serve-model", "fraud_model", "--port", str(port), "--poll-interval", "0.3"],
                            cwd=world.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    models = ModelRegistry(Registry(world.config.registry, project=world.config.project))
    lines: list[str] = []

    def wait_for(needle: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line and proc.poll() is not None:
                break
            lines.append(line)
            if needle in line:
                return line
        raise AssertionError(f"no {needle!r} in:\n{''.join(lines)}")

    try:
        started = wait_for("serving fraud_model")
        assert "champion fraud_model:3" in started and "shadow fraud_model:1" in started
        assert f"http://127.0.0.1:{port}/predict" in started
        models.set_alias("fraud_model", "shadow", None, expected=1, reason="test: swap")
        swapped = wait_for("swapped in")
        assert "shadow -" in swapped.split("(was:")[0] and "shadow fraud_model:1" in swapped.split("(was:")[1]
        models.set_alias("fraud_model", "shadow", 1, expected=None, reason="test: swap back")
        back = wait_for("swapped in")
        assert "shadow fraud_model:1" in back.split("(was:")[0]
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)
        models.registry.close()
