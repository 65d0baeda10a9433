"""The quadratic objective of FedNova's objective-inconsistency experiment (Wang et al. 2020, Sec. 3, Fig. 2).

Client i holds one "sample", its optimum e_i, and the objective F_i(x) = 1/2 ||x - e_i||^2
(the ``quadratic`` model computes it). With one sample per client, p_i = 1/m and the
global optimum is x* = mean(e_i). The test set is the same m points, so the reported
test loss is F(x) = (1/m) sum_i F_i(x).

Options: ``centers`` gives e_i explicitly (one row per client, or scalars for dim 1, e.g.
[1.0, -1.0] for the two-client case of tests/unit/test_fednova.py); otherwise e_i ~ N(0, std^2 I)
in ``dim`` dimensions for ``num_clients`` clients, seeded by ``seed`` (the run seed
unless set).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .datasets import Dataset


@dataclass(frozen=True)
class QuadraticOptions:
    num_clients: int = field(default=30, metadata={
        "gt": 0, "help": "clients drawn, each with F_i(x) = 1/2 ||x - e_i||^2 (unused when centers is given)"})
    dim: int = field(default=100, metadata={"gt": 0, "help": "dimension of x and of every centre e_i"})
    std: float = field(default=0.1, metadata={"ge": 0, "help": "centres e_i ~ N(0, std^2 I) when centers is empty"})
    centers: tuple[float, ...] = field(default=(), metadata={
        "help": "explicit centres e_i, one after another (a multiple of dim values); []: draw them"})
    seed: int | None = field(default=None, metadata={"ge": 0, "help": "seed of the centre draw; unset: run.seed"})

    def validate(self):
        if self.centers and len(self.centers) % self.dim:
            return [f"centers has {len(self.centers)} values, not a multiple of dim = {self.dim}"]
        return []


def load_quadratic(opts: QuadraticOptions, root: str | None, seed: int) -> Dataset:
    if opts.centers:
        e = np.array(opts.centers, dtype=np.float64).reshape(-1, opts.dim)
    else:
        gen = np.random.default_rng(opts.seed if opts.seed is not None else seed)
        e = gen.normal(0.0, opts.std, size=(opts.num_clients, opts.dim))
    m = e.shape[0]
    y = np.zeros(m, dtype=np.int64)
    clients = tuple(np.array([i], dtype=np.int64) for i in range(m))
    return Dataset("quadratic", e, y, e.copy(), y.copy(), 1, (opts.dim,), natural_clients=clients)
