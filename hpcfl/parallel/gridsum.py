"""Exact, order-independent sum of the round's contributions in O(L) memory per rank.

:class:`hpcfl.parallel.comm.ExactSum` picks each element's fixed-point grid from the largest
contribution of *this* round, so a rank keeps every contribution until all have been
seen (contributions x L x 8 bytes). :class:`GridSum` fixes the grid *before* the round
instead, from the largest values of the previous round, and folds each contribution into
int64 limbs the moment it is packed:

1. each segment of the row is cut into blocks of 16 elements (a segment under 64 elements,
   such as the scalars, into blocks of one, so unlike quantities never share a grid; no block
   straddles two segments, so a segment rounds the same whatever else the row holds); block k
   has a grid exponent ``G_k`` that every rank knows before the round (:meth:`GridSum.reset`);
2. a contribution ``v`` is rounded once, ``q = rint(v * 2**-G_k)`` (held within
   ``+-2**(3S - 1)``, which changes only values past the range, whose block sums to Inf
   anyway, and keeps every limb an int64 in every form), and split exactly into limbs of S
   bits, ``q = l + h * 2**S + t * 2**2S`` (truncating divisions);
   ``lo += l`` in one fused pass with no temporaries, and ``hi += h``, ``top += t`` in a
   second pass only when some |q| reaches ``2**S``;
3. at the end of the round ``Allreduce(MAX)`` of the blocks' largest exponents (about
   L/16 int16), then ``Allreduce(SUM)`` of ``lo``, and of the higher limbs only when some
   value could have reached them; the result is ``(lo + hi * 2**S + top * 2**2S) * 2**G_k``;
4. the next round's grid is ``G_k = E_k - P`` for the block's largest exponent ``E_k``
   (``max |v| < 2**E_k``) and ``P = S - 6`` bits: six bits (64x) of growth before the
   high limb is used at all.

Each ``q`` depends only on its own value and a grid all ranks share, and integer sums do
not depend on order, so the sum is bitwise identical for any number of ranks, any
placement and any order, as with ExactSum. The grid is engine state: it is checkpointed
(``server.exact_grid``), so a resumed run rounds exactly as the uninterrupted one.

With K contributions in the round, ``S = 62 - ceil(log2 K)`` keeps every limb sum inside
int64. The largest contribution of a block then keeps ``P = S - 6`` bits (52 for K = 16,
39 for K = 100,000) when its scale is that of the previous round; a block that grows
loses nothing (the higher limbs take it, up to ``2**(3S - P)`` times the previous maximum)
and a block that shrinks by ``2**m`` keeps ``P - m`` bits. A block that was all zero,
and every block in a run's first round, uses a default grid whose three limbs reach from
``2**(64 - 3S)`` to ``2**64``. NaN or Inf stops the run with an error naming the element; a
finite value beyond its grid's range makes its block's sum Inf, so the round ends as
diverged, as a float sum that overflows would.
"""

from __future__ import annotations

import math

import numpy as np

from ..native.jit import numba_or_none
from ..state import ServerArray
from .mpi import mpi_module

BLOCK_BITS = 4                 # 16 elements share a grid exponent
BLOCK = 1 << BLOCK_BITS
SHORT = 64                     # segments shorter than this get one grid per element
COMPILED_FROM = 1 << 18        # rows this long use the compiled kernels; shorter ones numpy (same bits,
                               # and no numba import and cache load, about 1 s, in every small run)
HEADROOM = 6                   # bits of growth over the last round before the high limb is needed
DEFAULT_TOP = 64               # a grid with no history reaches 2**64 through all three limbs
G_MIN, G_MAX = -1000, 1000     # 2**-G stays a normal float64


def block_starts(length: int, spans=None) -> np.ndarray:
    """(nblocks + 1,) int64 block boundaries: segments cut into 16s, short segments into 1s."""
    spans = [(0, length)] if spans is None else [(int(a), int(b)) for a, b in spans]
    if spans and (spans[0][0] != 0 or spans[-1][1] != length or any(b != c for (_, b), (c, _) in zip(spans, spans[1:]))):
        raise ValueError(f"segments {spans} do not tile 0..{length}")
    cuts = [np.arange(a, b, 1 if b - a < SHORT else BLOCK) for a, b in spans]
    return np.concatenate(cuts + [np.array([length])]).astype(np.int64)


def limb_bits(total: int) -> int:
    """S: bits of the low limb for ``total`` contributions (each limb sum stays below 2**62)."""
    return 62 - math.ceil(math.log2(max(int(total), 1)))


def _deposit_numpy(row, starts, scale, s_bits, lo, hi, top, bmax):
    """Reference deposit (numpy, several passes); bitwise equal to the compiled kernel and to
    :mod:`hpcfl.parallel.gridsum_torch`'s.

    Returns ``max |h|`` over the row, or NaN if the row holds NaN or Inf; the caller
    checks it (the limbs are then not to be used).
    """
    a = np.abs(row)
    if not np.isfinite(a.max()):
        return float("nan")
    np.maximum(bmax, np.maximum.reduceat(a, starts[:-1]), out=bmax)
    cap = 2.0 ** (3 * s_bits - 1)
    q = np.clip(np.rint(row * np.repeat(scale, np.diff(starts))), -cap, cap)
    up, down = 2.0 ** s_bits, 2.0 ** -s_bits
    h = np.trunc(q * down)
    hmax = float(np.abs(h).max(initial=0.0))
    lo += (q - h * up).astype(np.int64)
    if hmax >= 1.0:
        t = np.trunc(h * down)
        top += t.astype(np.int64)
        hi += (h - t * up).astype(np.int64)
    return hmax


def _convert_numpy(lo, hi, top, limbs, s_bits, starts, unit, out):
    """Conversion ``(lo + hi * 2**S + top * 2**2S) * 2**G``, rounded once per element (numpy form).

    An element whose higher limbs are zero is its low limb, converted by numpy (int64 to float64
    rounds to nearest even, as Python's ``float(int)`` does); the others go through Python
    integers: exact, about 1 us per element. On W most rounds need a second limb somewhere, but
    only for a few elements: converting all 62,006 through Python took 33 ms per round.
    """
    np.copyto(out, lo, casting="unsafe")
    if limbs > 1:
        t = top if limbs > 2 else np.zeros_like(lo)
        big = np.flatnonzero((hi != 0) | (t != 0))
        out[big] = [float(int(a) + (int(b) << s_bits) + (int(c) << (2 * s_bits)))
                    for a, b, c in zip(lo[big], hi[big], t[big])]
    out *= np.repeat(unit, np.diff(starts))


def _compile():
    """(deposit, convert) compiled with numba, or None where numba cannot be had."""
    if numba_or_none() is None:
        return None
    # imports numba: only once it is known to be there (and its cache folder is set)
    from . import gridsum_kernels

    return gridsum_kernels.deposit, gridsum_kernels.convert


_KERNEL: list = []   # [(deposit, convert) compiled, or None], built on first use (~1 s once, then cached)


def kernels(length: int | None = None):
    """(deposit, convert): compiled where numba is installed and the row is long, numpy otherwise (same bits)."""
    if length is not None and length < COMPILED_FROM:
        return _deposit_numpy, _convert_numpy
    if not _KERNEL:
        _KERNEL.append(_compile())
    return _KERNEL[0] or (_deposit_numpy, _convert_numpy)


class GridSum:
    """Running exact sum of float64 rows of length L on a grid fixed before the round.

    Usage per round: ``reset(total)`` with the number of contributions ``total`` over all
    ranks (the same on every rank); for each local contribution ``claim()``, fill the
    returned row in place, ``commit()`` (or ``add(row)``); then ``reduce(comm, total)`` on
    every rank. Memory: the row, the limbs (the higher ones mapped only once written) and
    about L/16 block values, whatever the number of contributions.

    This class keeps its buffers in host memory (numpy, the compiled kernels where numba is
    there); :class:`hpcfl.parallel.gridsum_torch.TorchGridSum` keeps them on a torch device, with the
    same grid, the same limbs and the same bits. The grid (:meth:`reset`), the agreement on
    limbs and the range check (:meth:`reduce`) are this class's for both.

    Parameters
    ----------
    length : int
        L, the length of a contribution row.
    spans : list of (start, stop), optional
        The row's segments, in order, covering 0..L (``Layout.slices``); one if omitted.
    """

    def __init__(self, length: int, spans=None):
        self.length = int(length)
        self.starts = block_starts(self.length, spans)
        self.nblocks = len(self.starts) - 1
        self.history = np.zeros(self.nblocks, dtype=np.int16)      # last round's biased exponents (0: none)
        self.grid = np.zeros(self.nblocks, dtype=np.int64)
        self.scale = np.ones(self.nblocks, dtype=np.float64)
        self.total = self.s_bits = None
        self.count = 0
        self.wire = [0, 0, 0]      # rounds that sent 1, 2, 3 limbs (for benchmarks and tests)
        self.hi_dirty = False
        self._allocate()

    def _allocate(self) -> None:
        """The row, the limbs and the blocks' maxima, in host memory."""
        self.row = np.empty(self.length, dtype=np.float64)
        self.lo = np.zeros(self.length, dtype=np.int64)
        self.hi = np.zeros(self.length, dtype=np.int64)           # np.zeros: pages mapped only when written
        self.top = np.zeros(self.length, dtype=np.int64)
        self.bmax = np.zeros(self.nblocks, dtype=np.float64)       # this round's max |v| per block
        # chosen (and compiled or loaded from numba's cache) now, before any round's phases start
        self._deposit, self._convert = kernels(self.length)

    def reset(self, total: int) -> None:
        """Start a round of ``total`` contributions: zero the limbs and fix the grid."""
        self.total, self.s_bits = int(total), limb_bits(total)
        self.count = 0
        e = self.history.astype(np.int64) - 1022                    # max|v| < 2**e last round
        predicted = e - (self.s_bits - HEADROOM)
        default = DEFAULT_TOP - 3 * self.s_bits
        self.grid = np.clip(np.where(self.history > 0, predicted, default), G_MIN, G_MAX)
        self.scale = np.ldexp(1.0, -self.grid)
        self._clear()

    def _clear(self) -> None:
        self.lo.fill(0)
        if self.hi_dirty:       # untouched otherwise: the high limbs' pages are never mapped in
            self.hi.fill(0)
            self.top.fill(0)
            self.hi_dirty = False
        self.bmax.fill(0.0)

    def claim(self) -> np.ndarray:
        """The row buffer (L,) float64 to fill in place before :meth:`commit`."""
        return self.row

    def commit(self) -> None:
        """Fold the claimed row into the limbs (rounded once on the block grids)."""
        if self.s_bits is None:
            raise RuntimeError("GridSum.reset(total) must start the round")
        hmax = self._deposit(self.row, self.starts, self.scale, self.s_bits, self.lo, self.hi, self.top, self.bmax)
        if hmax != hmax:
            self._refuse(np.flatnonzero(~np.isfinite(self.row))[0])
        # a finite value past the range (hmax >= 2**2S) is seen by every rank in reduce()'s
        # agreed maxima, and its block's sum becomes Inf there: no rank stops alone
        self.hi_dirty |= hmax >= 1.0
        self.count += 1

    @staticmethod
    def _refuse(element: int):
        """Raise for a row whose ``element`` is NaN or Inf."""
        raise FloatingPointError(f"a contribution holds NaN or Inf (element {element}); it cannot be summed")

    def add(self, row) -> None:
        row = np.asarray(row, dtype=np.float64).reshape(-1)
        if row.shape != (self.length,):
            raise ValueError(f"row of shape {row.shape}, expected ({self.length},)")
        np.copyto(self.row, row)
        self.commit()

    def reduce(self, comm, total: int, root: int | None = 0):
        """Sum over all ranks; the result (L,) float64 on ``root`` (all ranks if root is None).

        Also records the blocks' largest exponents as the next round's grid history.
        """
        if int(total) != self.total:
            raise ValueError(f"reduce(total={total}) after reset(total={self.total})")
        MPI = mpi_module()
        exps = self._exponents()
        comm.Allreduce(MPI.IN_PLACE, exps, op=MPI.MAX)
        limbs = self._limbs_needed(exps)
        self._sum_limbs(comm, limbs)
        return self._finish(exps, limbs, root is None or comm.rank == root)

    def _sum_limbs(self, comm, limbs: int) -> None:
        """``Allreduce(SUM)`` of the first ``limbs`` limbs, in place (integers: any order, the same sum)."""
        MPI = mpi_module()
        for limb in (self.lo, self.hi, self.top)[:limbs]:
            comm.Allreduce(MPI.IN_PLACE, limb, op=MPI.SUM)

    def _exponents(self) -> np.ndarray:
        """Biased binary exponents of the blocks' max |v| (int16; max|v| < 2**(E - 1022), 0 for none)."""
        return (self.bmax.view(np.uint64) >> np.uint64(52)).astype(np.int16)

    def _limbs_needed(self, exps: np.ndarray) -> int:
        """Limbs that may be non-zero somewhere: the same on every rank, from the agreed maxima."""
        # |v| < 2**(E - 1022), so |v| * 2**-G < 2**reach, and rint may round up to 2**reach.
        reach = int(np.max(np.where(exps > 0, exps.astype(np.int64) - 1022 - self.grid, 0), initial=0))
        return 1 + (reach >= self.s_bits) + (reach >= 2 * self.s_bits)

    def _beyond(self, exps: np.ndarray) -> np.ndarray:
        """Blocks where some value may exceed the three limbs (|q| >= 2**(3S - 1))."""
        return (exps > 0) & (exps.astype(np.int64) - 1022 - self.grid >= 3 * self.s_bits)

    def _finish(self, exps: np.ndarray, limbs: int, want: bool):
        """Record the grid history; the float64 sums (from limbs already summed over ranks) if ``want``."""
        self.history = exps
        self.wire[limbs - 1] += 1
        if limbs > 1:
            self.hi_dirty = True
        if not want:
            return None
        out = self._to_float(limbs)
        beyond = np.flatnonzero(self._beyond(exps))
        if len(beyond):
            for k in beyond:
                out[int(self.starts[k]): int(self.starts[k + 1])] = np.inf
            print(f"hpcfl: the exact sum's range was exceeded in {len(beyond)} block(s) from element "
                  f"{self.starts[beyond[0]]} (values more than 2**{2 * self.s_bits + HEADROOM} times the last "
                  f"round's, or above 2**{DEFAULT_TOP} in a first round); their sums are Inf", flush=True)
        return out

    def _to_float(self, limbs: int) -> np.ndarray:
        """The summed limbs as float64, (L,): one rounding per element of the exact integer sum;
        * 2**G is exact (G is clipped so that 2**G is a normal float), so sums that differ by a
        power of two stay exactly apart."""
        out = np.empty(self.length, dtype=np.float64)   # a fresh array: callers may keep a round's sums
        self._convert(self.lo, self.hi, self.top, limbs, self.s_bits, self.starts, np.ldexp(1.0, self.grid), out)
        return out

    def _finish_local(self):
        """:meth:`reduce` without the collectives, on limbs and maxima already combined (tests emulate ranks)."""
        exps = self._exponents()
        return self._finish(exps, self._limbs_needed(exps), True)

    def state(self) -> list:
        """The grid history as checkpointed server state (identical on every rank)."""
        def put(value):
            value = np.asarray(value, dtype=np.int16).reshape(-1)
            if value.shape != self.history.shape:
                raise ValueError(f"checkpointed exact_grid has {value.shape[0]} blocks; this run's rows need "
                                 f"{self.nblocks}: the model or algorithm changed since the checkpoint")
            self.history = value.copy()

        return [ServerArray("exact_grid", lambda: self.history, put)]
