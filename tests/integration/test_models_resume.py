"""Kill a real training process mid-run, start it again: it resumes from the last epoch's checkpoint and ends
with exactly the weights of a run that was never interrupted (CPU)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
EPOCHS = 6

SCRIPT = f"""
import sys
import numpy as np, torch
from quiver.models.data import Tensors
from quiver.models.network import NetworkConfig
from quiver.models.train import TrainConfig, train

rng = np.random.default_rng(0)
n = 100_000
x = rng.normal(size=(n, 6)).astype(np.float32)
c = rng.integers(0, 5, size=(n, 1))
y = (rng.random(n) < 1 / (1 + np.exp(-(x[:, 0] * 2 - 2 + (c[:, 0] == 1))))).astype(np.float32)
data = Tensors(torch.from_numpy(x), torch.from_numpy(c), torch.from_numpy(y))
cut = 80_000
tr = Tensors(data.numeric[:cut], data.categorical[:cut], data.label[:cut])
va = Tensors(data.numeric[cut:], data.categorical[cut:], data.label[cut:])
cfg = TrainConfig(epochs={EPOCHS}, batch_size=256, patience={EPOCHS}, hidden=(32, 16), dropout=0.2)
out = train(tr, va, NetworkConfig(3, (7,), cfg.hidden, cfg.dropout), cfg, device="cpu",
            checkpoint_dir=sys.argv[1], log=lambda line: print(line, flush=True))
torch.save(out.model.state_dict(), sys.argv[2])
print("RESUMED_FROM", out.resumed_from_epoch, flush=True)
"""


def run(checkpoints: Path, weights: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", SCRIPT, str(checkpoints), str(weights)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_killed_training_resumes_to_the_same_weights(tmp_path: Path) -> None:
    whole = run(tmp_path / "ckpt_whole", tmp_path / "whole.pt")
    whole_out, _ = whole.communicate(timeout=600)
    assert whole.returncode == 0, whole_out
    assert "RESUMED_FROM 0" in whole_out

    victim = run(tmp_path / "ckpt", tmp_path / "resumed.pt")
    progress = tmp_path / "ckpt" / "progress.json"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and victim.poll() is None:
        if progress.exists() and json.loads(progress.read_text())["epoch"] >= 2:
            break
        time.sleep(0.02)
    assert victim.poll() is None, "training finished before it could be killed:\n" + (victim.stdout.read()
                                                                                       if victim.stdout else "")
    victim.send_signal(signal.SIGKILL)
    victim.communicate(timeout=60)
    assert victim.returncode == -signal.SIGKILL
    killed_at = json.loads(progress.read_text())["epoch"]
    assert 2 <= killed_at < EPOCHS and not (tmp_path / "resumed.pt").exists()

    again = run(tmp_path / "ckpt", tmp_path / "resumed.pt")
    again_out, _ = again.communicate(timeout=600)
    assert again.returncode == 0, again_out
    assert f"resumed from {tmp_path / 'ckpt' / 'checkpoint.pt'} after epoch {killed_at}" in again_out
    assert f"RESUMED_FROM {killed_at}" in again_out

    expected = torch.load(tmp_path / "whole.pt", weights_only=True)
    resumed = torch.load(tmp_path / "resumed.pt", weights_only=True)
    assert expected.keys() == resumed.keys()
    for key in expected:
        assert np.array_equal(expected[key].numpy(), resumed[key].numpy()), key
