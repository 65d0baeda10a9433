"""Fused local training of tiny models: a whole group's round in one compiled call.

The batched torch step of :mod:`hpcfl.client.block` still launches ten to twenty small
kernels per local step; for multinomial logistic regression on CPU (Synthetic(1,1): 60
features, 10 classes, batches of 20) and for the quadratics of FedNova and GIFT that overhead
is most of the round. Here one compiled function (C through ctypes where a C compiler is
found, else numba's form of the same loops, with the same bits) runs every local step of every client
of a group: the model's loss and closed-form gradient (logistic regression: log-sum-exp and
dl/dz = softmax(z) - onehot(y); the quadratic: x - e, or h (x - c) + n) and the solver's update,
with no allocation per step.

Numerics. The arithmetic is done in the model's dtype (scalars are cast to it first, as torch
casts ``alpha``), in a fixed order that does not depend on the vector width: a logit sums its
features in order, a gradient sums its batch in order, and the only reductions are scalar loops.
No fast-math, so neither LLVM nor the C compiler reassociates or contracts into FMA: the result does
not depend on the CPU's vector width (exp and log come from the C math library, in both forms).
Each client's loop reads only its own row, so a client's result does not depend on
which clients share its group, its rank or the rank count. It differs from torch's kernels (the
sequential loop and the batched step) by rounding only (tests/unit/test_block.py).
"""

from __future__ import annotations

import numpy as np

from ..native.jit import numba_or_none

_KERNELS: dict = {}   # kind -> the chosen kernel or None, resolved on first use
# the kernels themselves: C in hpcfl/client/fused.c (loaded by fused_c.py), numba's in fused_kernels.py
KINDS = ("logreg", "quadratic", "quadratic_general")


def _compile(kind: str):
    """The group kernel of ``kind``: its C form (:mod:`hpcfl.client.fused_c`: compiled once per
    machine, loaded in about a millisecond, numba never imported), else numba's (the same bits),
    else None (no C compiler or ``HPCFL_NO_CC``, and no numba or ``HPCFL_NO_NUMBA``)."""
    from . import fused_c

    k = fused_c.kernel(kind)
    if k is not None:
        return k
    if numba_or_none() is None:
        return None
    # imports numba: only once it is known to be there (and its cache folder is set)
    from . import fused_kernels

    return fused_kernels.compiled(kind)


def kernel(kind: str = "logreg"):
    """The compiled group kernel of ``kind`` (one of :data:`KINDS`), or None (neither C nor numba can
    be had, or both are switched off); its form is :func:`backend`."""
    if kind not in _KERNELS:
        _KERNELS[kind] = _compile(kind)
    return _KERNELS[kind]


def backend(kern) -> str:
    """``"c"`` or ``"numba"``: which form the kernel ``kern`` (from :func:`kernel`) is."""
    return getattr(kern, "backend", "numba")


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
