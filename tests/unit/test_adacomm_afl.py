"""AdaComm's tau schedule and AFL's bound G(tau) and tau*, as pure numpy
(hpcfl/algorithms/tau_control.py, hpcfl/algorithms/afl_bound.py): GIFT's two baselines.

References: AdaComm (J. Wang, G. Joshi, SysML 2019), with the saturation fix of the GIFT paper's
comparison; AFL (S. Wang et al., "Adaptive federated learning in resource constrained edge
computing systems", JSAC 2019).
"""

from __future__ import annotations

import math

import pytest

from hpcfl.algorithms.afl_bound import afl_G, afl_h, afl_tau
from hpcfl.algorithms.tau_control import AdaCommController


def taus(decisions) -> list[int]:
    return [d.tau_next for d in decisions]


# ---------------------------------------------------------------- AdaComm and AFL

def adacomm_run(fix: bool, rounds) -> list:
    ctl = AdaCommController(16, saturation_fix=fix)
    return [ctl.step(loss, dur) for loss, dur in rounds]


# (loss, seconds): T0 = 10 x 0.1 s; ten rounds of 0.1 s sum to 0.9999999999999999, which reaches it
ADA = [(4.0, 0.1)] + [(3.0, 0.1)] * 8 + [(2.0, 0.1)] + [(3.0, 0.1)] * 9 + [(2.5, 0.1)] \
    + [(1.0, 0.05)] * 19 + [(0.25, 0.05)]


def test_adacomm_formula_and_saturation():
    """F0 = 4 (round 1). Round 10 (t = 1 = T0): F = 2 < 4, tau = ceil(sqrt(1/2) 16) = ceil(11.31) = 12.
    Round 20 (t = 2): F = 2.5 >= 2, the saturation fix halves 12 to 6; without it
    ceil(sqrt(2.5/4) 16) = ceil(12.65) = 13. Round 40 (t = 3 after twenty 0.05 s rounds): F = 0.25,
    ceil(sqrt(1/16) 16) = 4 in both."""
    for fix, mid, why in ((True, 6, "saturation"), (False, 13, "adacomm")):
        d = adacomm_run(fix, ADA)
        assert taus(d) == [16] * 9 + [12] * 10 + [mid] * 20 + [4]
        assert [(i + 1, x.reason) for i, x in enumerate(d) if x.reason] == [(10, "adacomm"), (20, why), (40, "adacomm")]


def test_adacomm_clip_rounds_and_resume():
    """Without a clock, boundaries every 3 rounds; a loss above F0 gives sqrt(9/4) 16 = 24, clipped
    to tau_max = tau0 = 16 (no change, no event); a NaN round changes nothing. A controller loaded
    from scalars() at round 4 continues identically."""
    seq = [4.0, 3.0, 1.0, 2.0, math.nan, 9.0, 3.0, 3.0, 1.0]
    ctl = AdaCommController(16, clock=False, interval_rounds=3, saturation_fix=False)
    d = [ctl.step(x) for x in seq]
    # round 3: ceil(sqrt(1/4) 16) = 8; round 6: 24 -> 16; round 9: 8
    assert taus(d) == [16, 16, 8, 8, 8, 16, 16, 16, 8]
    a = AdaCommController(16, clock=False, interval_rounds=3, saturation_fix=False)
    [a.step(x) for x in seq[:4]]
    b = AdaCommController(16, clock=False, interval_rounds=3, saturation_fix=False)
    b.load_state(a.state())
    assert [b.step(x) for x in seq[4:]] == d[4:]
    with pytest.raises(ValueError, match="duration"):
        AdaCommController(16).step(1.0)
    # F equal to F_prev did not decrease: the fix halves (the formula would keep sqrt(1) 16 = 16)
    eq = AdaCommController(16, clock=False, interval_rounds=2)
    assert [eq.step(4.0).tau_next for _ in range(2)] == [16, 8]


def test_afl_hand_case():
    """eta = 0.5, beta = 2, delta = 1: h = (2^tau - 1)/2 - tau/2 = 0, 0.5, 2. With phi = 1, c = 1,
    b = 3, R = 4: T' = 4 tau / (tau + 3) = 1, 1.6, 2 and G = [1 + sqrt(1 + 2 T'^2 rho h / tau)] / T'
    + rho h. rho = 0.75: G(1) = 2, G(2) = (1 + sqrt(1.96))/1.6 + 0.375 = 1.875,
    G(3) = (1 + sqrt 5)/2 + 1.5 = 3.118..., so tau* = 2."""
    args = dict(eta=0.5, beta=2.0, rho=0.75, delta=1.0, phi=1.0, c=1.0, b=3.0, R=4.0)
    assert [afl_h(t, 0.5, 2.0, 1.0) for t in (1, 2, 3)] == pytest.approx([0, 0.5, 2], abs=1e-12)
    assert [afl_G(t, **args) for t in (1, 2, 3)] == pytest.approx([2, 1.875, (1 + 5 ** 0.5) / 2 + 1.5], rel=1e-12)
    assert afl_tau(**args, tau_max=3) == 2 and afl_tau(**args, tau_max=1) == 1
    # rho = 0: G = 2 / T' = 2 (c tau + b) / (R tau) falls with tau -> tau_max; b = 0 too: G = 2 c / R
    # for every tau, a tie, so the smallest tau.
    assert afl_tau(**{**args, "rho": 0.0}, tau_max=7) == 7
    assert afl_tau(**{**args, "rho": 0.0, "b": 0.0}, tau_max=7) == 1


def test_afl_beta_limit_and_errors():
    """h -> 0 as beta -> 0, to first order delta eta^2 beta tau (tau - 1)/2; near that limit the
    closed form cancels, so compare with the exact rational value of the same float inputs.
    delta = 0 gives h = 0. Invalid inputs name the parameter."""
    from fractions import Fraction as Fr
    assert afl_h(10, 0.1, 0.0, 2.0) == 0.0 and afl_h(10, 0.1, 0.3, 0.0) == 0.0
    for beta in (1e-12, 1e-6, 1e-3, 0.5):
        e, bt, dl = Fr(0.1), Fr(beta), Fr(2.0)
        exact = dl / bt * ((e * bt + 1) ** 10 - 1) - e * dl * 10
        assert afl_h(10, 0.1, beta, 2.0) == pytest.approx(float(exact), rel=1e-12, abs=0)
    assert afl_h(10, 0.1, 1e-12, 2.0) == pytest.approx(2 * 0.01 * 1e-12 * 45, rel=1e-9, abs=0)
    for bad, name in [({"eta": 0.0}, "eta"), ({"beta": -1.0}, "beta"), ({"phi": math.nan}, "phi"),
                      ({"R": 0.0}, "R"), ({"c": 0.0, "b": 0.0}, "c"), ({"tau_max": 0}, "tau_max")]:
        with pytest.raises(ValueError, match=name):
            afl_tau(**{**dict(eta=0.1, beta=1.0, rho=1.0, delta=1.0, phi=0.1, c=1.0, b=1.0, R=100.0), **bad})
