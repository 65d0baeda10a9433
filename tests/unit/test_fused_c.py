"""The group kernels' C form (hpcfl/client/fused.c, loaded by hpcfl.client.fused_c) against numba's.

The C form is what ``vectorize = "auto"`` uses wherever a C compiler is found, so that a run's
start-up does not import numba; it must give numba's bits, on every kind, dtype and solver option,
for random inputs of several shapes (partial batches, clients with 0 steps, SCAFFOLD's corrections).
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hpcfl.client import fused, fused_c
from hpcfl.native import cc

REPO = Path(__file__).resolve().parents[2]
needs_cc = pytest.mark.skipif(cc.compiler() is None or os.environ.get("HPCFL_NO_CC"),
                              reason="no C compiler on this machine (or HPCFL_NO_CC is set)")
try:
    import numba  # noqa: F401   (the reference form)

    HAVE_NUMBA = not os.environ.get("HPCFL_NO_NUMBA")
except ImportError:
    HAVE_NUMBA = False
needs_both = pytest.mark.skipif(cc.compiler() is None or os.environ.get("HPCFL_NO_CC") or not HAVE_NUMBA,
                                reason="needs a C compiler and numba")

# (G clients, S steps, B batch, N samples, F features (logreg) or dim, C classes)
SHAPES = [(1, 1, 1, 5, 3, 2), (7, 5, 8, 50, 12, 5), (3, 9, 20, 300, 60, 10), (64, 4, 20, 500, 61, 10)]
SOLVERS = {"sgd": (0.0, 0.0, 0.0), "all": (1e-3, 0.3, 0.9)}   # weight decay, mu, momentum


def case(kind, dtype, G, S, B, N, F, C, solver, with_corr, seed):
    """Random arguments of a group kernel call, as fused.train_group builds them."""
    r = np.random.default_rng(seed)
    y = np.zeros(N, dtype=np.int64)
    if kind == "logreg":
        P, x, y = C * F + C, r.standard_normal((N, F)), r.integers(0, C, N)
    elif kind == "quadratic":
        P, x = F, r.standard_normal((N, F))
    else:
        P, x = F, r.standard_normal((N, 3, F))
        x[:, 1] = np.abs(x[:, 1]) + 0.5
    w = r.standard_normal((G, P)) * 0.3
    if kind == "logreg" and G > 1:   # client 0: a logit far above the rest (exp underflows for the others)
        w[0, :2] = 40.0
    sched = r.integers(0, N, (S, G, B))
    for g in range(G):   # a partial last batch (a prefix of valid rows, -1 after)
        sched[S - 1, g, r.integers(1, B + 1):] = -1
    steps = r.integers(1, S + 1, G)
    steps[G // 2] = 0 if G > 2 else steps[G // 2]       # a client with no steps
    alpha = np.array([-0.05 * 0.97**k for k in range(S)], dtype=dtype)
    coef = np.array([*SOLVERS[solver], 1.0, 0.0, 0.5], dtype=dtype)
    corr = (r.standard_normal((G, P)) * 0.01 if with_corr else np.zeros((0, P))).astype(dtype)
    return (w.astype(dtype), x.astype(dtype), y, sched, steps.astype(np.int64), alpha, coef, corr,
            w[0].astype(dtype), C)


@needs_both
@pytest.mark.parametrize("kind", fused.KINDS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_c_and_numba_group_kernels_give_the_same_bits(kind, dtype):
    from hpcfl.client import fused_kernels

    kc, kn = fused_c.kernel(kind), fused_kernels.compiled(kind)
    assert kc is not None and fused.backend(kc) == "c" and fused.backend(kn) == "numba"
    for i, shape in enumerate(SHAPES):
        for solver in SOLVERS:
            for with_corr in (False, True):
                args = case(kind, dtype, *shape, solver, with_corr, seed=i)
                wc, wn = args[0].copy(), args[0].copy()
                lc, ln = kc(wc, *args[1:]), kn(wn, *args[1:])
                where = f"{kind} {np.dtype(dtype)} shape {shape} {solver} corr={with_corr}"
                assert wc.dtype == wn.dtype == dtype and lc.dtype == ln.dtype == np.float64
                assert not np.array_equal(wc, args[0]), where                  # it trained
                assert np.isfinite(wc).all() and np.isfinite(lc).all(), where
                assert np.array_equal(wc, wn), where                           # the same bits
                assert np.array_equal(lc, ln), where


@needs_cc
def test_the_c_logreg_step_by_hand():
    """One sample, W = 0: softmax is uniform (C = 3, x = (2, -1), y = 1, lr = 0.5): dl/dz =
    (1/3, -2/3, 1/3), dl/dW = dl/dz x^T, dl/db = dl/dz, loss = log 3; no numba needed."""
    w = np.zeros((1, 9))
    loss = fused_c.kernel("logreg")(w, np.array([[2.0, -1.0]]), np.array([1]), np.array([[[0]]]), np.array([1]),
                                    np.array([-0.5]), np.array([0, 0, 0, 1, 0, 0.5]), np.zeros((0, 9)), np.zeros(9), 3)
    t = 1 / 3
    dz = np.array([t, t - 1, t])
    np.testing.assert_allclose(w[0], -0.5 * np.concatenate([np.outer(dz, [2.0, -1.0]).ravel(), dz]), rtol=1e-15)
    assert loss[0] == pytest.approx(np.log(3), rel=1e-15)


@needs_cc
def test_the_c_kernel_refuses_what_numba_refuses():
    """Wrong dtypes, layouts and shapes are errors in Python, never a read out of bounds in C."""
    k = fused_c.kernel("quadratic")
    args = list(case("quadratic", np.float64, 3, 2, 4, 10, 5, 0, "all", True, seed=0))
    k(args[0].copy(), *args[1:])
    for i, bad, err in ((0, args[0].astype(np.float32), TypeError),          # w float32, the rest float64
                        (1, np.asfortranarray(np.ones((10, 5))), TypeError),                  # Fortran order
                        (1, np.ones((10, 4)), ValueError),                     # dim 4 for weights of 5
                        (4, np.array([9, 1, 1]), ValueError),                  # more steps than scheduled
                        (7, np.ones((2, 5)), ValueError)):                     # corrections for 2 of 3 clients
        with pytest.raises(err):
            k(*[bad if j == i else a for j, a in enumerate(args)])


def _fresh(monkeypatch, tmp_path):
    monkeypatch.setenv("HPCFL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("HPCFL_NO_CC", raising=False)
    monkeypatch.setattr(fused_c, "_LIB", [])


@needs_cc
@pytest.mark.skipif("fma" not in Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else True,
                    reason="needs an x86 CPU with FMA")
def test_a_build_that_fuses_into_fma_is_refused(tmp_path, monkeypatch):
    """Built with FMA contraction the library's bits differ from numba's: the check against the Python
    transcription catches it, and the kernel is not used."""
    _fresh(monkeypatch, tmp_path)
    monkeypatch.setattr(fused_c, "FLAGS", ("-O3", "-mfma", "-ffp-contract=fast", "-lm"))
    with pytest.warns(UserWarning, match="do not keep IEEE arithmetic"):
        assert fused_c.kernel("logreg") is None


@needs_cc
def test_a_fast_math_build_is_refused(tmp_path, monkeypatch):
    _fresh(monkeypatch, tmp_path)
    monkeypatch.setattr(fused_c, "FLAGS", ("-O3", "-ffast-math", "-lm"))
    with pytest.warns(UserWarning, match="do not keep IEEE arithmetic"):
        assert fused_c.kernel("quadratic") is None


def _form_in_a_fresh_process(tmp_path, **env):
    code = ("import sys; from hpcfl.client import fused; k = fused.kernel('logreg'); "
            "print(None if k is None else fused.backend(k), 'numba' in sys.modules)")
    env = {**{k: v for k, v in os.environ.items() if k not in ("HPCFL_NO_CC", "HPCFL_NO_NUMBA", "NUMBA_CACHE_DIR")},
           "PYTHONPATH": str(REPO), "HPCFL_CACHE_DIR": str(tmp_path / "cache"), **env}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600,
                          check=True)
    return done.stdout.split()


@needs_both
def test_auto_takes_the_c_form_without_importing_numba_and_falls_back_to_numba(tmp_path):
    assert _form_in_a_fresh_process(tmp_path) == ["c", "False"]
    assert _form_in_a_fresh_process(tmp_path, HPCFL_NO_CC="1") == ["numba", "True"]
    assert _form_in_a_fresh_process(tmp_path, HPCFL_CC="no-such-compiler-here") == ["numba", "True"]
    assert _form_in_a_fresh_process(tmp_path, HPCFL_NO_CC="1", HPCFL_NO_NUMBA="1") == ["None", "False"]
    assert [p.name.split("-")[0] for p in (tmp_path / "cache" / "kernels").glob("*.so")] == ["fused"]
