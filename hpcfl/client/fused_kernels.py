"""The compiled group kernels of :mod:`hpcfl.client.fused`, as module-level functions.

Imported only where numba can be had (:func:`hpcfl.native.jit.numba_or_none`, which also points
numba's cache at hpcfl's cache folder first). They live here, at module level, so that numba's
cache matches in the next process: a kernel defined inside a function is a closure over the
helpers it calls (``solver``, ``batch_weight``), and numba keys a closure's cache entry on a
pickle of its cells, whose dispatchers carry a fresh id in every process: the cache never
matched, every run compiled the kernel again (3 s) and added two files to the cache. Module
globals are not part of the key. The kernels are compiled (or loaded from the cache) only when
:func:`compiled` asks for one kind, so a run compiles only the kernel it uses.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(inline="always")
def solver(wg, grad, k, a, coef, corr, g, x0, u):   # pragma: no cover - compiled
    """LocalSolver.step, element by element: wd, prox, correction, momentum, the scaled step."""
    wd, mu, rho = coef[0], coef[1], coef[2]
    has_corr = corr.shape[0] > 0
    for p in range(wg.shape[0]):
        gp = grad[p]
        if wd != 0:
            gp = gp + wd * wg[p]
        if mu != 0:
            gp = gp + mu * (wg[p] - x0[p])
        if has_corr:
            gp = gp + corr[g, p]
        if rho != 0:
            gp = gp if k == 0 else rho * u[p] + gp
            u[p] = gp
        wg[p] = wg[p] + a * gp


@numba.njit(inline="always")
def batch_weight(rows, cnt, one):   # pragma: no cover - compiled
    """(valid samples n, 1/n in the dtype): torch's valid / count."""
    n = 0
    for b in range(rows.shape[0]):
        if rows[b] >= 0:
            n += 1
    cnt[0] = n
    return n, one / cnt[0]


def logreg_group(w, x, y, sched, steps, alpha, coef, corr, x0, classes):   # pragma: no cover - compiled
    G, P = w.shape
    F = x.shape[1]
    C = classes
    B = sched.shape[2]
    CF = C * F
    one, zero = coef[3], coef[4]         # 1 and 0 in the dtype (an int would promote float32 to float64)
    loss = np.zeros(G, dtype=np.float64)
    xt = np.empty((F, B), dtype=w.dtype)  # the batch, transposed: logits vectorise over samples
    z = np.empty((C, B), dtype=w.dtype)
    grad = np.empty(P, dtype=w.dtype)
    u = np.zeros(P, dtype=w.dtype)
    cnt = np.empty(1, dtype=w.dtype)
    for g in range(G):
        wg = w[g]
        for k in range(steps[g]):
            rows = sched[k, g]
            n, wt = batch_weight(rows, cnt, one)
            # gather the valid samples (a prefix: only an epoch's last batch is padded)
            for b in range(n):
                xi = x[rows[b]]
                for f in range(F):
                    xt[f, b] = xi[f]
            # logits z[c, b] = sum_f W[c, f] x_b[f] (in f order) + bias[c]
            for c in range(C):
                for b in range(n):
                    z[c, b] = 0
                for f in range(F):
                    wcf = wg[c * F + f]
                    for b in range(n):
                        z[c, b] += wcf * xt[f, b]
                bc = wg[CF + c]
                for b in range(n):
                    z[c, b] += bc
            # softmax - onehot, weighted 1/n, into z; the step's loss
            step_loss = zero
            for b in range(n):
                m = z[0, b]
                for c in range(1, C):
                    if z[c, b] > m:
                        m = z[c, b]
                yb = y[rows[b]]
                zy = z[yb, b] - m
                s = zero
                for c in range(C):
                    e = np.exp(z[c, b] - m)
                    z[c, b] = e
                    s += e
                step_loss += (zy - np.log(s)) * wt
                r = wt / s
                for c in range(C):
                    z[c, b] = z[c, b] * r
                z[yb, b] -= wt
            loss[g] -= step_loss
            # gradient: W rows sum the batch in order; the bias sums dz
            for c in range(C):
                gc = grad[c * F : (c + 1) * F]
                for f in range(F):
                    gc[f] = 0
                gb = zero
                for b in range(n):
                    d = z[c, b]
                    gb += d
                    xi = x[rows[b]]
                    for f in range(F):
                        gc[f] += d * xi[f]
                grad[CF + c] = gb
            solver(wg, grad, k, alpha[k], coef, corr, g, x0, u)
    return loss


def quadratic_group(w, x, y, sched, steps, alpha, coef, corr, x0, classes):   # pragma: no cover
    G, P = w.shape
    one, zero, half = coef[3], coef[4], coef[5]
    loss = np.zeros(G, dtype=np.float64)
    grad = np.empty(P, dtype=w.dtype)
    u = np.zeros(P, dtype=w.dtype)
    cnt = np.empty(1, dtype=w.dtype)
    for g in range(G):
        wg = w[g]
        for k in range(steps[g]):
            rows = sched[k, g]
            n, wt = batch_weight(rows, cnt, one)
            for p in range(P):
                grad[p] = 0
            step_loss = zero
            for b in range(n):   # l_b = 1/2 ||x - e_b||^2, dl_b/dx = x - e_b
                e = x[rows[b]]
                s = zero
                for p in range(P):
                    d = wg[p] - e[p]
                    s += d * d
                    grad[p] += d * wt
                step_loss += half * s * wt
            loss[g] += step_loss
            solver(wg, grad, k, alpha[k], coef, corr, g, x0, u)
    return loss


def quadratic_general_group(w, x, y, sched, steps, alpha, coef, corr, x0, classes):   # pragma: no cover
    G, P = w.shape
    one, zero, half = coef[3], coef[4], coef[5]
    loss = np.zeros(G, dtype=np.float64)
    grad = np.empty(P, dtype=w.dtype)
    u = np.zeros(P, dtype=w.dtype)
    cnt = np.empty(1, dtype=w.dtype)
    for g in range(G):
        wg = w[g]
        for k in range(steps[g]):
            rows = sched[k, g]
            n, wt = batch_weight(rows, cnt, one)
            for p in range(P):
                grad[p] = 0
            step_loss = zero
            for b in range(n):   # l_b = 1/2 sum_j h_j (x_j - c_j)^2 + n . x; dl_b/dx = h (x - c) + n
                c, h, nz = x[rows[b], 0], x[rows[b], 1], x[rows[b], 2]
                for p in range(P):
                    d = wg[p] - c[p]
                    hd = h[p] * d
                    step_loss += (nz[p] * wg[p] + half * hd * d) * wt
                    grad[p] += (hd + nz[p]) * wt
            loss[g] += step_loss
            solver(wg, grad, k, alpha[k], coef, corr, g, x0, u)
    return loss


def _sigs(xdims: str) -> list:
    return [f"float64[::1](T[:, ::1], T[{xdims}::1], int64[::1], int64[:, :, ::1], int64[::1], T[::1], T[::1], "
            f"T[:, ::1], T[::1], int64)".replace("T", t) for t in ("float32", "float64")]


PYTHON = {"logreg": (logreg_group, ":, "), "quadratic": (quadratic_group, ":, "),
          "quadratic_general": (quadratic_general_group, ":, :, ")}


def compiled(kind: str):
    """The numba-compiled kernel of ``kind`` (float32 and float64 signatures; loaded from numba's
    cache when an earlier process compiled it)."""
    func, xdims = PYTHON[kind]
    return numba.njit(_sigs(xdims), cache=True, nogil=True)(func)
