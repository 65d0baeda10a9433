"""The engine's exact reduction (hpcfl.parallel.gridsum.GridSum): values, order independence, limbs, state."""

from fractions import Fraction

import numpy as np
import pytest
from mpi4py import MPI

from hpcfl.parallel import gridsum
from hpcfl.parallel.gridsum import BLOCK, DEFAULT_TOP, HEADROOM, GridSum, block_starts, limb_bits

ROWS = np.array(
    [
        [1e10, 1e-10, -3.0, 0.0, 0.1, -7.5],
        [-1e10, 2e-10, 5.0, 0.0, 0.2, 2.5],
        [0.5, -1e-10, 1e-3, 0.0, 0.3, 5.0],
    ]
)


def element_grid(acc):
    return np.repeat(acc.grid, np.diff(acc.starts))


def on_grid(rows, acc):
    """Exact reference: each value rounded half-to-even to 2**G of its block, summed as rationals, one rounding."""
    out = []
    grid = element_grid(acc)
    for j, col in enumerate(np.asarray(rows).T):
        unit = Fraction(2) ** int(grid[j])
        q = [round(Fraction(v) / unit) for v in col]      # Python's round() of a Fraction is half-to-even
        out.append(float(sum(q) * unit))
    return np.array(out)


def summed(acc, rows, total=None):
    acc.reset(len(rows) if total is None else total)
    for r in rows:
        acc.add(r)
    return acc.reduce(MPI.COMM_SELF, total=len(rows) if total is None else total)


def test_first_round_default_grid_hand_values():
    acc = GridSum(6)
    got = summed(acc, ROWS)
    s = limb_bits(3)
    assert s == 60 and acc.grid[0] == DEFAULT_TOP - 3 * s == -116
    assert got[0] == 0.5                        # 1e10 - 1e10 + 0.5, all on the 2**-116 grid
    assert got[3] == 0.0 and not np.signbit(got[3])
    assert got[5] == 0.0
    assert got[2] == 2.001
    assert (0.1 + 0.2) + 0.3 != 0.6 and got[4] == 0.6   # one rounding of the exact sum
    assert got.tobytes() == on_grid(ROWS, acc).tobytes()
    assert acc.wire == [0, 0, 1]                # 1e10 * 2**116 ~ 2**149 is past two limbs (2**120)


def test_blocks_follow_segments_and_short_segments_get_one_grid_per_element():
    assert block_starts(40).tolist() == list(range(41))
    assert block_starts(70).tolist() == [0, 16, 32, 48, 64, 70]
    assert block_starts(75, [(0, 70), (70, 75)]).tolist() == [0, 16, 32, 48, 64, 70, 71, 72, 73, 74, 75]
    with pytest.raises(ValueError, match="do not tile"):
        block_starts(75, [(0, 70), (71, 75)])


def test_a_segment_rounds_the_same_whatever_follows_it():
    rng = np.random.default_rng(7)
    rounds = [rng.standard_normal((3, 70)) for _ in range(3)]
    extra = [rng.standard_normal((3, 5)) * 1e6 for _ in range(3)]
    alone, joined = GridSum(70), GridSum(75, [(0, 70), (70, 75)])
    for r, e in zip(rounds, extra):
        a = summed(alone, r)
        b = summed(joined, np.hstack([r, e]))
        assert a.tobytes() == b[:70].tobytes()


def test_second_round_grid_comes_from_the_first_rounds_block_maxima():
    acc = GridSum(4 * BLOCK)
    first = np.zeros((2, 4 * BLOCK))
    first[0, 3], first[1, BLOCK + 1] = 3.0, -0.25      # block 0 max 3 < 2**2; block 1 max 0.25 < 2**-1
    first[0, 2 * BLOCK:] = 1.0
    summed(acc, first)
    rows = np.random.default_rng(0).standard_normal((2, 4 * BLOCK)) * np.repeat([1.0, 0.1, 1.0, 1.0], BLOCK)
    got = summed(acc, rows)
    s = limb_bits(2)                                   # 61
    assert list(acc.grid[:2]) == [2 - (s - HEADROOM), -1 - (s - HEADROOM)] == [-53, -56]
    assert got.tobytes() == on_grid(rows, acc).tobytes()
    assert acc.wire[0] == 1                            # within 2**6 of last round: one limb on the wire


def test_all_zero_block_keeps_the_default_grid():
    acc = GridSum(4 * BLOCK)
    rows = np.zeros((1, 4 * BLOCK))
    rows[0, :BLOCK] = 1.0
    summed(acc, rows)
    summed(acc, rows)
    assert acc.grid[1] == DEFAULT_TOP - 3 * limb_bits(1)
    assert acc.grid[0] == 1 - (limb_bits(1) - HEADROOM)


def rounds_in_groups(rows_by_round, groups):
    """Emulate ranks: each group deposits its rows; MAX of block exponents and SUM of limbs, as reduce() does."""
    length = rows_by_round[0].shape[1]
    accs = [GridSum(length) for _ in groups]
    results = []
    for rows in rows_by_round:
        for a, g in zip(accs, groups):
            a.reset(len(rows))
            for i in g:
                a.add(rows[i])
        exps = np.max([(a.bmax.view(np.uint64) >> np.uint64(52)) for a in accs], axis=0)
        lo, hi, top = sum(a.lo for a in accs), sum(a.hi for a in accs), sum(a.top for a in accs)
        for a in accs:      # every "rank" leaves with the same sums and history
            a.bmax[:] = np.where(exps > 0, np.ldexp(1.0, exps.astype(np.int64) - 1023), 0.0)
            a.lo[:], a.hi[:], a.top[:] = lo, hi, top
        results.append(accs[0]._finish_local())
        for a in accs[1:]:
            a._finish_local()
    return results


def test_any_grouping_and_order_gives_the_same_bits_over_rounds():
    rng = np.random.default_rng(1)
    length = 203                                        # a short last block
    scales = 10.0 ** rng.integers(-12, 12, size=length)
    rounds = [rng.standard_normal((9, length)) * scales * growth for growth in (1.0, 3.0, 500.0, 1e-4)]
    one = rounds_in_groups(rounds, [list(range(9))])
    for groups in ([[0, 1, 2, 3, 4, 5, 6, 7, 8]], [[8, 7, 6], [5, 4, 3], [2, 1, 0]], [[3], [0, 8, 1, 5], [7, 2, 6, 4]]):
        got = rounds_in_groups(rounds, groups)
        assert all(a.tobytes() == b.tobytes() for a, b in zip(one, got))


def test_growth_past_the_headroom_goes_through_the_high_limb_exactly():
    rng = np.random.default_rng(2)
    acc = GridSum(40)
    summed(acc, rng.standard_normal((4, 40)))
    assert acc.wire == [0, 1, 0] and acc.hi_dirty   # the first round: default grid, 2 limbs for values ~1
    summed(acc, rng.standard_normal((4, 40)))         # same scale: low limb only
    assert acc.wire == [1, 1, 0]
    big = rng.standard_normal((4, 40)) * 2.0 ** 20    # 2**20 > 2**HEADROOM growth
    got = summed(acc, big)
    assert acc.wire == [1, 2, 0]
    np.testing.assert_array_equal(got, on_grid(big, acc))


def test_error_bound_relative_to_the_blocks_last_maximum():
    rng = np.random.default_rng(3)
    length = 32 * BLOCK
    scales = np.repeat(10.0 ** rng.integers(-15, 15, size=32), BLOCK)   # one scale per block of 16
    acc = GridSum(length)
    summed(acc, rng.standard_normal((16, length)) * scales)
    rows = rng.standard_normal((16, length)) * scales
    got = summed(acc, rows)
    exact = np.array([float(sum(Fraction(v) for v in col)) for col in rows.T])
    unit = np.ldexp(1.0, element_grid(acc))
    # each of the 16 values is off by at most half a unit, plus the final rounding
    assert np.all(np.abs(got - exact) <= 16 * unit / 2 + np.spacing(np.abs(exact)))
    assert np.all(unit <= np.repeat(np.max(np.abs(rows).reshape(32, BLOCK, 16), axis=(1, 2)), BLOCK) * 2.0 ** -40)


def test_nan_inf_are_refused_with_the_element_and_out_of_range_blocks_sum_to_inf(capsys):
    acc = GridSum(20)
    acc.reset(2)
    with pytest.raises(FloatingPointError, match=r"NaN or Inf \(element 7\)"):
        row = np.zeros(20)
        row[7] = np.inf
        acc.add(row)
    summed(acc, np.ones((2, 20)))
    rows = np.ones((2, 20))
    rows[1, 13] = 2.0 ** 130             # 2**130 > 2**(2 * 61 + 6) times last round's 1
    got = summed(acc, rows)
    assert np.isinf(got[13]) and np.all(got[np.arange(20) != 13] == 2.0)
    assert "range was exceeded in 1 block(s) from element 13" in capsys.readouterr().out


def test_memory_does_not_grow_with_contributions_and_the_high_limb_stays_unmapped():
    acc = GridSum(1000)
    summed(acc, np.ones((1, 1000)))
    size = sum(v.nbytes for v in vars(acc).values() if isinstance(v, np.ndarray))
    rows = np.random.default_rng(4).uniform(0.5, 1.0, size=(200, 1000))
    summed(acc, rows, total=200)
    assert sum(v.nbytes for v in vars(acc).values() if isinstance(v, np.ndarray)) == size
    summed(acc, rows, total=200)
    assert acc.hi_dirty is False and not acc.hi.any()


def test_checkpointed_grid_restores_the_rounding():
    rng = np.random.default_rng(5)
    rows = [rng.standard_normal((3, 50)) * 10.0 ** k for k in (0, 1, 2)]
    straight = GridSum(50)
    outs = [summed(straight, r) for r in rows]
    first = GridSum(50)
    summed(first, rows[0])
    (item,) = first.state()
    assert item.name == "exact_grid"
    resumed = GridSum(50)
    resumed.state()[0].set(np.array(item.get()))
    assert summed(resumed, rows[1]).tobytes() == outs[1].tobytes()
    assert summed(resumed, rows[2]).tobytes() == outs[2].tobytes()
    with pytest.raises(ValueError, match="model or algorithm changed"):
        GridSum(80).state()[0].set(item.get())


@pytest.mark.parametrize("history", ["none", "predicted"])
def test_compiled_kernels_equal_the_numpy_reference_bitwise(history):
    deposit, convert = gridsum.kernels()
    if deposit is gridsum._deposit_numpy:
        pytest.skip("numba is not installed: the numpy reference is the only path")
    rng = np.random.default_rng(6)
    length = 10 * BLOCK + 5   # the last block has 5 elements
    a, b = GridSum(length), GridSum(length)
    if history == "predicted":
        a.history[:] = b.history[:] = (1023 + rng.integers(-30, 30, a.nblocks)).astype(np.int16)
    a.reset(7)
    b.reset(7)
    for _ in range(7):
        row = rng.standard_normal(length) * 10.0 ** rng.integers(-9, 9, length)
        row[rng.integers(0, length, 10)] = 0.0
        np.copyto(a.row, row)
        ha = deposit(a.row, a.starts, a.scale, a.s_bits, a.lo, a.hi, a.top, a.bmax)
        hb = gridsum._deposit_numpy(row, b.starts, b.scale, b.s_bits, b.lo, b.hi, b.top, b.bmax)
        assert ha == hb
    for name in ("lo", "hi", "top", "bmax"):
        assert getattr(a, name).tobytes() == getattr(b, name).tobytes(), name
    assert a.top.any() == (history == "none")
    unit = np.ldexp(1.0, a.grid)
    for limbs in (1, 2, 3):
        out_a, out_b = np.empty(length), np.empty(length)
        convert(a.lo, a.hi, a.top, limbs, a.s_bits, a.starts, unit, out_a)
        gridsum._convert_numpy(a.lo, a.hi, a.top, limbs, a.s_bits, a.starts, unit, out_b)
        assert out_a.tobytes() == out_b.tobytes()


def test_conversion_rounds_the_exact_integer_once():
    """Limbs anywhere in int64 (before carries): the compiled conversion equals Python's exact int -> float."""
    deposit, convert = gridsum.kernels()
    rng = np.random.default_rng(8)
    n, starts, unit = 2000, np.arange(2001, dtype=np.int64), np.ones(2000)
    for s_bits in (40, 47, 53, 60):
        lo, hi, top = (rng.integers(-2**62, 2**62, n) >> rng.integers(0, 60, n) for _ in range(3))
        out, ref = np.empty(n), np.empty(n)
        for limbs in (2, 3):
            convert(lo, hi, top, limbs, s_bits, starts, unit, out)
            gridsum._convert_numpy(lo, hi, top, limbs, s_bits, starts, unit, ref)
            assert out.tobytes() == ref.tobytes()
    exact = [float(int(a) + (int(b) << 53)) for a, b in zip(lo, hi)]
    gridsum._convert_numpy(lo, hi, top, 2, 53, starts, unit, ref)
    assert ref.tolist() == exact


def test_numpy_conversion_of_mixed_rows_is_pythons_exact_int():
    """Rows where some elements use only the low limb (numpy's int64 -> float64, lo beyond 2**53
    included) and others the higher limbs (Python ints): each is the exact integer rounded once."""
    rng = np.random.default_rng(9)
    n, starts, unit = 3000, np.arange(3001, dtype=np.int64), np.ones(3000)
    lo, hi, top = (rng.integers(-2**62, 2**62, n) >> rng.integers(0, 60, n) for _ in range(3))
    low_only = rng.random(n) < 0.7
    hi[low_only], top[low_only] = 0, 0
    deposit, convert = gridsum.kernels()   # the compiled form where numba is there, else numpy again
    for limbs in (2, 3):
        t = top if limbs > 2 else np.zeros_like(top)
        exact = [float(int(a) + (int(b) << 47) + (int(c) << 94)) for a, b, c in zip(lo, hi, t)]
        for conv in (gridsum._convert_numpy, convert):
            out = np.empty(n)
            conv(lo, hi, top, limbs, 47, starts, unit, out)
            assert out.tolist() == exact
    assert (np.abs(lo[low_only]) > 2**53).any()   # the rounding of the low limb itself was exercised


def test_limbs_needed_at_the_boundary_where_rint_rounds_up_to_the_next_limb():
    # K = 1024 contributions: S = 52, the default grid G = 64 - 3 * 52 = -92. A block whose
    # largest exponent gives reach = E - 1022 - G = S holds |v| * 2**-G < 2**52, and from
    # S <= 52 on that product has a half-unit fraction, so rint can give exactly 2**52 = 2**S:
    # one unit of the high limb. reach == S therefore needs 2 limbs, reach == 2S needs 3.
    acc = GridSum(1)
    acc.reset(1024)
    assert acc.s_bits == 52 and acc.grid[0] == -92
    exps = lambda reach: np.array([reach + 1022 - 92], dtype=np.int16)   # noqa: E731
    assert acc._limbs_needed(exps(51)) == 1
    assert acc._limbs_needed(exps(52)) == 2        # reach == S: 2**S is reachable
    assert acc._limbs_needed(exps(103)) == 2
    assert acc._limbs_needed(exps(104)) == 3       # reach == 2S
    assert acc._limbs_needed(np.array([0], dtype=np.int16)) == 1


def test_exact_sum_at_the_limb_boundary_with_1024_contributions():
    # v = 2**-40 - 2**-93 (the float below 2**-40): v * 2**92 = 2**52 - 1/2, a tie that rint
    # rounds to the even 2**52 = 2**S, so each q is 0 in the low limb and 1 in the high limb.
    # The exact sum on the grid is 1024 * 2**52 * 2**-92 = 2**-30; a reduction that sent only
    # the low limb would return 0.
    v = np.nextafter(2.0 ** -40, 0.0)
    assert v == 2.0 ** -40 - 2.0 ** -93
    acc = GridSum(1)
    got = summed(acc, np.full((1024, 1), v))
    assert acc.s_bits == 52
    assert got[0] == 2.0 ** -30
    assert acc.wire == [0, 1, 0]
