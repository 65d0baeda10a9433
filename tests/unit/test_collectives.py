"""The policies' collectives (hpcfl.parallel.comm.Collectives) and the sums' root and reset rules,
on one process: MPI.COMM_SELF, or a stand-in communicator that plays one rank of several.

Written against mutmut's survivors in comm.py (docs/testing.md, "Mutation testing"): every value here
is computed by hand.
"""

import numpy as np
import pytest
from mpi4py import MPI

from hpcfl.errors import ConfigError
from hpcfl.parallel.comm import Collectives, ExactSum, FloatSum, deal, fixed_point_bits, make_sum, owners


class OneOfMany:
    """Rank ``rank`` of a world whose other ranks contribute nothing to a sum and send ``others``
    to an allgather: reductions are then the identity, gathers see every rank's part."""

    def __init__(self, rank, others=()):
        self.rank, self.others, self.sent, self.ops = rank, list(others), [], []

    def Allreduce(self, sendbuf, recvbuf, op):   # noqa: N802  (mpi4py's name)
        assert sendbuf is MPI.IN_PLACE
        self.ops.append(op)

    def allgather(self, obj):
        self.sent.append(obj)
        return self.others[: self.rank] + [obj] + self.others[self.rank:]


# 2**53 + 1 is not a float64: a float sum loses the 1 and the exact one keeps it
BIG = [np.array([2.0 ** 53, 0.5]), np.array([1.0, 0.25]), np.array([-(2.0 ** 53), 0.0])]


def test_sum_is_exact_in_exact_mode_and_plain_float_otherwise():
    exact = Collectives(MPI.COMM_SELF, "exact")
    assert exact.sum("s", BIG, 2, total=3).tolist() == [1.0, 0.75]
    # float: (2**53 + 1) rounds to 2**53 (ties to even), minus 2**53 is 0
    assert Collectives(MPI.COMM_SELF, "float").sum("s", BIG, 2, total=3).tolist() == [0.0, 0.75]
    assert Collectives(MPI.COMM_SELF).sum("s", BIG, 2, total=3).tolist() == [1.0, 0.75]   # exact by default
    assert exact.calls == ["s"]


def test_sum_answers_on_every_rank_not_only_the_root():
    for mode in ("exact", "float"):
        got = Collectives(OneOfMany(rank=1), mode).sum("s", [np.array([1.5, -2.0])], 2, total=2)
        assert got.tolist() == [1.5, -2.0]


def test_float_and_exact_sums_answer_on_the_root_only_unless_root_is_none():
    for make in (FloatSum, ExactSum):
        acc = make(2)
        acc.add(np.array([3.0, 4.0]))
        assert acc.reduce(OneOfMany(rank=1), total=1) is None                 # root 0 by default
        assert acc.reduce(OneOfMany(rank=1), total=1, root=1).tolist() == [3.0, 4.0]
        assert acc.reduce(OneOfMany(rank=1), total=1, root=None).tolist() == [3.0, 4.0]


def test_exact_sum_reset_forgets_the_rows_and_their_magnitude():
    acc = ExactSum(2)
    acc.add(np.array([1.0, 8.0]))
    assert acc.reduce(MPI.COMM_SELF, total=1).tolist() == [1.0, 8.0]
    acc.reset()
    assert acc.count == 0
    # a leftover max |v| of 8 (or any 1.0) would put 2**-70 below the grid's last bit and sum it to 0
    acc.add(np.array([2.0 ** -70, 3.0 * 2.0 ** -80]))
    assert acc.reduce(MPI.COMM_SELF, total=1).tolist() == [2.0 ** -70, 3.0 * 2.0 ** -80]


def test_nan_and_inf_are_refused_with_the_reason():
    with pytest.raises(FloatingPointError, match=r"^a contribution holds NaN or Inf; it cannot be summed$"):
        FloatSum(2).add(np.array([np.inf, 0.0]))
    with pytest.raises(FloatingPointError, match=r"^a contribution holds NaN or Inf; it cannot be summed$"):
        ExactSum(2).add(np.array([0.0, np.nan]))


def test_sum_int_is_an_int64_sum():
    coll = Collectives(MPI.COMM_SELF)
    got = coll.sum_int("n", np.array([3, -4], dtype=np.int32))
    assert got.dtype == np.int64 and got.tolist() == [3, -4]
    assert coll.calls == ["n"]


def test_gather_places_each_ranks_rows_at_their_positions():
    # rank 1 of 3: rank 0 holds position 2, rank 2 holds none (it sends a (0, 0) block)
    comm = OneOfMany(rank=1, others=[(np.array([2]), np.array([[5.0, 6.0]])), (np.array([], np.int64), np.zeros((0, 0)))])
    coll = Collectives(comm)
    got = coll.gather("g", np.array([0, 1]), [1.0, 2.0, 3.0, 4.0], k=3)   # flat values: reshaped to (2, 2)
    assert got.tolist() == [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]
    assert coll.calls == ["g"]
    # what this rank sent: its positions and (m, width) rows
    pos, vals = comm.sent[0]
    assert pos.tolist() == [0, 1] and vals.shape == (2, 2)


def test_gather_from_a_rank_that_holds_nothing():
    comm = OneOfMany(rank=0, others=[(np.array([0, 1]), np.array([[7.0], [8.0]]))])
    got = Collectives(comm).gather("g", np.array([], dtype=np.int64), np.array([]), k=2)
    assert got.tolist() == [[7.0], [8.0]]
    pos, vals = comm.sent[0]
    assert len(pos) == 0 and vals.size == 0
    # no rank holds anything and k = 0: an empty (0, 1) table
    assert Collectives(OneOfMany(rank=0)).gather("g", [], [], k=0).shape == (0, 1)


def test_gather_refuses_a_position_held_twice_or_by_no_rank():
    twice = OneOfMany(rank=1, others=[(np.array([0]), np.array([[1.0]]))])
    with pytest.raises(RuntimeError, match=r"^collective 'g': positions \[0\] were not given by exactly one rank$"):
        Collectives(twice).gather("g", np.array([0]), np.array([[2.0]]), k=1)
    none = OneOfMany(rank=0)
    with pytest.raises(RuntimeError, match=r"positions \[1, 2\] were not given"):
        Collectives(none).gather("g", np.array([0]), np.array([[2.0]]), k=3)


def test_bcast_sends_from_rank_0_by_default():
    coll = Collectives(MPI.COMM_SELF)
    assert coll.bcast("b", {"x": 1}) == {"x": 1}
    assert coll.bcast("c", [2], root=0) == [2]
    assert coll.calls == ["b", "c"]


def test_bcast_passes_the_root_on():
    class Recording:
        def bcast(self, obj, root=0):
            self.root = root
            return obj

    comm = Recording()
    assert Collectives(comm).bcast("b", 5, root=1) == 5 and comm.root == 1


def test_deal_returns_int64_ranks():
    assert deal([3.0, 1.0, 2.0], 2).dtype == np.int64
    assert deal([3.0, 1.0], 1).dtype == np.int64


def test_exact_sum_agrees_on_the_max_exponent_then_sums():
    acc, comm = ExactSum(2), OneOfMany(rank=0)
    acc.add(np.array([1.0, 2.0]))
    acc.reduce(comm, total=1)
    assert comm.ops == [MPI.MAX, MPI.SUM]
    assert acc.exponents().dtype == np.int16 and acc.exponents().tolist() == [1023, 1024]


def test_exact_sum_rounds_to_nearest_on_the_grid():
    # total 3: b = 60; max |v| = 1 (E = 1023): shift = 60 + 1022 - 1023 = 59, unit 2**-59.
    # 1 - 1 + 0.625 units: rint(0.625) = 1 unit, so the sum is 2**-59 (truncation would give 0, a grid
    # one bit finer 2**-60: rint(1.25) = 1 unit of 2**-60)
    acc = ExactSum(1)
    acc.add([1.0])
    acc.add([-1.0])
    acc.add(np.array([[0.625 * 2.0 ** -59]]))        # any shape of one element
    assert acc.reduce(MPI.COMM_SELF, total=3).tolist() == [2.0 ** -59]
    with pytest.raises(ValueError, match=r"^row of shape \(2,\), expected \(1,\)$"):
        acc.add([1.0, 2.0])


def test_fixed_point_bits_for_one_contribution_or_none():
    assert fixed_point_bits(1) == 62 and fixed_point_bits(0) == 62 and fixed_point_bits(2) == 61


def test_make_sum_picks_the_accumulator_of_the_mode_and_place():
    from hpcfl.parallel.gridsum import GridSum
    from hpcfl.parallel.gridsum_torch import TorchFloatSum, TorchGridSum

    assert type(make_sum("exact", 4)) is GridSum and type(make_sum("float", 4)) is FloatSum
    assert type(make_sum("exact", 4, device="cpu")) is TorchGridSum
    assert type(make_sum("float", 4, device="cpu")) is TorchFloatSum


def test_an_unknown_placement_is_refused_with_the_choices():
    with pytest.raises(ConfigError, match=r"runtime.placement = 'spread'; choose 'balanced', 'block' or 'round_robin'$"):
        owners(4, 2, "spread")
