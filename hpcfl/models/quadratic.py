"""The quadratic "model" of FedNova's experiments: F_i(x) = 1/2 ||x - e_i||^2.

The parameter is x (dim,), starting at 0. ``forward`` passes the batch of targets e_i
through and ``loss`` evaluates the objective, so the real training loop (one full-batch
gradient step per local step with batch size >= 1) is plain gradient descent on F_i.
Use with the ``quadratic`` dataset (hpcfl.data.quadratic); accuracy is not defined.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class QuadraticModelOptions:
    pass


class Quadratic(torch.nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.x = torch.nn.Parameter(torch.zeros(dim))

    def forward(self, targets: torch.Tensor) -> torch.Tensor:
        return targets

    def loss(self, targets: torch.Tensor, _labels: torch.Tensor) -> torch.Tensor:
        """Mean over the batch of 1/2 ||x - e||^2; shapes (B, dim) -> scalar."""
        return 0.5 * ((self.x - targets) ** 2).sum(dim=1).mean()

    @staticmethod
    def batched_loss_grad(w: torch.Tensor, targets: torch.Tensor, _labels: torch.Tensor,
                          weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """sum_b weight_b 1/2 ||x_g - e_b||^2 per client and its gradient sum_b weight_b (x_g - e_b).

        Closed form for the vectorised client blocks; shapes (G, dim), (G, B, dim), (G, B)
        -> (G,), (G, dim).
        """
        diff = w.unsqueeze(1) - targets
        loss = (0.5 * (diff**2).sum(dim=2) * weight).sum(1)
        return loss, (diff * weight.unsqueeze(2)).sum(1)


def build_quadratic(opts: QuadraticModelOptions, input_shape: tuple[int, ...], num_classes: int) -> Quadratic:
    return Quadratic(int(input_shape[0]))


def fits_quadratic(opts, input_shape) -> str | None:
    return None if len(input_shape) == 1 else "needs flat inputs (the quadratic dataset)"
