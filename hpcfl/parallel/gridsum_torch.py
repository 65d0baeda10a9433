"""The exact sum on a torch device: :class:`hpcfl.parallel.gridsum.GridSum`'s grid and limbs, in torch.

On a GPU the round's contributions are made on the device; copying each one to the host
to fold it into the limbs there costs more than the training (VGG-11, 16 clients: 1.8 s a
round against 0.09 s). :class:`TorchGridSum` folds each contribution into int64 limbs
on the device instead, with the same rounding as the host form, so the limbs, and the sums,
are the same bits whichever form (and whichever device) computed them:

- every step of the deposit is exact in floating point (a product by a power of two,
  ``round`` half to even, ``trunc``, a difference of integers below 2**53 apart...), so any
  correct implementation of it, numpy, numba's or a GPU's, gives the same limbs;
- the blocks' maxima come from a running element-wise max |v| (one ``maximum`` per
  contribution, the block reduction once per round);
- a NaN or Inf is refused at :meth:`reduce` (a running max holds it), not at :meth:`commit`:
  checking each contribution would wait for the device once per client;
- the summed limbs become floats on the device: int64 -> float64 where only the low limb
  is used (one rounding, as numpy's), and :func:`exact_float` (the exact integer, rounded
  once, half to even) where the higher limbs are.

On CUDA, rows of a million elements and more are folded by one fused kernel (the deposit's
arithmetic compiled by ``torch.compile``; about 17 passes over the row become one): it is
checked once against the tensor-by-tensor form, bit for bit, on the run's first contribution,
and not used (with a warning) where it differs or cannot be compiled. ``HPCFL_NO_COMPILE=1``
keeps the tensor-by-tensor form.

Per round the device is waited for twice, for the blocks' exponents (L/16 int16) and, where
some higher limb is used, for their count; with several ranks the limbs travel once each
way for ``Allreduce`` (MPI reads host memory; a CUDA-aware MPI is not assumed).
:class:`TorchFloatSum` is ``runtime.reduce = "float"``'s device form.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
import torch

from .gridsum import GridSum
from .mpi import mpi_module

COMPILE_FROM = 1 << 20   # CUDA rows this long are folded by the fused (compiled) deposit


class TorchGridSum(GridSum):
    """:class:`hpcfl.parallel.gridsum.GridSum` with its row and limbs on ``device`` (same protocol, same bits).

    :meth:`claim` returns a (L,) float64 tensor on the device; :meth:`reduce` returns the sums
    as a (L,) float64 tensor on the device (on ``root``).

    Parameters
    ----------
    length, spans
        As for :class:`~hpcfl.parallel.gridsum.GridSum`.
    device : torch.device
    """

    def __init__(self, length: int, spans=None, device="cpu"):
        self.device = torch.device(device)
        super().__init__(length, spans)

    def _allocate(self) -> None:
        L, dev = self.length, self.device
        f64 = dict(dtype=torch.float64, device=dev)
        self.row = torch.empty(L, **f64)
        self.lo, self.hi, self.top = (torch.zeros(L, dtype=torch.int64, device=dev) for _ in range(3))
        self.amax = torch.zeros(L, **f64)           # running max |v| per element, this round
        self._f1, self._f2 = torch.empty(L, **f64), torch.empty(L, **f64)   # the deposit's work rows
        self._scale_e = torch.ones(L, **f64)        # 2**-G per element, this round
        sizes = np.diff(self.starts)
        self._sizes = torch.from_numpy(sizes).to(dev)
        self._pieces = _block_pieces(self.starts)
        self._host = None                           # pinned host limbs for MPI, made on first use
        self.bmax = None
        self._fused = None                          # the compiled deposit, once checked (see commit)
        self._try_fuse = (dev.type == "cuda" and L >= COMPILE_FROM and os.environ.get("HPCFL_NO_COMPILE") != "1")

    def _clear(self) -> None:
        self.lo.zero_()
        self.hi.zero_()
        self.top.zero_()
        self.amax.zero_()
        scale = torch.from_numpy(self.scale).to(self.device)
        self._scale_e = torch.repeat_interleave(scale, self._sizes, output_size=self.length)

    def commit(self) -> None:
        """Fold the claimed row into the limbs (the host form's steps, as tensor operations)."""
        if self.s_bits is None:
            raise RuntimeError("GridSum.reset(total) must start the round")
        S = self.s_bits
        if self._fused is not None:
            self._fused(self.row, self._scale_e, 2.0 ** S, 2.0 ** -S, 2.0 ** (3 * S - 1), self.lo, self.hi, self.top,
                        self.amax)
        elif self._try_fuse:   # the run's first contribution: fold it both ways, keep the fused form if equal
            self._try_fuse = False
            before = [t.clone() for t in (self.lo, self.hi, self.top, self.amax)]
            deposit(self.row, self._scale_e, S, self.lo, self.hi, self.top, self.amax, self._f1, self._f2)
            self._fused = checked_fusion(compile_deposit, self.row, self._scale_e, S, before,
                                         (self.lo, self.hi, self.top, self.amax))
        else:
            deposit(self.row, self._scale_e, S, self.lo, self.hi, self.top, self.amax, self._f1, self._f2)
        self.count += 1

    def add(self, row) -> None:
        row = torch.as_tensor(row, dtype=torch.float64).reshape(-1)
        if row.shape != (self.length,):
            raise ValueError(f"row of shape {tuple(row.shape)}, expected ({self.length},)")
        self.row.copy_(row)
        self.commit()

    def _exponents(self) -> np.ndarray:
        """The blocks' biased exponents (host int16), from the running maxima; refuses NaN and Inf."""
        self.bmax = torch.cat([piece(self.amax) for piece in self._pieces])
        exps = (self.bmax.view(torch.int64) >> 52).to(torch.int16).cpu().numpy()
        bad = np.flatnonzero((exps < 0) | (exps == 2047))   # 2047: Inf or NaN (a NaN may carry its sign)
        if len(bad):
            a, b = int(self.starts[bad[0]]), int(self.starts[bad[0] + 1])
            self._refuse(a + int(torch.nonzero(~torch.isfinite(self.amax[a:b]))[0, 0]))
        return exps

    def _sum_limbs(self, comm, limbs: int) -> None:
        if comm.size == 1:
            return
        MPI = mpi_module()
        for limb, host in zip((self.lo, self.hi, self.top)[:limbs], self._host_limbs()):
            if host is limb:     # a host tensor already: MPI reads it in place
                comm.Allreduce(MPI.IN_PLACE, limb.numpy(), op=MPI.SUM)
                continue
            host.copy_(limb)
            comm.Allreduce(MPI.IN_PLACE, host.numpy(), op=MPI.SUM)
            limb.copy_(host)

    def _host_limbs(self) -> list:
        if self.device.type == "cpu":
            return [self.lo, self.hi, self.top]
        if self._host is None:   # page-locked: the copies run at the bus's speed
            self._host = [torch.empty(self.length, dtype=torch.int64, pin_memory=True) for _ in range(3)]
        return self._host

    def _to_float(self, limbs: int) -> torch.Tensor:
        out = self.lo.to(torch.float64)
        if limbs > 1:
            top = self.top if limbs > 2 else torch.zeros_like(self.top)
            big = torch.nonzero((self.hi != 0) | (top != 0))[:, 0]
            if big.numel():
                out[big] = exact_float(self.lo[big], self.hi[big], top[big], self.s_bits)
        return out.div_(self._scale_e)    # * 2**G: exact, as 2**-G and 2**G are normal floats


def deposit(row, scale_e, s_bits: int, lo, hi, top, amax, f1, f2) -> None:
    """Fold ``row`` into the limbs: the host form's arithmetic (:func:`hpcfl.parallel.gridsum._deposit_numpy`).

    Parameters
    ----------
    row : (L,) float64 tensor
        The contribution (read only).
    scale_e : (L,) float64 tensor
        2**-G of each element's block.
    s_bits : int
        S, bits of a limb.
    lo, hi, top : (L,) int64 tensors
        The limbs, added to in place.
    amax : (L,) float64 tensor
        Running max |v|, updated in place (a NaN stays NaN).
    f1, f2 : (L,) float64 tensors
        Work rows, overwritten.
    """
    up, down, cap = 2.0 ** s_bits, 2.0 ** -s_bits, 2.0 ** (3 * s_bits - 1)
    torch.maximum(amax, torch.abs(row, out=f1), out=amax)
    q = torch.mul(row, scale_e, out=f1).round_().clamp_(-cap, cap)   # round: half to even, as rint
    h = torch.mul(q, down, out=f2).trunc_()
    lo.add_(q.sub_(h, alpha=up).to(torch.int64))       # q - h 2**S: the bits of q below 2**S, exactly
    t = torch.mul(h, down, out=f1).trunc_()
    top.add_(t.to(torch.int64))
    hi.add_(h.sub_(t, alpha=up).to(torch.int64))


def _deposit_fusable(row, scale_e, up: float, down: float, cap: float, lo, hi, top, amax) -> None:
    """:func:`deposit`'s arithmetic without work rows, for ``torch.compile`` to fuse into one kernel."""
    amax.copy_(torch.maximum(amax, row.abs()))
    q = torch.round(row * scale_e).clamp(-cap, cap)
    h = torch.trunc(q * down)
    t = torch.trunc(h * down)
    lo.add_((q - h * up).to(torch.int64))
    top.add_(t.to(torch.int64))
    hi.add_((h - t * up).to(torch.int64))


def compile_deposit():
    """:func:`_deposit_fusable` compiled (one kernel on CUDA); raises where torch cannot compile it."""
    return torch.compile(_deposit_fusable, dynamic=False, fullgraph=True)


def checked_fusion(make, row, scale_e, s_bits: int, before: list, after: tuple):
    """``make()``'s fused deposit if, applied to the limbs ``before`` a contribution, it gives the
    limbs ``after`` it (bit for bit, as :func:`deposit` made them); else None, with a warning.

    The deposit is exact arithmetic, so a correct fusion cannot differ; this makes sure of it on
    this machine's compiler before a run depends on it.
    """
    why = None
    try:
        fused = make()
        fused(row, scale_e, 2.0 ** s_bits, 2.0 ** -s_bits, 2.0 ** (3 * s_bits - 1), *before)
        if all(torch.equal(a, b) for a, b in zip(before, after)):
            return fused
        why = "it gave other limbs than the tensor-by-tensor form"
    except Exception as exc:   # no Triton, no C compiler, an unsupported build: the plain form serves
        why = f"it could not be compiled ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
    warnings.warn(f"hpcfl: the fused exact-sum deposit is not used: {why}; the tensor-by-tensor form (same "
                  f"bits, slower) is. HPCFL_NO_COMPILE=1 skips the attempt", stacklevel=3)
    return None


def _block_pieces(starts: np.ndarray) -> list:
    """Functions that take the (L,) element maxima to their blocks' maxima, in block order.

    Blocks are runs of 16 inside segments (plus a shorter last one) or single elements
    (:func:`hpcfl.parallel.gridsum.block_starts`): each run of equal-size blocks is one reshape and one
    ``amax``, so a round's reduction takes a few operations, not one per block.
    """
    sizes = np.diff(starts)
    pieces, k = [], 0
    while k < len(sizes):
        j = k
        while j + 1 < len(sizes) and sizes[j + 1] == sizes[k]:
            j += 1
        a, n, w = int(starts[k]), j - k + 1, int(sizes[k])
        pieces.append(lambda m, a=a, n=n, w=w: m[a: a + n * w].view(n, w).amax(1))
        k = j + 1
    return pieces


def _bit_length(x: torch.Tensor) -> torch.Tensor:
    """Bits of each x > 0 (int64): floor(log2 x) + 1, exactly (the float conversion may round up)."""
    e = torch.frexp(x.to(torch.float64)).exponent.to(torch.int64)   # x ~ m 2**e, m in [0.5, 1)
    e = torch.clamp(e, max=63)                                      # x < 2**63 rounds up to 2**63 at most
    return torch.where(x < torch.bitwise_left_shift(torch.ones_like(x), e - 1), e - 1, e)


def _power_of_two(e: torch.Tensor) -> torch.Tensor:
    """2.0**e for int64 e in [-1022, 1023], exactly (built from its bits; ``pow`` need not be exact)."""
    return ((e + 1023) << 52).view(torch.float64)


def _carry(lo, hi, top, s_bits: int):
    """The same integer with lo and hi in [0, 2**S) (arithmetic shifts floor)."""
    c = lo >> s_bits
    lo, hi = lo - (c << s_bits), hi + c
    c = hi >> s_bits
    return lo, hi - (c << s_bits), top + c


def exact_float(lo, hi, top, s_bits: int) -> torch.Tensor:
    """``lo + hi * 2**S + top * 2**2S`` rounded once, half to even, to float64 (int64 tensors, any sizes).

    The same value as Python's ``float(int)`` of the exact integer (and as the host form's
    compiled conversion): after carrying into the top limb and taking the magnitude, the
    62 bits from the leading one and a sticky bit for everything below make a 63-bit integer
    whose conversion rounds where the exact integer's does.
    """
    lo, hi, top = _carry(lo, hi, top, s_bits)
    neg = top < 0
    nlo, nhi, ntop = _carry(-lo, -hi, -top, s_bits)
    lo, hi, top = torch.where(neg, nlo, lo), torch.where(neg, nhi, hi), torch.where(neg, ntop, top)
    one = torch.ones_like(lo)
    # the magnitude's leading bit; the top limb is used when non-zero, else hi (some higher limb is non-zero)
    msb = torch.where(top > 0, _bit_length(top.clamp(min=1)) - 1 + 2 * s_bits,
                      _bit_length(hi.clamp(min=1)) - 1 + s_bits)
    k = torch.clamp(msb - 61, min=0)                 # bits below the 62 kept
    window = torch.zeros_like(lo)
    sticky = torch.zeros_like(lo, dtype=torch.bool)
    for part, base in ((top, 2 * s_bits), (hi, s_bits), (lo, 0)):
        d = k - base                                  # > 0: shift right and drop d bits; <= 0: shift left
        right = torch.clamp(d, 0, 63)
        left = torch.clamp(-d, 0, 63)
        window += torch.where(d > 0, part >> right, part << left)
        dropped = torch.where(d >= 63, part != 0,
                              (part & (torch.bitwise_left_shift(one, right) - 1)) != 0)
        sticky |= (d > 0) & dropped
    small = (top == 0) & (hi < (1 << (62 - s_bits)))  # below 2**62: the int64 itself converts in one rounding
    whole = (hi << s_bits) + lo
    m2 = (window << 1) | sticky.to(torch.int64)
    big = m2.to(torch.float64) * _power_of_two(k - 1)
    v = torch.where(small, whole.to(torch.float64), big)
    return torch.where(neg, -v, v)


class TorchFloatSum:
    """``runtime.reduce = "float"`` on a torch device: a running float64 sum and ``Allreduce(SUM)``.

    Same protocol as :class:`hpcfl.parallel.comm.FloatSum`; NaN and Inf are refused at :meth:`reduce`
    (the running sum holds them), and the sum travels to the host only for MPI.
    """

    def __init__(self, length: int, device="cpu"):
        self.length, self.device = int(length), torch.device(device)
        self.acc = torch.zeros(self.length, dtype=torch.float64, device=self.device)
        self.row = torch.empty(self.length, dtype=torch.float64, device=self.device)

    def reset(self, total: int | None = None) -> None:
        self.acc.zero_()

    def claim(self) -> torch.Tensor:
        return self.row

    def commit(self) -> None:
        self.acc += self.row

    def add(self, row) -> None:
        self.row.copy_(torch.as_tensor(row, dtype=torch.float64).reshape(-1))
        self.commit()

    def reduce(self, comm, total: int, root: int | None = 0):
        if not bool(torch.isfinite(self.acc).all()):
            raise FloatingPointError("a contribution holds NaN or Inf; it cannot be summed")
        if comm.size > 1:
            MPI = mpi_module()
            host = self.acc.cpu().numpy()
            comm.Allreduce(MPI.IN_PLACE, host, op=MPI.SUM)
            self.acc.copy_(torch.from_numpy(host))
        if root is not None and comm.rank != root:
            return None
        return self.acc.clone()
