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

# A faster rate than the default: the synthetic sets are small (12 steps an epoch).
SMALL = TrainConfig(epochs=4, batch_size=128, learning_rate=3e-3, patience=10, hidden=(16, 8), threads=1)


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


def test_the_baseline_is_a_candidate_a_network_that_cannot_beat_it_on_validation_falls_back_to() -> None:
    """Trained from the base rate, with the baseline's weights only a candidate judged on validation: a run
    too short to learn anything (one step at a tiny rate) ends as the baseline (epoch -1), never worse."""
    from quiver.models import metrics

    tr, va, net = synthetic()
    wide = replace(net, wide=True)
    baseline = metrics.fit_baseline(tr.numeric.numpy(), tr.categorical.numpy(), wide.cardinalities,
                                    tr.label.numpy(), seed=0)
    candidate = metrics.baseline_weights(baseline, tr.numeric.shape[1])
    lines: list[str] = []
    starved = replace(SMALL, epochs=1, learning_rate=1e-7, wide=True)
    outcome = train(tr, va, wide, starved, device="cpu", log=lines.append, linear_candidate=candidate)
    assert outcome.best_epoch == -1 and any(line.startswith("candidate before training") for line in lines)
    with torch.no_grad():
        ours = torch.sigmoid(outcome.model.eval()(va.numeric, va.categorical)).numpy()
    assert np.allclose(ours, metrics.baseline_scores(baseline, va.numeric.numpy(), va.categorical.numpy()),
                       atol=1e-5)
    # With a real schedule, whichever wins on validation is kept: never worse there than the candidate (on
    # this linear data the candidate is the true model's form; the demo's test checks the network wins there).
    lines = []
    learnt = train(tr, va, wide, replace(SMALL, epochs=6, wide=True), device="cpu", log=lines.append,
                   linear_candidate=candidate)
    candidate_loss = float(next(line for line in lines if line.startswith("candidate")).rsplit(" ", 1)[1])
    assert learnt.best_val_loss <= candidate_loss


def test_start_from_linear_needs_a_wide_network() -> None:
    _, _, net = synthetic()
    with pytest.raises(ValueError, match="wide=True"):
        TabularNet(net).start_from_linear(torch.zeros(8), [torch.zeros(c) for c in net.cardinalities], 0.0)


def test_an_ensemble_is_one_dense_network_whose_members_train_apart_and_average() -> None:
    tr, va, net = synthetic()
    ensemble = replace(net, members=4, wide=True)
    outcome = train(tr, va, ensemble, SMALL, device="cpu", log=quiet)
    model = outcome.model
    # Stored and scored as one dense network of 4 × the widths; a member's units never see another
    # member's embeddings or units (those weights are 0 after training too).
    first, second = model.body[0].weight, model.body[3].weight
    assert first.shape == (4 * 16, 2 * 4 + 4 * sum(net.embedding_dims)) and second.shape == (4 * 8, 4 * 16)
    for m in range(4):
        others = [o for o in range(4) if o != m]
        assert not second[m * 8:(m + 1) * 8].view(8, 4, 16)[:, others].any()
        embedding_columns = first[m * 16:(m + 1) * 16, 2 * 4:].view(16, 4, -1)  # one categorical feature
        assert not embedding_columns[:, others].any() and embedding_columns[:, m].all()
    with torch.inference_mode():
        members = model.member_logits(va.numeric, va.categorical)
        ensemble_logits = model(va.numeric, va.categorical)
    assert members.shape == (len(va), 4)
    assert torch.allclose(members.mean(dim=1), ensemble_logits, atol=1e-5)
    assert not torch.allclose(members[:, 0], members[:, 1])  # members differ: each had its own start
    assert np.array_equal(weights(model)["head.weight"],
                          weights(train(tr, va, ensemble, SMALL, device="cpu", log=quiet).model)["head.weight"])
    with pytest.raises(ValueError, match="needs a hidden layer"):
        NetworkConfig(2, (), (), members=2)


def test_a_network_starts_at_the_base_rate_of_its_training_split() -> None:
    tr, _, net = synthetic()
    model = TabularNet(replace(net, wide=True))
    rate = float(tr.label.mean())
    model.start_at_base_rate(rate)
    assert model.head.bias.item() == pytest.approx(np.log(rate / (1 - rate)))
    assert model.wide_numeric is not None and not model.wide_numeric.weight.any()
    with torch.no_grad():
        start = torch.sigmoid(model.eval()(tr.numeric, tr.categorical)).mean().item()
    assert start == pytest.approx(rate, abs=0.1)  # the MLP's small random output aside
    # Started so, every epoch is a candidate: the best epoch is a trained one, never the start (-1).
    assert train(*synthetic(), SMALL, device="cpu", log=quiet).best_epoch >= 0


def test_network_config_of_an_artifact_from_before_ensembles_is_one_member() -> None:
    _, _, net = synthetic()
    stored = {k: v for k, v in net.to_dict().items() if k != "members"}
    assert NetworkConfig.from_dict(stored) == net and net.members == 1
    assert NetworkConfig.from_dict(replace(net, members=3).to_dict()).members == 3
