"""From serving logs ⋈ labels to the judge's evidence (`quiver.monitoring.canary_stats.StepStats`).

Which rows count: only rows **tagged** with the rollout and step being judged (`rollout_id`,
`rollout_step`: every served row carries the arm set's tag), so rows a server routed at the old fraction
before its next poll never count in the new step. Per arm, the rows of the model version the rollout
compares; the champion's scores of the canary rows (arm `paired`, scored off the request path, or replayed
by the judge: `quiver.monitoring.canary_replay`) are matched to them by `request_id`.

Rows routed to an arm that never ran (error `NOT_RUN…`: the request failed first) count as routed units for
the sample-ratio check and nowhere else. Units: the routing unit is the key the split hashed (`routing_columns`); a model call is one request's rows
on one arm (`call_id` + arm). Served rows go in in time order; labelled rows of calls whose every row has
its label, in the order those calls completed (`arrived_at`), so the betting sequences see a prefix-stable
sequence as labels arrive.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from quiver.monitoring.canary_stats import JudgeSettings, StepStats
from quiver.serving.arms import NOT_RUN

if TYPE_CHECKING:
    from quiver.registry.rollouts import Rollout

PAIRED_ARM = "paired"  # the champion's score of a canary row, logged off the request path


def step_rows(joined: pd.DataFrame, rollout: Rollout, step: int | None = None) -> pd.DataFrame:
    """Rows served under `rollout` (at `step`, default its current one), by the compared versions."""
    if "rollout_id" not in joined or joined.empty:
        return joined.iloc[0:0]
    mine = joined[(joined["rollout_id"] == rollout.id)
                  & (joined["rollout_step"] == (rollout.step if step is None else step))]
    champion = f"{rollout.model}:{rollout.champion_version}"
    canary = f"{rollout.model}:{rollout.canary_version}"
    keep = (((mine["arm"] == "champion") & (mine["model_version"] == champion))
            | ((mine["arm"] == "canary") & (mine["model_version"] == canary))
            | ((mine["arm"] == PAIRED_ARM) & (mine["model_version"] == champion)))
    return mine[keep]


def step_evidence(rows: pd.DataFrame, settings: JudgeSettings, latency_threshold_ms: float | None,
                  routing_columns: list[str]) -> StepStats:
    """The judge's evidence from one step's rows (as `step_rows` returns them)."""
    stats = StepStats(settings, np.nan if latency_threshold_ms is None else latency_threshold_ms)
    served = rows[rows["arm"] != PAIRED_ARM].sort_values("ts", kind="stable")
    if served.empty:
        return stats
    paired = rows[rows["arm"] == PAIRED_ARM].drop_duplicates("request_id").set_index("request_id")["prediction"]
    entity = _codes(served, routing_columns or ["request_id"])
    on_canary = (served["arm"] == "canary").to_numpy()
    call_ids = served["call_id"].fillna("").astype(str) if "call_id" in served else served["request_id"].astype(str)
    # Rows logged without a call id (older servers) count one call each.
    call_ids = call_ids.where(call_ids != "", "row:" + served["request_id"].astype(str))
    call = pd.factorize(call_ids + "|" + served["arm"])[0].astype(np.int64)  # first seen = earliest
    score = served["prediction"].to_numpy(np.float64, na_value=np.nan)
    error = served["error"].fillna("").astype(str)
    ran = ~error.str.startswith(NOT_RUN).to_numpy()  # routed, but the request failed before this arm ran
    failed = ((error != "") | served["prediction"].isna()).to_numpy() & ran
    latency = served["latency_ms"].to_numpy(np.float64, na_value=np.nan)
    champion_score = served["request_id"].map(paired).to_numpy(np.float64, na_value=np.nan)
    champion_score = np.where(on_canary, champion_score, np.nan)
    stats.add_served(entity, call, on_canary, score, failed, latency, champion_score, ran)
    label = np.where(ran, served["label"].to_numpy(np.float64, na_value=np.nan), np.nan)
    arrived = pd.to_datetime(served["arrived_at"], utc=True) if "arrived_at" in served else \
        pd.Series(pd.NaT, index=served.index, dtype="datetime64[ns, UTC]")
    labelled = _complete_calls(call, ~np.isnan(label), arrived, failed)
    if labelled.size:
        stats.add_labelled(entity[labelled], call[labelled], on_canary[labelled], score[labelled],
                           label[labelled], champion_score[labelled])
    return stats


def _codes(frame: pd.DataFrame, columns: list[str]) -> np.ndarray:
    keys = frame[columns[0]].astype(str)
    for column in columns[1:]:
        keys = keys + "\x1f" + frame[column].astype(str)
    return pd.factorize(keys)[0].astype(np.int64)


def _complete_calls(call: np.ndarray, has_label: np.ndarray, arrived: pd.Series,
                    failed: np.ndarray) -> np.ndarray:
    """Row positions of the successfully scored rows of calls whose every row is labelled, ordered by when
    each call's last label arrived (then by call)."""
    frame = pd.DataFrame({"call": call, "labelled": has_label, "ok": ~failed,
                          "arrived": arrived.to_numpy()})
    per_call = frame.groupby("call").agg(complete=("labelled", "all"), done=("arrived", "max"))
    complete = per_call[per_call["complete"]]
    if complete.empty:
        return np.zeros(0, dtype=np.int64)
    order = complete.sort_values(["done"], kind="stable").index.to_numpy()
    rank = pd.Series(np.arange(len(order)), index=order)
    rows = frame[frame["call"].isin(order) & frame["ok"]]
    positions = rows.index.to_numpy()
    keys = rank.loc[rows["call"].to_numpy()].to_numpy()
    return positions[np.argsort(keys, kind="stable")].astype(np.int64)


def watch_rows(joined: pd.DataFrame, rollout: Rollout) -> pd.DataFrame:
    """After a promotion, as a step's rows: the new champion's rows (arm `canary`) and the old champion's
    scores of the same rows (arm `paired`) — the rollout's canary rows, paired while it ran, and since the
    promotion the champion's rows that the old champion shadowed."""
    new, old = f"{rollout.model}:{rollout.canary_version}", f"{rollout.model}:{rollout.champion_version}"
    if joined.empty:
        return joined
    during = joined[(joined["rollout_id"] == rollout.id)] if "rollout_id" in joined else joined.iloc[0:0]
    during = during[((during["arm"] == "canary") & (during["model_version"] == new))
                    | ((during["arm"] == PAIRED_ARM) & (during["model_version"] == old))]
    after = joined
    if rollout.finished_at is not None:
        after = joined[joined["ts"] >= rollout.finished_at]
    after = after[((after["arm"] == "champion") & (after["model_version"] == new))
                  | ((after["arm"] == "shadow") & (after["model_version"] == old))]
    rows = pd.concat([during, after], ignore_index=True)
    rows["arm"] = rows["arm"].replace({"champion": "canary", "shadow": PAIRED_ARM})
    return rows
