"""The quadratic "model": FedNova's F_i(x) = 1/2 ||x - e_i||^2 and GIFT's general, noisy form.

The parameter is x (dim,), every coordinate starting at ``init`` (0 for FedNova's experiments,
-100 for GIFT's Fig. 1 toy, -20 for its noisy quadratics). ``forward`` passes the batch of
targets through and ``loss`` evaluates the objective, so the real training loop is plain
(stochastic) gradient descent on F_i. Two input forms, as the ``quadratic`` dataset builds them
(hpcfl.data.quadratic):

- (dim,): a row is a centre e; loss of a batch = mean_b 1/2 ||x - e_b||^2 (Wang et al. 2020).
- (3, dim): a row is [c; h; n] (centre, diagonal curvature, gradient noise); loss of a batch =
  mean_b [1/2 sum_j h_bj (x_j - c_bj)^2 + n_b . x], whose gradient h_b (x - c_b) + n_b is the
  noisy gradient of Chen et al. 2023 (GIFT).

Accuracy is not defined.
"""

from __future__ import annotations

import torch

from .options import QuadraticModelOptions, fits_quadratic  # noqa: F401


class Quadratic(torch.nn.Module):
    def __init__(self, dim: int, init: float = 0.0):
        super().__init__()
        # float64 so that an init such as 0.1 is exact in a float64 run (FlatModel casts to the run's dtype)
        self.x = torch.nn.Parameter(torch.full((dim,), float(init), dtype=torch.float64))

    def forward(self, targets: torch.Tensor) -> torch.Tensor:
        return targets

    def loss(self, targets: torch.Tensor, _labels: torch.Tensor) -> torch.Tensor:
        """Mean loss of a batch; targets (B, dim) (plain form) or (B, 3, dim) (general form) -> scalar."""
        if targets.dim() == 2:
            return 0.5 * ((self.x - targets) ** 2).sum(dim=1).mean()
        c, h, n = targets.unbind(1)
        return (0.5 * (h * (self.x - c) ** 2).sum(dim=1) + (n * self.x).sum(dim=1)).mean()

    @staticmethod
    def batched_loss_grad(w: torch.Tensor, targets: torch.Tensor, _labels: torch.Tensor,
                          weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Weighted batch losses of G clients and their gradients, in closed form (vectorised client blocks).

        Parameters
        ----------
        w : torch.Tensor, (G, dim)
            Each client's x.
        targets : torch.Tensor, (G, B, dim) or (G, B, 3, dim)
            Each client's batch: centres e_b (plain form) or rows [c_b; h_b; n_b] (general form).
        weight : torch.Tensor, (G, B)
            Per-sample weights (1 / batch size, 0 for padding).

        Returns
        -------
        loss : torch.Tensor, (G,)
            sum_b weight_b l_b with l_b = 1/2 ||x_g - e_b||^2, or 1/2 sum_j h_bj (x_gj - c_bj)^2 + n_b . x_g.
        grad : torch.Tensor, (G, dim)
            sum_b weight_b (x_g - e_b), or sum_b weight_b (h_b (x_g - c_b) + n_b).
        """
        if targets.dim() == 3:
            diff = w.unsqueeze(1) - targets
            loss = (0.5 * (diff**2).sum(dim=2) * weight).sum(1)
            return loss, (diff * weight.unsqueeze(2)).sum(1)
        c, h, n = targets.unbind(2)
        x = w.unsqueeze(1)
        diff = x - c
        hd = h * diff
        wt = weight.unsqueeze(2)
        # few kernels: this runs once per local step of every block (GIFT's noisy quadratics: 25,600 steps)
        loss = (torch.addcmul(n * x, hd, diff, value=0.5) * wt).sum((1, 2))
        return loss, ((hd + n) * wt).sum(1)


def build_quadratic(opts: QuadraticModelOptions, input_shape: tuple[int, ...], num_classes: int) -> Quadratic:
    return Quadratic(int(input_shape[-1]), opts.init)
