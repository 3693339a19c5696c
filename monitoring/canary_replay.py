"""The champion's scores of canary rows the serving path did not pair, replayed by the judge from the logs.

The prediction service pairs every canary row with the champion's score of the same row, after the
response (arm `paired`). That score can be missing: pairing turned off (`pair_canary=False`, to spare the
serving hosts' CPU), a batch dropped when the off-path queue was full (`paired_dropped`), an off-path child
that died mid-batch. Without it the judge compares the arms unpaired, and with users who come back that
comparison may never narrow to its floor: the spread between users, not the number of rows, is the limit.

Every served row logs the input columns of both the champion and the canary, so the judge scores the
champion itself on the canary rows' logged inputs: the values the paired arm would have scored, by the
artifact the registry holds (checksum verified on load). The model is loaded only when a row needs it.
What could not be replayed stays unpaired, and `Pairing.reason` says why.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import pyarrow as pa

from quiver.monitoring.canary_evidence import PAIRED_ARM
from quiver.serving.arms import NOT_RUN
from quiver.serving.logs.read import ANSWERING_ARMS
from quiver.serving.logs.tables import FEATURE_PREFIX

if TYPE_CHECKING:
    from quiver.models.artifact import Scorer


@dataclass(frozen=True)
class Pairing:
    """Where the champion's scores of a step's scored canary rows came from."""

    logged: int = 0  # paired by the serving path
    replayed: int = 0  # scored here, from the rows' logged inputs
    unpaired: int = 0  # neither: compared unpaired
    reason: str = ""  # why rows stayed unpaired

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def replay_pairs(rows: pd.DataFrame, logs: pa.Table, load_champion: Callable[[], Scorer], champion_label: str,
                 served_arm: str = "canary", served_inputs: Collection[str] | None = None,
                 ) -> tuple[pd.DataFrame, Pairing]:
    """`rows` (a step's rows, as `canary_evidence.step_rows` gives them) with a `paired` row added for each
    scored `served_arm` row that has no finite paired score, from that row's inputs in `logs` (the serving
    log the rows were read from, feature columns and all). `load_champion` is called only when a row needs
    it. Paired rows logged without a score (the champion's off-path call failed) give way to replayed ones.
    `served_inputs`: the inputs the rows' serving logged, when not every input of the champion (a row logs
    its arm set's inputs; a column the log holds is null on rows that did not read it, which is not a
    missing value to score)."""
    arm = rows["arm"].to_numpy()
    scores = rows["prediction"].to_numpy(np.float64, na_value=np.nan)
    request_id = rows["request_id"].astype(str)
    paired_ok = request_id[(arm == PAIRED_ARM) & np.isfinite(scores)]
    error = rows["error"].fillna("").astype(str)
    scored = (arm == served_arm) & np.isfinite(scores) & ~error.str.startswith(NOT_RUN).to_numpy()
    todo = scored & ~request_id.isin(set(paired_ok)).to_numpy()
    logged = int(scored.sum() - todo.sum())
    if not todo.any():
        return rows, Pairing(logged=logged)
    try:
        model = load_champion()
    except Exception as exc:  # the judge still judges, unpaired; the decision says why
        return rows, Pairing(logged, 0, int(todo.sum()), f"{champion_label} could not be loaded: {exc}"[:500])
    absent = [name for name in model.features if FEATURE_PREFIX + name not in logs.column_names
              or (served_inputs is not None and name not in served_inputs)]
    if absent:
        return rows, Pairing(logged, 0, int(todo.sum()),
                             f"inputs of {champion_label} not logged on these rows: {', '.join(absent)}")
    need = rows[todo]
    inputs, found = logged_inputs(logs, need["request_id"].astype(str), model.features)
    need, inputs = need[found], inputs[found]
    try:
        replayed = np.asarray(model.predict({name: inputs[name].to_numpy() for name in model.features}),
                              dtype=np.float64)
    except Exception as exc:
        return rows, Pairing(logged, 0, int(todo.sum()), f"{champion_label} failed on the logged inputs: "
                                                         f"{type(exc).__name__}: {exc}"[:500])
    ok = np.isfinite(replayed)
    added = need[ok].assign(arm=PAIRED_ARM, model_version=champion_label, prediction=replayed[ok], error="",
                            latency_ms=np.nan)
    # A paired row logged without a score (its call failed) would shadow the replayed one.
    stale = (arm == PAIRED_ARM) & request_id.isin(set(added["request_id"].astype(str))).to_numpy()
    out = pd.concat([rows[~stale], added], ignore_index=True)
    left = int(todo.sum()) - len(added)
    reason = f"{left} rows: no logged inputs, or {champion_label} gave no finite score" if left else ""
    return out, Pairing(logged, len(added), left, reason)


def logged_inputs(logs: pa.Table, request_ids: pd.Series, names: list[str]) -> tuple[pd.DataFrame, np.ndarray]:
    """The logged values of input columns `names` on the served rows `request_ids` (a row each, in their
    order), and which of them the log holds a served row of. Served: an answering arm's row; off-path rows
    carry no feature columns."""
    import pyarrow.compute as pc

    wanted = pa.array(request_ids.unique(), pa.string())
    mask = pc.and_(pc.is_in(logs["request_id"], value_set=wanted),
                   pc.is_in(logs["arm"], value_set=pa.array(ANSWERING_ARMS, pa.string())))
    frame = logs.filter(mask).select(["request_id", *(FEATURE_PREFIX + name for name in names)]).to_pandas()
    frame = frame.drop_duplicates("request_id").set_index("request_id")
    frame.columns = names
    return frame.reindex(request_ids.to_numpy()), request_ids.isin(frame.index).to_numpy()
