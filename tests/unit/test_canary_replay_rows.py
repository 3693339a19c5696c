"""The judge's replay of the champion on canary rows the serving path did not pair (`canary_replay`): which
rows it scores, what it leaves unpaired and why. The model here is a stand-in (a fixed formula of the
inputs); the integration test replays a real artifact on a real service's logs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from quiver.monitoring.canary_evidence import PAIRED_ARM, step_evidence
from quiver.monitoring.canary_replay import Pairing, replay_pairs
from quiver.monitoring.canary_stats import JudgeSettings
from quiver.serving.arms import NOT_RUN

T0 = datetime(2026, 12, 1, tzinfo=UTC)


class Formula:
    """A champion whose score of a row is a known function of its inputs."""

    features: ClassVar[list[str]] = ["f0", "category"]

    def predict(self, columns: Any) -> np.ndarray:
        f0 = np.asarray(columns["f0"], dtype=np.float64)
        boost = np.array([0.1 if c == "b" else 0.0 for c in columns["category"]])
        return np.clip(np.nan_to_num(f0, nan=0.5) / 10 + boost, 0.0, 1.0)


def log_rows() -> tuple[pd.DataFrame, pa.Table]:
    """Six served rows and two paired ones, as `step_rows` gives them, and the log table they came from."""
    served = pd.DataFrame({
        "request_id": [f"r{i}" for i in range(6)],
        "arm": ["champion", "canary", "canary", "canary", "canary", "canary"],
        "prediction": [0.2, 0.3, 0.4, 0.5, np.nan, np.nan],
        "error": ["", "", "", "", "ValueError: boom", f"{NOT_RUN}champion call failed"],
        "f0": [1.0, 2.0, 3.0, np.nan, 5.0, 6.0],
        "category": ["a", "b", "a", "b", "a", "a"],
    })
    # r1 was paired on the serving path; r2's paired call failed (no score); r3 was not paired at all.
    paired = pd.DataFrame({"request_id": ["r1", "r2"], "arm": [PAIRED_ARM, PAIRED_ARM],
                           "prediction": [0.9, np.nan], "error": ["", "RuntimeError: child died"]})
    rows = pd.concat([served, paired], ignore_index=True)
    rows["ts"] = [T0 + timedelta(seconds=i) for i in range(len(rows))]
    rows["call_id"] = [f"c{i}" for i in range(len(rows))]
    rows["model_version"] = ["m:1", "m:2", "m:2", "m:2", "m:2", "m:2", "m:1", "m:1"]
    rows["latency_ms"] = 1.0
    rows["key.user_id"] = [0, 1, 2, 3, 4, 5, 1, 2]
    rows["label"] = np.nan  # no labels yet
    logs = pa.table({"request_id": rows["request_id"], "arm": rows["arm"],
                     "feature.f0": np.where(rows["arm"] == PAIRED_ARM, np.nan, rows["f0"]),
                     "feature.category": [c if a != PAIRED_ARM else None
                                          for c, a in zip(rows["category"], rows["arm"], strict=True)]})
    return rows.drop(columns=["f0", "category"]), logs


def test_only_scored_canary_rows_without_a_paired_score_are_replayed() -> None:
    rows, logs = log_rows()
    out, pairing = replay_pairs(rows, logs, Formula, "m:1")
    assert pairing == Pairing(logged=1, replayed=2, unpaired=0, reason="")
    paired = out[out["arm"] == PAIRED_ARM].set_index("request_id")
    # r1 keeps its logged score; r2's scoreless paired row gives way; r3 (a null input) is scored as logged.
    assert paired["prediction"].to_dict() == pytest.approx({"r1": 0.9, "r2": 0.3, "r3": 0.15})
    assert set(paired.loc[["r2", "r3"], "model_version"]) == {"m:1"}
    # A failed canary row and one whose arm never ran get no paired score; the served rows are untouched.
    assert {"r4", "r5"}.isdisjoint(paired.index)
    pd.testing.assert_frame_equal(out[out["arm"] != PAIRED_ARM].reset_index(drop=True),
                                  rows[rows["arm"] != PAIRED_ARM].reset_index(drop=True))
    stats = step_evidence(out, JudgeSettings(), 20.0, ["key.user_id"])
    assert stats.canary.shift_abs.n == 3  # the judge sees three paired canary calls


def test_nothing_to_replay_loads_no_model() -> None:
    rows, logs = log_rows()
    complete = rows[~rows["request_id"].isin(["r2", "r3"])]

    def refuse() -> Formula:
        raise AssertionError("the model was loaded with nothing to replay")

    out, pairing = replay_pairs(complete, logs, refuse, "m:1")
    assert out is complete and pairing == Pairing(logged=1)


@pytest.mark.parametrize(("load", "logs_without", "reason"), [
    (lambda: (_ for _ in ()).throw(OSError("artifact gone")), None, "m:1 could not be loaded: artifact gone"),
    (Formula, "feature.category", "inputs of m:1 not logged on these rows: category"),
])
def test_what_cannot_be_replayed_stays_unpaired_and_says_why(load: Any, logs_without: str | None,
                                                             reason: str) -> None:
    rows, logs = log_rows()
    if logs_without:
        logs = logs.drop_columns([logs_without])
    out, pairing = replay_pairs(rows, logs, load, "m:1")
    assert out is rows and pairing == Pairing(logged=1, replayed=0, unpaired=2, reason=reason)


def test_a_row_the_log_holds_no_inputs_for_stays_unpaired() -> None:
    rows, logs = log_rows()
    logs = logs.filter(pa.compute.not_equal(logs["request_id"], "r3"))
    out, pairing = replay_pairs(rows, logs, Formula, "m:1")
    assert (pairing.logged, pairing.replayed, pairing.unpaired) == (1, 1, 1) and "1 rows" in pairing.reason
    assert "r3" not in set(out.loc[out["arm"] == PAIRED_ARM, "request_id"])


def test_an_input_the_served_rows_did_not_read_is_not_taken_as_missing() -> None:
    # After a promotion a row logs the new champion's inputs; a column of the old one's that the log's schema
    # holds is null there because nobody read it, not because the value was missing.
    rows, logs = log_rows()
    out, pairing = replay_pairs(rows, logs, Formula, "m:1", served_inputs=["f0"])
    assert out is rows and pairing == Pairing(1, 0, 2, "inputs of m:1 not logged on these rows: category")
    assert replay_pairs(rows, logs, Formula, "m:1", served_inputs=["category", "f0", "f9"])[1].replayed == 2
