"""GIFT's decisions depend on C, not on the round number: the same policy, fed pools whose C keeps
falling fast, never halves tau, and halves it once C stalls.

C is injected through the policy's own inputs: the reduced segments ``gift_sum`` (S = sum_i u_i)
and ``gift_abs`` (A = sum_i |u_i|) of one coordinate, with A = 1 every round. The pools are EMAs
from zero (theta = 0.9), so C_r = Stilde_r / (1 - theta^r); S_r is chosen as
(Stilde_r - theta Stilde_{r-1}) / (1 - theta) with Stilde_r = c_r (1 - theta^r), which makes the
policy's C exactly the target sequence c_r (checked to 1e-12).

Targets over 120 rounds, the first 30 shared: c_r = 0.6 * 0.97^r (3 % a round: a tenth of itself
in under four rounds, so the stagnation rule's new-minimum test, eps_rel = 0.1 within patience 10,
keeps passing), then either the same fall (``falling``) or a flat C (``stalled``: 0.01 % up a
round), or a slow fall
of 0.5 % a round (``creeping``: a new minimum needs 10 %, about 21 rounds, longer than patience).
"""

import numpy as np
import pytest

from hpcfl.algorithms.gift import GiftOptions, GiftSteps

THETA, ROUNDS, SPLIT, TAU0 = 0.9, 120, 30, 50


def targets(kind: str) -> np.ndarray:
    r = np.arange(1, ROUNDS + 1)
    c = 0.6 * 0.97 ** r
    if kind == "stalled":          # flat, 0.01 % up a round so that C_r >= C_{r-1} survives rounding
        c[SPLIT:] = c[SPLIT - 1] * 1.0001 ** (r[SPLIT:] - SPLIT + 1)
    elif kind == "creeping":
        c[SPLIT:] = c[SPLIT - 1] * 0.995 ** (r[SPLIT:] - SPLIT)
    return c


def drive(kind: str, **opts) -> tuple[list[int], np.ndarray]:
    """tau_next and C of each round when the default policy (plus ``opts``) sees ``targets(kind)``."""
    policy = GiftSteps(GiftOptions(**opts), TAU0, num_params=1, own_sum=True)
    c = targets(kind)
    tilde = c * (1 - THETA ** np.arange(1, ROUNDS + 1))
    prev, taus, got = 0.0, [], []
    for t in tilde:
        s = (t - THETA * prev) / (1 - THETA)
        prev = t
        tau, _ = policy.decide(None, {"gift_sum": np.array([s]), "gift_abs": np.array([1.0])},
                               {"weight": 1.0, "count": 1.0})
        taus.append(tau)
        got.append(policy.C)
    r = first_change(taus) or ROUNDS    # the stagnation mode zeroes the pools at a change: C is ours up to it
    np.testing.assert_allclose(got[:r], c[:r], rtol=1e-12)
    return taus, np.array(got)


def first_change(taus) -> int | None:
    """The 1-based round after which tau first left tau0, or None."""
    moved = [r for r, t in enumerate(taus, 1) if t != TAU0]
    return moved[0] if moved else None


def test_fast_falling_C_never_halves_tau_in_the_stagnation_mode():
    taus, _ = drive("falling")
    assert taus == [TAU0] * ROUNDS


def test_stalled_C_halves_tau_after_patience():
    """The last new minimum (10 % below the previous one) is at most round 30: the halving comes
    patience = 10 rounds after it, within rounds 31-40, to 25."""
    taus, _ = drive("stalled")
    r = first_change(taus)
    assert r is not None and SPLIT < r <= SPLIT + 10
    assert taus[r - 1] == TAU0 // 2
    assert taus[: r - 1] == [TAU0] * (r - 1)


def test_creeping_C_halves_in_hpcfl_rule_but_not_in_algorithm_1():
    """A C still falling 0.5 % a round: hpcfl's stagnation rule halves tau (its own choice, documented),
    Algorithm 1 as printed (literal, C_r >= C_{r-1}) never does, and with relaxation on it raises tau."""
    taus, _ = drive("creeping")
    assert first_change(taus) is not None and taus[first_change(taus) - 1] == TAU0 // 2
    literal, _ = drive("creeping", mode="literal")
    assert literal == [TAU0] * ROUNDS
    relaxed, _ = drive("creeping", mode="literal", relax=True)
    assert relaxed[-1] > TAU0 and min(relaxed) == TAU0


@pytest.mark.parametrize("kind,halves", [("falling", False), ("stalled", True)])
def test_literal_mode_follows_C_too(kind, halves):
    """Algorithm 1 halves at the first round with C_r >= C_{r-1} (round 31 of ``stalled``), never under
    ``falling``."""
    taus, _ = drive(kind, mode="literal")
    assert (first_change(taus) == SPLIT + 1) if halves else taus == [TAU0] * ROUNDS
