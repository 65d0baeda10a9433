"""The group kernels of :mod:`hpcfl.client.fused` in C (``fused.c``), loaded through ctypes.

numba's form (:mod:`hpcfl.client.fused_kernels`) costs every run ``import numba`` and LLVM's
set-up when its kernel is loaded from numba's cache, 0.5-0.8 s of CPU before round 1. The
same loops in C are compiled once per machine into hpcfl's cache folder (:mod:`hpcfl.native.cc`)
and mapped in about a millisecond, and numba is then never imported. The two forms give the
same bits (``fused.c`` is a line-for-line transcription, compiled with ``-ffp-contract=off`` and
no fast-math; tests/unit/test_fused_c.py compares them on random inputs). Before a library is
used, :func:`_agrees_with_python` runs it on a small case against a transcription in Python
floats (IEEE double, never fused): a compiler that contracts or reassociates anyway (an
``HPCFL_CC`` with a fast floating-point model) is caught there, and numba's form runs instead.
"""

from __future__ import annotations

import ctypes
import warnings
from pathlib import Path

import numpy as np

from ..native import cc

# after pool.c's flags (hpcfl.native.cc.FLAGS): -O3, whose vectoriser (run-time alias checks, loop
# tails) takes the logits' and gradient's element-wise loops; at -O2 gcc 12 left them scalar and
# the logreg kernel took 2.7x numba's time (5.8 against 2.2 ms a group on the Synthetic(1,1) job's
# shapes), at -O3 the same (2.2); vectorising element-wise loops changes no bit. No FMA contraction
# (clang's default fuses a*b + c within a statement; numba's LLVM never does), and the math library
# for exp and log.
FLAGS = ("-O3", "-ffp-contract=off", "-lm")
NAMES = {"logreg": "logreg_group", "quadratic": "quadratic_group", "quadratic_general": "quadratic_general_group"}

_LIB: list = []   # [the checked library, or None], resolved once per process

_ptr, _i64 = ctypes.c_void_p, ctypes.c_int64
# w, x, y, sched, steps, alpha, coef, corr, has_corr, x0, loss, work, u, G, P, B, F, C
_ARGTYPES = [_ptr] * 8 + [_i64] + [_ptr] * 4 + [_i64] * 5


class CKernel:
    """One kind's C kernel, called as numba's: ``kern(w, x, y, sched, steps, alpha, coef, corr, x0,
    classes) -> loss`` (G,) float64, w updated in place (:func:`hpcfl.client.fused.train_group`
    documents the arguments). Checks what numba's signatures check (dtypes, C order, shapes), so a
    wrong array is a TypeError or ValueError here instead of a read out of bounds in C."""

    backend = "c"

    def __init__(self, kind: str, lib: ctypes.CDLL):
        self.kind, self.path = kind, lib._name
        self._fn = {}
        for dtype, suffix in ((np.float32, "f32"), (np.float64, "f64")):
            f = getattr(lib, f"{NAMES[kind]}_{suffix}")
            f.argtypes, f.restype = _ARGTYPES, None
            self._fn[np.dtype(dtype)] = f

    def __call__(self, w, x, y, sched, steps, alpha, coef, corr, x0, classes) -> np.ndarray:
        dt = w.dtype
        if dt not in self._fn:
            raise TypeError(f"the {self.kind} group kernel takes float32 or float64 weights, not {dt}")
        G, P = w.shape
        S, B = sched.shape[0], sched.shape[2]
        xdims = 3 if self.kind == "quadratic_general" else 2
        for name, a, dtype, ndim in (("w", w, dt, 2), ("x", x, dt, xdims), ("y", y, np.int64, 1),
                                     ("sched", sched, np.int64, 3), ("steps", steps, np.int64, 1),
                                     ("alpha", alpha, dt, 1), ("coef", coef, dt, 1), ("corr", corr, dt, 2),
                                     ("x0", x0, dt, 1)):
            if a.dtype != dtype or a.ndim != ndim or not a.flags.c_contiguous:
                raise TypeError(f"{name} must be a C-contiguous {ndim}-d {np.dtype(dtype)} array, "
                                f"not {a.ndim}-d {a.dtype} (C order: {a.flags.c_contiguous})")
        F = int(np.prod(x.shape[1:]))
        C = int(classes)
        shapes_ok = (sched.shape[1] == G and steps.shape == (G,) and alpha.shape == (S,) and coef.shape == (6,)
                     and corr.shape[0] in (0, G) and corr.shape[1] == P and x0.shape == (P,)
                     and (G == 0 or 0 <= int(steps.min()) and int(steps.max()) <= S)
                     and {"logreg": P == C * F + C, "quadratic": F == P,
                          "quadratic_general": x.shape[1:] == (3, P)}[self.kind])
        if not w.flags.writeable or not shapes_ok:
            raise ValueError(f"the {self.kind} group kernel got inconsistent arrays: w {w.shape}, x {x.shape}, "
                             f"sched {sched.shape}, steps {steps.shape}, alpha {alpha.shape}, corr {corr.shape}, "
                             f"x0 {x0.shape}, classes {C}")
        loss = np.zeros(G, dtype=np.float64)
        work = np.empty(F * B + C * B + P, dtype=dt)   # numba's form allocates the same per call
        u = np.zeros(P, dtype=dt)
        self._fn[dt](w.ctypes.data, x.ctypes.data, y.ctypes.data, sched.ctypes.data, steps.ctypes.data,
                     alpha.ctypes.data, coef.ctypes.data, corr.ctypes.data, int(corr.shape[0] > 0), x0.ctypes.data,
                     loss.ctypes.data, work.ctypes.data, u.ctypes.data, G, P, B, F, C)
        return loss


def _python_quadratic_general(w, x, sched, steps, alpha, coef, corr, x0) -> list[float]:
    """``quadratic_general_group`` in Python floats (float64, no FMA), on lists; w updated in place."""
    wd, mu, rho, one, zero, half = coef
    loss, u = [0.0] * len(w), [0.0] * len(x0)
    for g, wg in enumerate(w):
        for k in range(steps[g]):
            rows = sched[k][g]
            n = sum(r >= 0 for r in rows)
            wt = one / float(n)
            grad, step_loss = [0.0] * len(wg), zero
            for b in range(n):
                c, h, nz = x[rows[b]]
                for p in range(len(wg)):
                    d = wg[p] - c[p]
                    hd = h[p] * d
                    step_loss += (nz[p] * wg[p] + half * hd * d) * wt
                    grad[p] += (hd + nz[p]) * wt
            loss[g] += step_loss
            for p in range(len(wg)):   # LocalSolver.step: every option on
                gp = grad[p] + wd * wg[p]
                gp = gp + mu * (wg[p] - x0[p])
                gp = gp + corr[g][p]
                gp = gp if k == 0 else rho * u[p] + gp
                u[p] = gp
                wg[p] = wg[p] + alpha[k] * gp
    return loss


def _agrees_with_python(lib: ctypes.CDLL) -> bool:
    """Whether the library's float64 general quadratic (every solver option on, a partial batch)
    gives the Python transcription's bits: a compiler that fuses ``a * b + c`` into an FMA or
    reorders sums changes them. About 0.1 ms."""
    r = np.random.default_rng(36)
    G, P, N, S, B = 2, 5, 6, 3, 4
    w = r.standard_normal((G, P))
    x = r.standard_normal((N, 3, P))
    x[:, 1] = np.abs(x[:, 1]) + 0.5
    sched = r.integers(0, N, (S, G, B))
    sched[2, 0, 2:] = -1                                  # a partial last batch
    steps = np.array([3, 2], dtype=np.int64)
    alpha = np.array([-0.05 * 0.97**k for k in range(S)])
    coef = np.array([1e-3, 0.3, 0.9, 1.0, 0.0, 0.5])
    corr = r.standard_normal((G, P)) * 0.01
    x0 = w[0].copy()
    want_w = w.tolist()
    want = _python_quadratic_general(want_w, x.tolist(), sched.tolist(), steps.tolist(), alpha.tolist(),
                                     coef.tolist(), corr.tolist(), x0.tolist())
    loss = CKernel("quadratic_general", lib)(w, x, np.zeros(N, dtype=np.int64), sched, steps, alpha, coef, corr, x0, 0)
    return loss.tolist() == want and w.tolist() == want_w


def library() -> ctypes.CDLL | None:
    """``fused.c`` compiled (once per machine) and checked (once per process), or None: no C
    compiler, ``HPCFL_NO_CC``, a failed compile, or a build without IEEE arithmetic (a warning
    says which of the last two)."""
    if not _LIB:
        lib = cc.load(Path(__file__).with_name("fused.c"), FLAGS)
        if lib is not None:
            try:
                ieee = bool(lib.hpcfl_fused_ieee()) and _agrees_with_python(lib)
            except (AttributeError, TypeError, ValueError, ctypes.ArgumentError) as err:   # a symbol missing: numba's
                warnings.warn(f"hpcfl: the C group kernels are off ({err}); numba's are used", stacklevel=2)
                lib = None
            else:
                if not ieee:
                    warnings.warn(f"hpcfl: the C group kernels ({lib._name}) do not keep IEEE arithmetic with this "
                                  f"compiler (fast-math or FMA contraction); numba's are used. Set HPCFL_CC to a "
                                  f"compiler with IEEE semantics", stacklevel=2)
                    lib = None
        _LIB.append(lib)
    return _LIB[0]


def kernel(kind: str) -> CKernel | None:
    """The C group kernel of ``kind`` (:data:`hpcfl.client.fused.KINDS`), or None (see :func:`library`)."""
    lib = library()
    return None if lib is None else CKernel(kind, lib)
