"""Server rules and the server optimizer.

The server receives sums over the cohort (one exact reduction) and turns them into a
new global model. The rule computes the aggregate update ``agg`` (a model delta); the
server optimizer applies it::

    D   = -agg                      # pseudo-gradient
    buf = beta * buf + D            # beta = server_momentum; buf starts at 0
    x  <- x - server_lr * buf

With server_lr = 1 and beta = 0 this is ``x + agg``, i.e. plain FedAvg. It is FedAvgM
(Hsu et al. 2019) for beta > 0, and FedNova's SlowMo-style server momentum with a
constant lr (fednova.md 3.5).
"""

from __future__ import annotations

import numpy as np


class AverageRule:
    """agg = sum_i w_i Delta_i / sum_i w_i over the sampled clients (FedAvg, FedProx, SCAFFOLD).

    Renormalising by the cohort's weight sum is Alg. 1 of fednova.md 3.4.
    """

    def contribution(self, delta: np.ndarray, weight: float, anorm: float) -> np.ndarray:
        return delta * weight

    def aggregate(self, delta_sum: np.ndarray, scalars: dict) -> np.ndarray:
        return delta_sum / scalars["weight"]


class ServerOptimizer:
    """Server learning rate and momentum (state: the momentum buffer, on rank 0)."""

    def __init__(self, lr: float, momentum: float):
        self.lr, self.momentum = lr, momentum
        self.buf: np.ndarray | None = None

    def apply(self, x: np.ndarray, agg: np.ndarray) -> np.ndarray:
        """New model from the current one ``x`` and the aggregate update ``agg`` (float64)."""
        d = -agg
        self.buf = d if self.buf is None else self.momentum * self.buf + d
        return (x.astype(np.float64) - self.lr * self.buf).astype(x.dtype)
