"""The tabular model: standardized numerics with null indicators, categorical embeddings, an MLP head.

With ``members`` > 1 the MLP is an ensemble of that many independent MLPs stored as one network: each
member has its own embeddings and hidden units, every layer's weight is block-structured (a member's units
see the numeric inputs, its own embeddings and its own previous layer, nothing of the others), and the head
adds the members' outputs. Scoring is an ordinary dense forward pass (the blocks off the diagonal are zeros),
so an artifact's shape and the serving code do not depend on it; training gives each member its own loss
(`TabularNet.member_logits`), so the members do not co-adapt and the ensemble averages their errors away.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn


def embedding_dim(cardinality: int, largest: int = 16) -> int:
    """A small embedding for a vocabulary: grows slowly with its size, 2..`largest`."""
    return max(2, min(largest, round(1.6 * math.pow(cardinality, 0.56))))


@dataclass(frozen=True)
class NetworkConfig:
    """Shape of a TabularNet; stored in the artifact so loading rebuilds exactly this network."""

    n_numeric: int  # numeric features; the input has 2 × n_numeric columns (value, null indicator)
    cardinalities: tuple[int, ...]  # per categorical feature, vocabulary + the null and out-of-vocabulary slots
    hidden: tuple[int, ...] = (64, 32)
    dropout: float = 0.1
    embedding_dims: tuple[int, ...] = field(default=())
    wide: bool = False  # a logistic-regression path beside the MLP (wide & deep); see TabularNet
    members: int = 1  # independent MLPs averaged (hidden and embedding sizes are per member); see the module

    def __post_init__(self) -> None:
        if not self.embedding_dims:
            object.__setattr__(self, "embedding_dims", tuple(embedding_dim(c) for c in self.cardinalities))
        if self.members < 1 or (self.members > 1 and not self.hidden):
            raise ValueError(f"members must be >= 1, and an ensemble needs a hidden layer; got {self.members} "
                             f"member(s), hidden {self.hidden}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NetworkConfig:
        return cls(n_numeric=int(data["n_numeric"]), cardinalities=tuple(data["cardinalities"]),
                   hidden=tuple(data["hidden"]), dropout=float(data["dropout"]),
                   embedding_dims=tuple(data["embedding_dims"]), wide=bool(data.get("wide", False)),
                   members=int(data.get("members", 1)))  # artifacts from before ensembles: one member


class TabularNet(nn.Module):
    """Binary classifier over (numeric [B, 2·n_numeric] float, categorical [B, n_cat] long) → logits [B]."""

    def __init__(self, config: NetworkConfig):
        super().__init__()
        self.config = config
        k = config.members
        self.embeddings = nn.ModuleList(nn.Embedding(c, k * d) for c, d in
                                        zip(config.cardinalities, config.embedding_dims, strict=True))
        # Which member each input column belongs to (-1: the numeric inputs, which every member sees).
        owner = [-1] * (2 * config.n_numeric)
        for d in config.embedding_dims:
            owner += [m for m in range(k) for _ in range(d)]
        layers: list[nn.Module] = []
        for size in config.hidden:
            layer = nn.Linear(len(owner), k * size)
            if k > 1:
                _keep_blocks(layer, torch.tensor(owner), torch.arange(k).repeat_interleave(size))
            layers += [layer, nn.GELU(), nn.Dropout(config.dropout)]
            owner = [m for m in range(k) for _ in range(size)]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(len(owner), 1)
        if k > 1:
            with torch.no_grad():  # a member's output (k × its share of the head) starts at a single net's scale
                self.head.weight.mul_(1 / math.sqrt(k))
        # Wide & deep: a logistic regression's own form (a weight per numeric input, one per category value)
        # beside the MLP, trained with it: the main effects need no hidden unit, the MLP adds what they miss.
        # It starts at 0 (`start_at_base_rate`) or as a fitted logistic regression (`start_from_linear`).
        self.wide_numeric = nn.Linear(2 * config.n_numeric, 1) if config.wide else None
        self.wide_categorical = nn.ModuleList(nn.Embedding(c, 1) for c in config.cardinalities) \
            if config.wide else None

    def start_from_linear(self, numeric: Any, categorical: Sequence[Any], intercept: float) -> None:
        """Set the wide path to a fitted logistic regression (weights per numeric input column and per
        category value, and its intercept; arrays or tensors) and silence the MLP's output, so the net starts
        as that model."""
        if self.wide_numeric is None or self.wide_categorical is None:
            raise ValueError("start_from_linear needs a network built with wide=True")
        with torch.no_grad():
            self.wide_numeric.weight.copy_(torch.as_tensor(numeric, dtype=torch.float32).reshape(1, -1))
            self.wide_numeric.bias.fill_(intercept)
            for emb, weights in zip(self.wide_categorical, categorical, strict=True):
                cast(nn.Embedding, emb).weight.copy_(torch.as_tensor(weights, dtype=torch.float32).reshape(-1, 1))
            self.head.weight.zero_()
            self.head.bias.zero_()

    def start_at_base_rate(self, positive_rate: float) -> None:
        """Start the output at the log-odds of the training split's positive rate, with the wide path at 0
        (the MLP's output is small at initialisation). From the default start (p ≈ 0.5) the first epochs only
        learn the base rate of a 1-2 % positive label, and the validation loss turned upwards before the
        network had learnt anything else."""
        rate = min(max(positive_rate, 1e-6), 1 - 1e-6)
        with torch.no_grad():
            self.head.bias.fill_(math.log(rate / (1 - rate)))
            if self.wide_numeric is not None and self.wide_categorical is not None:
                self.wide_numeric.weight.zero_()
                self.wide_numeric.bias.zero_()
                for emb in self.wide_categorical:
                    cast(nn.Embedding, emb).weight.zero_()

    def member_logits(self, numeric: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        """[B, members] logits, one per member (each with the shared bias and wide path); their mean is
        `forward`. Training gives each its own loss.

        Computed member by member (batched), not as `forward`'s dense layers: those multiply every member's
        inputs by the other members' zero blocks, k times the arithmetic. The zero blocks get no gradient."""
        k, n = self.config.members, len(numeric)
        first = cast(nn.Linear, self.body[0]).weight
        shared = 2 * self.config.n_numeric
        # First layer: the numeric inputs through their dense block, each member's embeddings through its own.
        hidden = F.linear(numeric, first[:, :shared])
        if self.embeddings:
            looked_up = torch.cat([emb(categorical[:, i]).view(n, k, -1)
                                   for i, emb in enumerate(self.embeddings)], dim=2)  # [B, k, Σd]
            blocks = first[:, shared:].index_select(1, self._member_columns()).view(k, -1, k, looked_up.shape[2])
            own = torch.diagonal(blocks, dim1=0, dim2=2).permute(2, 0, 1)  # [k, h, Σd]: member m's rows × its columns
            hidden = hidden + torch.bmm(looked_up.transpose(0, 1), own.transpose(1, 2)).transpose(0, 1).reshape(n, -1)
        for position, layer in enumerate(self.body):
            if isinstance(layer, nn.Linear):
                if position > 0:  # block diagonal: member m's units of this layer see its units of the last
                    size = layer.out_features // k
                    own = torch.diagonal(layer.weight.view(k, size, k, -1), dim1=0, dim2=2).permute(2, 0, 1)
                    hidden = torch.bmm(hidden.view(n, k, -1).transpose(0, 1), own.transpose(1, 2)) \
                        .transpose(0, 1).reshape(n, -1)
                hidden = hidden + layer.bias
            else:
                hidden = layer(hidden)
        logits: torch.Tensor = (hidden * self.head.weight).view(n, k, -1).sum(dim=2) * k + self.head.bias
        return logits + self._wide(numeric, categorical).unsqueeze(1)

    def _member_columns(self) -> torch.Tensor:
        """Embedding columns reordered member-major (member 0's dims of every feature, then member 1's, …)."""
        cached = self.__dict__.get("_member_order")
        if cached is None:
            k, starts = self.config.members, [0]
            for d in self.config.embedding_dims:  # feature i's k·d columns start where feature i-1's end
                starts.append(starts[-1] + k * d)
            order = [begin + m * d + j for m in range(k)
                     for begin, d in zip(starts, self.config.embedding_dims, strict=False) for j in range(d)]
            cached = torch.tensor(order, dtype=torch.long)
            self.__dict__["_member_order"] = cached  # not an attribute nn.Module tracks (no state_dict entry)
        return cast(torch.Tensor, cached).to(self.head.weight.device)

    def _wide(self, numeric: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        """[B] logits of the wide path (zeros without one)."""
        if self.wide_numeric is None or self.wide_categorical is None:
            return torch.zeros(len(numeric), dtype=numeric.dtype, device=numeric.device)
        logits: torch.Tensor = self.wide_numeric(numeric)
        for i, emb in enumerate(self.wide_categorical):
            logits = logits + emb(categorical[:, i])
        return logits.squeeze(1)

    def infer(self, numeric: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        """`forward` for scoring in eval mode: the same kernels in the same order (so the same bits), called
        directly instead of through nine nn.Module calls and their attribute look-ups, which cost more than the
        arithmetic for a request of a few rows. Dropout is the identity in eval mode, so it is left out."""
        if self.training:
            raise RuntimeError("infer() scores in eval mode: call model.eval() first")
        embeddings, body, head, wide_numeric, wide_categorical = self._kernels()
        x = numeric
        if embeddings:  # torch.cat of the numeric block alone is a copy of it
            looked_up = (F.embedding(categorical[:, i], weight) for i, weight in enumerate(embeddings))
            x = torch.cat([numeric, *looked_up], dim=1)
        for gelu, weight, bias in body:
            x = F.gelu(x, approximate=gelu) if gelu else F.linear(x, weight, bias)
        logits = F.linear(x, *head)
        if wide_numeric is not None:
            logits = logits + F.linear(numeric, *wide_numeric)
            for i, weight in enumerate(wide_categorical):
                logits = logits + F.embedding(categorical[:, i], weight)
        return logits.squeeze(1)

    def _kernels(self) -> tuple[Any, ...]:
        """The parameters `infer` passes to each kernel, looked up once (the same Parameter objects, so
        weights trained or loaded in place are seen)."""
        cached = self.__dict__.get("_kernel_plan")
        if cached is None:
            body: list[tuple[str, Any, Any]] = []
            for layer in self.body:
                if isinstance(layer, nn.Linear):
                    body.append(("", layer.weight, layer.bias))
                elif isinstance(layer, nn.GELU):
                    body.append((layer.approximate, None, None))
                elif not isinstance(layer, nn.Dropout):
                    raise TypeError(f"infer() does not know layer {layer!r}")
            wide = None if self.wide_numeric is None else (self.wide_numeric.weight, self.wide_numeric.bias)
            cached = ([cast(nn.Embedding, e).weight for e in self.embeddings], body,
                      (self.head.weight, self.head.bias), wide,
                      [cast(nn.Embedding, e).weight for e in (self.wide_categorical or ())])
            self.__dict__["_kernel_plan"] = cached  # not an attribute nn.Module tracks (no state_dict entry)
        return cast(tuple[Any, ...], cached)

    def forward(self, numeric: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        parts: Sequence[torch.Tensor] = [numeric, *(emb(categorical[:, i]) for i, emb in enumerate(self.embeddings))]
        logits: torch.Tensor = self.head(self.body(torch.cat(list(parts), dim=1)))
        if self.wide_numeric is not None and self.wide_categorical is not None:
            logits = logits + self.wide_numeric(numeric)
            for i, emb in enumerate(self.wide_categorical):
                logits = logits + emb(categorical[:, i])
        return logits.squeeze(1)


def _keep_blocks(layer: nn.Linear, input_owner: torch.Tensor, output_owner: torch.Tensor) -> None:
    """Make `layer` block-structured for an ensemble: output unit j keeps its weight from input i only when
    i is shared (owner -1) or belongs to j's member; each unit's initial weights are scaled to the inputs it
    really has (its fan-in). The other weights start at 0 and stay 0: `member_logits`, which training uses,
    never reads them (no gradient), and AdamW leaves a zero with a zero gradient at zero."""
    mask = ((input_owner.unsqueeze(0) < 0) | (input_owner.unsqueeze(0) == output_owner.unsqueeze(1))).float()
    with torch.no_grad():
        layer.weight.mul_(mask * (mask.shape[1] / mask.sum(dim=1, keepdim=True)).sqrt())
