"""What the demo prints (issue 55): nulls as `null` and NaN as `NaN` in its tables (never pandas' `nan` for
both), the champion's metrics named for the test window they were measured on, and `quiver stream` run quietly
(its INFO lines, Beam's and PyFlink's among them, interrupted the story)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest

from quiver.cli import console
from quiver.pipelines.demo import run
from tests.cli_runs import done, quiver

METRICS = {"roc_auc": 0.88, "pr_auc": 0.2, "log_loss": 0.045, "brier": 0.0097, "ece": 0.002}


def printed(call: Any, *args: Any) -> str:
    with console.capture() as out:
        call(*args)
    return out.get()


def test_a_null_prints_as_null_and_a_nan_as_nan() -> None:
    """Before: `show` printed a pandas frame, where a missing value and a NaN both read `nan`."""
    text = printed(run.show, pa.table({"user_id": [7, 8, 9], "amount_mean_24h": [30.41, None, float("nan")],
                                       "country": ["DE", None, "FR"]}))
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines() if line.startswith("│")]
    assert cells == [["7", "30.41", "DE"], ["8", "null", "null"], ["9", "NaN", "FR"]], text
    assert "nan" not in text


def test_the_champions_table_names_the_test_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: "validation metric" over metrics computed on the test window."""
    import quiver.pipelines.training as training

    version = SimpleNamespace(label="fraud_model:1", name="fraud_model")
    result = SimpleNamespace(version=version, metrics=METRICS, baseline=METRICS, status="registered", device="cpu",
                             samples_per_s=1000.0)
    monkeypatch.setattr(training, "run_training", lambda *args, **kwargs: result)
    monkeypatch.setattr(run, "_model_aliases", lambda config, name: {"champion": 1})
    text = printed(run.train_champion, SimpleNamespace(), 8)
    assert "test-window metric" in text and "validation" not in text


def test_the_demo_runs_the_stream_job_at_warning_level(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Before: the demo ran `quiver stream --bounded` at INFO: the job's lines, Beam's and PyFlink's, amid its
    story. The demo's command, through the real CLI, starts the job logging warnings only."""
    from quiver.cli import streaming
    from quiver.streaming.options import parse_args

    (tmp_path / "quiver.yaml").write_text("project: s\n")
    started: list[list[str]] = []
    monkeypatch.setattr(streaming, "_has_pyflink", lambda: False)  # the job's own venv: a process, recorded here
    monkeypatch.setattr(streaming, "stream_python", lambda config: "python")
    monkeypatch.setattr(streaming, "_run_forwarding_signals", lambda cmd: started.append(cmd) or 0)
    demo = run.stream_job_command()
    assert demo[1:4] == ["-m", "quiver.cli", "stream"]
    done(quiver(*demo[3:], cwd=tmp_path))
    [job] = started
    assert job[1:3] == ["-m", "quiver.streaming.runner"] and parse_args(job[3:]).log_level == "WARNING"
    refused = quiver("stream", "--log-level", "loud", cwd=tmp_path)
    assert refused.returncode == 2 and "--log-level must be one of debug, info, warning, error" in refused.stderr
