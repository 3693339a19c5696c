"""Smaller things an operator hits, in-process on the demo-like project (`operator_world`, or a copy where a
command writes): `models list` says where each version stands, `decisions list` cuts its "why" at a word,
`drift --model` records only with `--record`, and `serve-model` / `describe` name the closest name."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from quiver.config import load_config

pytestmark = pytest.mark.integration
MODEL = "fraud_model"
LONG_REASON = ("the on-call engineer saw the canary's latency climb on the payments dashboard while the "
               "guardrails still passed, and rolled it back before the evening peak")


def cli(*args: str) -> Any:
    from quiver.cli import _register_optional_commands, app

    if not any(getattr(g, "name", None) == "models" for g in app.registered_groups):
        _register_optional_commands()
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "400"})


def rows(output: str) -> list[list[str]]:
    """The cells of a rich table's rows."""
    return [[cell.strip() for cell in line.split("│")[1:-1]] for line in output.splitlines()
            if line.startswith("│")]


@pytest.fixture(scope="module")
def copied(operator_world: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A copy of the world (its own registry) where an operator rolled the promoted version back; returns its
    quiver.yaml and the rollback's decision id."""
    from quiver.monitoring.canary_judge import rollback

    root = tmp_path_factory.mktemp("copied") / "project"
    shutil.copytree(operator_world.root, root)
    config_file = root / "quiver.yaml"
    config_file.write_text(config_file.read_text().replace(str(operator_world.root), str(root)))
    decision, _ = rollback(load_config(config_file), MODEL, reason=LONG_REASON, by="oncall")
    return config_file, decision.id


def test_models_list_says_where_each_version_stands(operator_world: Any, copied: tuple[Path, int]) -> None:
    """Before: every version but the rejected one read plain "registered", a rolled-back one included."""
    config = str(operator_world.root / "quiver.yaml")
    result = cli("models", "list", MODEL, "--config", config)
    assert result.exit_code == 0, result.output
    stands = {r[1]: (r[2], r[3]) for r in rows(result.output)}
    assert stands == {"1": ("registered", "shadow"), "2": ("rejected", "-"), "3": ("registered", "champion")}, \
        result.output
    config_file, decision = copied
    after = cli("models", "list", MODEL, "--config", str(config_file))
    stands = {r[1]: r[3] for r in rows(after.output)}
    assert stands == {"1": "champion", "2": "-", "3": f"rolled back by decision #{decision}"}, after.output


def test_decisions_list_cuts_why_at_a_word(copied: tuple[Path, int]) -> None:
    """Before: the first 100 characters, cut mid-word ("… before the e")."""
    config_file, decision = copied
    result = cli("decisions", "list", MODEL, "--config", str(config_file))
    assert result.exit_code == 0, result.output
    table = rows(result.output)
    start = next(i for i, r in enumerate(table) if r[0] == f"#{decision}")
    end = next((i for i in range(start + 1, len(table)) if table[i][0]), len(table))
    why = " ".join(r[-1] for r in table[start:end] if r[-1])  # rich wraps a long cell over lines
    assert why.endswith(" …") and len(why) <= 102, why
    shown = why.removesuffix(" …")
    assert LONG_REASON.startswith(shown) and LONG_REASON[len(shown)] == " ", why


def test_models_describe_cuts_why_at_a_word(copied: tuple[Path, int], operator_world: Any) -> None:
    """Before: the first 120 characters, cut mid-word."""
    config_file, decision = copied
    result = cli("models", "describe", MODEL, str(operator_world.promoted_version), "--config", str(config_file))
    assert result.exit_code == 0, result.output
    table = rows(result.output)
    start = next(i for i, r in enumerate(table) if r[0] == f"#{decision}")
    end = next((i for i in range(start + 1, len(table)) if table[i][0]), len(table))
    why = " ".join(r[-1] for r in table[start:end] if r[-1])
    assert why.endswith(" …") and len(why) <= 122, why
    shown = why.removesuffix(" …")
    assert LONG_REASON.startswith(shown) and LONG_REASON[len(shown)] == " ", why


def test_drift_of_a_model_records_only_with_record(copied: tuple[Path, int]) -> None:
    """Before: `drift --model` recorded a run whenever a quiver.yaml was present, and the console showed it as
    a second drift run of the window the drift DAG had checked."""
    from quiver.monitoring.repository import list_drift_runs
    from quiver.registry.repository import Registry

    config_file, _ = copied
    config = load_config(config_file)

    def runs() -> int:
        return len(list_drift_runs(Registry(config.registry, project=config.project), limit=1000))

    before = runs()
    diagnosis = cli("drift", "--model", MODEL, "--config", str(config_file))
    assert diagnosis.exit_code == 0, diagnosis.output
    assert runs() == before and "recorded as drift run" not in diagnosis.output
    refused = cli("drift", "--model", MODEL, "--alert", "--config", str(config_file))
    assert refused.exit_code != 0 and "--alert needs --record" in refused.output
    recorded = cli("drift", "--model", MODEL, "--record", "--config", str(config_file))
    assert recorded.exit_code == 0, recorded.output
    assert runs() == before + 1 and "recorded as drift run" in recorded.output


def test_serve_model_and_describe_name_the_closest_name(operator_world: Any) -> None:
    config = str(operator_world.root / "quiver.yaml")
    served = cli("serve-model", "fraud_modl", "--config", config)
    assert served.exit_code == 2 and "unknown model 'fraud_modl' (did you mean 'fraud_model'?)" in served.output
    described = cli("describe", "stas", "--config", config)
    assert described.exit_code == 2 and "no definition named 'stas' (did you mean 'stats'?)" in \
        " ".join(described.output.split()), described.output
