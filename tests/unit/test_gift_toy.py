"""GIFT on the paper's Fig. 1 toy, as pure numpy (hpcfl/algorithms/tau_control.py): checks C1-C4.

Reference: GIFT (Chen et al., "GIFT: Toward Accurate and Efficient Federated Learning With
Gradient-Instructed Frequency Tuning", JSAC 2023), Fig. 1: L1 = (w + 2)^2, L2 = (w - 10)^2 / 5,
full-batch GD, two clients, unweighted mean. The toy runs as a plain Python loop written here;
its fixed point has the closed form of C1. The engine's run of the same toy is in
test_gift_quadratics.py.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from hpcfl.algorithms.tau_control import GiftController, Pools


def toy_round(w: float, tau: int, eta: float = 0.05) -> tuple[float, float]:
    """One FedAvg round of the Fig. 1 toy: both clients' updates after tau full-batch GD steps."""
    w1 = w2 = w
    for _ in range(tau):
        w1 -= eta * 2 * (w1 + 2)
        w2 -= eta * 0.4 * (w2 - 10)
    return w1 - w, w2 - w


# ---------------------------------------------------------------- C: the Fig. 1 toy

def fixed_point(tau: int, eta: float) -> float:
    """FedAvg's fixed point on the toy: 2 (4 + a - 5 b) / (2 - a - b), a = (1 - 2 eta)^tau,
    b = (1 - 0.4 eta)^tau (client 1 maps w to -2 + a (w + 2), client 2 to 10 + b (w - 10))."""
    a, b = (1 - 2 * eta) ** tau, (1 - 0.4 * eta) ** tau
    return 2 * (4 + a - 5 * b) / (2 - a - b)


@pytest.mark.parametrize("tau,eta,table", [(1, 0.05, 0.0), (2, 0.05, 0.069686), (10, 0.05, 0.631261),
                                           (32, 0.05, 1.962742), (64, 0.05, 3.049131), (100, 0.05, 3.573965),
                                           (500, 0.05, 3.999877), (10, 0.1, 1.275803)])
def test_C1_fixed_point(tau, eta, table):
    """The plain loop from w0 = -100, run until a round moves w by < 1e-13, ends at the closed
    form (the contraction is at most 0.94 per round, so the residual is < 2e-12); the closed form
    matches the paper-derived table to 1e-6."""
    w, step = -100.0, math.inf
    while step >= 1e-13:
        u1, u2 = toy_round(w, tau, eta)
        step = abs((u1 + u2) / 2)
        w += (u1 + u2) / 2
    assert w == pytest.approx(fixed_point(tau, eta), abs=1e-10)
    assert fixed_point(tau, eta) == pytest.approx(table, abs=1e-6)


def test_C2_C3_agreement_then_bifurcation():
    """tau = 64, theta = 0.9: both clients move right in rounds 1-2 (C = 1 exactly); by round 10
    w sits at the fixed point 3.049131 with updates -+5.04318 that cancel, so the pools' signed
    part only decays (C ~ theta^r: ratio 0.9 per round) while the absolute part stays. C_20, C_50
    and C_100 are the reference values of an independent prototype of the same toy (2%)."""
    pools = Pools(1, theta=0.9)
    ctl = GiftController(64, size=1, mode="fixed", theta=0.9)
    w, C = -100.0, []
    for r in range(1, 101):
        u1, u2 = toy_round(w, 64)
        S, A = np.array([u1 + u2]), np.array([abs(u1) + abs(u2)])
        C.append(pools.update(S, A))
        d = ctl.step(S, A)
        assert d.C == C[-1] and d.tau_next == 64      # fixed mode: same C, tau kept
        if r <= 2:
            assert u1 > 0 and u2 > 0
        if r == 10:
            assert (u1, u2) == (pytest.approx(-5.04318, abs=1e-5), pytest.approx(5.04318, abs=1e-5))
            assert w + (u1 + u2) / 2 == pytest.approx(3.049131, abs=1e-6)
        w += (u1 + u2) / 2
    assert C[0] == C[1] == 1.0
    assert C[19] == pytest.approx(0.250, rel=0.02)
    assert C[49] == pytest.approx(1.19e-2, rel=0.02)
    assert C[99] == pytest.approx(6.1e-5, rel=0.02)
    assert C[99] / C[98] == pytest.approx(0.9, abs=1e-3)


def test_C4_gift_escapes():
    """Stagnation mode with defaults from tau0 = 64 halves tau down to 1 within 400 rounds and
    reaches |w| < 0.01 (the optimum is 0); FedAvg at tau = 64 stays at its fixed point 3.049131."""
    ctl = GiftController(64, size=1)
    w, wf, tau, levels = -100.0, -100.0, 64, [64]
    for r in range(400):
        u1, u2 = toy_round(w, tau)
        d = ctl.step(np.array([u1 + u2]), np.array([abs(u1) + abs(u2)]))
        w += (u1 + u2) / 2
        if d.tau_next != tau:
            levels.append(d.tau_next)
        tau = d.tau_next
        f1, f2 = toy_round(wf, 64)
        wf += (f1 + f2) / 2
    assert levels == [64, 32, 16, 8, 4, 2, 1]
    assert abs(w) < 0.01
    assert wf == pytest.approx(3.049131, abs=1e-6)
