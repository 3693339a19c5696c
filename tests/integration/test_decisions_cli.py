"""`quiver decisions` read at 3 a.m. on the demo-like project (`operator_world`): `list` readable at 160
columns with every version label whole, `show` opening with the decision's plain sentence, naming the floors
it was judged on that are not the defaults, and the one latency cut-off the console names too."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.cli_runs import done, quiver

pytestmark = pytest.mark.integration


def test_decisions_list_at_160_columns_keeps_every_version_label_whole(operator_world: Any) -> None:
    from quiver.registry import Registry, rollouts
    from quiver.registry.plain_words import decision_sentence

    world = operator_world
    text = done(quiver("decisions", "list", "fraud_model", cwd=world.root, env={"COLUMNS": "160"}))
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 160
    assert not re.search(r"fraud_mod\w*…", text), text  # before: "fraud_model…" in both version columns
    registry = Registry(world.config.registry, project=world.config.project)
    for decision_id in world.decisions.values():
        d = rollouts.get_decision(registry, decision_id)
        [row] = [i for i, line in enumerate(lines) if re.match(rf"│ #{d.id}\s", line)]
        assert re.search(rf"\s{re.escape(d.candidate_version)}\s", lines[row]), lines[row]
        assert f"vs {d.champion_version}" in lines[row + 1], lines[row + 1]
        # What happened in plain words, starting on the row's first line (the numbers are `show N`'s).
        assert " ".join(decision_sentence(d).split()[:2]) in lines[row], lines[row]
    registry.close()


def test_decisions_show_opens_with_plain_words_and_marks_non_default_floors(operator_world: Any) -> None:
    world = operator_world
    promote = world.decisions["promote"]
    lines = done(quiver("decisions", "show", str(promote), cwd=world.root, env={"COLUMNS": "250"})).splitlines()
    assert lines[1] == ("fraud_model:3 was promoted to champion: at canary share 0.5 every guardrail showed it no "
                        "worse than the champion fraud_model:1 beyond its floor.")
    text = "\n".join(lines)
    assert "why (the numbers): every guardrail passed at 0.5" in text
    # The operator world's canary ran on loosened floors: log loss 0.08 and Brier 0.03 (defaults 0.02, 0.01).
    assert "Judged on non-default floors: " in text
    assert "log-loss floor 0.08 (default 0.02, looser)" in text and "Brier floor 0.03 (default 0.01, looser)" in text
    assert "non-default: looser than 0.02" in text  # in the guardrail table, beside log loss's floor
    [cutoff] = re.findall(r"latency cut-off (\S+ ms) \(as decision #(\d+) recorded it", text)
    record = json.loads(done(quiver("decisions", "show", str(promote), "--json", cwd=world.root)))
    assert record["sentence"] == lines[1]
    assert {c["name"] for c in record["non_default_settings"]} >= {"log_loss_floor", "brier_floor"}
    assert cutoff == (f"{record['latency_cutoff_ms']:.2f}".rstrip("0").rstrip(".") + " ms", str(promote))
    latency = next(g for g in record["statistics"]["guardrails"] if g["name"] == "latency_p99")
    assert record["latency_cutoff_ms"] == latency["statistics"]["threshold_ms"]  # the one the decision recorded
