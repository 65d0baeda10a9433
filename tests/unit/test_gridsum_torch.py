"""The exact sum's device form (hpcfl.parallel.gridsum_torch) against the host form (hpcfl.parallel.gridsum), bit for bit.

Run here on CPU tensors: the device form is the same torch code on a GPU, where
bench/gpu_check.sh runs its bitwise checks again (and the fused CUDA kernel checks itself).
"""

import warnings

import numpy as np
import pytest
import torch
from mpi4py import MPI

from hpcfl.parallel import gridsum
from hpcfl.parallel.gridsum import BLOCK, GridSum
from hpcfl.parallel.gridsum_torch import (TorchFloatSum, TorchGridSum, _deposit_fusable, checked_fusion, deposit,
                                 exact_float)
from hpcfl.parallel.comm import FloatSum

SPANS = [(0, 150), (150, 190), (190, 203)]   # a long segment (blocks of 16 and a short one) and short ones
L = 203


def hard_rounds(seed=0):
    """Rounds of 9 rows: scales over 24 decades, zeros of both signs, values on the grid's ties, growth
    past the headroom (x500, x2**30), a shrink (1e-4), and a block that was zero coming back."""
    rng = np.random.default_rng(seed)
    scales = 10.0 ** rng.integers(-12, 12, size=L)
    out = []
    for growth in (1.0, 3.0, 500.0, 1e-4, 2.0 ** 30, 1.0):
        rows = rng.standard_normal((9, L)) * scales * growth
        rows[:, 5] = 0.0
        rows[4, 6] = -0.0
        rows[:, 20:36] = 0.0 if growth == 3.0 else rows[:, 20:36]   # a block all zero for a round
        out.append(rows)
    return out


def with_ties(acc, rows):
    """Put exact ties of the grid (k + 1/2 units, k even and odd, both signs) into column 7 of ``rows``."""
    if len(rows) >= 4:
        unit = np.ldexp(1.0, int(np.repeat(acc.grid, np.diff(acc.starts))[7]))
        rows[:4, 7] = np.array([0.5, 1.5, -2.5, -3.5]) * unit
    return rows


def run_both(rounds, groups=None):
    host, dev = GridSum(L, SPANS), TorchGridSum(L, SPANS, "cpu")
    outs = []
    for rows in rounds:
        host.reset(len(rows))
        dev.reset(len(rows))
        rows = with_ties(host, rows.copy())
        for i in (groups or range(len(rows))):
            host.add(rows[i])
            dev.add(torch.from_numpy(rows[i]))
        for name in ("lo", "hi", "top"):
            assert getattr(host, name).tobytes() == getattr(dev, name).numpy().tobytes(), name
        a, b = host.reduce(MPI.COMM_SELF, len(rows)), dev.reduce(MPI.COMM_SELF, len(rows))
        assert isinstance(b, torch.Tensor)
        assert a.tobytes() == b.numpy().tobytes()
        assert host.history.tobytes() == dev.history.tobytes() and host.wire == dev.wire
        outs.append(a)
    return outs, host.wire


def test_limbs_sums_and_grids_equal_the_host_form_bitwise():
    outs, wire = run_both(hard_rounds())
    assert wire[1] >= 1 and wire[2] >= 1     # the higher limbs were used (first round, growth)
    assert np.isfinite(np.concatenate(outs)).all()


def test_the_order_of_contributions_does_not_change_a_bit():
    a, _ = run_both(hard_rounds(1))
    b, _ = run_both(hard_rounds(1), groups=[8, 3, 1, 0, 7, 2, 6, 5, 4])
    assert all(x.tobytes() == y.tobytes() for x, y in zip(a, b))


def test_the_numba_form_gives_the_same_limbs_as_the_torch_form():
    dep, _ = gridsum.kernels()
    if dep is gridsum._deposit_numpy:
        pytest.skip("numba is not installed")
    rng = np.random.default_rng(2)
    n = 10 * BLOCK + 5
    host, dev = GridSum(n), TorchGridSum(n, None, "cpu")
    host.history[:] = dev.history[:] = (1023 + rng.integers(-30, 30, host.nblocks)).astype(np.int16)
    host.reset(7)
    dev.reset(7)
    for _ in range(7):
        row = rng.standard_normal(n) * 10.0 ** rng.integers(-9, 9, n)
        np.copyto(host.row, row)
        dep(host.row, host.starts, host.scale, host.s_bits, host.lo, host.hi, host.top, host.bmax)
        dev.add(torch.from_numpy(row))
    for name in ("lo", "hi", "top"):
        assert getattr(host, name).tobytes() == getattr(dev, name).numpy().tobytes()


def test_a_block_past_the_range_sums_to_inf_in_both_forms(capsys):
    rows = np.ones((2, L))
    big = rows.copy()
    big[1, 13] = 2.0 ** 200            # far past 2**(2S + 6) times the last round's 1: q is held at 2**(3S - 1)
    outs, _ = run_both([rows, big])
    assert np.isinf(outs[1][:BLOCK]).all() and np.all(outs[1][BLOCK:] == 2.0)   # element 13's block of 16
    assert capsys.readouterr().out.count("range was exceeded in 1 block(s) from element 0") == 2


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nan_and_inf_are_refused_at_reduce_naming_the_element(bad):
    acc = TorchGridSum(L, SPANS, "cpu")
    acc.reset(2)
    acc.add(torch.ones(L))
    row = torch.ones(L, dtype=torch.float64)
    row[171] = bad
    acc.add(row)   # not refused here: checking each row would wait for the device once per client
    with pytest.raises(FloatingPointError, match=r"NaN or Inf \(element 171\)"):
        acc.reduce(MPI.COMM_SELF, 2)


def python_float(lo, hi, top, s):
    return np.array([float(int(a) + (int(b) << s) + (int(c) << (2 * s))) for a, b, c in zip(lo, hi, top)])


def test_exact_float_is_pythons_exact_int_to_float():
    rng = np.random.default_rng(3)
    n = 4000
    for s in (40, 47, 53, 58, 60):
        lo, hi, top = (rng.integers(-2**62, 2**62, n) >> rng.integers(0, 62, n) for _ in range(3))
        got = exact_float(torch.from_numpy(lo), torch.from_numpy(hi), torch.from_numpy(top), s).numpy()
        assert got.tobytes() == python_float(lo, hi, top, s).tobytes()


def test_exact_float_rounds_ties_to_even_and_sees_bits_far_below():
    """Integers exactly halfway between two doubles (even and odd mantissa: down and up), and the
    same plus one unit 100 bits below (a sticky bit in the low limb: always up)."""
    s = 50
    cases = []
    for mant in (2**52 + 2, 2**52 + 3):            # even, odd last bit
        for shift in (60, 80, 100):
            v = (2 * mant + 1) << (shift - 1)      # mant * 2**shift + half a unit
            cases += [v, v + 1, -v, -(v + 1)]
    for v in (2**62 + 2**9, 2**62 + 2**9 + 1, 2**62 + 3 * 2**9):   # 63-bit: the tie is 9 bits up, one bit below
        cases += [v, -v]
    lo = np.array([v % (1 << s) if v >= 0 else -((-v) % (1 << s)) for v in cases], dtype=np.int64)
    rest = [(v - int(a)) >> s for v, a in zip(cases, lo)]
    hi = np.array([r % (1 << s) if r >= 0 else -((-r) % (1 << s)) for r in rest], dtype=np.int64)
    top = np.array([(r - int(b)) >> s for r, b in zip(rest, hi)], dtype=np.int64)
    assert [int(a) + (int(b) << s) + (int(c) << 2 * s) for a, b, c in zip(lo, hi, top)] == cases
    got = exact_float(torch.from_numpy(lo), torch.from_numpy(hi), torch.from_numpy(top), s).numpy()
    assert got.tolist() == [float(v) for v in cases]
    assert got[0] != got[1]                         # the tie went down, the unit below broke it upwards


def test_the_fused_deposit_is_used_only_when_it_gives_the_same_limbs():
    rng = np.random.default_rng(4)
    row = torch.from_numpy(rng.standard_normal(500) * 1e3)
    scale = torch.full((500,), 2.0 ** 40, dtype=torch.float64)
    s = 58

    def limbs():
        return [torch.zeros(500, dtype=torch.int64) for _ in range(3)] + [torch.zeros(500, dtype=torch.float64)]

    after = limbs()
    deposit(row, scale, s, *after, torch.empty(500, dtype=torch.float64), torch.empty(500, dtype=torch.float64))
    assert checked_fusion(lambda: _deposit_fusable, row, scale, s, limbs(), tuple(after)) is _deposit_fusable

    def off_by_one(row, scale_e, up, down, cap, lo, hi, top, amax):
        _deposit_fusable(row, scale_e, up, down, cap, lo, hi, top, amax)
        lo[3] += 1

    def fails():
        raise RuntimeError("no compiler\nmore")

    for make, why in ((lambda: off_by_one, "other limbs"), (fails, "RuntimeError: no compiler")):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            assert checked_fusion(make, row, scale, s, limbs(), tuple(after)) is None
        assert why in str(seen[0].message) and "HPCFL_NO_COMPILE" in str(seen[0].message)


def test_float_sum_device_form_equals_the_host_form():
    rng = np.random.default_rng(5)
    rows = rng.standard_normal((6, 40)) * 10.0 ** rng.integers(-8, 8, 40)
    host, dev = FloatSum(40), TorchFloatSum(40, "cpu")
    host.reset(6)
    dev.reset(6)
    for r in rows:
        host.add(r)
        np.copyto(dev.claim().numpy(), r)
        dev.commit()
    a, b = host.reduce(MPI.COMM_SELF, 6), dev.reduce(MPI.COMM_SELF, 6)
    assert a.tobytes() == b.numpy().tobytes()
    dev.reset()
    dev.add(torch.full((40,), np.inf))
    with pytest.raises(FloatingPointError):
        dev.reduce(MPI.COMM_SELF, 1)


def test_checkpointed_grid_restores_the_rounding_of_the_device_form():
    rounds = hard_rounds(6)[:3]
    straight = TorchGridSum(L, SPANS, "cpu")
    outs = []
    for rows in rounds:
        straight.reset(9)
        for r in rows:
            straight.add(torch.from_numpy(r))
        outs.append(straight.reduce(MPI.COMM_SELF, 9).numpy())
    first = TorchGridSum(L, SPANS, "cpu")
    first.reset(9)
    for r in rounds[0]:
        first.add(torch.from_numpy(r))
    first.reduce(MPI.COMM_SELF, 9)
    resumed = GridSum(L, SPANS)                  # the host form resumes the device form's checkpoint
    resumed.state()[0].set(np.array(first.state()[0].get()))
    resumed.reset(9)
    for r in rounds[1]:
        resumed.add(r)
    assert resumed.reduce(MPI.COMM_SELF, 9).tobytes() == outs[1].tobytes()
