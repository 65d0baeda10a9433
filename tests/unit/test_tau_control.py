"""GIFT's gradient consistency and tau controller as pure numpy (hpcfl/algorithms/tau_control.py):
checks A1-A6, B1-B3 and B5 (the Fig. 1 toy, C1-C4: test_gift_toy.py; AdaComm and AFL:
test_adacomm_afl.py).

Reference: GIFT (Chen et al., "GIFT: Toward Accurate and Efficient Federated Learning With
Gradient-Instructed Frequency Tuning", JSAC 2023), Eq. (1) and Algorithm 1.

A scripted consistency sequence is fed as one coordinate S = c, A = 1 with theta = 0: the pools
are then that round's P = (1 + c)/2, N = (c - 1)/2 and C = |P + N| / (P - N) = c up to one
rounding, which keeps every comparison the scripts rely on (their steps are >= 1e-3). The
scripts of the controller's mechanics (patience, warm-up, peak guard, relaxation) run with the
absolute threshold alone (eps_rel = 0), so that their steps can be written in hundredths; the
default relative threshold has its own tests (test_B2_relative_*).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from hpcfl.algorithms.tau_control import GiftController, Pools, consistency, split


def raw_metric(U: np.ndarray, reduce: str) -> float:
    """The paper's raw metric from client updates U (n, M): |sum_i u| / sum_i |u| per coordinate
    (mean over coordinates, 0 where nobody moved), or the l1 ratio."""
    num, den = np.abs(U.sum(0)), np.abs(U).sum(0)
    if reduce == "l1":
        return float(num.sum() / den.sum())
    return float(np.mean([n / d if d > 0 else 0.0 for n, d in zip(num, den)]))


def scripted(Cs, tau0=100, **kw) -> list:
    """Decisions of a controller fed the consistency sequence Cs (see the module docstring);
    eps_rel = 0 unless given."""
    ctl = GiftController(tau0, size=1, theta=0.0, **{"eps_rel": 0.0, **kw})
    return [ctl.step(np.array([c]), np.array([1.0])) for c in Cs]


def taus(decisions) -> list[int]:
    return [d.tau_next for d in decisions]


# ---------------------------------------------------------------- A: the metric

def test_A1_identity():
    """(A + S)/2 and (S - A)/2 are sum ReLU(u) and -sum ReLU(-u) (summed here directly), and with
    theta = 0 every round's C is that round's raw metric, in both reductions."""
    rng = np.random.default_rng(1)
    for reduce in ("coord_mean", "l1"):
        pools = Pools(30, theta=0.0, reduce=reduce)
        for _ in range(3):
            U = rng.normal(size=(5, 30)) * rng.uniform(0.1, 10, size=30)
            S, A = U.sum(0), np.abs(U).sum(0)
            P, N = split(S, A)
            np.testing.assert_allclose(P, np.maximum(U, 0).sum(0), rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(N, -np.maximum(-U, 0).sum(0), rtol=1e-12, atol=1e-12)
            assert pools.update(S, A) == pytest.approx(raw_metric(U, reduce), rel=1e-12)


@pytest.mark.parametrize("theta", [0.0, 0.3, 0.9, 0.999])
def test_A2_agreement(theta):
    """Every coordinate keeps one sign across clients and rounds (magnitudes arbitrary): N~ or P~
    is exactly 0 per coordinate, so |P~ + N~| and P~ - N~ are the same float and C = 1 exactly."""
    rng = np.random.default_rng(2)
    sign = rng.choice([-1.0, 1.0], size=40)
    for reduce in ("coord_mean", "l1"):
        pools = Pools(40, theta=theta, reduce=reduce)
        for _ in range(20):
            U = sign * rng.uniform(1e-3, 1e3, size=(4, 40)) * rng.uniform(0.01, 100)
            assert pools.update(U.sum(0), np.abs(U).sum(0)) == 1.0


def test_A3_cancellation():
    """u and -u cancel: S = 0, so C = 0; zero coordinates (denominator 0) count 0 in the mean,
    with no NaN and no floating-point warning (errors raised if any 0/0 were evaluated)."""
    u = np.array([1.5, 0.0, -2.0, 0.0])
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        for reduce in ("coord_mean", "l1"):
            assert Pools(4, 0.9, reduce).update(u + -u, 2 * np.abs(u)) == 0.0
            assert Pools(4, 0.9, reduce).update(np.zeros(4), np.zeros(4)) == 0.0
            assert consistency(np.zeros(3), np.zeros(3), reduce) == 0.0
        # one agreeing coordinate of four: 1 / 4 in the mean, 1 in the l1 ratio
        assert Pools(4, 0.9, "coord_mean").update([2.0, 0, 0, 0], [2.0, 0, 0, 0]) == 0.25
        assert Pools(4, 0.9, "l1").update([2.0, 0, 0, 0], [2.0, 0, 0, 0]) == 1.0


def test_A4_hand_example():
    """u1 = [1, -2, 0], u2 = [3, 2, 0]: S = [4, 0, 0], A = [4, 4, 0]; coord_mean (1 + 0 + 0)/3,
    l1 4/8."""
    U = np.array([[1.0, -2, 0], [3, 2, 0]])
    S, A = U.sum(0), np.abs(U).sum(0)
    np.testing.assert_array_equal(S, [4, 0, 0])
    np.testing.assert_array_equal(A, [4, 4, 0])
    assert Pools(3, 0.0, "coord_mean").update(S, A) == pytest.approx(1 / 3, rel=1e-15)
    assert Pools(3, 0.0, "l1").update(S, A) == 0.5


@pytest.mark.parametrize("theta", [0.0, 0.5, 0.9, 0.99])
def test_A5_ema_initialisation(theta):
    """Zero start: round 1's C is the raw metric for any theta (the factor 1 - theta cancels);
    afterwards P~ and N~ follow theta P~ + (1 - theta) P_r bit for bit."""
    rng = np.random.default_rng(3)
    pools = Pools(25, theta)
    U = rng.normal(size=(3, 25))
    assert pools.update(U.sum(0), np.abs(U).sum(0)) == pytest.approx(raw_metric(U, "coord_mean"), rel=1e-12)
    for _ in range(5):
        P0, N0 = pools.P.copy(), pools.N.copy()
        U = rng.normal(size=(3, 25))
        S, A = U.sum(0), np.abs(U).sum(0)
        pools.update(S, A)
        np.testing.assert_array_equal(pools.P, theta * P0 + (1 - theta) * ((A + S) / 2))
        np.testing.assert_array_equal(pools.N, theta * N0 + (1 - theta) * ((S - A) / 2))


@pytest.mark.parametrize("reduce", ["coord_mean", "l1"])
def test_A6_permutation_and_scale(reduce):
    """C is a function of sums over clients (order-free) and a ratio of 1-homogeneous pools, so
    permuting clients or scaling every update of every round by k > 0 changes it only by rounding."""
    rng = np.random.default_rng(4)
    rounds = [rng.normal(size=(6, 50)) + rng.normal(size=50) for _ in range(12)]
    runs = {key: Pools(50, 0.9, reduce) for key in ("base", "perm", "k=3.7", "k=1e-3")}
    for U in rounds:
        Up = U[rng.permutation(6)]
        C = {"base": runs["base"].update(U.sum(0), np.abs(U).sum(0)),
             "perm": runs["perm"].update(Up.sum(0), np.abs(Up).sum(0)),
             "k=3.7": runs["k=3.7"].update((3.7 * U).sum(0), np.abs(3.7 * U).sum(0)),
             "k=1e-3": runs["k=1e-3"].update((1e-3 * U).sum(0), np.abs(1e-3 * U).sum(0))}
        assert 0 < C["base"] < 1
        for key in ("perm", "k=3.7", "k=1e-3"):
            assert C[key] == pytest.approx(C["base"], rel=1e-12, abs=0), key


# ---------------------------------------------------------------- B: the controller

def test_B1_literal():
    """Algorithm 1 line 12 from round 2: C_3 = 0.85 >= C_2 halves 100 to 50; a falling C keeps 100;
    ceil(25/2) = 13, ceil(3/2) = 2, 1 stays 1; gamma 3: ceil of 100/3, 34/3, 12/3, 4/3, 2/3 is
    34, 12, 4, 2, 1; gamma 10: 10, 1. A constant C is ">=" every round."""
    assert taus(scripted([0.9, 0.8, 0.85], mode="literal")) == [100, 100, 50]
    assert scripted([0.9, 0.8, 0.85], mode="literal")[2].reason == "literal"
    assert taus(scripted([0.9, 0.8, 0.7], mode="literal")) == [100, 100, 100]
    assert taus(scripted([0.5, 0.5], 25, mode="literal")) == [25, 13]
    assert taus(scripted([0.5, 0.5], 3, mode="literal")) == [3, 2]
    ones = scripted([0.5, 0.6, 0.7], 1, mode="literal")
    assert taus(ones) == [1, 1, 1] and all(d.reason is None for d in ones)
    assert taus(scripted([0.5] * 7, mode="literal", gamma=3)) == [100, 34, 12, 4, 2, 1, 1]
    assert taus(scripted([0.5] * 4, mode="literal", gamma=10)) == [100, 10, 1, 1]


def test_B1_literal_line14_and_fixed():
    """Line 14 read as 'C fell strictly in each of the last o rounds with tau unchanged': with
    o = 3, C falling from round 1 has 3 falls at round 4 (+5), the next 3 at round 7. Fixed mode
    never moves tau but reports C."""
    falling = [1 - 0.01 * r for r in range(9)]
    assert taus(scripted(falling, 10, mode="literal", relaxation=True, o=3, phase="always")) == \
        [10, 10, 10, 15, 15, 15, 20, 20, 20]
    fixed = scripted([0.5] * 30 + [0.9, 0.1] * 10, mode="fixed")
    assert taus(fixed) == [100] * 50 and fixed[1].C == fixed[0].C and fixed[-1].C < 0.2


def test_B1_literal_relaxation_has_no_phase_switch_and_no_cap():
    """Algorithm 1 lines 14-15 hold at any time and add delta without a bound. After the halving at
    round 2 (C_2 = C_1), three falls (o = 3) relax 5 back to 10 although phase = "initial" (the
    stagnation mode's rule) is left at its default; with tau0 = 2, o = 1, tau climbs 2, 7, 12, ...
    past 10 tau0 = 20, where the stagnation mode's cap would stop it."""
    after = scripted([0.5, 0.5, 0.4, 0.3, 0.2], 10, mode="literal", relaxation=True, o=3)
    assert taus(after) == [10, 5, 5, 5, 10] and after[4].reason == "relax"
    falling = [1 - 0.1 * r for r in range(6)]
    assert taus(scripted(falling, 2, mode="literal", relaxation=True, o=1)) == [2, 7, 12, 17, 22, 27]
    capped = scripted(falling, 2, mode="stagnation", relaxation=True, o=1, warmup=100)
    assert max(taus(capped)) == 20


def test_B2_falling_C_never_changes_tau():
    """A new minimum (a drop of 0.002 > eps_abs) every round keeps r - r_min = 0 < patience."""
    decisions = scripted([1 - 0.002 * r for r in range(300)])
    assert taus(decisions) == [100] * 300


@pytest.mark.parametrize("k,patience,warmup,expected", [
    (15, 10, 10, 25),     # last improvement at round 15, patience 10: divides at 25
    (15, 4, 10, 19),
    (3, 4, 10, 10),       # 3 + 4 = 7 is inside the warm-up: the first allowed round, 10
])
def test_B2_constant_after_k(k, patience, warmup, expected):
    """C falls by 0.01 up to round k (each a new minimum), then stays: no new minimum after k, so
    tau is divided exactly patience rounds later, or at the end of the warm-up if that is later;
    the peak guard then waits for C to fall again, which it never does."""
    Cs = [1 - 0.01 * min(r, k) for r in range(1, 60)]
    got = taus(scripted(Cs, patience=patience, warmup=warmup))
    assert got == [100] * (expected - 1) + [50] * (60 - expected)


@pytest.mark.parametrize("scale,second", [(False, 41), (True, 51)])
def test_B2_scale_patience(scale, second):
    """Halving at round 25 as in the constant case; C then falls again, 0.84 at round 26 to 0.79
    at round 31, and stays. The next halving comes patience rounds after that minimum: 10
    (round 41), or with scale_patience 10 x gamma = 20 (round 51)."""
    Cs = [1 - 0.01 * min(r, 15) for r in range(1, 26)] + [0.84 - 0.01 * min(i, 5) for i in range(35)]
    events = [(i + 1, x.tau_next) for i, x in enumerate(scripted(Cs, scale_patience=scale)) if x.reason]
    assert events == [(25, 50), (second, 25)]


def test_B2_peak_guard_ignores_burst():
    """C falls by 0.02 to round 15 (0.70), stays (halving at round 25 as above), then bursts
    upwards from 0.71 for 30 rounds. With the guard no minimum is tracked while C only rises;
    without it round 26 is a minimum and round 36 (warm-up 11 >= 10, patience 10) divides again,
    and round 47 once more: the cascade the guard exists to stop."""
    Cs = [1 - 0.02 * min(r, 15) for r in range(1, 26)] + [0.71 + 0.005 * i for i in range(30)]
    guarded = taus(scripted(Cs))
    assert guarded == [100] * 24 + [50] * 31
    # the start counts as a change (the pools start empty, as after a reset): C rising from
    # round 1 is not tracked either
    assert taus(scripted([0.3 + 0.01 * r for r in range(40)])) == [100] * 40
    unguarded = scripted(Cs, peak_guard=False)
    assert taus(unguarded)[24:] == [50] * 11 + [25] * 11 + [13] * 9 and unguarded[35].reason == "stagnation"


@pytest.mark.parametrize("seed", range(4))
def test_B2_non_increasing_without_relaxation(seed):
    """Noisy random rounds (mean drift plus noise over 3 clients) under the default controller:
    tau never rises (relaxation off) and does fall, so the check is not vacuous."""
    rng = np.random.default_rng(seed)
    ctl = GiftController(64, size=20, patience=3, warmup=2)
    drift = rng.normal(size=20)
    d = [ctl.step((U := drift + rng.normal(scale=2, size=(3, 20))).sum(0), np.abs(U).sum(0)) for _ in range(80)]
    assert all(x.tau_next <= x.tau_used for x in d) and d[-1].tau_next < 64


def test_B3_relaxation_every_o_falls():
    """delta 5, o 10, C falling by 0.005 every round (a new minimum each time, so no stagnation):
    the 10th strict fall with tau unchanged is round 11, then 21, 31. One flat round (round 6)
    restarts the count: 10 falls again by round 16."""
    falling = [1 - 0.005 * r for r in range(40)]
    d = scripted(falling, relaxation=True, delta=5, o=10)
    assert taus(d) == [100] * 10 + [105] * 10 + [110] * 10 + [115] * 10
    assert [i + 1 for i, x in enumerate(d) if x.reason] == [11, 21, 31] and d[10].reason == "relax"
    flat = falling[:5] + [falling[4]] + [falling[4] - 0.005 * i for i in range(1, 20)]
    assert [i + 1 for i, x in enumerate(scripted(flat, relaxation=True)) if x.reason] == [16]


def test_B3_relaxation_cap():
    """tau_max = 22 caps 10 -> 15 -> 20 -> 22 and stays (no event at the cap); tau_max None means
    10 tau0, i.e. 20 for tau0 = 2: 2, 7, 12, 17, 20."""
    falling = [1 - 0.005 * r for r in range(60)]
    d = scripted(falling, 10, relaxation=True, tau_max=22)
    assert [x.tau_next for x in d][10::10] == [15, 20, 22, 22, 22]
    assert [i + 1 for i, x in enumerate(d) if x.reason] == [11, 21, 31]
    assert taus(scripted(falling, 2, relaxation=True))[10::10] == [7, 12, 17, 20, 20]


@pytest.mark.parametrize("phase", ["initial", "always"])
def test_B3_relaxation_phase(phase):
    """Falls to round 15 (+5 at round 11), a plateau (stagnation halves 105 to 53 at round 25),
    then 30 more falls: phase "initial" adds nothing after that decrease, "always" adds 5 once
    10 falls and 10 rounds since the change have passed (round 35), again at 45 and 55."""
    Cs = [1 - 0.01 * min(r, 15) for r in range(1, 26)] + [0.8 - 0.005 * i for i in range(1, 31)]
    d = scripted(Cs, relaxation=True, phase=phase)
    events = [(i + 1, x.tau_next, x.reason) for i, x in enumerate(d) if x.reason]
    tail = [] if phase == "initial" else [(35, 58, "relax"), (45, 63, "relax"), (55, 68, "relax")]
    assert events == [(11, 105, "relax"), (25, 53, "stagnation")] + tail


@pytest.mark.parametrize("reset", [True, False])
def test_B2_ema_reset_on_change(reset):
    """theta 0.9, warm-up 0, patience 1; rounds S = c, A = 1 pool P = (1 + c)/2, N = (c - 1)/2.
    c = 1, 0, 1: P~ = 0.1, 0.14, 0.226 and N~ = 0, -0.05, -0.045, so C = 1, 0.09/0.19, 0.181/0.271:
    a minimum at round 2, a rise at 3, which halves 4 to 2. Round 4 (c = 0.2: P = 0.6, N = -0.4)
    after a reset is its raw metric 0.2 (A5); without one P~ = 0.9 (0.226) + 0.06 = 0.2634,
    N~ = 0.9 (-0.045) - 0.04 = -0.0805 and C = 0.1829 / 0.3439."""
    ctl = GiftController(4, size=1, theta=0.9, warmup=0, patience=1, reset_ema_on_tau_change=reset)
    d = [ctl.step(np.array([c]), np.array([1.0])) for c in (1.0, 0.0, 1.0, 0.2)]
    assert [x.C for x in d[:3]] == pytest.approx([1, 0.09 / 0.19, 0.181 / 0.271], rel=1e-12)
    assert [x.tau_next for x in d] == [4, 4, 2, 2] and d[2].reason == "stagnation"
    assert d[3].C == pytest.approx(0.2 if reset else 0.1829 / 0.3439, rel=1e-12)


def geometric(rate, rounds, scale):
    """C_r = scale (1 - rate)^r, r = 1..rounds: C improves by the fraction ``rate`` of itself every round."""
    return [scale * (1 - rate) ** r for r in range(1, rounds + 1)]


@pytest.mark.parametrize("scale", [0.66, 0.2, 0.05])
def test_B2_relative_threshold_stalls_on_slow_relative_progress(scale):
    """Default controller (eps_rel 0.1, eps_abs 1e-3, patience and warm-up 10, peak guard): C falling by
    0.5% of itself a round. Round 1 is not tracked (the guard waits for a fall), round 2 sets c_min; a new
    minimum needs C < 0.9 c_min, i.e. 0.995^k < 0.9, k = 22 rounds > patience, so tau halves at round 12
    (r - r_min = 10, warm-up 12 >= 10). After the change round 13 sets c_min again and round 23 halves,
    then 34, 45: every 11 rounds. The same at every scale of C (its improvement relative to itself is what
    counts; here 0.1 c_min > eps_abs throughout), which the absolute threshold alone does not do: with
    eps_rel = 0 C falls by more than 1e-3 a round at scale 0.66 (0.0033) and tau never moves."""
    d = scripted(geometric(0.005, 50, scale), eps_rel=0.1)
    assert [(i + 1, x.tau_next) for i, x in enumerate(d) if x.reason] == [(12, 50), (23, 25), (34, 13), (45, 7)]
    assert all(x.reason in (None, "stagnation") for x in d)
    if scale == 0.66:
        assert taus(scripted(geometric(0.005, 50, scale))) == [100] * 50


@pytest.mark.parametrize("scale", [0.66, 0.05])
def test_B2_relative_threshold_keeps_tau_while_C_improves(scale):
    """C falling by 2% of itself a round: 0.98^k < 0.9 after k = 6 rounds < patience, so a new minimum
    comes every 6 rounds and tau never moves in 100 rounds (C goes from scale to 0.13 scale; 0.1 c_min
    stays above eps_abs = 1e-3 for scale 0.05 down to c_min = 0.01, which 0.05 0.98^80 reaches)."""
    assert taus(scripted(geometric(0.02, 80, scale), eps_rel=0.1)) == [100] * 80


def test_B2_relative_is_the_default_and_eps_abs_the_floor_near_zero():
    """A default-built controller decides as eps_rel = 0.1 with eps_abs = 1e-3: the 0.5% schedule above.
    Near 0 the absolute floor decides: C = 5e-4 0.9^r (the toy's theta^r decay, 10% a round) makes a new
    minimum 0.1 c_min lower every 2 rounds, but C is below 1e-3 altogether, so with the floor no round
    after round 2's c_min is a new minimum and tau halves at round 12; without it (eps_abs = 0) it never does."""
    ctl = GiftController(100, size=1, theta=0.0)
    got = [ctl.step(np.array([c]), np.array([1.0])).tau_next for c in geometric(0.005, 50, 0.66)]
    assert got == taus(scripted(geometric(0.005, 50, 0.66), eps_rel=0.1))
    near_zero = geometric(0.1, 30, 5e-4)
    assert [i + 1 for i, x in enumerate(scripted(near_zero, eps_rel=0.1)) if x.reason][:1] == [12]
    assert taus(scripted(near_zero, eps_rel=0.1, eps_abs=0.0)) == [100] * 30


def test_B2_default_resets_the_pools_on_a_change():
    """The default controller zeroes P~ and N~ when tau changes (reset_ema_on_tau_change defaults to true):
    the round after the change reports its own raw metric, as test_B2_ema_reset_on_change[True] does."""
    ctl = GiftController(4, size=1, theta=0.9, warmup=0, patience=1)
    d = [ctl.step(np.array([c]), np.array([1.0])) for c in (1.0, 0.0, 1.0)]
    assert d[-1].tau_next == 2 and not ctl.ema.P.any() and not ctl.ema.N.any()
    assert ctl.step(np.array([0.2]), np.array([1.0])).C == pytest.approx(0.2, rel=1e-12)


@pytest.mark.parametrize("reset", [True, False])
def test_B1_literal_never_resets_the_pools(reset):
    """Algorithm 1 has no reset: in literal mode the pools carry over a change whatever
    reset_ema_on_tau_change says. theta 0.9, rounds S = c, A = 1 with c = 1, 0, 1, 0.2: C = 1, 0.09/0.19,
    0.181/0.271 (>= C_2: line 12 halves 4 to 2 at round 3), then without a reset 0.1829/0.3439 < C_3, so
    tau stays 2 (a reset would report 0.2)."""
    ctl = GiftController(4, size=1, theta=0.9, mode="literal", reset_ema_on_tau_change=reset)
    d = [ctl.step(np.array([c]), np.array([1.0])) for c in (1.0, 0.0, 1.0, 0.2)]
    assert [x.tau_next for x in d] == [4, 4, 2, 2] and d[2].reason == "literal"
    assert d[3].C == pytest.approx(0.1829 / 0.3439, rel=1e-12)


@pytest.mark.parametrize("phase", ["always", "initial"])
def test_B5_resume_bitwise(phase):
    """60 noisy rounds with every branch live (relaxation, scale_patience, eps_rel, gamma 1.5):
    fresh controllers loaded from state() after ANY round (so every state field is restored at a
    moment where it matters), and from scalars() + pools() at round 25, continue with the same
    tau, reasons and C (== on floats: bitwise) as the uninterrupted run."""
    rng = np.random.default_rng(1)
    drift = rng.normal(size=30)
    rounds = [(U.sum(0), np.abs(U).sum(0)) for U in
              (drift * 0.95 ** r + rng.normal(size=(4, 30)) for r in range(60))]
    kw = dict(size=30, patience=2, warmup=5, relaxation=True, phase=phase, o=3, delta=2,
              scale_patience=True, eps_rel=0.01, gamma=1.5)    # warm-up > patience: last_change matters
    ref, full, snaps = GiftController(17, **kw), [], []
    for S, A in rounds:
        full.append(ref.step(S, A))
        snaps.append(ref.state())
        if len(full) == 25:
            vec, pools = ref.scalars(), ref.pools()
    assert {x.reason for x in full} >= {"stagnation", "relax"}      # not vacuous
    assert set(snaps[24]) >= {"tau", "P_ema", "N_ema", "C_hist", "C_count", "c_min", "r_min", "last_change",
                              "patience_cur", "peaked", "dec_streak", "decreased_once", "round"}
    for k in range(1, 60):
        ctl = GiftController(17, **kw)
        ctl.load_state(snaps[k - 1])
        assert [ctl.step(S, A) for S, A in rounds[k:]] == full[k:], f"resumed after round {k}"
    ctl = GiftController(17, **kw)
    ctl.load_scalars(vec)
    ctl.load_pools(pools)
    assert [ctl.step(S, A) for S, A in rounds[25:]] == full[25:]
    with pytest.raises(ValueError, match="shape"):
        GiftController(17, **{**kw, "o": 4}).load_scalars(vec)


def test_B5_c_min_infinity_survives():
    """Right after a change c_min is +inf; it packs into float64 and restores as inf."""
    ctl = GiftController(4, size=1, theta=0.0, warmup=0, patience=1)
    for c in (0.9, 0.8, 0.8):
        d = ctl.step(np.array([c]), np.array([1.0]))
    assert d.tau_next == 2 and ctl.scalars()[2] == math.inf
    other = GiftController(4, size=1, theta=0.0, warmup=0, patience=1)
    other.load_scalars(ctl.scalars())
    assert other.c_min == math.inf and other.tau == 2


def test_pool_normalize_mean():
    """Cohorts of 1 then 4 clients, theta 0.5, one coordinate: S, A = (1, 1) then (-4, 4). Summed
    pools: P~ = 0.25, N~ = 0.5 (0.5 (-4 - 4)/2) = -2, C = 1.75 / 2.25 = 7/9. Mean pools divide
    round 2 by 4: N~ = -0.5, C = 0.25 / 0.75 = 1/3."""
    for how, count2, want in (("sum", None, 7 / 9), ("mean", 4, 1 / 3)):
        pools = Pools(1, 0.5, pool_normalize=how)
        pools.update([1.0], [1.0], 1)
        assert pools.update([-4.0], [4.0], count2) == pytest.approx(want, rel=1e-15)


def test_controller_rejects_bad_parameters():
    """Each message names the parameter that is wrong."""
    for kw, name in [({"gamma": 1.0}, "gamma"), ({"mode": "fast"}, "mode"), ({"tau_min": 200}, "tau_min"),
                     ({"theta": 1.0}, "theta"), ({"phase": "late"}, "phase"), ({"reduce": "sum"}, "reduce")]:
        with pytest.raises(ValueError, match=name):
            GiftController(100, size=3, **kw)
    with pytest.raises(ValueError, match="count"):
        GiftController(100, size=1, pool_normalize="mean").step([1.0], [1.0])
    with pytest.raises(ValueError, match="shape"):
        GiftController(100, size=2).step([1.0], [1.0])
