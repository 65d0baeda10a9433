"""FedLGA's three sign readings told apart on a straggler whose full-E update is known in closed form.

Derived from the paper (Li et al., FedLGA, Eq. 4-7 and Algorithms 1-2) independently of
hpcfl's code, then compared with :func:`hpcfl.algorithms.fedlga.correct`.

Setup: three clients share the quadratic F_c(w) = 1/2 (w - c)^T H (w - c), H = diag(h), with
centres c_1, c_2 (complete: E steps) and c_3 = (c_1 + c_2) / 2 (the straggler: S < E steps).
Gradient descent with step eta from w^t = 0 gives w_k - c = M^k (w^t - c), M = I - eta H, so

    D_E(c) = (I - M^E) c        (the full-E displacement, Algorithm 1's Delta = w_E - w^t)

is linear in c: the complete clients' mean Dbar = D_E(c_3), the straggler's own full-E update.
Its truncated update is D = (I - M^S) c_3, and the paper's g (Eq. 6) is the gradient at its last
iterate, g = H (w_S - c_3) = -H M^S c_3, with G = g g^T.

Eq. 4 is the exact identity D_E = D + (w_E - w_{E_i}) with the Hessian term standing in for the
identity; Eq. 5 replaces w_E by w_bar = w^t + Dbar (Algorithm 2 line 7) and the Hessian by G:

    B (as printed, displacements):          D + G (Dbar - D)     error (I - G)(D - D_E)
    C (pseudo-gradients, 3 signs flipped):  D + G (D - Dbar)     error (I + G)(D - D_E)
    A (Table I, inconsistent):              D + G (Dbar + D)     error (D - D_E) + G (D_E + D)

Numbers: h = (1, 1/4), eta = 1/2, E = 8, S = 4, c_3 = (4, 4); M^4 = diag(1/16, (7/8)^4),
||g||^2 ~ 0.41 < 2, so B's error shrinks (0.61 of the gap ||D - D_E||); C's grows (1.40); A adds
G (D + D_E), 2.8 times the gap, and overshoots (1.86).
"""

import numpy as np
import pytest

from hpcfl.algorithms.fedlga import LgaOptions, correct

H = np.array([1.0, 0.25])
ETA, E, S = 0.5, 8, 4
C1, C2 = np.array([5.0, 3.0]), np.array([3.0, 5.0])
C3 = (C1 + C2) / 2


def full_update(c, steps):
    """D_k(c) = (I - M^k) c from w^t = 0, M = I - eta H (closed form of ``steps`` GD steps)."""
    return (1 - (1 - ETA * H) ** steps) * c


def straggler():
    """(D, Dbar, g, D_E) of the hand-built round, each (2,)."""
    d_e = full_update(C3, E)
    dbar = (full_update(C1, E) + full_update(C2, E)) / 2
    d = full_update(C3, S)
    g = -H * (1 - ETA * H) ** S * C3          # grad F at w_S = (I - M^S) c_3
    return d, dbar, g, d_e


PAPER = {   # Eq. 5 under each reading, written from the paper's lines (module docstring)
    "B_alg1": lambda d, dbar, g: d + np.outer(g, g) @ (dbar - d),
    "C_pseudo": lambda d, dbar, g: d + np.outer(g, g) @ (d - dbar),
    "A_table1": lambda d, dbar, g: d + np.outer(g, g) @ (dbar + d),
}


def test_hand_case_is_the_one_described():
    """The closed forms the other tests rest on: Dbar is exactly the straggler's full-E update, g is the
    gradient at the truncated iterate (checked against 4 explicit GD steps), and ||g||^2 < 2."""
    d, dbar, g, d_e = straggler()
    np.testing.assert_allclose(dbar, d_e, rtol=1e-15)
    w = np.zeros(2)
    for _ in range(S):
        w = w - ETA * H * (w - C3)
    np.testing.assert_allclose(w, d, rtol=1e-15)
    np.testing.assert_allclose(g, H * (w - C3), rtol=1e-15)
    assert 0.3 < g @ g < 2
    assert np.linalg.norm(d_e - d) > 0.5           # a real gap to close


def test_only_the_printed_reading_moves_towards_the_full_update():
    """B's approximation is closer to D_E than D is; C's and A's are farther (the paper's lines, numpy)."""
    d, dbar, g, d_e = straggler()
    gap = np.linalg.norm(d - d_e)
    err = {k: np.linalg.norm(f(d, dbar, g) - d_e) for k, f in PAPER.items()}
    assert err["B_alg1"] < 0.8 * gap
    assert err["C_pseudo"] > gap
    assert err["A_table1"] > gap


@pytest.mark.parametrize("variant", list(PAPER))
def test_correct_implements_each_reading_with_the_last_gradient(variant):
    """hpcfl's correct() (rank1, last_grad, lam 1, the guard not reached) equals the paper's Eq. 5 under the
    reading it names, to 1e-14, and only the variant named for the printed paper moves towards D_E."""
    d, dbar, g, d_e = straggler()
    got, alpha = correct(d, S, E, dbar, ETA, LgaOptions(variant=variant, grad_proxy="last_grad"), grad=g)
    np.testing.assert_allclose(got, PAPER[variant](d, dbar, g), rtol=1e-14, atol=1e-14)
    closer = np.linalg.norm(got - d_e) < np.linalg.norm(d - d_e)
    assert closer == (variant == "B_alg1")
    assert alpha == pytest.approx(1 + (got - d) @ d / (d @ d), rel=1e-12)


def test_last_grad_is_not_parallel_to_the_update():
    """With the paper's g the correction leaves D's direction (with avg_update it cannot: g = D / (lr S))."""
    d, dbar, g, _ = straggler()
    got, _ = correct(d, S, E, dbar, ETA, LgaOptions(variant="B_alg1", grad_proxy="last_grad"), grad=g)
    corr = got - d
    cos = corr @ d / (np.linalg.norm(corr) * np.linalg.norm(d))
    assert abs(cos) < 0.99
    avg, _ = correct(d, S, E, dbar, ETA, LgaOptions(variant="B_alg1", alpha_min=-1e30))
    cos_avg = (avg - d) @ d / (np.linalg.norm(avg - d) * np.linalg.norm(d))
    assert abs(abs(cos_avg) - 1) < 1e-12
    with pytest.raises(ValueError, match="last_grad"):
        correct(d, S, E, dbar, ETA, LgaOptions(grad_proxy="last_grad"))


def test_B_guard_stops_a_reversed_update():
    """B with avg_update: alpha = 1 + (D . Dbar - ||D||^2) / (lr S)^2 = 1 + (0.5 - 2) / 0.0004 = -3749. Unset
    alpha_min clips it at 0 (the update is dropped, never reversed); alpha_min = -1e30 lifts the guard; C is not
    guarded. With last_grad, g = (30, -10): corr = (g . (Dbar - D)) g = -5 g, alpha = 1 - 100 / 2 = -49; the clip
    scales the correction along its own direction until alpha = 0."""
    d, dbar = np.array([1.0, 1.0]), np.array([0.5, 0.0])
    lr, steps = 0.01, 2
    want = 1 + (d @ dbar - d @ d) / (lr * steps) ** 2
    assert want == pytest.approx(-3749)
    got, alpha = correct(d, steps, 5, dbar, lr, LgaOptions(variant="B_alg1"))
    assert alpha == 0.0 and np.array_equal(got, np.zeros(2))
    _, free = correct(d, steps, 5, dbar, lr, LgaOptions(variant="B_alg1", alpha_min=-1e30))
    assert free == pytest.approx(want, rel=1e-12)
    _, c_alpha = correct(d, steps, 5, dbar, lr, LgaOptions(variant="C_pseudo"))
    assert c_alpha > 1000
    g = np.array([30.0, -10.0])
    got, alpha = correct(d, steps, 5, dbar, lr, LgaOptions(variant="B_alg1", grad_proxy="last_grad"), grad=g)
    assert alpha == 0.0
    np.testing.assert_allclose(got @ d, 0.0, atol=1e-12)                # no component along D left
    corr = got - d
    np.testing.assert_allclose(corr / np.linalg.norm(corr), -g / np.linalg.norm(g), rtol=1e-12)


def test_last_gradient_is_the_gradient_at_the_last_iterate():
    """last_gradient(ctx, j, res, P) loads x^t + D (not x^t) and returns the batch gradient of the local
    objective there, plus weight decay: for a linear model y ~ w . x with loss 1/2 mean (w . x - y)^2 the
    gradient is X^T (X w - y) / n + wd w, computed here in numpy on the same batch."""
    import types

    import torch

    from hpcfl.algorithms.fedlga import last_gradient
    from hpcfl.params import FlatModel

    class Linear(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))

        def forward(self, x):
            return x @ self.w

        @staticmethod
        def loss(out, y):
            return 0.5 * ((out - y) ** 2).mean()

    rng = np.random.default_rng(5)
    X, y = rng.standard_normal((7, 3)), rng.standard_normal(7)
    model = FlatModel(Linear(), torch.device("cpu"), torch.float64)
    x0, delta, wd, batch = np.array([0.5, -1.0, 2.0]), np.array([0.25, 0.5, -1.0]), 0.01, 4
    drawn = []

    def data(j, positions):
        drawn.append(positions.numpy().copy())
        return torch.from_numpy(X[positions.numpy()]), torch.from_numpy(y[positions.numpy()])

    clients = types.SimpleNamespace(
        model=model, x0=torch.from_numpy(x0), trainer=types.SimpleNamespace(batch_size=batch), data=data,
        generator=lambda j: torch.Generator().manual_seed(11), loss_fn=Linear.loss, weight_decay=wd)
    ctx = types.SimpleNamespace(clients=clients, sizes=np.array([7]))
    res = types.SimpleNamespace(delta=torch.from_numpy(delta))
    g = last_gradient(ctx, 0, res, 3)
    idx = drawn[0]
    assert len(idx) == batch
    w = x0 + delta
    want = X[idx].T @ (X[idx] @ w - y[idx]) / batch + wd * w
    np.testing.assert_allclose(g, want, rtol=1e-13, atol=1e-15)
