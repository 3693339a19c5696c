"""Training sets from what serving saw ("log and wait"): the logged feature vectors of a window joined to
their delayed labels by request id, with only the features the logs lack computed point-in-time.

    built = get_logged_features("fraud_model", config=config, start=…, end=…)
    built.frame        # one row per labelled request: request_id, event_ts, keys, request fields, label, features
    built.logged       # view:feature taken from the serving logs on every row
    built.backfilled   # view:feature computed by `get_historical_features` at each row's request time

Rows: the answering arms (champion, canary) of [start, end), one per request id (shadow and paired rows
repeat a request's reads), without rows whose call failed (counted: `rows["errored"]`), and only those
with a label that had arrived by `labels_as_of` (the rest are counted as `unlabelled`, never silently lost).
Rows the serving loggers dropped under pressure are not in the logs: their accounts count them (`dropped`),
and a window that lost more than `max_dropped_share` of its rows is refused.
A feature is taken from the logs on the rows whose model version read it (`serving_log_read.rows_reading`:
the registry's recorded inputs, or the rows' own values for a version it does not know); on the other rows —
a feature added after the rows were served, or read by one arm and not the other — it is backfilled. A
logged null stays null: it is what the model was given. Columns and dtypes are those of
`get_historical_features` for the same rows, so a set built here and one built by a full backfill compare
value for value where serving was fresh.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from quiver.catalog.errors import NoRowsError, QuiverError
from quiver.catalog.ir import Catalog
from quiver.catalog.references import FeatureRef, resolve_features
from quiver.config import Config
from quiver.offline.store import store_for
from quiver.serving.logs.read import ANSWERING_ARMS, logged_column, rows_reading, version_rows
from quiver.serving.logs.tables import KEY_PREFIX, REQUEST_PREFIX

ARRIVAL_COLUMN = "label_arrived_at"
MAX_DROPPED_SHARE = 0.01  # of a window's served rows the loggers may have dropped before a set is refused


@dataclass(frozen=True)
class LoggedFeatures:
    """A training set built from serving logs, and where each feature's values came from."""

    frame: pd.DataFrame
    logged: tuple[str, ...]  # view:feature from the logs on every row
    backfilled: tuple[str, ...]  # view:feature computed point-in-time on every row
    mixed: dict[str, int] = field(default_factory=dict)  # view:feature → rows backfilled (logged on the rest)
    rows: dict[str, int] = field(default_factory=dict)  # logged, duplicates, errored, unlabelled, kept
    window: tuple[str, str] = ("", "")
    model: str | None = None

    feature_columns: tuple[str, ...] = ()  # the frame's feature columns, in request order
    served_at: Any = None  # request time of every request of the window, labelled or not (Arrow)

    @property
    def label_columns(self) -> list[str]:
        """The label-row columns of `frame` (request id, time, keys, request fields, label): all but features."""
        return [c for c in self.frame.columns if c not in self.feature_columns]

    def lineage(self) -> dict[str, Any]:
        """What a model registry records of it: the source, the window, and each feature's origin."""
        return {"source": "serving_logs", "window": list(self.window), "model": self.model,
                "logged": list(self.logged), "backfilled": list(self.backfilled),
                "partly_backfilled": dict(self.mixed), "rows": dict(self.rows)}


def get_logged_features(features: str | Sequence[str], *, config: Config, start: datetime, end: datetime,
                        catalog: Catalog | None = None, model: str | None = None,
                        labels: pa.Table | pd.DataFrame | None = None, labels_as_of: datetime | None = None,
                        label_column: str = "label", timestamp_column: str = "event_ts",
                        full_feature_names: bool = False, engine: str | None = None,
                        registry: Any = None, max_dropped_share: float = MAX_DROPPED_SHARE) -> LoggedFeatures:
    """The labelled requests served in [start, end) with `features` (``["view:feature", …]`` or a feature
    service) as serving saw them, backfilling what the logs lack (see the module docstring). `model`: only its
    versions' rows (default: every model's). `labels`: rows of (request_id, label[, arrived_at]) (default: the
    project's label store, `quiver labels`), those arrived by `labels_as_of` (default: every label). `registry`
    says which version read what (default: the project's). Refuses when the serving loggers dropped more than
    `max_dropped_share` of the answering rows of the window's hours (their accounts, every replica's): such a
    set would silently miss them; `rows` states the dropped count either way."""
    from quiver.registry.repository import load_applied_catalog
    from quiver.serving.logs import log_schema, read_serving_logs

    if end <= start:
        raise QuiverError(f"the window is empty: end {end.isoformat()} is not after start {start.isoformat()}")
    catalog = catalog or load_applied_catalog(config).catalog
    refs = resolve_features(catalog, features, full_feature_names)
    store = store_for(config)
    logged = read_serving_logs(store, start, end, schema=log_schema(catalog))
    rows = {"logged": logged.num_rows}
    logged = logged.filter(pc.is_in(logged["arm"], pa.array(ANSWERING_ARMS)))
    rows["dropped"] = _dropped(store, start, end, logged.num_rows, max_dropped_share)
    if model is not None:
        served_by = pc.unique(logged["model_version"]).to_pylist()
        of_model = [label for label in served_by if label is not None and label.rsplit(":", 1)[0] == model]
        logged = logged.filter(pc.is_in(logged["model_version"], pa.array(of_model, pa.string())))
        if logged.num_rows == 0:
            from quiver.serving.logs.read import span_hint

            raise NoRowsError(f"no serving-log rows of model {model!r} in [{start.isoformat()}, {end.isoformat()}); "
                              f"{span_hint(store)}")
    failed = pc.fill_null(pc.greater(pc.utf8_length(pc.fill_null(logged["error"], "")), 0), False)
    rows["errored"] = int(pc.sum(failed).as_py() or 0)
    logged = logged.filter(pc.invert(failed))
    logged, rows["duplicates"] = _first_per_request(logged)
    served_at = logged["ts"]
    logged, rows["unlabelled"] = _join_labels(logged, _labels(config, labels, labels_as_of))
    rows["kept"] = logged.num_rows
    if logged.num_rows == 0:
        raise NoRowsError(f"no labelled serving-log rows in [{start.isoformat()}, {end.isoformat()})"
                          + (f" of model {model!r}" if model else "") + f": {rows}")
    base = _base_frame(catalog, logged, label_column, timestamp_column)
    clashes = [r.column for r in refs if r.column in base.columns]
    if clashes:
        raise QuiverError(f"feature column(s) {', '.join(map(repr, clashes))} clash with the label-row columns "
                          f"({', '.join(base.columns)}); pass full_feature_names=True or another label_column")
    versions = _versions(config, registry)
    groups = version_rows(logged)
    sources: dict[str, tuple[str | None, np.ndarray]] = {}
    named: dict[str, int] = {}  # feature name → how many views have one of that name
    specs: list[Any] = [*catalog.views.values(), *catalog.on_demand.values()]
    for spec in specs:
        for feature in spec.feature_names:
            named[feature] = named.get(feature, 0) + 1
    for ref in refs:
        column = logged_column(logged, ref.view, ref.feature)
        # Logged under a bare name several views use: which view's value was served is unknown; backfill it.
        ambiguous = column == f"feature.{ref.feature}" and named[ref.feature] > 1
        mask = (rows_reading(logged, column, ref.view, ref.feature, versions, groups)
                if column is not None and not ambiguous else np.zeros(logged.num_rows, dtype=bool))
        sources[ref.column] = (column, mask)
    need = [r for r in refs if not sources[r.column][1].all()]
    filled = _backfill(catalog, config, base, need, sources, timestamp_column, engine or config.engine)
    columns = {r.column: _typed(catalog, r, logged, sources[r.column], filled.get(r.column)) for r in refs}
    frame = pd.concat([base, pd.DataFrame(columns, index=base.index)], axis=1)
    name = {r.column: f"{r.view}:{r.feature}" for r in refs}
    logged_all = tuple(name[r.column] for r in refs if sources[r.column][1].all())
    none = tuple(name[r.column] for r in refs if not sources[r.column][1].any())
    mixed = {name[r.column]: int((~sources[r.column][1]).sum()) for r in refs
             if sources[r.column][1].any() and not sources[r.column][1].all()}
    window = (start.astimezone(UTC).isoformat(), end.astimezone(UTC).isoformat())
    return LoggedFeatures(frame, logged_all, none, mixed, rows, window, model, tuple(columns), served_at)


def _dropped(store: Any, start: datetime, end: datetime, answering: int, limit: float) -> int:
    """Answering rows the loggers dropped in the window's hours (a dropped row whose arm is unknown counts);
    raises when they are more than `limit` of the rows served."""
    from quiver.serving.logs.accounts import read_accounts

    accounts = read_accounts(store, start, end)
    by_arm = accounts.dropped_by_arm()
    dropped = sum(n for arm, n in by_arm.items() if arm in ANSWERING_ARMS or arm == "?")
    served = answering + dropped
    if served and dropped / served > limit:
        reasons = ", ".join(f"{n:,} {why}" for why, n in accounts.to_dict()["dropped_by_reason"].items())
        raise QuiverError(f"the serving loggers dropped {dropped:,} of the {served:,} rows served in "
                          f"[{start.isoformat()}, {end.isoformat()}) ({dropped / served:.1%}: {reasons}), more than "
                          f"{limit:.1%}: a training set from these logs would miss them; pick another window or "
                          f"pass a larger max_dropped_share")
    return dropped


def _labels(config: Config, labels: pa.Table | pd.DataFrame | None, as_of: datetime | None) -> pa.Table:
    if labels is None:
        from quiver.monitoring.labels import read_labels

        return read_labels(store_for(config), as_of)
    table = labels if isinstance(labels, pa.Table) else pa.Table.from_pandas(labels, preserve_index=False)
    missing = [c for c in ("request_id", "label") if c not in table.column_names]
    if missing:
        raise QuiverError(f"labels lack column(s) {', '.join(missing)}; columns: {', '.join(table.column_names)}")
    if as_of is not None and "arrived_at" in table.column_names:  # knowledge time, as for the label store
        utc = pa.timestamp("us", tz="UTC")
        table = table.filter(pc.fill_null(pc.less_equal(table["arrived_at"].cast(utc), pa.scalar(as_of, utc)), False))
    return table


def _first_per_request(logged: pa.Table) -> tuple[pa.Table, int]:
    """The first row of each request id (a request logged twice, e.g. retried, is one training row)."""
    if pc.count_distinct(logged["request_id"], mode="all").as_py() == logged.num_rows:
        return logged, 0
    ids = logged["request_id"].to_numpy(zero_copy_only=False)
    _, first = np.unique(ids.astype(str), return_index=True)
    return logged.take(pa.array(np.sort(first))), logged.num_rows - len(first)


def _join_labels(logged: pa.Table, labels: pa.Table) -> tuple[pa.Table, int]:
    """Logged rows with their label (and arrival time) appended; rows without one are counted, not kept."""
    # read_labels keeps one label per id (the newest); a table given by the caller: its first row of an id.
    taken = pc.fill_null(pc.index_in(logged["request_id"], value_set=labels["request_id"].combine_chunks()), -1)
    taken = np.asarray(taken.to_numpy(zero_copy_only=False), dtype=np.int64)
    has = taken >= 0
    kept = logged.filter(pa.array(has))
    chosen = pa.array(taken[has])
    kept = kept.append_column("__label", labels["label"].take(chosen).cast(pa.float64()))
    arrived = labels["arrived_at"].take(chosen) if "arrived_at" in labels.column_names else pa.nulls(len(chosen))
    kept = kept.append_column("__arrived", arrived.cast(pa.timestamp("us", tz="UTC")))
    return kept, int((~has).sum())


def _base_frame(catalog: Catalog, logged: pa.Table, label_column: str, timestamp_column: str) -> pd.DataFrame:
    """The label-row columns: request id, request time, join keys (catalog types), request fields, label."""
    from quiver.monitoring.consistency_evidence import key_array

    keys = {k: dtype for v in catalog.views.values() for k, dtype in v.keys}
    fields = {name: dtype for spec in catalog.on_demand.values() for name, dtype in spec.request_fields}
    columns: dict[str, Any] = {"request_id": logged["request_id"].to_pandas(),
                               timestamp_column: logged["ts"].to_pandas()}
    for key, dtype in keys.items():
        column = f"{KEY_PREFIX}{key}"
        if column in logged.column_names:
            columns[key] = key_array(logged[column], dtype).to_pandas()
    for name in fields:
        column = f"{REQUEST_PREFIX}{name}"
        if column in logged.column_names:
            columns[name] = logged[column].to_pandas()
    columns[label_column] = logged["__label"].to_pandas()
    columns[ARRIVAL_COLUMN] = logged["__arrived"].to_pandas()
    clash = [c for c in (label_column, ARRIVAL_COLUMN) if c in {*keys, *fields}]
    if clash:
        raise QuiverError(f"label column {clash[0]!r} is also a join key or request field; pick another name")
    return pd.DataFrame(columns)


def _versions(config: Config, registry: Any) -> dict[str, Any]:
    from quiver.registry import Registry
    from quiver.registry.models import ModelRegistry

    own = registry is None
    registry = registry or Registry(config.registry, project=config.project)
    try:
        return {v.label: v for v in ModelRegistry(registry).versions()}
    finally:
        if own:
            registry.close()


def _backfill(catalog: Catalog, config: Config, base: pd.DataFrame, need: list[FeatureRef],
              sources: dict[str, tuple[str | None, np.ndarray]], timestamp_column: str,
              engine: str) -> dict[str, tuple[np.ndarray, Any]]:
    """Point-in-time values of `need` on the rows that did not log them: column → (row positions, values)."""
    if not need:
        return {}
    missing = np.zeros(len(base), dtype=bool)
    for ref in need:
        missing |= ~sources[ref.column][1]
    index = np.flatnonzero(missing)
    from quiver.offline.pit import get_historical_features

    rows = base.iloc[index].drop(columns=["request_id"]).reset_index(drop=True)
    label_like = [c for c in rows.columns if c != timestamp_column and c not in _inputs(catalog)]
    built = get_historical_features(rows.drop(columns=label_like), [f"{r.view}:{r.feature}" for r in need],
                                    catalog=catalog, config=config, engine=engine, full_feature_names=True,
                                    timestamp_column=timestamp_column)
    out = {}
    for ref in need:
        wanted = ~sources[ref.column][1][index]
        out[ref.column] = (index[wanted], built[f"{ref.view}__{ref.feature}"].array[wanted])
    return out


def _inputs(catalog: Catalog) -> set[str]:
    """Label-row columns the engine reads: join keys and request fields."""
    keys = {k for v in catalog.views.values() for k, _ in v.keys}
    return keys | {name for spec in catalog.on_demand.values() for name, _ in spec.request_fields}


def _typed(catalog: Catalog, ref: FeatureRef, logged: pa.Table, source: tuple[str | None, np.ndarray],
           filled: tuple[np.ndarray, Any] | None) -> Any:
    """One feature column typed as `get_historical_features` types it: logged values where served, backfilled
    values elsewhere."""
    from quiver.compile.on_demand import typed
    from quiver.offline.layout import arrow_type
    from quiver.offline.pit import nullable_feature, to_pandas

    column, served = source
    spec: Any = catalog.views.get(ref.view) or catalog.on_demand[ref.view]
    dtype = spec.feature_dtype(ref.feature)
    values = (logged[column].combine_chunks() if column is not None
              else pa.nulls(logged.num_rows)).cast(arrow_type(dtype))
    if filled is not None:
        positions, backfilled = filled
        merged = pa.array(backfilled, type=arrow_type(dtype), from_pandas=True)
        order = np.full(logged.num_rows, -1, dtype=np.int64)
        order[positions] = np.arange(len(positions))
        spread = merged.take(pa.array(np.where(order >= 0, order, 0))) if len(positions) else values
        values = pc.if_else(pa.array(served), values, spread)
    if ref.view in catalog.on_demand:
        return typed(values.to_pandas(), dtype, f"{ref.view}:{ref.feature}").array
    return to_pandas(values, dtype, nullable=nullable_feature(spec, ref.feature))
