"""Local solvers: how a client takes one step.

One solver covers plain SGD, momentum SGD, proximal SGD (FedProx) and their
combinations; SCAFFOLD adds a per-client control variate on top.

Update for one local step k (g = mini-batch gradient at x_k, x0 = round-start model)::

    g~ = g + wd * x_k + mu * (x_k - x0) + corr      # corr = c - c_i for SCAFFOLD/VR, else 0
    u  = rho * u + g~                               # u = 0 at round start; rho = 0: plain SGD
    x_{k+1} = x_k - lr_t * gamma**k * u             # lr_t: the round's lr; gamma: in-round decay

References: FedProx (Li et al. 2020, eq. 2); SCAFFOLD (Karimireddy et al. 2020, Alg. 1,
option II); the momentum convention is PyTorch's (dampening 0), as in fednova.md 3.1.

The normaliser ||a||_1 (FedNova: Delta = -lr * sum_k a_k g_k) is tracked for every
solver with the "shadow scalar" of fednova.md 3.1: the same update run on a 1-D dummy
parameter starting at 0 whose gradient is always 1; then ||a||_1 = -x_shadow / lr.
It is kept in normalised form A = -x_shadow / lr (u_s <- rho u_s + 1 - mu lr A;
A <- A + gamma**k u_s), which is exactly fednova.md's incremental recurrences (A += 1
for SGD, so A is an exact integer; c = rho c + 1, A += c for momentum;
A = A(1 - lr mu) + 1 for prox) and holds for any combination of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SolverSpec:
    """Hyper-parameters of the local update (see module docstring)."""

    lr: float
    momentum: float = 0.0
    weight_decay: float = 0.0
    mu: float = 0.0
    decay: float = 1.0   # gamma: the k-th local step uses lr * gamma**k (fednova.md 3.1)


class LocalSolver:
    """Stateful within one client's round: call :meth:`begin`, then :meth:`step` per batch."""

    def __init__(self, spec: SolverSpec):
        self.spec = spec

    def begin(self, x0: torch.Tensor, lr: float | None = None) -> None:
        """Reset per-round state; ``x0`` (num_params,) is the round-start weight vector.

        ``lr`` is this round's learning rate (after any round schedule); default spec.lr.
        """
        self.x0 = x0
        self.lr = self.spec.lr if lr is None else lr
        self.k = 0
        self.u = None
        self.shadow_a = 0.0   # A = ||a||_1 so far
        self.shadow_u = 0.0

    def step(self, x: torch.Tensor, g: torch.Tensor, corr: torch.Tensor | None) -> None:
        """Update ``x`` (num_params,) in place given its gradient ``g`` (num_params,)."""
        s = self.spec
        if s.weight_decay:
            g = g.add(x, alpha=s.weight_decay)
        if s.mu:
            g = g.add(x - self.x0, alpha=s.mu)
        if corr is not None:
            g = g.add(corr)
        if s.momentum:
            self.u = g.clone() if self.u is None else self.u.mul_(s.momentum).add_(g)
            g = self.u
        step_scale = s.decay**self.k if s.decay != 1.0 else 1.0
        x.add_(g, alpha=-self.lr * step_scale)
        # Shadow scalar with unit gradient (weight decay is part of the objective, not of a).
        self.shadow_u = s.momentum * self.shadow_u + 1.0 - s.mu * self.lr * self.shadow_a
        self.shadow_a += step_scale * self.shadow_u
        self.k += 1

    def anorm(self) -> float:
        """||a||_1 of this round so far (relative to the round's lr)."""
        return self.shadow_a


class ScaffoldState:
    """SCAFFOLD control variates (option II) for the clients a rank owns.

    Per-client state lives on the owning rank in ONE array, ``c_local`` of shape
    (clients on this rank, num_params), allocated at first use. The server variate
    ``c`` (num_params,) is held by every rank (broadcast with the model).
    """

    def __init__(self, num_local: int, num_params: int, device: torch.device, dtype: torch.dtype):
        self.num_local = num_local
        self.num_params = num_params
        self.device, self.dtype = device, dtype
        self.c_local: torch.Tensor | None = None
        self.c = torch.zeros(num_params, device=device, dtype=dtype)

    def _table(self) -> torch.Tensor:
        if self.c_local is None:
            self.c_local = torch.zeros(self.num_local, self.num_params, device=self.device, dtype=self.dtype)
        return self.c_local

    def correction(self, slot: int) -> torch.Tensor:
        """c - c_i, added to every local gradient of the client in ``slot``."""
        return self.c - self._table()[slot]

    def update(self, slot: int, delta: torch.Tensor, anorm: float, lr: float) -> torch.Tensor:
        """Option II: c_i+ = c_i - c + (x0 - y_i) / (||a||_1 lr); returns Delta c_i = c_i+ - c_i.

        ``delta`` is y_i - x0 over the parameters. With plain SGD ||a||_1 = K (the number
        of local steps), which is the paper's formula; ||a||_1 generalises it to momentum
        and proximal solvers.
        """
        table = self._table()
        new = table[slot] - self.c - delta / (anorm * lr)
        dc = new - table[slot]
        table[slot] = new
        return dc


class VRState:
    """FedNova's cross-client variance reduction, raw-h rule (fednova.md 3.6, A7).

    Every local gradient is corrected by c_i = hbar - h_i, where h_i is client i's raw
    normalised gradient of the previous round and hbar = sum_j p_j h_j. After training,
    d_i = -Delta_i / (lr ||a_i||_1) includes the correction, so h_i = d_i - c_i.
    Per-client h lives on the owning rank in one array (clients on rank, num_params);
    hbar is broadcast with the model. Defined for full participation only.
    """

    def __init__(self, num_local: int, num_params: int, device: torch.device, dtype: torch.dtype):
        self.h_local = torch.zeros(num_local, num_params, device=device, dtype=dtype)
        self.c = torch.zeros(num_params, device=device, dtype=dtype)  # hbar, named c to share broadcast code

    def correction(self, slot: int) -> torch.Tensor:
        return self.c - self.h_local[slot]

    def update(self, slot: int, delta: torch.Tensor, anorm: float, lr: float) -> torch.Tensor:
        """Store and return the new raw h_i = d_i - c_i."""
        corr = self.c - self.h_local[slot]
        h = -delta / (lr * anorm) - corr
        self.h_local[slot] = h
        return h
