"""The numba-compiled loops of :mod:`hpcfl.parallel.gridsum`, as module-level functions.

Imported only where numba can be had (:func:`hpcfl.native.jit.numba_or_none`, which points numba's
cache at hpcfl's cache folder first). At module level so that numba's cache matches in the next
process: defined inside a function, ``convert_mixed`` was a closure over the ``to_float``
dispatcher (and ``to_float`` over ``bitlen``), numba keys a closure's cache entry on a pickle of
its cells, and a dispatcher's pickle carries a fresh id in every process, so those two were
compiled again in every run. Module globals are not part of the key.
"""

import math

import numba
import numpy as np


# No early exit: a branch out of the loop stops it from vectorising (2x slower). A
# NaN or Inf turns ``chk`` into NaN; the caller refuses the whole row then. The high
# limb is written in a second pass, only when some |h| >= 1: on a predicted grid that
# is rare, and skipping it saves a third of the memory traffic.
@numba.njit("float64(float64[::1], int64[::1], float64[::1], int64, int64[::1], float64[::1])",
            cache=True, nogil=True)
def deposit_lo(row, starts, scale, s_bits, lo, bmax):   # pragma: no cover - compiled
    up, down, cap = 2.0 ** s_bits, 2.0 ** -s_bits, 2.0 ** (3 * s_bits - 1)
    chk, hmax = 0.0, 0.0
    for k in range(scale.shape[0]):
        sc, m = scale[k], bmax[k]
        for j in range(starts[k], starts[k + 1]):
            v = row[j]
            a = abs(v)
            chk += a * 0.0
            m = max(m, a)
            q = min(max(np.rint(v * sc), -cap), cap)
            h = np.trunc(q * down)
            hmax = max(hmax, abs(h))
            lo[j] += np.int64(q - h * up)   # exact: the bits of q below 2**S
        bmax[k] = m
    return chk + hmax

@numba.njit("void(float64[::1], int64[::1], float64[::1], int64, int64[::1], int64[::1])", cache=True, nogil=True)
def deposit_hi(row, starts, scale, s_bits, hi, top):   # pragma: no cover - compiled
    up, down, cap = 2.0 ** s_bits, 2.0 ** -s_bits, 2.0 ** (3 * s_bits - 1)
    for k in range(scale.shape[0]):
        sc = scale[k]
        for j in range(starts[k], starts[k + 1]):
            h = np.trunc(min(max(np.rint(row[j] * sc), -cap), cap) * down)
            t = np.trunc(h * down)
            top[j] += np.int64(t)
            hi[j] += np.int64(h - t * up)

def deposit(row, starts, scale, s_bits, lo, hi, top, bmax):
    hmax = deposit_lo(row, starts, scale, s_bits, lo, bmax)
    if hmax >= 1.0:
        deposit_hi(row, starts, scale, s_bits, hi, top)
    return hmax

@numba.njit("int64(int64)", cache=True)
def bitlen(x):   # pragma: no cover - compiled; x > 0
    e = math.frexp(np.float64(x))[1]
    return e - 1 if x < (np.int64(1) << (e - 1)) else e

@numba.njit(inline="always")
def carry(lo, hi, top, s_bits):   # pragma: no cover - compiled
    # the same integer, with lo and hi brought into [0, 2**S) (arithmetic shifts floor)
    c = lo >> s_bits
    lo -= c << s_bits
    hi += c
    c = hi >> s_bits
    hi -= c << s_bits
    return lo, hi, top + c

@numba.njit("float64(int64, int64, int64, int64)", cache=True)
def to_float(lo, hi, top, s_bits):   # pragma: no cover - compiled
    # lo + hi * 2**S + top * 2**2S, rounded once (half to even) to float64
    one = np.int64(1)
    lo, hi, top = carry(lo, hi, top, s_bits)
    neg = top < 0
    if neg:                       # negate, then bring the low limbs back into [0, 2**S)
        lo, hi, top = carry(-lo, -hi, -top, s_bits)
    if top == 0 and hi < (one << (62 - s_bits)):
        v = np.float64((hi << s_bits) + lo)         # fits in int64: one rounding
    else:
        msb = bitlen(top) - 1 + 2 * s_bits if top > 0 else bitlen(hi) - 1 + s_bits
        shift = msb - 63                             # keep 64 bits; the rest is sticky
        m, sticky = np.uint64(0), False
        for part, base in ((top, 2 * s_bits), (hi, s_bits), (lo, 0)):
            amount = base - shift
            if amount >= 0:
                m |= np.uint64(part) << np.uint64(amount)
            elif amount > -64:
                m |= np.uint64(part >> (-amount))
                sticky |= (part & ((one << (-amount)) - one)) != 0
            else:
                sticky |= part != 0
        # 63 bits in a signed int (its conversion rounds correctly; uint64's need not), with
        # the dropped bits as a sticky bit 0, 9 bits below the rounding point: it breaks ties only
        m2 = np.int64((m >> np.uint64(1)) | (m & np.uint64(1)) | np.uint64(sticky))
        v = np.float64(m2) * 2.0 ** (shift + 1)
    return -v if neg else v

@numba.njit("void(int64[::1], int64[::1], int64[::1], int64, int64, int64[::1], float64[::1], float64[::1])",
            cache=True, nogil=True)
def convert_mixed(lo, hi, top, limbs, s_bits, starts, unit, out):   # pragma: no cover - compiled
    for k in range(unit.shape[0]):
        u = unit[k]
        for j in range(starts[k], starts[k + 1]):
            t = top[j] if limbs > 2 else 0
            if hi[j] == 0 and t == 0:   # the low limb alone: int64 -> float64 rounds once
                out[j] = np.float64(lo[j]) * u
            else:
                out[j] = to_float(lo[j], hi[j], t, s_bits) * u

@numba.njit("void(int64[::1], int64[::1], float64[::1], float64[::1])", cache=True, nogil=True)
def convert_low(lo, starts, unit, out):   # pragma: no cover - compiled
    for k in range(unit.shape[0]):        # no branch in the loop: the usual round, one limb
        u = unit[k]
        for j in range(starts[k], starts[k + 1]):
            out[j] = np.float64(lo[j]) * u

def convert(lo, hi, top, limbs, s_bits, starts, unit, out):
    if limbs == 1:
        convert_low(lo, starts, unit, out)
    else:
        convert_mixed(lo, hi, top, limbs, s_bits, starts, unit, out)
