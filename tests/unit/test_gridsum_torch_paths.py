"""The device form's paths that one CPU process does not take by itself (hpcfl.parallel.gridsum_torch):
the limbs summed over more than one rank, the root rule, the fused deposit and its check, all on CPU
tensors with a stand-in communicator.

Written against mutmut's survivors in gridsum_torch.py (docs/testing.md, "Mutation testing").
"""

import warnings

import numpy as np
import pytest
import torch
from mpi4py import MPI

from hpcfl.parallel import gridsum_torch
from hpcfl.parallel.gridsum import GridSum
from hpcfl.parallel.gridsum_torch import (COMPILE_FROM, TorchFloatSum, TorchGridSum, _deposit_fusable,
                                          checked_fusion, deposit)

SPANS = [(0, 40), (40, 43)]
L = 43


class Twin:
    """Rank ``rank`` of two ranks that hold the same contributions: an in-place SUM doubles, MAX keeps."""

    size = 2

    def __init__(self, rank=0):
        self.rank, self.ops = rank, []

    def Allreduce(self, sendbuf, recvbuf, op):   # noqa: N802  (mpi4py's name)
        assert sendbuf is MPI.IN_PLACE and isinstance(recvbuf, np.ndarray)
        self.ops.append(op)
        if op is MPI.SUM:
            recvbuf *= 2
        else:
            assert op is MPI.MAX


def rows(seed=0, n=3):
    """Rows over 30 decades with an element of 2**60 (a first round's grid needs all three limbs for it)."""
    rng = np.random.default_rng(seed)
    out = rng.standard_normal((n, L)) * 10.0 ** rng.integers(-15, 15, L)
    out[1, 3] = 2.0 ** 60
    return out


def test_limbs_summed_over_two_ranks_equal_the_host_sum_of_both_ranks_rows():
    rs = rows()
    host = GridSum(L, SPANS)
    host.reset(6)
    for r in np.concatenate([rs, rs]):
        host.add(r)
    want = host.reduce(MPI.COMM_SELF, 6)
    for device_rank in (0, 1):
        dev, comm = TorchGridSum(L, SPANS, "cpu"), Twin(device_rank)
        dev.reset(6)
        for r in rs:
            dev.add(torch.from_numpy(r))
        got = dev.reduce(comm, 6, root=None)
        assert got.numpy().tobytes() == want.tobytes()
        assert dev.wire == host.wire == [0, 0, 1]          # all three limbs crossed
        assert comm.ops == [MPI.MAX, MPI.SUM, MPI.SUM, MPI.SUM]
    assert want[3] == 2.0 ** 61


def test_device_sums_answer_on_the_root_only_unless_root_is_none():
    for make in (lambda: TorchGridSum(L, SPANS, "cpu"), lambda: TorchFloatSum(L, "cpu")):
        acc = make()
        acc.reset(2)
        acc.add(torch.ones(L))
        assert acc.reduce(Twin(rank=1), 2) is None                 # root 0 by default
        acc.reset(2)
        acc.add(torch.ones(L))
        assert acc.reduce(Twin(rank=1), 2, root=1).tolist() == [2.0] * L


def test_float_device_sum_over_two_ranks_and_its_refusal():
    acc = TorchFloatSum(3, "cpu")
    acc.add(torch.tensor([1.5, -2.0, 0.25]))
    comm = Twin()
    assert acc.reduce(comm, 2, root=None).tolist() == [3.0, -4.0, 0.5]
    assert comm.ops == [MPI.SUM]
    assert acc.reduce(MPI.COMM_SELF, 1).tolist() == [3.0, -4.0, 0.5]   # one rank: no collective, as it was
    acc.add(np.array([np.nan, 0, 0]))
    with pytest.raises(FloatingPointError, match=r"^a contribution holds NaN or Inf; it cannot be summed$"):
        acc.reduce(MPI.COMM_SELF, 1)


def test_the_default_device_is_the_cpu_and_no_fusion_is_tried_there():
    assert TorchGridSum(8).device == torch.device("cpu") and TorchFloatSum(8).device == torch.device("cpu")
    assert TorchGridSum(8).row.device.type == "cpu"
    # the fused deposit is for CUDA rows of COMPILE_FROM or more; a CPU row of that length folds plainly
    assert TorchGridSum(COMPILE_FROM, device="cpu")._try_fuse is False
    assert TorchGridSum(8, device="cpu")._try_fuse is False


def limbs(n):
    return [torch.zeros(n, dtype=torch.int64) for _ in range(3)] + [torch.zeros(n, dtype=torch.float64)]


def three_limb_row(n=64):
    """A row whose grid units (2**-40) need all three 20-bit limbs, with one element past the cap."""
    rng = np.random.default_rng(7)
    row = torch.from_numpy(rng.standard_normal(n) * 1e3)
    row[5] = 2.0 ** 30     # 2**70 units, past 2**(3 * 20 - 1): clamped
    row[6] = -(2.0 ** 30)
    return row, torch.full((n,), 2.0 ** 40, dtype=torch.float64), 20


def test_the_fusable_deposit_gives_the_plain_deposits_limbs_in_all_three_limbs():
    row, scale, s = three_limb_row()
    plain, fused = limbs(64), limbs(64)
    deposit(row, scale, s, *plain, torch.empty(64, dtype=torch.float64), torch.empty(64, dtype=torch.float64))
    _deposit_fusable(row, scale, 2.0 ** s, 2.0 ** -s, 2.0 ** (3 * s - 1), *fused)
    for a, b in zip(plain, fused):
        assert torch.equal(a, b)
    lo, hi, top, _ = plain
    assert (hi != 0).sum() > 50 and (top != 0).sum() > 50
    # the clamped element: q = 2**59 = top 2**19, hi 0, lo 0 (and its negative)
    assert (int(lo[5]), int(hi[5]), int(top[5])) == (0, 0, 2 ** 19)
    assert (int(lo[6]), int(hi[6]), int(top[6])) == (0, 0, -(2 ** 19))


def test_checked_fusion_keeps_a_fusion_that_agrees_in_all_three_limbs_and_says_why_it_refuses():
    row, scale, s = three_limb_row()
    after = limbs(64)
    deposit(row, scale, s, *after, torch.empty(64, dtype=torch.float64), torch.empty(64, dtype=torch.float64))
    assert checked_fusion(lambda: _deposit_fusable, row, scale, s, limbs(64), tuple(after)) is _deposit_fusable

    def fails_silently():
        raise RuntimeError()

    cases = [(lambda: (lambda *a: None), "it gave other limbs than the tensor-by-tensor form"),
             (fails_silently, "it could not be compiled (RuntimeError: )")]
    for make, why in cases:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            assert checked_fusion(make, row, scale, s, limbs(64), tuple(after)) is None
        assert str(seen[0].message) == (f"hpcfl: the fused exact-sum deposit is not used: {why}; the tensor-by-tensor "
                                        f"form (same bits, slower) is. HPCFL_NO_COMPILE=1 skips the attempt")


def test_commit_through_the_fused_deposit_and_through_its_first_check(monkeypatch):
    """The CUDA path on CPU: a fusion (the uncompiled fusable form) tried on the first row, then used."""
    rs = rows(3)
    plain = TorchGridSum(L, SPANS, "cpu")
    fused = TorchGridSum(L, SPANS, "cpu")
    monkeypatch.setattr(gridsum_torch, "compile_deposit", lambda: _deposit_fusable)
    fused._try_fuse = True
    for acc in (plain, fused):
        acc.reset(3)
        for r in rs:
            acc.add(torch.from_numpy(r))
    assert fused._fused is _deposit_fusable and fused._try_fuse is False
    for name in ("lo", "hi", "top", "amax"):
        assert torch.equal(getattr(plain, name), getattr(fused, name)), name
    assert plain.reduce(MPI.COMM_SELF, 3).numpy().tobytes() == fused.reduce(MPI.COMM_SELF, 3).numpy().tobytes()


def test_bit_length_is_exact_where_the_float_conversion_rounds_up():
    from hpcfl.parallel.gridsum_torch import _bit_length

    # 2**60 - 1 and 2**63 - 1 convert to 2**60 and 2**63: frexp says 61 and 64, the bits are 60 and 63
    x = torch.tensor([1, 2, 3, 2 ** 60 - 1, 2 ** 60, 2 ** 63 - 1], dtype=torch.int64)
    assert _bit_length(x).tolist() == [1, 2, 2, 60, 61, 63]


def test_add_keeps_float64_and_names_a_wrong_shape():
    acc = TorchGridSum(4, device="cpu")
    acc.reset(1)
    acc.add([0.1, 0.2, 2.0 ** -100, 3.0])                  # a list: float64, not torch's default float32
    assert acc.reduce(MPI.COMM_SELF, 1).tolist() == [0.1, 0.2, 2.0 ** -100, 3.0]
    acc.reset(1)
    with pytest.raises(ValueError, match=r"^row of shape \(3,\), expected \(4,\)$"):
        acc.add([1.0, 2.0, 3.0])


def test_a_nan_in_the_last_block_is_named_by_its_element():
    acc = TorchGridSum(64, device="cpu")                 # one segment of 64: four blocks of 16
    acc.reset(1)
    row = torch.zeros(64, dtype=torch.float64)
    row[63] = float("nan")
    acc.add(row)
    with pytest.raises(FloatingPointError, match=r"\(element 63\)"):
        acc.reduce(MPI.COMM_SELF, 1)


def test_the_device_form_counts_and_refuses_a_commit_before_reset():
    acc = TorchGridSum(4, device="cpu")
    with pytest.raises(RuntimeError, match=r"^GridSum.reset\(total\) must start the round$"):
        acc.add([1.0, 2.0, 3.0, 4.0])
    acc.reset(2)
    acc.add([1.0, 2.0, 3.0, 4.0])
    acc.add([1.0, 2.0, 3.0, 4.0])
    assert acc.count == 2


def test_the_float_device_sum_keeps_float64_from_a_list():
    acc = TorchFloatSum(2, "cpu")
    acc.add([0.1, 0.2])                                   # torch's default would be float32
    assert acc.reduce(MPI.COMM_SELF, 1).tolist() == [0.1, 0.2]


def test_blocks_of_16_and_a_shorter_last_one_on_the_device():
    # one segment of 100: six blocks of 16 and one of 4 (the block maxima come in runs of equal sizes)
    rng = np.random.default_rng(9)
    row = rng.standard_normal(100) * 10.0 ** rng.integers(-6, 6, 100)
    host, dev = GridSum(100), TorchGridSum(100, device="cpu")
    for acc in (host, dev):
        acc.reset(1)
        acc.add(row)
    assert dev.reduce(MPI.COMM_SELF, 1).numpy().tobytes() == host.reduce(MPI.COMM_SELF, 1).tobytes()
    assert dev.history.tolist() == host.history.tolist() and len(host.history) == 7


def test_exact_float_keeps_a_sticky_bit_from_the_hi_limb():
    from hpcfl.parallel.gridsum_torch import exact_float

    # S = 20: N = top 2**43 (2**83) + hi 1025 (2**30 + 2**20) + lo 0. float64 keeps bits 83..31 of N, bit 30
    # is a tie, bit 20 (dropped from hi, lo is zero) breaks it upwards: 2**83 + 2**31
    got = exact_float(torch.tensor([0]), torch.tensor([1025]), torch.tensor([2 ** 43]), 20)
    assert got.tolist() == [float(2 ** 83 + 2 ** 30 + 2 ** 20)] == [2.0 ** 83 + 2.0 ** 31]
