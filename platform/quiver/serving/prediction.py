"""The prediction service: online features → champion scores, with a shadow and a canary arm.

    service = PredictionService(store, "fraud_model")       # loads the model's aliases from the registry
    result = service.predict([{"request_id": "r1", "entities": {"user_id": 7, "merchant_id": 3}}])

One request, many rows:
1. Features of every row come from the online store in **one** call: the union of the features all loaded
   arms need, as of each row's `at` (default: now).
2. Routing: with a running rollout, a row goes to the canary when hash(salt, routing key) < fraction — the
   routing key is one entity key (default: the first join key), so an entity sees one arm within a step and
   the split is independent of everything the models see. Every other row goes to the champion.
3. A canary that failed to load or raises scores nothing: its rows get the champion's score, are counted
   (`canary_fallbacks`), logged on the canary arm with the error (one failed call), and an alert is raised
   (at most one per `alert_interval_s`, from a background thread).
4. The response is built from champion/canary scores only. Off the request path, on a worker thread fed by
   a bounded queue: the shadow (alias `shadow`) scores the very same feature vectors, and the champion scores
   the canary's rows (arm `paired`), so the canary judge compares both models on the same rows. When the
   queue is full the batch is dropped and counted (`shadow_dropped`, `paired_dropped`). Nothing off the path
   ever changes or delays a response. With `off_path="process"` (what `quiver serve-model` runs) the worker
   only batches: a process of its own scores and logs (quiver.serving.off_path_process).
5. Hot swap: a poller re-reads aliases and the running rollout every `poll_interval_s`; new versions are
   loaded off the request path, then the whole arm set is replaced by one reference assignment. A request
   reads the arm set once, so an in-flight request finishes on the models it started with. A version that
   fails to load is retried with exponential backoff (`retry_base_s` … `retry_max_s`) and swapped in as soon
   as it loads. A champion that fails to load keeps the current one serving (alert `champion_load_failed`);
   a service that starts while its champion cannot load serves the newest earlier champion that does and
   says so (`champion_fallback`: the version it could not load and why), until the champion loads.
6. Every row is logged (serving logs: features, score, arm, model version, latency, error) with its
   request_id, the request's call_id and the rollout tag (rollout, step, fraction) of the arm set that
   served it; shadow and paired rows carry the request_id of the row they mirror and no feature columns of
   their own (they scored exactly that row's vector, logged once, on the row's own arm).
   A request whose champion call raises fails, but all its rows are still logged: the champion's with the
   error, those routed to the canary with `NOT_RUN` (its arm never ran), so the judge counts what the router
   assigned.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from quiver.catalog.errors import QuiverError
from quiver.compile.on_demand import check_request_rows, row_field
from quiver.online.base import FieldStatus, timestamp_us
from quiver.serving.arms import (
    Arm,
    ArmSet,
    Model,
    Prediction,
    RowInputs,
    ServiceStats,
    _columns,
    _features_of,
    _take,
    log_failed_request,
    missing_inputs,
    over_policy,
    route_share,
)
from quiver.serving.micro_batch import MicroBatcher
from quiver.serving.off_path import AlertOutbox, OffPath, OffPathQueue

if TYPE_CHECKING:
    from quiver.registry.models import ModelRegistry, ModelVersion
    from quiver.serving.logs import ServingLogger
    from quiver.serving.result import OnlineResult
    from quiver.serving.store import FeatureStore, OnlineCall

log = logging.getLogger(__name__)
# Where the shadow's and the paired scores are computed and logged: a thread of this process (in-process SDK
# use, replays), or a process of their own that keeps their GIL time off the request loop (the server).
OFF_PATH_MODES = ("thread", "process")


@dataclass(frozen=True)
class ScoringCall:
    """A prepared `predict` call (`PredictionService.begin`): the arm set it runs on and its planned read."""

    began: float
    arms: ArmSet
    call_id: str
    request_ids: list[str]
    entities: dict[str, list[Any]]  # as the rows gave them (typed by the read: `read.entities`)
    fields: dict[str, list[Any]]
    times: list[Any] | None
    read: OnlineCall


__all__ = ["Arm", "ArmSet", "Model", "Prediction", "PredictionService", "ScoringCall", "ServiceStats", "route_share"]


class PredictionService:
    """Champion / canary / shadow scoring over the online store (see the module docstring)."""

    def __init__(self, store: FeatureStore, model_name: str, *, models: ModelRegistry | None = None,
                 logger: ServingLogger | None = None, alerts: Any = None, routing_key: str | None = None,
                 poll_interval_s: float = 2.0, shadow_queue_size: int = 256, alert_interval_s: float = 60.0,
                 loader: Callable[[ModelVersion], Model] | None = None, micro_batch: bool = False,
                 shadow_linger_s: float = 0.05, pair_canary: bool = True, retry_base_s: float = 1.0,
                 retry_max_s: float = 60.0, off_path: str = "thread", off_path_idle: bool = True):
        from quiver.registry import Registry
        from quiver.registry.models import ModelRegistry

        self.store = store
        self.model_name = model_name
        self.models = models or ModelRegistry(Registry(store.config.registry, project=store.config.project))
        self.logger = logger
        self.alerts = alerts
        self.routing_key = routing_key
        self.micro_batch = micro_batch
        self.poll_interval_s = poll_interval_s
        self.pair_canary = pair_canary
        if off_path not in OFF_PATH_MODES:
            raise QuiverError(f"off_path must be one of {', '.join(OFF_PATH_MODES)}, not {off_path!r}")
        self.off_path, self.off_path_idle = off_path, off_path_idle
        self.retry_base_s, self.retry_max_s = retry_base_s, retry_max_s
        self.stats = ServiceStats()
        self._loader = loader or self._load
        self._cache: dict[int, Arm] = {}
        self._failures: dict[int, tuple[int, float, Arm]] = {}  # version → (failures, next try, failed arm)
        self.champion_fallback: tuple[int, str] | None = None  # (registry champion that cannot load, why)
        self._refresh_lock = threading.Lock()
        self._stop = threading.Event()
        self._off_path_queue = OffPathQueue(self.stats, logger, size=shadow_queue_size, linger_s=shadow_linger_s,
                                            stopping=self._stop)
        self._outbox = AlertOutbox(alerts, model_name, alert_interval_s)
        self._threads: list[threading.Thread] = []
        self._owns_logger = False
        self._arms = self._build(first=True)

    # ----- lifecycle -----

    def start(self) -> PredictionService:
        """Start the shadow worker (and, with `off_path="process"`, its scoring process), the alert sender and
        the registry poller (idempotent)."""
        if not self._threads:
            if self.off_path == "process":
                self._off_path_queue.start_process(idle=self.off_path_idle)
            for target, name in ((self._off_path_queue.run, "shadow"), (self._outbox.run, "alerts"),
                                 (self._poller, "poller")):
                thread = threading.Thread(target=target, name=f"quiver-predict-{name}", daemon=True)
                thread.start()
                self._threads.append(thread)
        return self

    def close(self) -> None:
        """Stop the background threads after the queued shadow work is done (and flush an owned logger)."""
        self._stop.set()
        running = bool(self._threads)
        self._off_path_queue.stop(running)
        self._outbox.stop(running)
        for thread in self._threads:
            thread.join(10)
        # The child writes every row it was sent; a hung one is killed, which frees a worker stuck sending to it.
        self._off_path_queue.stop_process()
        for thread in self._threads:
            thread.join(10)
        self._threads = []
        self._off_path_queue.finish_here()  # never started (or stopped early): score what is still queued
        if self._owns_logger and self.logger is not None:
            self.logger.close()

    def __enter__(self) -> PredictionService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def arms(self) -> ArmSet:
        """The arm set requests use now."""
        return self._arms

    @property
    def fallback_from(self) -> int | None:
        """The registry's champion version that could not load while another one serves, else None."""
        return None if self.champion_fallback is None else self.champion_fallback[0]

    # ----- models -----

    def _load(self, version: ModelVersion) -> Model:
        from quiver.artifacts import ArtifactStore
        from quiver.models.artifact import load_model

        # Through the artifact store: the version may have been trained on another machine.
        artifacts = getattr(self.models, "artifacts", None) or ArtifactStore.from_config(self.store.config)
        return load_model(artifacts.local_dir(version.artifact_path), self.store.catalog,
                          expected_sha256=version.sha256,
                          version_label=version.label)

    def _arm(self, version: int, strict: bool) -> Arm:
        """The loaded arm of `version`: cached when it loaded before; a failed load is retried only once its
        backoff has passed (until then the failed arm is returned, or with `strict` its error raised)."""
        cached = self._cache.get(version)
        if cached is not None and cached.model is not None:
            return cached
        label = f"{self.model_name}:{version}"
        failures, next_try, failed = self._failures.get(version, (0, 0.0, None))
        if failed is not None and time.monotonic() < next_try:
            if strict:
                raise QuiverError(f"cannot load {label} (retrying in {next_try - time.monotonic():.0f} s): "
                                  f"{failed.error}")
            return failed
        try:
            model = self._loader(self.models.get(self.model_name, version))
        except Exception as exc:
            failures += 1
            delay = min(self.retry_max_s, self.retry_base_s * 2 ** (failures - 1))
            arm = Arm(version, label, None, f"{type(exc).__name__}: {exc}"[:500])
            self._failures[version] = (failures, time.monotonic() + delay, arm)
            log.warning("cannot load %s (attempt %d, next in %.0f s): %s", label, failures, delay, exc)
            if strict:
                raise
            return arm
        self._failures.pop(version, None)
        arm = Arm(version, label, model, batcher=MicroBatcher(model) if self.micro_batch else None)
        self._cache[version] = arm
        return arm

    def _champion(self, version: int, first: bool) -> Arm:
        """The champion arm. When `version` cannot load: keep serving the current champion (refreshes), or on
        the first build the newest earlier champion that loads (from the alias history)."""
        try:
            arm = self._arm(version, strict=True)
        except Exception as exc:
            self._alert("champion_load_failed", f"{self.model_name}:{version}", f"{type(exc).__name__}: {exc}")
            failed = self._failures.get(version)
            error = failed[2].error if failed is not None else f"{type(exc).__name__}: {exc}"
            # One tuple (one assignment: /health reads it from another thread), the error without its type.
            self.champion_fallback = (version, error.partition(": ")[2] or error)
            if not first:
                raise
            for earlier in self._earlier_champions(version):
                with contextlib.suppress(Exception):
                    arm = self._arm(earlier, strict=True)
                    log.error("champion %s:%d cannot load; serving %s until it does", self.model_name, version,
                              arm.label)
                    return arm
            raise
        return arm

    def _earlier_champions(self, version: int) -> list[int]:
        seen: list[int] = []
        for move in reversed(self.models.history(self.model_name, "champion")):
            for candidate in (move.from_version, move.to_version):
                if candidate is not None and candidate != version and candidate not in seen:
                    seen.append(candidate)
        return seen

    def _build(self, first: bool = False) -> ArmSet:
        from quiver.registry import rollouts

        aliases = self.models.aliases(self.model_name)
        champion_version = aliases.get("champion")
        if champion_version is None:
            raise QuiverError(f"model {self.model_name!r} has no champion alias to serve "
                              f"(aliases: {', '.join(sorted(aliases)) or 'none'})")
        champion = self._champion(champion_version, first)
        rollout = rollouts.active_rollout(self.models.registry, self.model_name)
        canary = None
        salt, fraction, rollout_id, step = "", 0.0, None, 0
        if rollout is not None and aliases.get("canary") == rollout.canary_version:
            canary = self._arm(rollout.canary_version, strict=False)
            salt, fraction, rollout_id, step = rollout.salt, rollout.fraction, rollout.id, rollout.step
            if canary.model is None:
                self._alert("canary_load_failed", canary.label, canary.error)
        shadow = None
        if aliases.get("shadow") is not None and aliases["shadow"] != champion.version:
            shadow = self._arm(aliases["shadow"], strict=False)
        refs: dict[str, None] = {}
        for arm in (champion, canary, shadow):
            if arm is not None and arm.model is not None:
                refs.update(dict.fromkeys(arm.model.feature_refs))
        # Drop cached versions no arm uses any more (their weights can be large).
        used = {a.version for a in (champion, canary, shadow) if a is not None} | {champion_version}
        self._cache = {v: a for v, a in self._cache.items() if v in used}
        self._failures = {v: f for v, f in self._failures.items() if v in used}
        if champion.version == champion_version:  # this set serves the registry's champion again
            self.champion_fallback = None
        return ArmSet(champion, canary, shadow, salt, fraction, rollout_id, tuple(refs), step)

    def refresh(self) -> bool:
        """Re-read aliases and the rollout; swap in a new arm set when anything changed. True on a swap."""
        with self._refresh_lock:
            try:
                fresh = self._build()
            except Exception as exc:  # keep serving the current models; say why
                self.stats.add(swap_failures=1)
                log.warning("model refresh failed, keeping %s: %s", self._arms.champion.label, exc)
                return False
            if fresh.key == self._arms.key and fresh.feature_refs == self._arms.feature_refs:
                return False  # the key includes which arms loaded: an arm that loads now is swapped in
            old = self._arms
            self._arms = fresh  # one reference assignment: requests see the old set or the new, never a mix
            self.stats.add(swaps=1)
            log.info("swapped in: %s (was: %s)", fresh.describe(), old.describe())
            return True

    def _poller(self) -> None:
        while not self._stop.wait(self.poll_interval_s):
            self.refresh()

    # ----- scoring -----

    def predict(self, rows: Sequence[Mapping[str, Any]], *, explain_missing: bool = False) -> list[Prediction]:
        """Score request rows: {"request_id", "entities": {key: value}, "at" (optional), "fields" (the
        request fields the model's on-demand features read)}. Every prediction says how many of its inputs
        were missing, and applies the serving model's missing-input policy (flag or refuse beyond its
        share); `explain_missing` also names them.

        The same in three steps, for a server that keeps the store round trip off its event loop:
        `call = begin(rows)`, `fetched = store.online.fetch(call.read.pending)` (skipped when `call.read.pending`
        is None), `finish(call, fetched)`."""
        call = self.begin(rows)
        fetched = self.store.online.fetch(call.read.pending) if call.read.pending is not None else None
        return self.finish(call, fetched, explain_missing=explain_missing)

    def begin(self, rows: Sequence[Mapping[str, Any]]) -> ScoringCall:
        """Step 1 of `predict` (no I/O): check the rows, read the arm set once, plan the store read."""
        began = time.perf_counter()
        arms = self._arms  # read once: this request finishes on these models whatever the poller does
        request_ids = [str(r["request_id"]) for r in rows]
        if len(set(request_ids)) != len(request_ids):
            raise QuiverError("request_id values must be unique within a request")
        entities = _columns([r.get("entities") or {} for r in rows], "entities")
        plan = self.store.plan(arms.feature_refs)
        given = [r.get("fields") or {} for r in rows]
        if plan.request_fields or any(given):
            check_request_rows(given, dict(plan.request_fields))
        fields = _columns(given, "fields")
        at = [r.get("at") for r in rows]
        times = None if all(t is None for t in at) else at
        if times is not None and any(t is None for t in times):
            raise QuiverError("give `at` for every row of a request or for none")
        read = self.store.prepare_online(arms.feature_refs, entities, at=times)
        return ScoringCall(began, arms, os.urandom(8).hex(), request_ids, entities, fields, times, read)

    def finish(self, call: ScoringCall, fetched: Any, *, explain_missing: bool = False) -> list[Prediction]:
        """Step 3 of `predict` (no I/O but the serving log's buffer): decode, route, score, log."""
        began, arms, call_id, request_ids, entities, fields, times = (
            call.began, call.arms, call.call_id, call.request_ids, call.entities, call.fields, call.times)
        n = len(request_ids)
        plan = call.read.plan
        # Rows log at their own `at` (replays of simulated days), else at the request's wall-clock time (µs UTC).
        logged_at: np.ndarray | int = np.array([timestamp_us(t) for t in times], dtype=np.int64) \
            if times is not None else time.time_ns() // 1000
        result = self.store.finish_online(call.read, fetched, fields, path=row_field)
        inputs = RowInputs(result, fields, n)
        fetched_at = time.perf_counter()
        on_canary = np.zeros(n, dtype=bool)
        if arms.canary is not None and arms.fraction > 0:
            # The read's first key is `routing_key_for(catalog, feature_refs)`: what the judge counts.
            key = self.routing_key or next(iter(result.entities))
            if key not in entities:
                raise QuiverError(f"rows lack the routing key {key!r}")
            on_canary = route_share(arms.salt, entities[key]) < arms.fraction
        canaries = int(np.count_nonzero(on_canary))  # rows routed to the canary (none without a rollout)
        scores = np.empty(n, dtype=np.float64)
        champion_rows = ~on_canary
        assert arms.champion.model is not None
        champion_ms = canary_ms = 0.0
        if canaries < n:
            t = time.perf_counter()
            try:
                scores[champion_rows if canaries else slice(None)] = arms.champion.predict(
                    inputs.of(arms.champion.model.features, champion_rows if canaries else None), n - canaries)
            except Exception as exc:
                # No score to answer with: the request fails, but the failed call is logged like a canary's,
                # so the judge compares both arms' error rates on the same footing, and the rows routed to
                # the canary are logged as not run, so its sample-ratio check counts them.
                if self.logger is not None:
                    log_failed_request(self.logger, arms, request_ids, entities, on_canary,
                                       (time.perf_counter() - began) * 1e3, logged_at,
                                       f"{type(exc).__name__}: {exc}"[:500], call_id)
                self.stats.add(champion_errors=int(champion_rows.sum()))
                raise
            champion_ms = (time.perf_counter() - t) * 1e3
        canary_error = ""
        if canaries:
            assert arms.canary is not None
            t = time.perf_counter()
            try:
                if arms.canary.model is None:
                    raise RuntimeError(f"canary not loaded: {arms.canary.error}")
                canary_scores = arms.canary.predict(inputs.of(arms.canary.model.features, on_canary), canaries)
                if canary_scores.shape != (canaries,) or not np.isfinite(canary_scores).all():
                    raise ValueError("canary returned missing or non-finite scores")
                scores[on_canary] = canary_scores
            except Exception as exc:  # the canary must never fail a request: the champion answers
                canary_error = f"{type(exc).__name__}: {exc}"[:500]
                scores[on_canary] = arms.champion.predict(inputs.of(arms.champion.model.features, on_canary),
                                                          canaries)
                self.stats.add(canary_fallbacks=canaries)
                self._alert("canary_failed", arms.canary.label, canary_error)
            canary_ms = (time.perf_counter() - t) * 1e3
        feature_ms = (fetched_at - began) * 1e3
        champion_label = arms.champion.label
        canary_label = arms.canary.label if arms.canary is not None else ""
        fallback = bool(canary_error)
        served_by_canary = on_canary if canaries and not fallback else np.zeros(n, dtype=bool)
        missing, flagged, refused, names = self._missing(arms, result, served_by_canary, n)
        scores[refused] = np.nan
        out = []
        score_list, canary_list = scores.tolist(), on_canary.tolist()
        counts, flags, refusals = missing.tolist(), flagged.tolist(), refused.tolist()
        for i, (request_id, score, routed) in enumerate(zip(request_ids, score_list, canary_list, strict=True)):
            which = tuple(names[i]) if explain_missing else ()
            if routed and not fallback:
                out.append(Prediction(request_id, score, canary_label, "canary", False, counts[i], flags[i],
                                      refusals[i], which))
            else:
                out.append(Prediction(request_id, score, champion_label, "champion", routed, counts[i], flags[i],
                                      refusals[i], which))
        self.stats.add(requests=1, rows=n, champion_rows=n - canaries, canary_rows=canaries)
        if self.logger is not None:
            # The served inputs as one array when they are (one view's numbers): the log keeps it whole.
            features = result.block(arms.served_features) or _features_of(arms, inputs.columns())
            self._log(request_ids, entities, features, arms, scores, on_canary, canaries, canary_error,
                      feature_ms + champion_ms, feature_ms + canary_ms, logged_at, call_id,
                      {name: fields[name] for name, _ in plan.request_fields if name in fields}, missing, refused)
        if arms.shadow is not None and arms.shadow.model is not None:
            self._off_path(OffPath(arms.shadow, "shadow", request_ids, entities,
                                   inputs.of(arms.shadow.model.features), feature_ms, logged_at,
                                    arms.rollout, call_id), "shadow_dropped")
        if self.pair_canary and self.logger is not None and canaries and not canary_error:
            # The champion scores the canary's rows too, after the response: the judge's paired comparison.
            self._off_path(OffPath(arms.champion, "paired", [r for r, c in zip(request_ids, canary_list, strict=True)
                                                               if c],
                                    _take(entities, on_canary, n),
                                    inputs.of(arms.champion.model.features, on_canary), feature_ms,
                                    logged_at[on_canary] if isinstance(logged_at, np.ndarray) else logged_at,
                                    arms.rollout, call_id), "paired_dropped")
        return out

    def _missing(self, arms: ArmSet, result: OnlineResult, served_by_canary: np.ndarray,
                 n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[list[str]]]:
        """Per row: missing inputs of the model that served it, flagged, refused, and their names."""
        missing = np.zeros(n, dtype=np.int64)
        flagged = np.zeros(n, dtype=bool)
        refused = np.zeros(n, dtype=bool)
        names: list[list[str]] = [[] for _ in range(n)]
        if result.all_present():  # nothing missing: no per-feature statuses to build
            return missing, flagged, refused, names
        statuses = result.statuses()
        for arm, rows in ((arms.champion, ~served_by_canary), (arms.canary, served_by_canary)):
            if arm is None or arm.model is None or not rows.any():
                continue
            count, checked = missing_inputs(arm.model, statuses, n)
            action, beyond = over_policy(arm.model, count)
            missing = np.where(rows, count, missing)
            if action == "flag":
                flagged |= rows & beyond
            elif action == "refuse":
                refused |= rows & beyond
            for i in np.flatnonzero(rows & (count > 0)):
                names[i] = [f for f in checked if statuses[f][i] != FieldStatus.PRESENT]
        return missing, flagged, refused, names

    def _off_path(self, item: OffPath, dropped: str) -> None:
        self._off_path_queue.offer(item, dropped)

    def _log(self, request_ids: list[str], entities: Mapping[str, Any], features: Mapping[str, Any], arms: ArmSet,
             scores: np.ndarray, on_canary: np.ndarray, canaries: int, canary_error: str, champion_ms: float,
             canary_ms: float, logged_at: np.ndarray | int, call_id: str, request: Mapping[str, Any],
             missing: np.ndarray, refused: np.ndarray) -> None:
        assert self.logger is not None
        version: str | np.ndarray = arms.champion.label
        arm: str | np.ndarray = "champion"
        latency: float | np.ndarray = champion_ms
        error: str | np.ndarray = ""
        if arms.canary is not None and canaries:  # per-row columns only when the rows differ
            version = np.where(on_canary, arms.canary.label, arms.champion.label)
            arm = np.where(on_canary, "canary", "champion")
            latency = np.where(on_canary, canary_ms, champion_ms)
            if canary_error:  # its rows log the error and no score
                error = np.where(on_canary, canary_error, "")
        if refused.any():  # refused by the model's missing-input policy: no score, and why
            error = np.where(refused, "refused: too many inputs missing", error)
        self.logger.log_batch(request_ids, entities, features, version, arm, latency, scores,
                              ts_us=logged_at, error=error, rollout=arms.rollout, call_id=call_id,
                              request=request or None, missing=missing)

    def drain(self, timeout_s: float = 10.0) -> bool:
        """Wait until queued shadow work is done and logged (tests, shutdown); True when it was in time."""
        return self._off_path_queue.drain(timeout_s)

    def off_path_health(self) -> dict[str, Any]:
        """Where off-path scoring runs, and in process mode the child's restarts and serving log (/health)."""
        return self._off_path_queue.health(self.off_path)

    def _alert(self, kind: str, subject: str, message: str) -> None:
        self._outbox.alert(kind, subject, message, inline=not self._threads)  # not started: deliver inline
