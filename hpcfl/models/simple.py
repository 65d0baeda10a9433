"""Fully connected models on flattened inputs: logistic regression and MLPs.

Any input shape is accepted; a sample of shape ``input_shape`` is flattened to
``prod(input_shape)`` features, so an MLP fed (B, 1, 8, 8) digits sees (B, 64).
"""

from __future__ import annotations

import torch
from torch import nn

from ._common import ZooModel, flat_size, normal_fan_in_
from .options import MLP_INITS, FedlgaMlpOptions, LogRegOptions, MlpOptions  # noqa: F401

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh}

class LogReg(ZooModel):
    """Multinomial logistic regression: logits = flatten(x) W^T + b.

    Parameters
    ----------
    in_features : int
    num_classes : int
    """

    def __init__(self, in_features: int, num_classes: int):
        super().__init__()
        self.feature_dim = in_features
        self.fc = nn.Linear(in_features, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, *input_shape) -> (B, in_features): the flattened input."""
        return x.flatten(1)

    def batched_loss_grad(self, w: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor,
                          weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Cross-entropy of G clients' weights at once, with its gradient in closed form.

        For the vectorised client blocks (:mod:`hpcfl.client.block`), which would otherwise
        pay an autograd graph per step. With logits z = W x + b and softmax p,
        dl/dz = p - onehot(y); the per-sample terms are weighted by ``weight``.

        Parameters
        ----------
        w : (G, C*F + C)  flat [fc.weight (C, F) | fc.bias (C,)] per client
        xb : (G, B, *input_shape);  yb : (G, B);  weight : (G, B) per-sample loss weights

        Returns
        -------
        loss (G,) = sum_b weight * l_b, and its gradient (G, C*F + C).
        """
        C, Fdim = self.fc.out_features, self.feature_dim
        G = w.shape[0]
        W, b = w[:, : C * Fdim].view(G, C, Fdim), w[:, C * Fdim :]
        x = xb.flatten(2)
        z = torch.baddbmm(b.unsqueeze(1), x, W.transpose(1, 2))     # (G, B, C)
        logp = torch.log_softmax(z, dim=2)
        loss = -(logp.gather(2, yb.unsqueeze(2)).squeeze(2) * weight).sum(1)
        dz = logp.exp_()
        dz.scatter_add_(2, yb.unsqueeze(2), -torch.ones_like(dz[..., :1]))
        dz.mul_(weight.unsqueeze(2))
        grad = torch.cat([torch.bmm(dz.transpose(1, 2), x).flatten(1), dz.sum(1)], dim=1)
        return loss, grad


def build_logreg(opts: LogRegOptions, input_shape: tuple[int, ...], num_classes: int) -> LogReg:
    """Softmax regression: W in R^{60x10}, b in R^10 on Synthetic(1,1) (Wang et al. 2020, FedNova, Sec. 6)."""
    model = LogReg(flat_size(input_shape), num_classes)
    if opts.init == "zeros":
        nn.init.zeros_(model.fc.weight)
        nn.init.zeros_(model.fc.bias)
    return model


class Mlp(ZooModel):
    """Flatten -> [Linear -> act] * len(hidden) -> Linear.

    Parameters
    ----------
    in_features : int
    hidden : tuple of int
    num_classes : int
    activation : {"relu", "tanh"}
    """

    def __init__(
        self, in_features: int, hidden: tuple[int, ...], num_classes: int, activation: str
    ):
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten(1)]
        width = in_features
        for h in hidden:
            layers += [nn.Linear(width, h), ACTIVATIONS[activation]()]
            width = h
        self.body = nn.Sequential(*layers)
        self.feature_dim = width
        self.fc = nn.Linear(width, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """(B, *input_shape) -> (B, hidden[-1]), or the flattened input if no hidden layer."""
        return self.body(x)

    def init_weights(self, scheme: str) -> None:
        """Re-draw the weights per ``scheme`` (one of ``MLP_INITS``)."""
        if scheme == "default":
            return
        hidden_layers = [m for m in self.body if isinstance(m, nn.Linear)]
        for layer in hidden_layers:
            normal_fan_in_(layer, gain=2.0)
        # The output layer feeds softmax, not ReLU, so "he_lecun" drops the ReLU factor 2.
        normal_fan_in_(self.fc, gain=2.0 if scheme == "he_normal" else 1.0)


def build_mlp(opts: MlpOptions, input_shape: tuple[int, ...], num_classes: int) -> Mlp:
    """Build an MLP over ``prod(input_shape)`` features."""
    model = Mlp(flat_size(input_shape), opts.hidden, num_classes, opts.activation)
    model.init_weights(opts.init)
    return model
