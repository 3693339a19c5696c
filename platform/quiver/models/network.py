"""The tabular model: standardized numerics with null indicators, categorical embeddings, an MLP head."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
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

    def __post_init__(self) -> None:
        if not self.embedding_dims:
            object.__setattr__(self, "embedding_dims", tuple(embedding_dim(c) for c in self.cardinalities))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NetworkConfig:
        return cls(n_numeric=int(data["n_numeric"]), cardinalities=tuple(data["cardinalities"]),
                   hidden=tuple(data["hidden"]), dropout=float(data["dropout"]),
                   embedding_dims=tuple(data["embedding_dims"]))


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

    def forward(self, numeric: torch.Tensor, categorical: torch.Tensor) -> torch.Tensor:
        parts: Sequence[torch.Tensor] = [numeric, *(emb(categorical[:, i]) for i, emb in enumerate(self.embeddings))]
        logits: torch.Tensor = self.head(self.body(torch.cat(list(parts), dim=1))).squeeze(1)
        return logits
