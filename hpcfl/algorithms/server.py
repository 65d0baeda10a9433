"""Server rules and the server optimizer.

The server receives sums over the cohort (one exact reduction) and turns them into a
new global model. The rule computes the aggregate update ``agg`` (a model delta); the
server optimizer applies it::

    D   = -agg                      # pseudo-gradient (descent direction)
    buf = beta * buf + D            # beta = server_momentum; buf starts at 0
    x  <- x - server_lr * buf

With beta = 0 this is ``x + server_lr * agg``: plain FedAvg for server_lr = 1. With
beta > 0 it is FedAvgM (Hsu et al. 2019). FedNova's SlowMo-style server momentum
(Wang et al. 2020, Sec. 5, as in the authors' code) divides D by the round's client lr eta_t and multiplies back:
``buf = beta * buf + D / eta_t; x <- x - eta_t * buf`` (``lr_scaled = True``); the two
agree when eta_t is constant.

The weight normaliser is the cohort's weight sum (FedNova's App. H, Alg. 1; the
default) or 1 when the sampling already made the weights unbiased (``normalize=False``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import numpy as np

from .protocol import ServerRule


def divide_(x, d: float):
    """``x /= d`` in place, correctly rounded wherever ``x`` lives.

    A CUDA tensor divided by a Python number is multiplied by its reciprocal instead (torch's
    shortcut, up to one ulp off); a 0-dim tensor on the device (filled there: nothing waits)
    makes torch divide. On the host, numpy and torch divide.
    """
    if _is_tensor(x) and x.device.type != "cpu":
        import torch

        return x.div_(torch.full((), d, dtype=x.dtype, device=x.device))
    x /= d
    return x


def _is_tensor(x) -> bool:
    """Whether ``x`` is a torch tensor, without importing torch (reading a job must not: registry)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _copy(x):
    return x.clone() if _is_tensor(x) else x.copy()


class AverageRule(ServerRule):
    """agg = sum_i w_i Delta_i / sum_i w_i (FedAvg, FedProx, SCAFFOLD); the contribution is
    w_i Delta_i (:meth:`ServerRule.contribute_into`)."""

    def __init__(self, num_params: int, normalize: bool = True):
        self.num_params, self.normalize = num_params, normalize

    tensors = True   # aggregate() also takes the delta sum as a tensor (element-wise: it runs on the device)

    def aggregate(self, delta_sum, s: dict, seg: dict | None = None):
        """The aggregate update from the cohort sums (``seg``: every reduced segment, by name);
        ``delta_sum`` (L,) float64 is a host array or a device tensor, and is not changed."""
        return divide_(_copy(delta_sum), s["weight"] if self.normalize else 1.0)


@dataclass(frozen=True)
class NovaOptions:
    """FedNova's effective step count (Wang et al. 2020, Sec. 5; docs/algorithms/fednova.md).

    ``tau_eff = "auto"``: sum p_i ||a_i||_1 (the paper's default), or sum p_i tau_i when
    the local solver is proximal (the authors' code does so whenever mu != 0). ``"anorm"`` and
    ``"steps"`` force one of the two; ``"const"`` uses ``value``.
    """

    tau_eff: str = field(default="auto", metadata={
        "choices": ("auto", "anorm", "steps", "const"),
        "help": "FedNova's effective steps: auto = sum p_i ||a_i||_1 (sum p_i tau_i when algorithm.mu > 0), anorm, "
                "steps, or const = value"})
    value: float = field(default=1.0, metadata={"gt": 0, "help": "tau_eff when tau_eff = 'const'"})


class NovaRule(ServerRule):
    """FedNova, eq. 12: agg = tau_eff * sum_i p_i Delta_i / ||a_i||_1 / sum_i p_i.

    Each client sends its update divided by its own normaliser ||a_i||_1, so every client
    counts with weight p_i whatever its number of steps or its local solver. Float buffers
    (batch-norm statistics) are not gradient steps: they are averaged with plain weights.
    """

    def __init__(self, opts: NovaOptions, num_params: int, prox: bool, normalize: bool = True):
        self.opts, self.num_params, self.normalize = opts, num_params, normalize
        self.mode = ("steps" if prox else "anorm") if opts.tau_eff == "auto" else opts.tau_eff

    def contribute_into(self, out, weight: float, anorm: float):
        out *= weight
        divide_(out[: self.num_params], anorm)
        return out

    def tau_eff(self, s: dict) -> float:
        if self.mode == "const":
            return self.opts.value
        num = s["weight_anorm"] if self.mode == "anorm" else s["weight_steps"]
        return num / s["weight"]

    tensors = True

    def aggregate(self, delta_sum, s: dict, seg: dict | None = None):
        agg = divide_(_copy(delta_sum), s["weight"] if self.normalize else 1.0)
        agg[: self.num_params] *= self.tau_eff(s)
        return agg


class ServerOptimizer:
    """Server learning rate and momentum (state: the momentum buffer, on rank 0)."""

    def __init__(self, lr: float, momentum: float, lr_scaled: bool = False):
        self.lr, self.momentum, self.lr_scaled = lr, momentum, lr_scaled
        self.buf: np.ndarray | None = None

    def apply(self, x: np.ndarray, agg: np.ndarray, client_lr: float = 1.0) -> np.ndarray:
        """New model from the current one ``x`` and the aggregate update ``agg`` (float64, this
        round's own array: it is used as the work buffer and overwritten)."""
        if self.momentum == 0 and _is_tensor(agg):   # device sums: the same on the device
            return agg.mul_(self.lr).add_(x).to(x.dtype)
        if self.momentum == 0:  # no buffer: exactly x + lr * agg (beta = 0 is bit-exact plain FedNova)
            # in place, with x widened element by element as astype would: the same sum, the same
            # bits, without two fresh (L,) float64 arrays (VGG-11: 0.25 s a round of page faults)
            np.multiply(agg, self.lr, out=agg)
            np.add(agg, x, out=agg)
            return agg.astype(x.dtype)
        x64 = x.astype(np.float64)
        d = -agg / client_lr if self.lr_scaled else -agg
        self.buf = d if self.buf is None else self.momentum * self.buf + d
        scale = self.lr * client_lr if self.lr_scaled else self.lr
        return (x64 - scale * self.buf).astype(x.dtype)
