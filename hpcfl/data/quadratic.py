"""Quadratic objectives: FedNova's objective inconsistency and GIFT's heterogeneous, noisy quadratics.

**Plain form** (Wang et al. 2020, FedNova, Sec. 3, Fig. 2). Client i holds one "sample", its
optimum e_i, and the objective F_i(x) = 1/2 ||x - e_i||^2 (the ``quadratic`` model computes it).
With one sample per client, p_i = 1/m and the global optimum is x* = mean(e_i). The test set is
the same m points, so the reported test loss is F(x) = (1/m) sum_i F_i(x). Inputs have shape (dim,).

**General form** (Chen et al. 2023, GIFT: the Fig. 1 toy and the noisy heterogeneous quadratics of
the evaluation). Client i has a diagonal curvature h_i > 0 and the objective
F_i(x) = 1/2 sum_j h_ij (x_j - c_ij)^2; a local step's gradient is h_i * (x - c_i) + n, where n is
gradient noise. The optimum of F = (1/m) sum_i F_i is x*_j = sum_i h_ij c_ij / sum_i h_ij. Every
training sample is the stacked rows [c_i; h_i; n_s], input shape (3, dim), and the model's loss of a
sample is 1/2 sum_j h_j (x_j - c_j)^2 + n_s . x, whose gradient is the noisy one. Client i holds
``samples`` rows, n_s = sigma * xi_s with xi_s ~ N(0, I) per (client, sample), then centred over the
client's rows, so the client's full-batch gradient is exactly h_i (x - c_i). With batch size 1 each
local step draws one row, i.e. one noise value from this finite centred pool: the draw is keyed
like every other batch (seed, round, client), so runs are reproducible on any rank count, and it
is unbiased (an epoch over the pool adds zero noise in total). The test set has one row per client
with n = 0, so the test loss is (1/m) sum_i F_i(x).

The general form is used when any of ``curvatures``, ``curvature_low``/``curvature_high``,
``noise`` > 0 or ``samples`` > 1 is set. Draws come from one generator seeded by ``seed`` (the run
seed unless set), in the order: centres (when not given), curvatures (when drawn), noise.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .container import Dataset


@dataclass(frozen=True)
class QuadraticOptions:
    num_clients: int = field(default=30, metadata={
        "gt": 0, "help": "clients drawn, each with F_i(x) = 1/2 ||x - e_i||^2 (unused when centers is given)"})
    dim: int = field(default=100, metadata={"gt": 0, "help": "dimension of x and of every centre e_i"})
    std: float = field(default=0.1, metadata={"ge": 0, "help": "centres e_i ~ N(0, std^2 I) when centers is empty"})
    centers: tuple[float, ...] = field(default=(), metadata={
        "help": "explicit centres e_i, one after another (a multiple of dim values); []: draw them"})
    seed: int | None = field(default=None, metadata={
        "ge": 0, "help": "seed of the centre, curvature and noise draws; unset: run.seed"})
    curvatures: tuple[float, ...] = field(default=(), metadata={
        "gt": 0, "help": "explicit diagonal curvatures h_i, one row of dim per client like centers (general form: "
                         "F_i = 1/2 sum_j h_ij (x_j - c_ij)^2); []: all 1 unless curvature_low/high are set"})
    curvature_low: float | None = field(default=None, metadata={
        "gt": 0, "help": "draw h_ij ~ U(curvature_low, curvature_high) iid, after the centres (set both)"})
    curvature_high: float | None = field(default=None, metadata={
        "gt": 0, "help": "upper end of the curvature draw (set with curvature_low)"})
    noise: float = field(default=0.0, metadata={
        "ge": 0, "help": "std sigma of the gradient noise: each row adds n_s = sigma xi_s, centred over the "
                         "client's rows (needs samples > 1)"})
    samples: int = field(default=1, metadata={
        "gt": 0, "help": "rows per client, the pool a batch draws its noise from (general form when > 1)"})

    @property
    def general(self) -> bool:
        """True when the dataset uses the general (curvature, noise) form, input shape (3, dim)."""
        return bool(self.curvatures) or self.curvature_low is not None or self.curvature_high is not None \
            or self.noise > 0 or self.samples > 1

    def validate(self):
        out = []
        if self.centers and len(self.centers) % self.dim:
            out.append(f"centers has {len(self.centers)} values, not a multiple of dim = {self.dim}")
        if self.curvatures:
            want = len(self.centers) if self.centers else self.num_clients * self.dim
            if len(self.curvatures) != want:
                out.append(f"curvatures has {len(self.curvatures)} values, but {want // self.dim} client(s) x dim = "
                           f"{self.dim} need {want}: give one row of dim values per client, like centers")
            if self.curvature_low is not None or self.curvature_high is not None:
                out.append("curvatures and curvature_low/curvature_high both set: give explicit curvatures or a "
                           "range to draw them from, not both")
        if (self.curvature_low is None) != (self.curvature_high is None):
            out.append("set both curvature_low and curvature_high (the range of the uniform draw), or neither")
        elif self.curvature_low is not None and self.curvature_low > self.curvature_high:
            out.append(f"curvature_low = {self.curvature_low} exceeds curvature_high = {self.curvature_high}: "
                       f"swap them")
        if self.noise > 0 and self.samples < 2:
            out.append(f"noise = {self.noise} needs samples > 1: the noise of one row is centred to 0, so set "
                       f"samples to the size of each client's noise pool (e.g. 100)")
        return out


def load_quadratic(opts: QuadraticOptions, root: str | None, seed: int) -> Dataset:
    gen = None
    if opts.centers:
        e = np.array(opts.centers, dtype=np.float64).reshape(-1, opts.dim)
    else:
        gen = np.random.default_rng(opts.seed if opts.seed is not None else seed)
        e = gen.normal(0.0, opts.std, size=(opts.num_clients, opts.dim))
    m = e.shape[0]
    y = np.zeros(m, dtype=np.int64)
    if not opts.general:   # FedNova's form, kept exactly as it was: one row e_i per client
        clients = tuple(np.array([i], dtype=np.int64) for i in range(m))
        return Dataset("quadratic", e, y, e.copy(), y.copy(), 1, (opts.dim,), natural_clients=clients)
    if gen is None:   # explicit centres: the same generator, its first draws now the curvatures or noise
        gen = np.random.default_rng(opts.seed if opts.seed is not None else seed)
    if opts.curvatures:
        h = np.array(opts.curvatures, dtype=np.float64).reshape(m, opts.dim)
    elif opts.curvature_low is not None:
        h = gen.uniform(opts.curvature_low, opts.curvature_high, size=(m, opts.dim))
    else:
        h = np.ones((m, opts.dim))
    s = opts.samples
    noise = np.zeros((m, s, opts.dim))
    if opts.noise > 0:
        noise = opts.noise * gen.standard_normal((m, s, opts.dim))
        # centred per client: the full-batch gradient is exactly h_i (x - c_i), so the noise biases nothing
        noise -= noise.mean(axis=1, keepdims=True)
    x_train = np.empty((m, s, 3, opts.dim))
    x_train[:, :, 0] = e[:, None]
    x_train[:, :, 1] = h[:, None]
    x_train[:, :, 2] = noise
    x_test = np.stack([e, h, np.zeros_like(e)], axis=1)   # (m, 3, dim): no noise, test loss = mean_i F_i
    clients = tuple(np.arange(i * s, (i + 1) * s, dtype=np.int64) for i in range(m))
    return Dataset("quadratic", x_train.reshape(m * s, 3, opts.dim), np.zeros(m * s, dtype=np.int64),
                   x_test, y.copy(), 1, (3, opts.dim), natural_clients=clients)
