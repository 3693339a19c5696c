"""The training loop: one plain `for` loop over batches sliced from in-memory tensors.

Read top to bottom: the config, the device choice, then `train()` — seeds, model, AdamW, a warmup + cosine
schedule, autocast on CUDA, BCEWithLogitsLoss, gradient clipping, validation loss each epoch, early stopping,
and a checkpoint after every epoch that a killed run resumes from, bit for bit on CPU.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from quiver.artifacts import make_private, private_dirs
from quiver.catalog.errors import QuiverError
from quiver.models.data import Tensors
from quiver.models.network import NetworkConfig, TabularNet

CHECKPOINT, PROGRESS = "checkpoint.pt", "progress.json"


@dataclass(frozen=True)
class TrainConfig:
    """Everything that shapes a training run (stored with the model, part of the checkpoint's identity)."""

    epochs: int = 30
    batch_size: int = 512
    learning_rate: float = 1e-3
    weight_decay: float = 1e-4
    warmup_fraction: float = 0.05  # of all steps, linear from 0
    min_lr_fraction: float = 0.05  # cosine decays to this share of the peak
    grad_clip: float = 1.0
    patience: int = 4  # epochs without a better validation loss before stopping
    min_delta: float = 1e-5
    pos_weight: float = 1.0  # weight of positives in the loss; 1.0 chosen by measurement (docs/models.md)
    # Per member: one narrow layer, light dropout, embeddings of at most 8 dims. On the demo's windows (a few
    # hundred positives) one such net lands +0.004 to +0.019 ROC-AUC above the logistic baseline depending on
    # its seed; the mean of 8 is within ±0.002 of +0.012 (docs/models.md, "The network against its baseline").
    hidden: tuple[int, ...] = (32,)
    dropout: float = 0.1
    members: int = 8  # independent MLPs in one network, averaged (NetworkConfig.members)
    embedding_max: int = 8  # largest embedding per categorical feature and member (network.embedding_dim)
    wide: bool = True  # the network's linear path (NetworkConfig.wide), trained with the MLP
    # Start the wide path as the fitted logistic baseline (else at 0, the output at the base rate). Off: from
    # the baseline's weights no epoch improved on it (they overfit the noisy categoricals and the net stayed
    # there, "best epoch -1"), so every version was its baseline.
    start_from_baseline: bool = False
    seed: int = 0
    # torch CPU threads. 1 by measurement: this small MLP's batches gain nothing from more threads and ran
    # 5-8x slower with 2 on a busy 2-core machine (threads spin-wait for each other). None: torch's default.
    threads: int | None = 1

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class TrainOutcome:
    """The best model (by validation loss) and how the run went."""

    model: TabularNet
    device: str
    precision: str
    epochs_run: int
    best_epoch: int
    best_val_loss: float
    samples_per_s: float
    resumed_from_epoch: int
    history: list[dict[str, float]] = field(default_factory=list)


def pick_device(requested: str = "auto") -> torch.device:
    """`auto`: CUDA when present, else CPU. Asking for `cuda` without one is a clear error."""
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested == "cuda" and not torch.cuda.is_available():
        raise QuiverError("--device cuda: no CUDA device is visible to torch on this machine")
    if requested not in ("cpu", "cuda"):
        raise QuiverError(f"device must be auto, cpu or cuda, got {requested!r}")
    return torch.device(requested)


def precision_for(device: torch.device) -> tuple[torch.dtype | None, bool]:
    """(autocast dtype or None, use GradScaler): bf16 on CUDA, fp16 + scaler without bf16, fp32 on CPU."""
    if device.type != "cuda":
        return None, False
    if torch.cuda.is_bf16_supported():
        return torch.bfloat16, False
    return torch.float16, True


def autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager[Any]:
    """Mixed precision on CUDA; plain fp32 (no autocast at all) on CPU."""
    return torch.autocast(device_type=device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()


def lr_at(step: int, total_steps: int, cfg: TrainConfig) -> float:
    """Linear warmup, then cosine decay to min_lr_fraction of the peak (a pure function of the step)."""
    warmup = max(1, int(cfg.warmup_fraction * total_steps))
    if step < warmup:
        return cfg.learning_rate * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
    floor = cfg.min_lr_fraction * cfg.learning_rate
    return floor + 0.5 * (cfg.learning_rate - floor) * (1 + math.cos(math.pi * progress))


def train(train_set: Tensors, valid_set: Tensors, network: NetworkConfig, cfg: TrainConfig, *,
          device: str = "auto", checkpoint_dir: str | Path | None = None, log: Callable[[str], None] = print,
          linear_start: tuple[Any, Sequence[Any], float] | None = None,
          linear_candidate: tuple[Any, Sequence[Any], float] | None = None) -> TrainOutcome:
    """Train a TabularNet; resume from `checkpoint_dir` when it holds a checkpoint of this same run.

    `linear_start` (numeric weights, per-categorical weights, intercept — `metrics.baseline_weights`) starts
    a wide network as that logistic regression; the start is then the first candidate for the best epoch
    (epoch -1), so the result is never worse on validation than the model it started from. Without it the
    network starts at the training split's base rate (`TabularNet.start_at_base_rate`); `linear_candidate`
    (the same weights) is then only the first candidate for the best epoch, judged on validation like every
    epoch: on a window too small for the network to beat it there, the result is the baseline (epoch -1)
    rather than a worse network. A network of several members trains each on its own loss; early stopping
    watches the ensemble's validation loss."""
    # ----- setup -----
    dev = pick_device(device)
    amp_dtype, use_scaler = precision_for(dev)
    precision = {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[amp_dtype]
    threads_before = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    model = TabularNet(network)
    if linear_start is not None:
        model.start_from_linear(*linear_start)
    else:
        model.start_at_base_rate(float(train_set.label.mean()))
    model = model.to(dev)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay)
    scaler = torch.amp.GradScaler("cuda", enabled=use_scaler)
    loss_fn = nn.BCEWithLogitsLoss(pos_weight=torch.tensor(cfg.pos_weight, device=dev))
    # Tabular data fits in device memory: move it once, then every batch is an index gather there.
    x_num, x_cat, y = (t.to(dev) for t in (train_set.numeric, train_set.categorical, train_set.label))
    n = len(train_set)
    steps_per_epoch = math.ceil(n / cfg.batch_size)
    total_steps = cfg.epochs * steps_per_epoch
    log(f"training on {dev} ({precision}{', GradScaler' if use_scaler else ''}): {n:,} train rows, "
        f"{len(valid_set):,} validation rows, {steps_per_epoch} steps/epoch, up to {cfg.epochs} epochs")

    # ----- resume -----
    run_id = _run_identity(train_set, valid_set, network, cfg)
    ckpt_path = Path(checkpoint_dir) / CHECKPOINT if checkpoint_dir else None
    start_epoch, step, best_val, best_epoch, bad_epochs = 0, 0, math.inf, -1, 0
    best_state: dict[str, torch.Tensor] = copy.deepcopy(model.state_dict())
    history: list[dict[str, float]] = []
    if ckpt_path is not None and ckpt_path.exists():
        ckpt = torch.load(ckpt_path, map_location=dev, weights_only=True)
        if ckpt["run_id"] == run_id:
            model.load_state_dict(ckpt["model"])
            optimizer.load_state_dict(ckpt["optimizer"])
            scaler.load_state_dict(ckpt["scaler"])
            best_state = ckpt["best_state"]
            start_epoch, step, best_val = int(ckpt["epoch"]), int(ckpt["step"]), float(ckpt["best_val"])
            best_epoch, bad_epochs, history = int(ckpt["best_epoch"]), int(ckpt["bad_epochs"]), ckpt["history"]
            torch.set_rng_state(ckpt["rng_cpu"].cpu())
            if dev.type == "cuda" and "rng_cuda" in ckpt:
                torch.cuda.set_rng_state(ckpt["rng_cuda"].cpu())
            log(f"resumed from {ckpt_path} after epoch {start_epoch}")
        else:
            log(f"ignoring {ckpt_path}: it belongs to another run (data, network or config differ)")
    if start_epoch == 0 and linear_start is not None:
        best_val = evaluate_loss(model, valid_set, dev, amp_dtype)
        best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        log(f"start: the baseline's weights, val loss {best_val:.5f}")
    elif start_epoch == 0 and linear_candidate is not None:
        candidate = TabularNet(network)
        candidate.start_from_linear(*linear_candidate)
        candidate = candidate.to(dev)
        best_val = evaluate_loss(candidate, valid_set, dev, amp_dtype)
        best_state = {k: v.detach().clone() for k, v in candidate.state_dict().items()}
        log(f"candidate before training: the baseline's weights, val loss {best_val:.5f}")
    resumed_from = start_epoch

    # ----- the loop -----
    train_time, samples = 0.0, 0
    epoch = start_epoch
    stopped = start_epoch > 0 and bad_epochs >= cfg.patience
    while not stopped and epoch < cfg.epochs:
        model.train()
        # The order of epoch e depends only on (seed, e): a resumed run shuffles exactly like an unbroken one.
        order = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.seed * 1_000_003 + epoch)).to(dev)
        started = time.perf_counter()
        train_loss = torch.zeros((), device=dev)
        for start in range(0, n, cfg.batch_size):
            idx = order[start:start + cfg.batch_size]
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, total_steps, cfg)
            with autocast(dev, amp_dtype):
                # One loss per member (the mean over members): they learn independently, not as one model.
                logits = model.member_logits(x_num[idx], x_cat[idx]) if network.members > 1 \
                    else model(x_num[idx], x_cat[idx])
            target = y[idx].unsqueeze(1).expand_as(logits) if logits.dim() == 2 else y[idx]
            loss = loss_fn(logits.float(), target)  # the loss in fp32 even under autocast
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            train_loss += loss.detach() * len(idx)
            step += 1
        if dev.type == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - started
        train_time, samples = train_time + elapsed, samples + n
        val_loss = evaluate_loss(model, valid_set, dev, amp_dtype)
        improved = val_loss < best_val - cfg.min_delta
        if improved:
            best_val, best_epoch, bad_epochs = val_loss, epoch, 0
            best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        else:
            bad_epochs += 1
        history.append({"epoch": float(epoch), "train_loss": float(train_loss) / n, "val_loss": val_loss,
                        "lr": lr_at(step - 1, total_steps, cfg), "samples_per_s": n / elapsed})
        log(f"epoch {epoch:>3}  train loss {float(train_loss) / n:.5f}  val loss {val_loss:.5f}"
            f"{' *' if improved else '  '}  lr {history[-1]['lr']:.2e}  {n / elapsed:,.0f} samples/s")
        epoch += 1
        stopped = bad_epochs >= cfg.patience
        if ckpt_path is not None:
            _save_checkpoint(ckpt_path, {
                "run_id": run_id, "epoch": epoch, "step": step, "model": model.state_dict(),
                "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(), "best_state": best_state,
                "best_val": best_val, "best_epoch": best_epoch, "bad_epochs": bad_epochs, "history": history,
                "rng_cpu": torch.get_rng_state(),
                **({"rng_cuda": torch.cuda.get_rng_state()} if dev.type == "cuda" else {})})
        if stopped:
            log(f"early stop: no better validation loss for {cfg.patience} epochs (best: epoch {best_epoch})")

    model.load_state_dict(best_state)
    model = model.to("cpu").eval()
    torch.set_num_threads(threads_before)
    rate = samples / train_time if train_time else 0.0
    log(f"done on {dev}: {epoch} epochs, best epoch {best_epoch}, val loss {best_val:.5f}, {rate:,.0f} samples/s")
    return TrainOutcome(model, str(dev), precision, epoch, best_epoch, best_val, rate, resumed_from, history)


@torch.no_grad()
def evaluate_loss(model: TabularNet, data: Tensors, device: torch.device, amp_dtype: torch.dtype | None,
                  batch_size: int = 65_536) -> float:
    """Mean unweighted BCE on `data` in eval mode (what early stopping watches)."""
    model.eval()
    total = 0.0
    for start in range(0, len(data), batch_size):
        sl = slice(start, start + batch_size)
        with autocast(device, amp_dtype):
            logits = model(data.numeric[sl].to(device), data.categorical[sl].to(device))
        total += float(nn.functional.binary_cross_entropy_with_logits(
            logits.float(), data.label[sl].to(device), reduction="sum"))
    return total / max(1, len(data))


def _run_identity(train_set: Tensors, valid_set: Tensors, network: NetworkConfig, cfg: TrainConfig) -> str:
    import hashlib

    blob = json.dumps({"train": train_set.fingerprint(), "valid": valid_set.fingerprint(),
                       "network": network.to_dict(), "config": cfg.to_dict()}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    # Written beside, then renamed: a kill mid-write leaves the previous epoch's checkpoint intact.
    private_dirs(path.parent)  # owner-only, as the artifacts (see quiver.artifacts)
    staged = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(state, staged)
    make_private(staged)
    os.replace(staged, path)
    progress = path.parent / PROGRESS
    staged_progress = progress.with_name(f".{progress.name}.{os.getpid()}.tmp")
    staged_progress.write_text(json.dumps({"epoch": state["epoch"], "step": state["step"],
                                           "best_epoch": state["best_epoch"]}))
    make_private(staged_progress)
    os.replace(staged_progress, progress)  # readers (monitors, tests) never see a half-written file
