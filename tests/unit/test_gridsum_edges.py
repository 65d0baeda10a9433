"""The exact sum's edges (hpcfl.parallel.gridsum.GridSum): limbs needed exactly at 2**S and 2**2S, the
range's last bit, the grid's clipping, a round abandoned before reduce, two ranks' limbs, and the
protocol's errors. Every expected value is computed by hand in the comments.

Written against mutmut's survivors in gridsum.py (docs/testing.md, "Mutation testing").
"""

import numpy as np
import pytest
from mpi4py import MPI

from hpcfl.parallel import gridsum
from hpcfl.parallel.gridsum import COMPILED_FROM, G_MAX, G_MIN, GridSum, block_starts, limb_bits


class Twin:
    """Rank ``rank`` of two ranks holding the same contributions: in-place SUM doubles, MAX keeps."""

    size = 2

    def __init__(self, rank=0):
        self.rank, self.ops = rank, []

    def Allreduce(self, sendbuf, recvbuf, op):   # noqa: N802  (mpi4py's name)
        assert sendbuf is MPI.IN_PLACE
        self.ops.append(op)
        if op is MPI.SUM:
            recvbuf *= 2
        else:
            assert op is MPI.MAX


def one(value, total):
    """The sum of one contribution [value] on a GridSum of one element, in a first round."""
    g = GridSum(1)
    g.reset(total)
    g.add([value])
    return g.reduce(MPI.COMM_SELF, total)[0], g


def test_spans_must_start_at_zero_and_end_at_the_length():
    with pytest.raises(ValueError, match=r"segments \[\(1, 5\)\] do not tile 0..5"):
        block_starts(5, [(1, 5)])
    with pytest.raises(ValueError, match=r"do not tile 0..5"):
        block_starts(5, [(0, 4)])


def test_limb_bits_for_one_contribution_or_none():
    assert limb_bits(1) == 62 and limb_bits(0) == 62 and limb_bits(2) == 61 and limb_bits(3) == 60


def test_a_value_that_rounds_up_to_two_to_the_s_needs_the_second_limb():
    # total 2**40: S = 22, a first round's grid G = 64 - 3 * 22 = -2 (unit 1/4).
    # v = 2**20 - 1/16 is 2**22 - 1/4 units: |v| < 2**20 = 2**(S + G), so the reach is S, and rint
    # takes it up to 2**22 = 2**S units: lo 0, hi 1. Dropping the hi limb would give 0.
    got, g = one(2.0 ** 20 - 2.0 ** -4, 2 ** 40)
    assert got == 2.0 ** 20 and g.wire == [0, 1, 0]
    # likewise at 2**2S units: v = 2**42 - 1/16 needs the top limb
    got, g = one(2.0 ** 42 - 2.0 ** -4, 2 ** 40)
    assert got == 2.0 ** 42 and g.wire == [0, 0, 1]


def test_the_range_ends_at_two_to_the_64_in_a_first_round(capsys):
    # one contribution: S = 62, G = 64 - 186 = -122; a value below 2**63 fits (reach 3S - 1) ...
    got, _ = one(np.nextafter(2.0 ** 63, 0), 1)
    assert got == np.nextafter(2.0 ** 63, 0)
    assert capsys.readouterr().out == ""
    # ... one below 2**64 reaches 3S: past the three limbs, its block sums to Inf, and the run is told
    got, _ = one(np.nextafter(2.0 ** 64, 0), 1)
    assert got == np.inf
    assert capsys.readouterr().out == (
        "hpcfl: the exact sum's range was exceeded in 1 block(s) from element 0 (values more than 2**130 "
        "times the last round's, or above 2**64 in a first round); their sums are Inf\n")


def test_the_grid_is_clipped_so_that_its_unit_stays_a_normal_float():
    g = GridSum(2, [(0, 1), (1, 2)])
    g.history = np.array([1, 2046], dtype=np.int16)   # last round: max below 2**-1021 and below 2**1024
    g.reset(2 ** 40)                                   # S = 22: predicted G = e - 16
    # block 0: -1021 - 16 = -1037, clipped to G_MIN; block 1: 1024 - 16 = 1008, clipped to G_MAX
    assert g.grid.tolist() == [G_MIN, G_MAX] == [-1000, 1000]
    g.history = np.array([0, 1], dtype=np.int16)      # no history (0) takes the default, 1 a prediction
    g.reset(2 ** 40)
    assert g.grid.tolist() == [64 - 66, G_MIN]


def test_a_round_abandoned_before_reduce_leaves_nothing_in_the_next():
    g = GridSum(1)
    g.reset(2 ** 40)
    g.add([2.0 ** 20 - 2.0 ** -4])     # hi limb 1 (see above)
    g.add([1.0])                       # a later row with no high part must not forget it
    assert g.count == 2
    g.reset(2 ** 40)                   # abandoned: no reduce
    assert g.count == 0
    g.add([2.0 ** 20 - 2.0 ** -4])
    assert g.reduce(MPI.COMM_SELF, 2 ** 40)[0] == 2.0 ** 20


def test_two_ranks_limbs_and_the_root_rule():
    for rank in (0, 1):
        g, comm = GridSum(1), Twin(rank)
        g.reset(2 ** 40)
        g.add([2.0 ** 20 - 2.0 ** -4])
        got = g.reduce(comm, 2 ** 40, root=None)
        assert got.tolist() == [2.0 ** 21] and comm.ops == [MPI.MAX, MPI.SUM, MPI.SUM]   # two limbs crossed
        g.reset(2 ** 40)
        g.add([32.0])                  # the grid now follows the last round: unit 16 (see below)
        comm.ops.clear()
        got = g.reduce(comm, 2 ** 40)                                                         # root 0
        assert got is None if rank == 1 else got.tolist() == [64.0]
        assert comm.ops == [MPI.MAX, MPI.SUM]                                                # one limb


def test_a_grid_history_from_an_earlier_round_carries_over_from_a_second_rank():
    """Two ranks, the other one's big values only: this rank's hi limb is written by the sum over
    ranks, and must be cleared before the next round that needs it again."""

    class Partner:
        size, rank = 2, 0

        def __init__(self, other):
            self.other = other

        def Allreduce(self, sendbuf, recvbuf, op):   # noqa: N802
            if op is MPI.MAX:
                np.maximum(recvbuf, self.other._exponents(), out=recvbuf)
            else:
                recvbuf += next(self.limbs)

    def round_(me, other, mine, theirs):
        other.history = me.history.copy()     # as if it had reduced with us: the same grid
        for g, v in ((me, mine), (other, theirs)):
            g.reset(2 ** 40)
            g.add([v])
        comm = Partner(other)
        comm.limbs = iter([other.lo.copy(), other.hi.copy(), other.top.copy()])
        return me.reduce(comm, 2 ** 40)[0]

    me, other = GridSum(1), GridSum(1)
    big = 2.0 ** 20 - 2.0 ** -4          # lo 0, hi 1 on the grid of unit 1/4
    assert round_(me, other, 0.25, big) == 2.0 ** 20 + 0.25
    # next round: the grid follows the history (max below 2**20: G = 20 - 16 = 4, unit 16);
    # 2**30 is 2**26 units, hi 16: a hi limb left from the last round would add 2**26
    assert round_(me, other, 0.0, 2.0 ** 30) == 2.0 ** 30
    assert me.grid.tolist() == [4]


def test_commit_before_reset_and_mismatched_calls_are_refused():
    g = GridSum(4)
    with pytest.raises(RuntimeError, match=r"^GridSum.reset\(total\) must start the round$"):
        g.add([1.0, 2.0, 3.0, 4.0])
    g.reset(2)
    with pytest.raises(ValueError, match=r"^row of shape \(3,\), expected \(4,\)$"):
        g.add([1.0, 2.0, 3.0])
    g.add(np.array([[1.0], [2.0], [3.0], [4.0]]))          # any shape of 4 elements: flattened
    with pytest.raises(ValueError, match=r"^reduce\(total=3\) after reset\(total=2\)$"):
        g.reduce(MPI.COMM_SELF, 3)
    assert g.reduce(MPI.COMM_SELF, 2).tolist() == [1.0, 2.0, 3.0, 4.0]


def test_the_checkpointed_grid_is_int16_blocks_whatever_it_is_given():
    g = GridSum(64)                                      # blocks of 16: 4
    g.reset(1)
    g.add(np.arange(64.0))
    g.reduce(MPI.COMM_SELF, 1)
    (grid,) = g.state()
    # max |v| per block 15, 31, 47, 63: below 2**4, 2**5, 2**6, 2**6 -> biased 1026, 1027, 1028, 1028
    assert grid.get().dtype == np.int16 and grid.get().tolist() == [1026, 1027, 1028, 1028]
    grid.set([[1030], [1031], [1032], [1033]])           # a (4, 1) list of ints, as a reader may give
    assert g.history.dtype == np.int16 and g.history.tolist() == [1030, 1031, 1032, 1033]


def test_a_fresh_sum_has_counted_nothing_and_holds_an_int16_grid():
    g = GridSum(64)
    assert g.count == 0
    assert g.state()[0].get().dtype == np.int16 and g.state()[0].get().tolist() == [0, 0, 0, 0]


def test_short_rows_use_numpy_and_long_rows_the_compiled_kernels(monkeypatch):
    monkeypatch.setattr(gridsum, "_KERNEL", [])       # choose afresh, not from an earlier test's cache
    numpy_pair = (gridsum._deposit_numpy, gridsum._convert_numpy)
    assert gridsum.kernels(COMPILED_FROM - 1) == numpy_pair
    assert GridSum(10)._deposit is gridsum._deposit_numpy
    compiled = gridsum.kernels(COMPILED_FROM)
    assert compiled == gridsum.kernels()
    if gridsum.numba_or_none() is not None:
        from hpcfl.parallel import gridsum_kernels
        assert compiled == (gridsum_kernels.deposit, gridsum_kernels.convert)
    else:
        assert compiled == numpy_pair


def test_the_numpy_deposit_at_one_unit_of_the_high_limb_and_past_the_cap():
    # S = 20, unit 2**-40: 2**-20 is 2**20 units = hi 1 exactly (max |h| = 1.0 must write the hi limb);
    # 2**30 is 2**70 units, clamped to 2**59 = top 2**19
    row = np.array([2.0 ** -20, 2.0 ** 30, -(2.0 ** 30)])
    lo, hi, top = (np.zeros(3, dtype=np.int64) for _ in range(3))
    hmax = gridsum._deposit_numpy(row, np.array([0, 1, 2, 3]), np.full(3, 2.0 ** 40), 20, lo, hi, top, np.zeros(3))
    assert hmax == 2.0 ** 39
    assert (lo.tolist(), hi.tolist(), top.tolist()) == ([0, 0, 0], [1, 0, 0], [0, 2 ** 19, -(2 ** 19)])
    lo, hi, top = (np.zeros(1, dtype=np.int64) for _ in range(3))
    assert gridsum._deposit_numpy(row[:1], np.array([0, 1]), np.full(1, 2.0 ** 40), 20, lo, hi, top,
                                  np.zeros(1)) == 1.0
    assert (lo.tolist(), hi.tolist(), top.tolist()) == ([0], [1], [0])
