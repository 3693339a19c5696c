"""The training loop on small in-memory tensors (CPU): determinism, NaN safety, early stopping, schedule."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch

from quiver.catalog.errors import QuiverError
from quiver.models import data
from quiver.models.network import NetworkConfig, TabularNet, embedding_dim
from quiver.models.train import TrainConfig, lr_at, pick_device, precision_for, train

SMALL = TrainConfig(epochs=4, batch_size=128, patience=10, hidden=(16, 8), threads=1)


def synthetic(n: int = 2_000, seed: int = 0) -> tuple[data.Tensors, data.Tensors, NetworkConfig]:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({
        "x": rng.normal(size=n),
        "noisy": np.where(rng.random(n) < 0.3, np.nan, rng.normal(size=n)),
        "all_null": np.full(n, np.nan),
        "constant": np.full(n, 7.0),
        "color": rng.choice(["red", "green", "blue"], n).astype(object),
    })
    logit = 2.0 * frame["x"] + (frame["color"] == "red") * 1.5 - 1.0
    frame["y"] = (rng.random(n) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    numeric, categorical = ["x", "noisy", "all_null", "constant"], ["color"]
    prep = data.fit_preprocessor(frame.iloc[: n * 3 // 4], numeric, categorical)
    tr = data.to_tensors(frame.iloc[: n * 3 // 4], prep, "y")
    va = data.to_tensors(frame.iloc[n * 3 // 4:], prep, "y")
    return tr, va, NetworkConfig(len(numeric), prep.cardinalities, SMALL.hidden, SMALL.dropout)


def quiet(_: str) -> None:
    pass


def weights(model: TabularNet) -> dict[str, np.ndarray]:
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}


def test_same_data_and_seed_give_identical_weights_on_cpu() -> None:
    tr, va, net = synthetic()
    first = weights(train(tr, va, net, SMALL, device="cpu", log=quiet).model)
    second = weights(train(tr, va, net, SMALL, device="cpu", log=quiet).model)
    assert first.keys() == second.keys()
    assert all(np.array_equal(first[k], second[k]) for k in first)
    other = weights(train(tr, va, net, replace(SMALL, seed=1), device="cpu", log=quiet).model)
    assert any(not np.array_equal(first[k], other[k]) for k in first)


def test_all_null_and_constant_columns_train_without_nan_and_learn_the_signal() -> None:
    tr, va, net = synthetic()
    outcome = train(tr, va, net, replace(SMALL, epochs=15), device="cpu", log=quiet)
    assert all(np.isfinite(w).all() for w in weights(outcome.model).values())
    assert all(np.isfinite(h["train_loss"]) and np.isfinite(h["val_loss"]) for h in outcome.history)
    with torch.inference_mode():
        p = torch.sigmoid(outcome.model(va.numeric, va.categorical)).numpy()
    from sklearn.metrics import roc_auc_score

    assert roc_auc_score(va.label.numpy(), p) > 0.8
    assert outcome.device == "cpu" and outcome.precision == "fp32" and outcome.samples_per_s > 0


def test_early_stopping_keeps_the_best_epoch() -> None:
    tr, va, net = synthetic(n=600)
    # A huge learning rate makes validation loss worsen quickly after the first epochs.
    cfg = replace(SMALL, epochs=40, patience=2, learning_rate=0.3, warmup_fraction=0.0, grad_clip=100.0)
    outcome = train(tr, va, net, cfg, device="cpu", log=quiet)
    assert outcome.epochs_run < 40
    assert outcome.epochs_run == outcome.best_epoch + 1 + cfg.patience
    best = min(h["val_loss"] for h in outcome.history)
    assert outcome.best_val_loss == best == outcome.history[outcome.best_epoch]["val_loss"]


def test_checkpoint_of_a_finished_run_is_reused_and_of_another_run_ignored(tmp_path) -> None:  # type: ignore[no-untyped-def]
    tr, va, net = synthetic(n=800)
    lines: list[str] = []
    first = train(tr, va, net, SMALL, device="cpu", checkpoint_dir=tmp_path, log=lines.append)
    again = train(tr, va, net, SMALL, device="cpu", checkpoint_dir=tmp_path, log=lines.append)
    assert any("resumed from" in line for line in lines)
    assert again.resumed_from_epoch == SMALL.epochs
    assert all(np.array_equal(a, b) for a, b in zip(weights(first.model).values(), weights(again.model).values(),
                                                    strict=True))
    lines.clear()
    train(tr, va, net, replace(SMALL, seed=5), device="cpu", checkpoint_dir=tmp_path, log=lines.append)
    assert any("belongs to another run" in line for line in lines)


def test_learning_rate_warms_up_then_decays_to_the_floor() -> None:
    cfg = TrainConfig(learning_rate=1.0, warmup_fraction=0.1, min_lr_fraction=0.1)
    rates = [lr_at(step, 100, cfg) for step in range(100)]
    assert rates[0] == pytest.approx(0.1) and rates[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in itertools.pairwise(rates[9:]))
    assert rates[-1] == pytest.approx(0.1, abs=1e-3)


def test_devices() -> None:
    assert pick_device("cpu").type == "cpu"
    assert precision_for(torch.device("cpu")) == (None, False)
    with pytest.raises(QuiverError, match="auto, cpu or cuda"):
        pick_device("tpu")
    if not torch.cuda.is_available():
        assert pick_device("auto").type == "cpu"
        with pytest.raises(QuiverError, match="no CUDA device"):
            pick_device("cuda")


def test_embedding_sizes_grow_slowly() -> None:
    assert embedding_dim(3) == 3 and embedding_dim(10_000) == 16 and embedding_dim(1) == 2


def test_a_wide_net_started_from_the_baseline_is_that_baseline_and_never_ends_worse_on_validation() -> None:
    from quiver.models import metrics

    tr, va, net = synthetic()
    wide = replace(net, wide=True)
    baseline = metrics.fit_baseline(tr.numeric.numpy(), tr.categorical.numpy(), wide.cardinalities,
                                    tr.label.numpy(), seed=0)
    start = metrics.baseline_weights(baseline, tr.numeric.shape[1])
    model = TabularNet(wide)
    model.start_from_linear(*start)
    with torch.no_grad():
        ours = torch.sigmoid(model.eval()(va.numeric, va.categorical)).numpy()
    theirs = metrics.baseline_scores(baseline, va.numeric.numpy(), va.categorical.numpy())
    assert np.allclose(ours, theirs, atol=1e-5)  # the same function before any training
    lines: list[str] = []
    outcome = train(tr, va, wide, replace(SMALL, epochs=6, wide=True), device="cpu", log=lines.append,
                    linear_start=start)
    start_loss = float(next(line for line in lines if line.startswith("start:")).rsplit(" ", 1)[1])
    assert outcome.best_val_loss <= start_loss
    assert outcome.best_epoch >= -1


def test_start_from_linear_needs_a_wide_network() -> None:
    _, _, net = synthetic()
    with pytest.raises(ValueError, match="wide=True"):
        TabularNet(net).start_from_linear(torch.zeros(8), [torch.zeros(c) for c in net.cardinalities], 0.0)
