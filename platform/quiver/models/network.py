"""The tabular model: standardized numerics with null indicators, categorical embeddings, an MLP head."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn


def embedding_dim(cardinality: int) -> int:
    """A small embedding for a vocabulary: grows slowly with its size, 2..16."""
    return max(2, min(16, round(1.6 * math.pow(cardinality, 0.56))))


@dataclass(frozen=True)
class NetworkConfig:
    """Shape of a TabularNet; stored in the artifact so loading rebuilds exactly this network."""

    n_numeric: int  # numeric features; the input has 2 × n_numeric columns (value, null indicator)
    cardinalities: tuple[int, ...]  # per categorical feature, vocabulary + the null and out-of-vocabulary slots
    hidden: tuple[int, ...] = (64, 32)
    dropout: float = 0.1
    embedding_dims: tuple[int, ...] = field(default=())
    wide: bool = False  # a logistic-regression path beside the MLP (wide & deep); see TabularNet

    def __post_init__(self) -> None:
        if not self.embedding_dims:
            object.__setattr__(self, "embedding_dims", tuple(embedding_dim(c) for c in self.cardinalities))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NetworkConfig:
        return cls(n_numeric=int(data["n_numeric"]), cardinalities=tuple(data["cardinalities"]),
                   hidden=tuple(data["hidden"]), dropout=float(data["dropout"]),
                   embedding_dims=tuple(data["embedding_dims"]), wide=bool(data.get("wide", False)))


class TabularNet(nn.Module):
    """Binary classifier over (numeric [B, 2·n_numeric] float, categorical [B, n_cat] long) → logits [B]."""

    def __init__(self, config: NetworkConfig):
        super().__init__()
        self.config = config
        self.embeddings = nn.ModuleList(nn.Embedding(c, d) for c, d in
                                        zip(config.cardinalities, config.embedding_dims, strict=True))
        width = 2 * config.n_numeric + sum(config.embedding_dims)
        layers: list[nn.Module] = []
        for size in config.hidden:
            layers += [nn.Linear(width, size), nn.GELU(), nn.Dropout(config.dropout)]
            width = size
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, 1)
        # Wide & deep: a logistic regression's own form (a weight per numeric input, one per category value)
        # beside the MLP. It starts from the fitted baseline (`start_from_linear`), so the MLP only learns
        # what the linear model misses, and on a small window the net does not fall behind its baseline.
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
