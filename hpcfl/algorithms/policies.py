"""Steps and weights policies: how many local steps tau_i and which weight p_i.

Each policy is a pure function of (round, cohort ids, cohort sample counts), so every
rank computes the same decisions for the whole cohort.
"""

from __future__ import annotations

import numpy as np


class EpochSteps:
    """tau_i = E * ceil(n_i / B): E full epochs including the partial last batch.

    This is FedNova's [CODE] convention (fednova.md 3.8, A2); FedAvg's "E local epochs".
    """

    def __init__(self, epochs: int, batch_size: int):
        self.epochs, self.batch_size = epochs, batch_size

    def __call__(self, rnd: int, clients: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        return self.epochs * -(-sizes.astype(np.int64) // self.batch_size)


class FixedSteps:
    """tau_i = K for every client."""

    def __init__(self, steps: int):
        self.steps = steps

    def __call__(self, rnd: int, clients: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        return np.full(len(clients), self.steps, dtype=np.int64)


class SizeWeights:
    """p_i proportional to n_i (FedAvg, McMahan et al. 2017)."""

    def __call__(self, rnd: int, clients: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        return sizes.astype(np.float64)


class UniformWeights:
    """p_i equal for all sampled clients."""

    def __call__(self, rnd: int, clients: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        return np.ones(len(clients), dtype=np.float64)
