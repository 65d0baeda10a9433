"""Mutation-driven checks of :mod:`hpcfl.algorithms.fedlga_grad` (issue 48) on a hand-sized model.

A linear model y = x . w with loss 0.5 mean (x . w - y)^2 over two samples, x1 = [1, 2], y1 = 1 and
x2 = [3, -1], y2 = 0, at the last iterate w = x0 + D = [0.5, 0.5] + [0.5, -1] = [1, -0.5]: residuals
r = [-1, 3.5], so the mean gradient X^T r / 2 = [4.75, -2.75] and the first sample's alone [-1, -2].
"""

import types

import numpy as np
import pytest
import torch

from hpcfl.algorithms.fedlga_grad import (
    full_gradient,
    full_steps_of_pass,
    last_gradient,
)

X = torch.tensor([[1.0, 2.0], [3.0, -1.0]], dtype=torch.float64)
Y = torch.tensor([1.0, 0.0], dtype=torch.float64)


class _Lin(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))

    def forward(self, x):
        return x @ self.w


class _Model:
    """The part of hpcfl's model wrapper the gradients use: load, module, grad, weights."""

    def __init__(self):
        self.module = _Lin()

    def load(self, v):
        with torch.no_grad():
            self.module.w.copy_(torch.as_tensor(v))

    def grad(self, loss):
        return torch.autograd.grad(loss, self.module.w)[0]

    @property
    def weights(self):
        return self.module.w


def _ctx(n, weight_decay=0.0):
    """A RoundContext with one client of n samples (the first n rows of X) and LocalClients' fields."""
    c = types.SimpleNamespace(
        model=_Model(), x0=torch.tensor([0.5, 0.5], dtype=torch.float64), weight_decay=weight_decay,
        loss_fn=lambda out, y: 0.5 * ((out - y) ** 2).mean(), data=lambda j, idx: (X[idx], Y[idx]),
        trainer=types.SimpleNamespace(batch_size=64), generator=lambda j: torch.Generator().manual_seed(0))
    return types.SimpleNamespace(clients=c, sizes=np.array([n]))


RES = types.SimpleNamespace(delta=torch.tensor([0.5, -1.0], dtype=torch.float64))


def test_full_steps_of_pass_is_int64_ceil_of_size_over_batch():
    """ceil(n_i / B) as int64 even for float sizes: [10, 3, 8] / 4 -> [3, 1, 2]."""
    s = full_steps_of_pass([10.0, 3.0, 8.0], 4)
    assert s.dtype == np.int64 and s.tolist() == [3, 1, 2]


def test_full_gradient_of_one_sample_and_of_two_chunks():
    """n = 1 is a valid client (gradient [-1, -2]); n = 2 in chunks of 1 gives the mean [4.75, -2.75],
    taken at x0 + D (not x0 - D)."""
    np.testing.assert_allclose(full_gradient(_ctx(1), 0, RES, 2, chunk=1), [-1.0, -2.0], rtol=0, atol=1e-15)
    np.testing.assert_allclose(full_gradient(_ctx(2), 0, RES, 2, chunk=1), [4.75, -2.75], rtol=0, atol=1e-15)


def test_full_gradient_refuses_a_client_without_samples():
    """n = 0 is refused with a message that names the cohort position."""
    with pytest.raises(ValueError, match=r"^client at cohort position 0 has no training samples: no gradient of F_i$"):
        full_gradient(_ctx(0), 0, RES, 2)


def test_last_gradient_adds_the_weight_decay_term_at_the_last_iterate():
    """One batch holding both samples plus wd w: [4.75, -2.75] + 0.5 [1, -0.5] = [5.25, -3.0]."""
    np.testing.assert_allclose(last_gradient(_ctx(2, 0.5), 0, RES, 2), [5.25, -3.0], rtol=0, atol=1e-15)
    np.testing.assert_allclose(last_gradient(_ctx(2), 0, RES, 2), [4.75, -2.75], rtol=0, atol=1e-15)
