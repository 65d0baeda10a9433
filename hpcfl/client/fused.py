"""Fused local training of tiny models: a whole group's round in one compiled call.

The batched torch step of :mod:`hpcfl.client.block` still launches ten to twenty small
kernels per local step; for multinomial logistic regression on CPU (Synthetic(1,1): 60
features, 10 classes, batches of 20) and for the quadratics of FedNova and GIFT that overhead
is most of the round. Here one numba-compiled function runs every local step of every client
of a group: the model's loss and closed-form gradient (logistic regression: log-sum-exp and
dl/dz = softmax(z) - onehot(y); the quadratic: x - e, or h (x - c) + n) and the solver's update,
with no allocation per step.

Numerics. The arithmetic is done in the model's dtype (scalars are cast to it first, as torch
casts ``alpha``), in a fixed order that does not depend on the vector width: a logit sums its
features in order, a gradient sums its batch in order, and the only reductions are scalar loops.
No fast-math, so LLVM neither reassociates nor contracts into FMA: the result does not depend on
the CPU's vector width (exp and log come from the C math library). Each client's loop reads only its own row, so a client's result does not depend on
which clients share its group, its rank or the rank count. It differs from torch's kernels (the
sequential loop and the batched step) by rounding only (tests/unit/test_block.py).
"""

from __future__ import annotations

import numpy as np

from ..native.jit import numba_or_none

_KERNELS: dict = {}   # kind -> compiled kernel or None, built on first use (compiled once, then numba's cache)
KINDS = ("logreg", "quadratic", "quadratic_general")


def _compile(kind: str):
    """The compiled group kernel of ``kind``, or None where numba cannot be had (or ``HPCFL_NO_NUMBA``)."""
    numba = numba_or_none()
    if numba is None:
        return None

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

    def sigs(xdims: str) -> list:
        return [f"float64[::1](T[:, ::1], T[{xdims}::1], int64[::1], int64[:, :, ::1], int64[::1], T[::1], T[::1], "
                f"T[:, ::1], T[::1], int64)".replace("T", t) for t in ("float32", "float64")]

    if kind == "logreg":
        @numba.njit(sigs(":, "), cache=True, nogil=True)
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

        return logreg_group

    if kind == "quadratic":
        @numba.njit(sigs(":, "), cache=True, nogil=True)
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

        return quadratic_group

    @numba.njit(sigs(":, :, "), cache=True, nogil=True)
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

    return quadratic_general_group


def kernel(kind: str = "logreg"):
    """The compiled group kernel of ``kind`` (one of :data:`KINDS`), or None (numba missing or disabled)."""
    if kind not in _KERNELS:
        _KERNELS[kind] = _compile(kind)
    return _KERNELS[kind]


def train_group(kern, w: np.ndarray, x: np.ndarray, y: np.ndarray, sched: np.ndarray,
                steps: np.ndarray, spec, lr: float, corr: np.ndarray | None, x0: np.ndarray,
                classes: int = 0) -> np.ndarray:
    """Run every local step of G clients in place; their loss sums (G,) float64.

    Parameters
    ----------
    kern : a compiled kernel (:func:`kernel`)
    w : (G, P) weights per client, updated in place (logreg: [W (C, F) | b (C,)], P = C*F + C;
        the quadratic: x, P = dim)
    x : the training set in w's dtype: logreg (N, F) flattened, quadratic (N, dim) centres or
        (N, 3, dim) rows [c; h; n];  y : (N,) int64 labels (read by logreg only)
    sched : (S, G, B) int64 sample indices per step and client, -1 after a partial batch's end;
        client g uses its first ``steps[g]`` rows
    steps : (G,) int64
    spec : SolverSpec;  lr : this round's learning rate
    corr : (G, P) solver corrections (SCAFFOLD, VR) or None;  x0 : (P,) the round-start weights
    classes : C (logreg)
    """
    # -lr * gamma**k in Python floats, then cast: what LocalSolver passes to torch's add_ as alpha
    alpha = np.array([-lr * (spec.decay**k if spec.decay != 1.0 else 1.0) for k in range(sched.shape[0])],
                     dtype=w.dtype)
    coef = np.array([spec.weight_decay, spec.mu, spec.momentum, 1.0, 0.0, 0.5], dtype=w.dtype)
    corr = np.zeros((0, w.shape[1]), dtype=w.dtype) if corr is None else corr
    return kern(w, x, y, sched, steps.astype(np.int64), alpha, coef, corr, x0, int(classes))
