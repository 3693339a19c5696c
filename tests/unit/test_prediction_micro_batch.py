"""Micro-batching: concurrent calls get exactly their own rows' scores, share forward passes under
contention, and one bad call fails alone."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from quiver.serving.micro_batch import MicroBatcher


class Doubler:
    """A model whose score is 2·x; it blocks on a gate so calls pile up behind the first."""

    def __init__(self) -> None:
        self.features = ["x"]
        self.gate = threading.Event()
        self.calls: list[int] = []

    def predict(self, columns):
        self.gate.wait()
        x = np.asarray(columns["x"], dtype=float)
        if np.isnan(x).any():
            raise ValueError("nan input")
        self.calls.append(len(x))
        return 2 * x


def test_concurrent_calls_share_batches_and_get_their_own_scores() -> None:
    model = Doubler()
    batcher = MicroBatcher(model)
    results: dict[int, np.ndarray] = {}

    def call(k: int) -> None:
        results[k] = batcher.predict({"x": np.arange(k, k + 3, dtype=float)}, 3)

    threads = [threading.Thread(target=call, args=(k * 10,)) for k in range(8)]
    threads[0].start()
    while batcher.calls == 0 and not batcher._busy:  # the first call holds the model
        pass
    for t in threads[1:]:
        t.start()
    while len(batcher._queued) < 7:  # the other seven wait behind it
        pass
    model.gate.set()
    for t in threads:
        t.join()
    for k, scores in results.items():
        assert scores.tolist() == [2.0 * v for v in range(k, k + 3)]
    assert sorted(model.calls) == [3, 21]  # the first alone, then the seven that queued, in one pass
    assert batcher.batches == 2 and batcher.calls == 8


def test_a_bad_call_fails_alone() -> None:
    model = Doubler()
    model.gate.set()
    batcher = MicroBatcher(model)
    assert batcher.predict({"x": [1.0]}, 1).tolist() == [2.0]
    with pytest.raises(ValueError, match="nan"):
        batcher.predict({"x": [float("nan")]}, 1)
    # In one batch with a good call, the bad one is retried alone and only it raises.
    batcher._busy = True  # hold the lead so both calls queue, then release it by hand
    out: dict[str, object] = {}

    def call(name: str, x: float) -> None:
        try:
            out[name] = batcher.predict({"x": [x]}, 1).tolist()
        except ValueError as exc:
            out[name] = exc

    threads = [threading.Thread(target=call, args=("good", 4.0)), threading.Thread(target=call, args=("bad", np.nan))]
    for t in threads:
        t.start()
    while len(batcher._queued) < 2:
        pass
    with batcher._lock:
        first = batcher._queued[0]
        first.lead = True
        first.done.set()
    for t in threads:
        t.join()
    assert out["good"] == [8.0] and isinstance(out["bad"], ValueError)
    assert not batcher._busy
