"""Exact, order-independent reduction (hpcfl.comm.ExactSum) and client placement."""

from fractions import Fraction

import numpy as np
import pytest
from mpi4py import MPI

from hpcfl.comm import ExactSum, FloatSum, dequantize, fixed_point_bits, owners
from hpcfl.errors import ConfigError

ROWS = np.array(
    [
        [1e10, 1e-10, -3.0, 0.0, 0.1, -7.5],
        [-1e10, 2e-10, 5.0, 0.0, 0.2, 2.5],
        [0.5, -1e-10, 1e-3, 0.0, 0.3, 5.0],
    ]
)


def exact(rows):
    """Exact rational column sums, rounded once to float64."""
    return np.array([float(sum(Fraction(v) for v in col)) for col in rows.T])


def virtual_ranks(rows, groups, total):
    """Emulate an MPI reduction: MAX of exponents, then integer SUM, over rank groups."""
    accs = []
    for g in groups:
        a = ExactSum(rows.shape[1])
        for i in g:
            a.add(rows[i])
        accs.append(a)
    exp = np.max([a.exponents() for a in accs], axis=0)
    q = [a.quantized_sum(exp, total) for a in accs]
    return dequantize(sum(qs for qs, _ in q), q[0][1])


def test_hand_computed_sums_with_mixed_magnitudes_signs_and_zeros():
    acc = ExactSum(6)
    for r in ROWS:
        acc.add(r)
    got = acc.reduce(MPI.COMM_SELF, total=3)
    # Column by column, by hand: 1e10 - 1e10 + 0.5; 1e-10 + 2e-10 - 1e-10; -3 + 5 + 0.001; 0; 0.1+0.2+0.3; -7.5+2.5+5.
    assert got[0] == 0.5
    assert got[3] == 0.0 and not np.signbit(got[3])
    assert got[5] == 0.0
    assert got[2] == 2.001
    # 0.1 + 0.2 + 0.3 rounds to 0.6000000000000001 in float64 left to right; the exact sum is 0.6.
    assert (0.1 + 0.2) + 0.3 != 0.6 and got[4] == 0.6
    # 2e-10: within b = 60 bits of the element's own max (2e-10), i.e. exact to float64 here.
    assert got[1] == exact(ROWS)[1]


def test_error_bound_relative_to_each_elements_own_max():
    rng = np.random.default_rng(0)
    scales = 10.0 ** rng.integers(-30, 30, size=200)
    rows = rng.standard_normal((16, 200)) * scales
    acc = ExactSum(200)
    for r in rows:
        acc.add(r)
    got = acc.reduce(MPI.COMM_SELF, total=16)
    b = fixed_point_bits(16)
    assert b == 58
    _, e = np.frexp(np.abs(rows).max(axis=0))
    # Quantisation: K half-steps of the grid 2**(e-b). Rounding: half an ulp for our
    # result and half an ulp for the reference, which is itself rounded to float64.
    bound = 16 * np.ldexp(1.0, e - b - 1) + np.abs(exact(rows)) * 2.0**-52
    assert np.all(np.abs(got - exact(rows)) <= bound)


@pytest.mark.parametrize("groups", [[[0, 1, 2]], [[0], [1, 2]], [[2], [0], [1]], [[1, 0], [2]], [[2, 1, 0]]])
def test_bitwise_identical_for_any_split_and_order(groups):
    ref = virtual_ranks(ROWS, [[0, 1, 2]], 3)
    got = virtual_ranks(ROWS, groups, 3)
    assert got.tobytes() == ref.tobytes()


def test_random_splits_are_bitwise_identical_while_float_sums_are_not():
    rng = np.random.default_rng(1)
    rows = rng.standard_normal((40, 1000)) * 10.0 ** rng.integers(-8, 8, size=(40, 1000))
    ref = virtual_ranks(rows, [list(range(40))], 40)
    float_results = set()
    for trial in range(5):
        perm = rng.permutation(40)
        cut = sorted(rng.choice(np.arange(1, 40), size=2, replace=False))
        groups = [list(perm[: cut[0]]), list(perm[cut[0] : cut[1]]), list(perm[cut[1] :])]
        assert virtual_ranks(rows, groups, 40).tobytes() == ref.tobytes()
        float_results.add(sum(rows[perm]).tobytes())
    assert len(float_results) > 1  # the plain float sum does depend on order


def test_nan_contribution_is_refused():
    acc = ExactSum(2)
    with pytest.raises(FloatingPointError):
        acc.add(np.array([1.0, np.nan]))
    with pytest.raises(FloatingPointError):
        FloatSum(2).add(np.array([np.inf, 0.0]))


def test_float_sum_matches_plain_sum():
    acc = FloatSum(6)
    for r in ROWS:
        acc.add(r)
    got = acc.reduce(MPI.COMM_SELF, total=3)
    assert np.array_equal(got, (ROWS[0] + ROWS[1]) + ROWS[2])


def test_owners_blocks_and_round_robin():
    assert owners(7, 3).tolist() == [0, 0, 0, 1, 1, 2, 2]
    assert owners(7, 3, "round_robin").tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert owners(4, 4).tolist() == [0, 1, 2, 3]
    with pytest.raises(ConfigError, match="data.num_clients = 3"):
        owners(3, 4)
