"""Local solvers: how a client takes one step.

One solver covers plain SGD, momentum SGD, proximal SGD (FedProx) and their
combinations; SCAFFOLD adds a per-client control variate on top.

Update for one local step k (g = mini-batch gradient at x_k, x0 = round-start model)::

    g~ = g + wd * x_k + mu * (x_k - x0) + corr      # corr = c - c_i for SCAFFOLD/VR, else 0
    u  = rho * u + g~                               # u = 0 at round start; rho = 0: plain SGD
    x_{k+1} = x_k - lr_t * gamma**k * u             # lr_t: the round's lr; gamma: in-round decay

References: FedProx (Li et al. 2020, eq. 2); SCAFFOLD (Karimireddy et al. 2020, Alg. 1,
option II); the momentum convention is PyTorch's (dampening 0), as in FedNova (Wang et al.
2020, Sec. 4.1 and App. B.2). Equations and options: docs/algorithms/.

The normaliser ||a||_1 (FedNova: Delta = -lr * sum_k a_k g_k) is tracked for every
solver with a "shadow scalar": the same update run on a 1-D dummy
parameter starting at 0 whose gradient is always 1; then ||a||_1 = -x_shadow / lr.
It is kept in normalised form A = -x_shadow / lr (u_s <- rho u_s + 1 - mu lr A;
A <- A + gamma**k u_s), which reproduces the incremental recurrences of FedNova's code (A += 1
for SGD, so A is an exact integer; c = rho c + 1, A += c for momentum;
A = A(1 - lr mu) + 1 for prox) and holds for any combination of them.

The diagnostics of FedNova's Theorem 1 also need ||a||_2^2 and the last coefficient a_{-1}.
The solver is linear in the gradients: after any step, gradient g_j has a coefficient u_j in the
momentum buffer and A_j in -(x - x0)/lr, and every pair (u_j, A_j) then moves by the same 2x2
map M_k (u <- rho u - mu lr A, then A <- A + gamma**k u), while the new gradient enters as
(u, A) = (1, 0) before the A update. So the Gram matrix G = sum_j (u_j, A_j)(u_j, A_j)^T follows
G <- M_k G M_k^T plus the new gradient's term: O(1) per step, whatever tau, and
||a||_2^2 = G_AA at the end. The last gradient enters x once, with the last step's scale, so
a_{-1} = gamma**(tau-1) for every combination (1 without in-round decay).
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
    decay: float = 1.0   # gamma: the k-th local step uses lr * gamma**k (Wang et al. 2020, Sec. 4.1)


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
        self.gram = (0.0, 0.0, 0.0)   # (G_uu, G_uA, G_AA): sum_j u_j^2, u_j A_j, A_j^2 (module docstring)
        self.last_scale = 0.0         # gamma**k of the latest step: a_{-1}

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
        self._track_gram(s.momentum, s.mu * self.lr, step_scale)
        self.k += 1

    def _track_gram(self, rho: float, alpha: float, scale: float) -> None:
        """Advance (G_uu, G_uA, G_AA) by one step; alpha = mu lr, scale = gamma**k."""
        uu, ua, aa = self.gram
        # u_j <- rho u_j - alpha A_j for every earlier gradient; the new one enters with u = 1, A = 0
        uu, ua = rho * rho * uu - 2.0 * rho * alpha * ua + alpha * alpha * aa + 1.0, rho * ua - alpha * aa
        # A_j <- A_j + scale u_j
        self.gram = (uu, ua + scale * uu, aa + 2.0 * scale * ua + scale * scale * uu)
        self.last_scale = scale

    def anorm(self) -> float:
        """||a||_1 of this round so far (relative to the round's lr)."""
        return self.shadow_a

    def anorm2(self) -> float:
        """||a||_2^2 of this round so far (FedNova's Theorem 1: constants A and B)."""
        return self.gram[2]

    def alast(self) -> float:
        """a_{-1}, the coefficient of the latest gradient (gamma**(tau-1); 0 before any step)."""
        return self.last_scale
