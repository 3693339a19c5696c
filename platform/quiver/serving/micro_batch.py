"""Opportunistic micro-batching: concurrent scoring calls on one model share one forward pass.

No waiting window: a call that finds the model idle scores at once (alone, no added latency). Calls that
arrive while it is busy queue up; when the running batch finishes, the first queued caller becomes the next
leader and scores everything queued in one call. Under load, per-call overhead (input encoding, the torch
dispatch) is paid once per batch instead of once per request. A batch that fails is retried call by call,
so one bad request cannot fail its neighbours.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np


class _Scores(Protocol):
    @property
    def features(self) -> list[str]: ...

    def predict(self, columns: Mapping[str, Any]) -> np.ndarray: ...


class _Call:
    __slots__ = ("columns", "done", "error", "lead", "n", "result")

    def __init__(self, columns: Mapping[str, Any], n: int):
        self.columns, self.n = columns, n
        self.done = threading.Event()
        self.lead = False
        self.result: np.ndarray | None = None
        self.error: BaseException | None = None

    def outcome(self) -> np.ndarray:
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


class MicroBatcher:
    """Combine concurrent `predict` calls on `model` (see the module docstring)."""

    def __init__(self, model: _Scores, max_rows: int = 4096):
        self.model = model
        self.max_rows = max_rows
        self._lock = threading.Lock()
        self._queued: list[_Call] = []
        self._busy = False
        self.batches = 0
        self.calls = 0

    def predict(self, columns: Mapping[str, Any], n: int) -> np.ndarray:
        """Scores of `n` rows; blocks until they are scored (possibly together with other callers' rows)."""
        call = _Call(columns, n)
        with self._lock:
            self._queued.append(call)
            lead = not self._busy
            self._busy = True
        if not lead:
            call.done.wait()
            if not call.lead:
                return call.outcome()
        while True:  # lead: score what is queued (our own call included), then hand over or go idle
            with self._lock:
                batch: list[_Call] = []
                rows = 0
                while self._queued and (not batch or rows + self._queued[0].n <= self.max_rows):
                    rows += self._queued[0].n
                    batch.append(self._queued.pop(0))
            self._run(batch)
            with self._lock:
                if not self._queued:
                    self._busy = False
                    break
                if call.done.is_set():  # ours is scored: pass the lead on instead of working for others
                    successor = self._queued[0]
                    successor.lead = True
                    successor.done.set()
                    break
        return call.outcome()

    def _run(self, batch: Sequence[_Call]) -> None:
        self.batches += 1
        self.calls += len(batch)
        if len(batch) == 1:
            self._score_alone(batch[0])
            return
        try:
            names = self.model.features
            columns = {f: _concat([c.columns[f] for c in batch]) for f in names}
            scores = np.asarray(self.model.predict(columns), dtype=np.float64)
            if scores.shape != (sum(c.n for c in batch),):
                raise ValueError("batched scores do not match the rows")
        except Exception:  # one bad call must not fail the others: score each on its own
            for c in batch:
                self._score_alone(c)
            return
        offset = 0
        for c in batch:
            c.result = scores[offset:offset + c.n]
            offset += c.n
            c.lead = False
            c.done.set()

    def _score_alone(self, call: _Call) -> None:
        try:
            call.result = np.asarray(self.model.predict(call.columns), dtype=np.float64)
        except BaseException as exc:  # handed back to the caller's thread, raised there
            call.error = exc
        call.lead = False
        call.done.set()


def _concat(parts: list[Any]) -> Any:
    if all(isinstance(p, np.ndarray) for p in parts):
        return np.concatenate(parts)
    return [v for p in parts for v in (p.tolist() if isinstance(p, np.ndarray) else p)]
