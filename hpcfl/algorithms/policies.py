"""Steps and weights policies: how many local steps tau_i and which weight p_i.

Each policy here is a pure function of (seed, round, client, n_i): every rank computes
the same decisions for the whole cohort, and a client's draw never depends on which
other clients are asked together (keys per client, see :mod:`hpcfl.rng`). The engine
calls ``steps(ctx)`` / ``weights(ctx)`` with the round's
:class:`~hpcfl.algorithms.protocol.RoundContext`; ``__call__(rnd, clients, sizes)`` is
the same rule on plain arrays.

Policies with options take them from ``[algorithm.<policy name>]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import rng
from .protocol import Policy


def epoch_steps(epochs: np.ndarray | int, sizes: np.ndarray, batch_size: int, rounding: str = "ceil") -> np.ndarray:
    """Local steps of E epochs over n_i samples with batch B (docs/algorithms/fedavg.md).

    "ceil": E * ceil(n_i / B), full epochs including a partial last batch (FedNova's
    released code, the default); "floor": max(1, floor(E * n_i / B)), the formula of the
    FedNova paper (Wang et al. 2020, Sec. 2).
    """
    n = sizes.astype(np.int64)
    if rounding == "floor":
        return np.maximum(1, (np.asarray(epochs, dtype=np.int64) * n) // batch_size)
    return np.asarray(epochs, dtype=np.int64) * -(-n // batch_size)



class _Steps(Policy):
    """A steps policy given by ``__call__(rnd, clients, sizes)``."""

    def steps(self, ctx) -> np.ndarray:
        return self(ctx.rnd, ctx.cohort, ctx.sizes)


class _Weights(Policy):
    """A static weights policy: w_i depends on the client alone (``__call__``)."""

    def weights(self, ctx) -> np.ndarray:
        return self(ctx.rnd, ctx.cohort, ctx.sizes)


class EpochSteps(_Steps):
    """tau_i = E epochs of the client's data (see :func:`epoch_steps` for the rounding).

    FedAvg's "E local epochs"; FedNova's CIFAR setting E_i = 2.
    """

    def __init__(self, epochs: int, batch_size: int, rounding: str = "ceil"):
        self.epochs, self.batch_size, self.rounding = epochs, batch_size, rounding

    def __call__(self, rnd: int, clients: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        return epoch_steps(self.epochs, sizes, self.batch_size, self.rounding)


class FixedSteps(_Steps):
    """tau_i = K for every client."""

    def __init__(self, steps: int):
        self.count = steps

    def __call__(self, rnd: int, clients: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        return np.full(len(clients), self.count, dtype=np.int64)


@dataclass(frozen=True)
class RandomEpochsOptions:
    """E_i(t) uniform on the integers low..high (inclusive), fresh per client and round."""

    low: int = field(default=2, metadata={"ge": 1, "help": "fewest local epochs E_i(t), inclusive"})
    high: int = field(default=5, metadata={"ge": 1, "help": "most local epochs E_i(t), inclusive"})

    def validate(self):
        return [] if self.low <= self.high else [f"low = {self.low} exceeds high = {self.high}"]


class RandomEpochSteps(_Steps):
    """tau_i(t) = E_i(t) epochs, E_i(t) ~ U{low..high} (Wang et al. 2020, Sec. 6; integer epochs).

    The CIFAR setting E ~ U(2,5) and the synthetic E ~ U(1,5) of the FedNova paper. The
    draw is keyed by (seed, round, client), never by rank or list position.
    """

    def __init__(self, opts: RandomEpochsOptions, batch_size: int, seed: int, rounding: str = "ceil"):
        self.opts, self.batch_size, self.seed, self.rounding = opts, batch_size, seed, rounding

    def epochs(self, rnd: int, clients: np.ndarray) -> np.ndarray:
        return np.array([rng.numpy_rng(self.seed, rng.STEPS, rnd, c).integers(self.opts.low, self.opts.high + 1)
                         for c in clients], dtype=np.int64)

    def __call__(self, rnd: int, clients: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        return epoch_steps(self.epochs(rnd, clients), sizes, self.batch_size, self.rounding)


@dataclass(frozen=True)
class ClientStepsOptions:
    """Per-client step counts: an explicit list, or a distribution.

    ``steps = [2, 8]`` gives client i the count ``steps[i mod len]``. Otherwise
    ``dist = "uniform"`` draws integers low..high, ``dist = "normal"`` draws
    round(N(mean, std)) clipped to [low, high] (FedNova's quadratic experiment:
    mean 30, std 20, in [1, 96]; Wang et al. 2020, Fig. 2). ``per_round = false`` draws once per
    client (fixed heterogeneous tau); true draws afresh every round.
    """

    steps: tuple[int, ...] = field(default=(), metadata={
        "help": "explicit step counts: client i runs steps[i mod len]; []: draw them from dist"})
    dist: str = field(default="uniform", metadata={
        "choices": ("uniform", "normal"),
        "help": "when steps is empty: uniform on low..high, or normal = round(N(mean, std)) clipped to [low, high]"})
    low: int = field(default=1, metadata={"ge": 1, "help": "smallest step count drawn"})
    high: int = field(default=10, metadata={"ge": 1, "help": "largest step count drawn"})
    mean: float = field(default=30.0, metadata={"help": "mean of dist = 'normal', in steps"})
    std: float = field(default=20.0, metadata={"ge": 0, "help": "std of dist = 'normal', in steps"})
    per_round: bool = field(default=False, metadata={
        "help": "draw afresh every round; false: once per client (fixed heterogeneous steps)"})

    def validate(self):
        p = []
        if self.low > self.high:
            p.append(f"low = {self.low} exceeds high = {self.high}")
        if any(s < 0 for s in self.steps):
            p.append("steps must be non-negative step counts")
        return p


class ClientSteps(_Steps):
    """tau_i from a per-client list or a keyed distribution (see :class:`ClientStepsOptions`)."""

    def __init__(self, opts: ClientStepsOptions, seed: int):
        self.opts, self.seed = opts, seed

    def _draw(self, rnd: int, client: int) -> int:
        o = self.opts
        g = rng.numpy_rng(self.seed, rng.STEPS, rnd if o.per_round else -1, client)
        if o.dist == "uniform":
            return int(g.integers(o.low, o.high + 1))
        return int(np.clip(np.rint(g.normal(o.mean, o.std)), o.low, o.high))

    def __call__(self, rnd: int, clients: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        if self.opts.steps:
            return np.array([self.opts.steps[c % len(self.opts.steps)] for c in clients], dtype=np.int64)
        return np.array([self._draw(rnd, int(c)) for c in clients], dtype=np.int64)


class SizeWeights(_Weights):
    """p_i proportional to n_i (FedAvg, McMahan et al. 2017)."""

    def __call__(self, rnd: int, clients: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        return sizes.astype(np.float64)


class UniformWeights(_Weights):
    """p_i equal for all clients."""

    def __call__(self, rnd: int, clients: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        return np.ones(len(clients), dtype=np.float64)

