"""What the consistency job recomputes offline: point-in-time values at the logged request times, and the
evidence of each cause for the rows that differ (earlier moments, a TTL moved by a margin, the offline store
without the late events that arrived after the request).

Everything goes through the point-in-time engine (`quiver.offline.pit_numpy`, or `pit_spark`): the same
tiles, last values and head events a training set is built from, never a second implementation.

Arrival times: Quiver keeps no per-event arrival time. What it has is the streaming feeder's late-event store
(`quiver.streaming.late`): events that came in behind the watermark and went to the batch route instead of
the online store. Their arrival is taken as the time their file was written (its modification time), the
moment the feeder set them aside. Events of the batch sources carry no arrival at all, so a batch event that
landed after serving cannot be told from a wrong value here.
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from quiver.catalog.ir import Catalog, ViewSpec
from quiver.catalog.references import FeatureRef
from quiver.config import Config
from quiver.monitoring.consistency import Values, as_values
from quiver.offline.pit_plan import LabelSet, timestamps_us

US = 1_000_000
# Earlier moments tried for stream lag (seconds before the request), up to the lag allowed.
LAG_LADDER_S = (1, 2, 5, 10, 30, 60, 120, 300, 600, 900, 1800, 3600)
Key = tuple[Any, ...]


@dataclass(frozen=True)
class Rows:
    """Label rows for the engine: request times (epoch µs) and join keys typed as the catalog declares."""

    t_us: np.ndarray
    keys: Mapping[str, pa.Array]

    def take(self, index: np.ndarray) -> Rows:
        where = pa.array(index)
        return Rows(self.t_us[index], {k: v.take(where) for k, v in self.keys.items()})

    def at(self, t_us: np.ndarray) -> Rows:
        return Rows(t_us, self.keys)

    def repeat(self, times: int) -> Rows:
        where = pa.array(np.tile(np.arange(len(self.t_us)), times))
        return Rows(np.tile(self.t_us, times), {k: v.take(where) for k, v in self.keys.items()})

    def key_tuples(self, names: Sequence[str]) -> list[Key]:
        return list(zip(*(self.keys[n].to_pylist() for n in names), strict=True))


def point_in_time(config: Config, catalog: Catalog, refs: Sequence[FeatureRef], rows: Rows,
                  engine: str = "duckdb", ttl_shift_us: int = 0, window_shift_us: int = 0,
                  ) -> dict[tuple[str, str], Values]:
    """Each ref's value as of each row's time, by the point-in-time engine. `ttl_shift_us` lengthens (or,
    negative, shortens) the TTL of last-value views: the TTL-edge evidence. `window_shift_us` does the same
    to every window (never below 0), for `read_before`."""
    from quiver.offline.pit import plan_requests

    requests = plan_requests(catalog, config, list(refs))
    if ttl_shift_us:
        requests = [dataclasses.replace(r, view=_shifted_ttl(r.view, ttl_shift_us)) for r in requests]
    if window_shift_us:
        requests = [dataclasses.replace(r, view=_shifted_windows(r.view, window_shift_us)) for r in requests]
    labels = LabelSet(rows.t_us, rows.keys)
    if engine == "spark":
        from quiver.offline import pit_spark

        arrays = pit_spark.compute(labels, requests, config)
    else:
        from quiver.offline import pit_numpy

        arrays = pit_numpy.compute(labels, requests)
    return {key: as_values(array) for key, array in arrays.items()}


def on_demand_offline(config: Config, catalog: Catalog, refs: Sequence[FeatureRef], rows: Rows,
                      request: Mapping[str, pa.Array], engine: str = "duckdb") -> dict[tuple[str, str], Values]:
    """On-demand features as a training set of the logged requests holds them: `get_historical_features` on
    label rows made of the logged keys, request time and request fields (what the request sent), so the same
    function, input typing and point-in-time inputs as training."""
    import pandas as pd

    from quiver.offline.pit import get_historical_features

    time_column = "__request_ts"
    frame = pd.DataFrame({name: array.to_pandas() for name, array in {**rows.keys, **request}.items()})
    frame[time_column] = pd.to_datetime(rows.t_us, unit="us", utc=True)
    wanted = [f"{r.view}:{r.feature}" for r in refs]
    built = get_historical_features(frame, wanted, catalog=catalog, config=config, engine=engine,
                                    full_feature_names=True, timestamp_column=time_column)
    return {(r.view, r.feature): as_values(pa.array(built[f"{r.view}__{r.feature}"], from_pandas=True))
            for r in refs}


def _shifted_ttl(view: ViewSpec, shift_us: int) -> ViewSpec:
    if view.kind != "last" or not view.ttl_us:
        return view
    return dataclasses.replace(view, ttl_us=max(1, view.ttl_us + shift_us))


def _shifted_windows(view: ViewSpec, shift_us: int) -> ViewSpec:
    aggregations = tuple(dataclasses.replace(a, window_us=max(0, a.window_us + shift_us)) for a in view.aggregations)
    return dataclasses.replace(view, aggregations=aggregations)


def read_before(config: Config, catalog: Catalog, view: ViewSpec, refs: Sequence[FeatureRef], rows: Rows,
                cutoff_us: np.ndarray, engine: str = "duckdb") -> dict[tuple[str, str], Values]:
    """Each ref of `view` as an online read at each row's time returns it from a store that took no event
    from `cutoff_us` (at or before the row's time) on: what a lagging stream or a stale materialization serves.

    Last values are the point-in-time values at the cutoff. Windows are not: the online reader anchors a
    window at the request, tiles from floor_g(t) − w on, so a stale store yields the events in
    [floor_g(t) − w, cutoff). That is the engine's window of length w − (floor_g(t) − floor_g(cutoff)) read
    at the cutoff, or an empty window where that length is negative.
    """
    if view.kind == "last" or not view.tile_us:
        return point_in_time(config, catalog, refs, rows.at(cutoff_us), engine)
    tile = int(view.tile_us)
    shift = (rows.t_us - rows.t_us % tile) - (cutoff_us - cutoff_us % tile)
    window = {(r.view, r.feature): a.window_us for r in refs for a in view.aggregations if a.name == r.feature}
    parts: dict[tuple[str, str], list[tuple[np.ndarray, Values]]] = {k: [] for k in window}
    for d in np.unique(shift).tolist():
        group = np.flatnonzero(shift == d)
        at_cutoff = rows.take(group).at(cutoff_us[group])
        reaching = [r for r in refs if window[(r.view, r.feature)] >= d]
        if reaching:
            for key, values in point_in_time(config, catalog, reaching, at_cutoff, engine, window_shift_us=-d).items():
                parts[key].append((group, values))
        beyond = [r for r in refs if window[(r.view, r.feature)] < d]
        if beyond:  # the window starts after the cutoff: nothing in it. Keys no entity has read exactly that.
            no_entity = Rows(at_cutoff.t_us, {k: pa.nulls(len(group), v.type) for k, v in at_cutoff.keys.items()})
            for key, values in point_in_time(config, catalog, beyond, no_entity, engine).items():
                parts[key].append((group, values))
    return {key: _scatter(len(rows.t_us), pieces) for key, pieces in parts.items()}


def _scatter(n: int, pieces: Sequence[tuple[np.ndarray, Values]]) -> Values:
    first = pieces[0][1]
    values = np.empty(n, dtype=first.values.dtype)
    missing = np.ones(n, dtype=bool)
    for index, piece in pieces:
        values[index] = piece.values
        missing[index] = piece.missing
    return Values(values, missing, first.numeric)


def earlier_moments(t_us: np.ndarray, max_lag_s: float,
                    materialized_us: Sequence[np.ndarray] | np.ndarray | None) -> list[np.ndarray]:
    """Moments before each request at which serving may have been stuck: the ladder of lags up to
    `max_lag_s`, then each of the view's materializations before the request (`materialized_us`: one array
    per materialization, newest first, -1 where there is none)."""
    moments = [t_us - int(lag * US) for lag in LAG_LADDER_S if lag <= max_lag_s]
    if materialized_us is None:
        return moments
    for done in [materialized_us] if isinstance(materialized_us, np.ndarray) else materialized_us:
        if (done >= 0).any():
            moments.append(np.where(done >= 0, done, t_us))
    return moments


def last_materialization(registry: Any, view: str, t_us: np.ndarray, back: int = 0) -> np.ndarray | None:
    """Per request, the data time (µs) of the view's newest successful materialization at or before it (with
    `back` = 1, the one before that), -1 when none; None when the registry records none at all.

    The one before matters because a run is recorded by its data time: a request between that time and the
    moment its write to the store finished was served by the previous run."""
    ends = sorted(_us(r["end_ts"]) for r in registry.runs(view=view, kind="materialize")
                  if r["status"] == "succeeded" and r["end_ts"] is not None)
    if not ends:
        return None
    known = np.asarray(ends, dtype=np.int64)
    position = np.searchsorted(known, t_us, side="right") - 1 - back
    return np.where(position >= 0, known[np.maximum(position, 0)], -1)


def _us(moment: datetime) -> int:
    moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * US)


# ----- late events -----


@dataclass(frozen=True)
class LateFile:
    """One file of the late-event store: its events' keys and times, and when it was written (arrival)."""

    path: str  # inside the offline store's filesystem
    arrival_us: int
    keys: list[Key]
    event_us: np.ndarray


def late_files(config: Config, view: ViewSpec) -> list[LateFile]:
    """The late-event files of the view's source, oldest arrival first."""
    import pyarrow.parquet as pq

    from quiver.offline.store import store_for

    store = store_for(config)
    out = []
    for path in store.late_event_files(view.source):
        table = pq.read_table(path, columns=[*view.key_names, view.timestamp_field], partitioning=None,
                              filesystem=store.fs)
        event_us, _ = timestamps_us(table[view.timestamp_field])
        keys = list(zip(*(table[k].to_pylist() for k in view.key_names), strict=True))
        out.append(LateFile(path, store.arrival_us(path), keys, event_us))
    return sorted(out, key=lambda f: f.arrival_us)


def unseen_late(files: Sequence[LateFile], keys: Sequence[Key], t_us: np.ndarray) -> list[frozenset[int]]:
    """Per row, the late files holding an event of its entity dated before the request that arrived after
    it (indexes into `files`; empty: none)."""
    by_key: dict[Key, list[tuple[int, int, int]]] = {}
    for i, late in enumerate(files):
        for key, event in zip(late.keys, late.event_us.tolist(), strict=True):
            by_key.setdefault(key, []).append((event, late.arrival_us, i))
    out = []
    for key, t in zip(keys, t_us.tolist(), strict=True):
        out.append(frozenset(i for event, arrival, i in by_key.get(key, ()) if event < t < arrival))
    return out


class _NoRuns:
    """A registry stand-in for scratch backfills: they are a recomputation, not runs of the project."""

    def start_run(self, *args: Any, **kwargs: Any) -> int:
        return 0

    def finish_run(self, *args: Any, **kwargs: Any) -> None:
        return None


def without_late(config: Config, catalog: Catalog, view: ViewSpec, refs: Sequence[FeatureRef], rows: Rows,
                 files: Sequence[LateFile], excluded: frozenset[int], engine: str = "duckdb",
                 ) -> dict[tuple[str, str], Values]:
    """The refs of `view` as of each row, recomputed from an offline store backfilled without the late
    files `excluded` (the events that had not arrived by the request): a scratch copy, thrown away after."""
    from quiver.offline.backfill import backfill

    reach = view.ttl_us if view.kind == "last" else view.max_window_us + (view.tile_us or 0)
    first = _day(int(rows.t_us.min()) - int(reach or 0))
    last = _day(int(rows.t_us.max()))
    from quiver.offline.store import store_for

    store = store_for(config)
    scratch = Path(tempfile.mkdtemp(prefix="quiver-consistency-"))
    try:
        for i, late in enumerate(files):
            if i not in excluded:  # keep the late events that had arrived, at their place in the store's layout
                target = scratch / late.path[len(store.base.rstrip("/")) + 1:]
                target.parent.mkdir(parents=True, exist_ok=True)
                if store.is_local:
                    target.symlink_to(late.path)
                else:
                    with store.fs.open_input_file(late.path) as stream:
                        target.write_bytes(stream.read())
        local = dataclasses.replace(config, offline_root=str(scratch))
        backfill(local, catalog, first, last, views=[view.name], registry=_NoRuns(), threads=1)
        return point_in_time(local, catalog, refs, rows, engine=engine)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _day(us: int) -> date:
    return (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=us)).date()


def key_array(values: pa.Array | pa.ChunkedArray, dtype: str) -> pa.Array:
    """A logged key column as the catalog's key type (a flush may have logged numbers as text)."""
    from quiver.offline.layout import arrow_type

    array = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    want = arrow_type(dtype)
    if array.type == want:
        return array
    if pa.types.is_floating(array.type) and not pa.types.is_floating(want):
        array = pc.if_else(pc.is_nan(array), pa.scalar(None, array.type), array)
    try:
        return array.cast(want)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return pa.nulls(len(array), want)  # keys the view cannot hold find no entity: null features
