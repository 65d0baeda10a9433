"""FedLGA's server correction: spec tests A1, A3-A5, A7 and C2 (its runs: A2, A6, A8, C4 in test_straggler.py).

Two ways in: :func:`hpcfl.algorithms.fedlga.correct` (one slow client's approximated full
update), and the engine path, where a real :class:`hpcfl.algorithms.Algorithm` runs the round
hooks on hand-made client results exactly as ``hpcfl.engine.simulation.run`` does (pack the complete
clients, hold the slow ones, release, pack the held ones, one exact sum, ``server_step``).

Notation (as in hpcfl/algorithms/fedlga.py): D_i = x_i - x^t, S_i the steps run, Dbar the complete
clients' mean update, g_i = D_i / (lr S_i), and D~_i = D_i + lam G_i (beta Dbar + sigma D_i) with
G_i = g_i g_i^T (rank1) or diag(g_i * g_i) (diag); (beta, sigma) = (-1, +1) for the pseudo-gradient
reading C_pseudo (the default), (+1, -1) for B_alg1, (+1, +1) for A_table1 (SIGNS below, written here
independently of the code's table).
"""

import json
import math
import os
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest
import torch
from mpi4py import MPI
from runner import job

from hpcfl import config
from hpcfl.algorithms import Algorithm
from hpcfl.algorithms.fedlga import LgaOptions, correct
from hpcfl.algorithms.protocol import RoundContext
from hpcfl.client.trainer import ClientResult
from hpcfl.parallel.comm import Collectives, ExactSum

VARIANTS = ("C_pseudo", "B_alg1", "A_table1")
# B_alg1's rank1 alpha_i is clipped at 0 unless alpha_min is set: the operator tests below check the unguarded
# formula, so they lift the guard (test_fedlga_readings.py checks the guard itself)
UNGUARDED = {"alpha_min": -1e30}   # finite: runner.job passes overrides as JSON text, which has no -inf
SIGNS = {"C_pseudo": (-1.0, 1.0), "B_alg1": (1.0, -1.0), "A_table1": (1.0, 1.0)}    # (beta, sigma)
# The three ways the rule can run: rank1 (two reductions), diag fused into the training reduction (one),
# and diag with a correction clip, which needs Dbar first (two reductions); the clip is set far above any
# correction in these tests, so it never binds and all three compute the same D~_i.
PATHS = {"rank1": {"hessian": "rank1"}, "diag_fused": {"hessian": "diag"},
         "diag_clip": {"hessian": "diag", "corr_clip_ratio": 1e6}}


def engine_round(w, deltas, steps, full_steps, lr, eta_g=1.0, **algorithm):
    """One server round through the real hooks on a single rank.

    Parameters
    ----------
    w : (P,) the round-start model.  deltas : (k, P) the clients' updates D_i.
    steps, full_steps : (k,) S_i run and the full local work; S_i < full is a slow client.
    lr, eta_g : client and server learning rates.  algorithm : overrides of ``[algorithm]``.

    Returns
    -------
    (new model, (client records, round records), the RoundContext, the ClientResults)
    """
    k, P = deltas.shape
    table = job(**{"algorithm.lr": lr, "algorithm.server_lr": eta_g, "algorithm.clients_per_round": k,
                   "data.num_clients": k, "runtime.dtype": "float64",
                   **{f"algorithm.{key}": v for key, v in algorithm.items()}})
    sizes = np.full(k, 10, dtype=np.int64)
    algo = Algorithm(config.from_dict(table), P, P, k, torch.device("cpu"), torch.float64, sizes)
    ids = np.arange(k)
    ctx = RoundContext(0, 1, 0, ids, sizes, sizes, np.zeros((k, 2), dtype=np.int64), lr, ids, ids,
                       Collectives(MPI.COMM_SELF), log=lambda msg: None)
    ctx.weights = algo.sampler.weights(algo.weights_policy.weights(ctx), ctx.cohort, ctx.draws)
    ctx.steps, ctx.full_steps = np.asarray(steps, dtype=np.int64), np.asarray(full_steps, dtype=np.int64)
    results = [ClientResult(torch.tensor(d, dtype=torch.float64), int(s), float(s), 0.0, 0)   # SGD: ||a||_1 = S
               for d, s in zip(deltas, steps)]
    acc, held = ExactSum(algo.layout.length), []
    for j in range(k):                     # hpcfl.engine.simulation.run, phases 3-5
        if algo.holds(ctx, j):
            held.append((j, j, results[j]))
            continue
        acc.add(algo.pack(ctx, j, j, results[j], float(ctx.weights[j])))
    algo.release(ctx, held)
    for j, slot, res in held:
        acc.add(algo.pack(ctx, j, slot, res, float(ctx.weights[j])))
    sums = acc.reduce(MPI.COMM_SELF, total=k, root=0)
    x, _ = algo.server_step(ctx, np.array(w, dtype=np.float64), sums)
    return x, algo.records(ctx), ctx, results


# ------------------------------------------------------------------------------------ A1
W = np.array([1.0, -1.0, 2.0])
LR = 0.5
D = np.array([[-1.0, 0.0, 0.5], [-3.0, 2.0, 0.5], [-1.0, 1.0, 0.0], [0.0, 2.0, 0.0]])
# E = 5 steps (step unit): clients 0, 1 ran all 5 (tau 1); client 2 ran 2 (tau = 5 - 2 + 1 = 4), client 3 ran 4
# (tau 2). So full_steps = 5 for everyone and S = steps run.
S, FULL = [5, 5, 2, 4], [5, 5, 5, 5]
# spec section 6, A1: (variant, hessian) -> D~_2, D~_3, mean update, w (eta_g 1), w (eta_g 2), (alpha_2, alpha_3)
TABLE = {
    # C_pseudo rank1: v_2 = D_2 - Dbar = [1, 0, -0.5], g_2 . v_2 = -1, D~_2 = D_2 - g_2 = 0 (alpha 0);
    # v_3 = [2, 1, -0.5], g_3 . v_3 = 1, D~_3 = [0, 3, 0] (alpha 1.5).
    # diag: g_2^2 v_2 = [1, 0, 0], g_3^2 v_3 = [0, 1, 0]
    ("C_pseudo", "rank1"): ([0, 0, 0], [0, 3, 0], [-1, 1.25, 0.25], [0, 0.25, 2.25], [-1, 1.5, 2.5], (0, 1.5)),
    ("C_pseudo", "diag"): ([0, 1, 0], [0, 3, 0], [-1, 1.5, 0.25], [0, 0.5, 2.25], [-1, 2, 2.5], None),
    ("A_table1", "rank1"): ([-6, 6, 0], [0, 5, 0], [-2.5, 3.25, 0.25], [-1.5, 2.25, 2.25], [-4, 5.5, 2.5], (6, 2.5)),
    ("A_table1", "diag"): ([-4, 3, 0], [0, 5, 0], [-2, 2.5, 0.25], [-1, 1.5, 2.25], [-3, 4, 2.5], None),
    ("B_alg1", "rank1"): ([-2, 2, 0], [0, 1, 0], [-1.5, 1.25, 0.25], [-0.5, 0.25, 2.25], [-2, 1.5, 2.5], (2, 0.5)),
    ("B_alg1", "diag"): ([-2, 1, 0], [0, 1, 0], [-1.5, 1, 0.25], [-0.5, 0, 2.25], [-2, 1, 2.5], None),
}


@pytest.mark.parametrize("variant,hessian", list(TABLE))
def test_A1_hand_table_through_correct_and_the_mean(variant, hessian):
    """The spec's hand table, via ``correct`` and the uniform mean, exact in float64.

    Every input and every intermediate (g_2 = D_2 / (0.5 * 2), g_3 = D_3 / 2, Dbar = [-2, 1, 0.5]) is a
    short dyadic fraction, so float64 arithmetic is exact and the table's numbers (worked by hand in the
    spec, e.g. A rank1: v_2 = Dbar + D_2 = [-3, 2, 0.5], g_2 . v_2 = 5, D~_2 = D_2 + 5 g_2 = [-6, 6, 0]) must
    come out bit for bit.
    """
    t2, t3, mean, w1, w2, alphas = TABLE[variant, hessian]
    opts = LgaOptions(variant=variant, hessian=hessian)
    dbar = D[:2].mean(axis=0)
    assert np.array_equal(dbar, [-2, 1, 0.5]) and np.array_equal(W + dbar, [-1, 0, 2.5])   # w^_E
    c2, a2 = correct(D[2], S[2], FULL[2], dbar, LR, opts)
    c3, a3 = correct(D[3], S[3], FULL[3], dbar, LR, opts)
    assert np.array_equal(c2, t2) and np.array_equal(c3, t3)
    if alphas is None:
        assert math.isnan(a2) and math.isnan(a3)
    else:
        assert (a2, a3) == alphas
    update = (D[0] + D[1] + c2 + c3) / 4
    assert np.array_equal(update, mean)
    assert np.array_equal(W + 1 * update, w1) and np.array_equal(W + 2 * update, w2)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("eta_g", [1.0, 2.0])
def test_A1_hand_table_through_the_engine_hooks(path, variant, eta_g):
    """The same table through the real hooks, on the rank1 (two reductions), diag fused (one reduction) and
    diag + non-binding corr_clip_ratio (two reductions) paths: w^{t+1} exactly the table's.

    The exact sum is exact here (dyadic values on a 2^-58 grid), and the uniform weights are 1 each, so the
    engine must reproduce the hand numbers bit for bit; the policy collectives show which path ran.
    """
    opts = PATHS[path]
    t2, t3, _, w1, w2, alphas = TABLE[variant, opts["hessian"]]
    x, (clients, rounds), ctx, _ = engine_round(W, D, S, FULL, LR, eta_g, name="fedlga", **{
        "lga.variant": variant, **{f"lga.{k}": v for k, v in opts.items()}})
    assert np.array_equal(x, w1 if eta_g == 1 else w2), x
    assert rounds["lga_corrected"] == 2 and rounds["lga_no_full"] == 0
    assert ctx.collective.calls == {"rank1": ["lga_full", "lga_alpha"], "diag_fused": [],
                                    "diag_clip": ["lga_full"]}[path]
    expect_alpha = [np.nan, np.nan, *alphas] if alphas else [np.nan] * 4
    assert np.array_equal(clients["lga_alpha"], expect_alpha, equal_nan=True)


def test_A1_fedavg_and_fednova_rows_through_the_engine():
    """FedAvg: mean D = [-5, 5, 1] / 4 = [-1.25, 1.25, 0.25], w = [-0.25, 0.25, 2.25] (exact, dyadic).

    FedNova (p = 1/4, tau_eff = sum p S = 16/4 = 4): 4 * sum_i D_i / (4 S_i) = D_0/5 + D_1/5 + D_2/2 + D_3/4 =
    [-1.3, 1.4, 0.2], w = [-0.3, 0.4, 2.2]. Tenths are not binary fractions, so that row is checked to 1e-15
    (a few ulps), not bitwise.
    """
    x, *_ = engine_round(W, D, S, FULL, LR, name="fedavg", weights="uniform")
    assert np.array_equal(x, [-0.25, 0.25, 2.25])
    x, *_ = engine_round(W, D, S, FULL, LR, name="fednova", weights="uniform")
    np.testing.assert_allclose(x, [-0.3, 0.4, 2.2], rtol=0, atol=1e-15)


def test_A1_release_leaves_the_real_update_to_other_policies():
    """docs/architecture.md: only the server rule reads res.adjusted; other policies (SCAFFOLD's c_i) still
    see the client's actual update. After release (default variant C_pseudo: D~_3 = [0, 3, 0]), res.delta of
    slow client 3 must still be D_3 = [0, 2, 0]."""
    _, _, _, results = engine_round(W, D, S, FULL, LR, name="fedlga")
    assert np.array_equal(results[3].adjusted[:3], [0, 3, 0])
    assert np.array_equal(results[3].delta.numpy(), D[3])


# ------------------------------------------------------------------------------- A3, A4
def random_client(n, seed):
    gen = np.random.default_rng(seed)
    return gen.standard_normal(n), gen.standard_normal(n)


@pytest.mark.parametrize("n", [1, 17, 300])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("proxy", ["avg_update", "raw_update"])
def test_A3_operators_equal_the_explicit_matrices(n, variant, proxy):
    """rank1: D + lam g (g . v) equals D + lam (outer(g, g) @ v); diag: D + lam diag(outer(g, g)) * v, rtol
    1e-12, with v = beta Dbar + sigma D and g = D / (lr S) (or D itself for raw_update). Only the summation
    order of g . v differs from the matrix product, so the two agree to rounding."""
    d, dbar = random_client(n, n)
    lr, steps, lam = 0.05, 3, 0.7
    g = d / (lr * steps) if proxy == "avg_update" else d
    beta, sigma = SIGNS[variant]
    v = beta * dbar + sigma * d
    for hessian, matrix in (("rank1", np.outer(g, g) @ v), ("diag", np.diag(np.outer(g, g)) * v)):
        lift = UNGUARDED if hessian == "rank1" else {}
        got, _ = correct(d, steps, 5, dbar, lr, LgaOptions(variant=variant, hessian=hessian, grad_proxy=proxy,
                                                              lam=lam, **lift))
        want = d + lam * matrix
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.abs(want).max())


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("lr", [0.05, 0.01])
def test_A4_rank1_correction_rescales_the_update(variant, lr):
    """rank1 + avg_update: g_i is parallel to D_i, so D~_i = alpha_i D_i with
    alpha_i = 1 + lam (beta D_i . Dbar + sigma ||D_i||^2) / (lr S_i)^2: cos(D~_i, D_i) = +-1 and D~_i == alpha_i D_i
    to 1e-12, and the reported alpha is that alpha. With lr S = 0.02 (lr 0.01, S 2) and ||D||^2 ~ 50, B's alpha
    is hugely negative (cos -1), A's and C's hugely positive (sigma ||D||^2 dominates D . Dbar)."""
    beta, sigma = SIGNS[variant]
    lam, signs = 0.9, set()
    for seed, steps in ((1, 2), (2, 3), (3, 4)):
        d, dbar = random_client(50, seed)
        got, alpha = correct(d, steps, 5, dbar, lr, LgaOptions(variant=variant, lam=lam, **UNGUARDED))
        want_alpha = 1 + lam * (beta * (d @ dbar) + sigma * (d @ d)) / (lr * steps) ** 2
        cos = got @ d / (np.linalg.norm(got) * np.linalg.norm(d))
        assert abs(abs(cos) - 1) <= 1e-12
        np.testing.assert_allclose(got, want_alpha * d, rtol=1e-12, atol=0)
        assert alpha == pytest.approx(want_alpha, rel=1e-12)
        signs.add(np.sign(cos))
    if lr == 0.01:
        assert signs == {sigma}


# ------------------------------------------------------------------------------- A5, C2
def alg2_pseudo_gradients(w, P, steps, full, lr, eta_g, variant, hessian, lam, flip_g=False):
    """Alg. 2 in model space, written independently of the engine, storing pseudo-gradients P_i = w - x_i.

    The pseudo-gradient reading (C) takes Delta = P in every line: the full-E model estimate of line 7 is
    w - mean_K2 Delta (a pseudo-gradient points away from the new model) and the step of line 14 is
    w - eta_g mean Delta~. The Table I reading (A) keeps Delta = P but line 7 as printed (w + mean) and only
    line 14's sign flipped so it descends; the Alg. 1 reading (B) receives Delta = x_i - w = -P and reads every
    line as printed. The models w_i = w - P_i and w^_E are formed explicitly; G_i uses g_i = P_i / (lr S_i)
    (its sign is irrelevant: ``flip_g`` negates it).
    """
    delta = -P if variant == "B_alg1" else P
    local = w - P                                               # x_i, recovered from what the server holds
    done = [i for i in range(len(P)) if steps[i] == full[i]]
    w_hat = w - delta[done].mean(axis=0) if variant == "C_pseudo" else w + delta[done].mean(axis=0)   # line 7
    out = []
    for i in range(len(P)):
        if steps[i] == full[i]:
            out.append(delta[i])
            continue
        g = (-1 if flip_g else 1) * P[i] / (lr * steps[i])
        d = w_hat - local[i]
        out.append(delta[i] + lam * (g * (g @ d) if hessian == "rank1" else g * g * d))   # line 11
    mean = np.mean(out, axis=0)
    return w + eta_g * mean if variant == "B_alg1" else w - eta_g * mean                  # line 14


def random_round(seed, k=10, n=40):
    gen = np.random.default_rng(seed)
    w, deltas = gen.standard_normal(n), 0.1 * gen.standard_normal((k, n))
    steps = gen.integers(1, 6, size=k)
    steps[:3], steps[3:5] = 5, (2, 3)          # at least three complete and two slow clients
    return w, deltas, steps, np.full(k, 5)


@pytest.mark.parametrize("hessian", ["rank1", "diag"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_A5_pseudo_gradient_implementation_gives_the_same_model(variant, hessian):
    """The engine (displacements D) and the independent pseudo-gradient Alg. 2 (P = -D, models formed
    explicitly) give the same w^{t+1} to 1e-12, and negating g in the latter changes nothing: G = g g^T
    and diag(g * g) are even in g, and float negation is exact, so the flipped run is bitwise equal."""
    w, deltas, steps, full = random_round(7)
    lr, eta_g, lam = 0.1, 1.5, 0.8
    lift = {"lga.alpha_min": -1e30} if hessian == "rank1" else {}
    x, *_ = engine_round(w, deltas, steps, full, lr, eta_g, name="fedlga", **{
        "lga.variant": variant, "lga.hessian": hessian, "lga.lam": lam, **lift})
    ref = alg2_pseudo_gradients(w, -deltas, steps, full, lr, eta_g, variant, hessian, lam)
    flipped = alg2_pseudo_gradients(w, -deltas, steps, full, lr, eta_g, variant, hessian, lam, flip_g=True)
    np.testing.assert_allclose(x, ref, rtol=1e-12, atol=1e-12)
    assert np.array_equal(ref, flipped)


def fedlga_aggregate(w, D, tau, S, lr, eta_g, lam=1.0, variant="C_pseudo", hessian="rank1"):
    """The spec's single-process mathematical form (section 2.10), in numpy, uniform mean, with the sign
    of Dbar of the pseudo-gradient reading."""
    beta, sigma = SIGNS[variant]
    full = [i for i in range(len(D)) if tau[i] == 1]
    slow = [i for i in range(len(D)) if tau[i] > 1]
    if not full:
        return w + eta_g * D.mean(axis=0)
    dbar = D[full].mean(axis=0)
    agg = D[full].sum(axis=0)
    for i in slow:
        g = D[i] / (lr * S[i])
        v = beta * dbar + sigma * D[i]
        agg = agg + D[i] + lam * (g * (g @ v) if hessian == "rank1" else g * g * v)
    return w + eta_g * agg / len(D)


@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("variant", VARIANTS)
def test_C2_reference_aggregate_equals_the_two_phase_engine(variant, path):
    """fedlga_aggregate (spec 2.10) on random inputs equals the engine's hook path within 1e-10 (float64;
    tau_i = E - S_i + 1 with E = 5 steps), for both variants and every reduction path."""
    w, deltas, steps, full = random_round(11, k=12, n=64)
    lr, eta_g, lam = 0.05, 1.0, 1.0
    opts = {**PATHS[path], **(UNGUARDED if path == "rank1" else {})}
    x, *_ = engine_round(w, deltas, steps, full, lr, eta_g, name="fedlga", **{
        "lga.variant": variant, **{f"lga.{k}": v for k, v in opts.items()}})
    ref = fedlga_aggregate(w, deltas, full - steps + 1, steps, lr, eta_g, lam, variant, opts["hessian"])
    np.testing.assert_allclose(x, ref, rtol=1e-10, atol=1e-10)
    assert not np.allclose(ref, fedlga_aggregate(w, deltas, np.ones(len(steps)), steps, lr, eta_g))  # LGA acted


# ----------------------------------------------------------------------------------- A7
A7_TIMING = """
import json, pathlib, sys, time, types
import numpy as np
import hpcfl

# fedlga.py needs only numpy and its siblings protocol.py and server.py: skip the package __init__, whose
# torch import would cost more than the timing itself
sub = types.ModuleType("hpcfl.algorithms")
sub.__path__ = [str(pathlib.Path(hpcfl.__file__).parent / "algorithms")]
sys.modules["hpcfl.algorithms"] = sub
from hpcfl.algorithms.fedlga import LgaOptions, correct


def reference(d, dbar):
    # a known O(n) kernel with correct's memory traffic: three fresh (n,) arrays, one dot product
    v = 0.5 * d
    v += dbar
    g = d / 0.02
    return g * float(g @ v)


cost = {"rank1": [], "diag": []}
for n in (10**5, 10**6, 10**7):
    dbar = np.random.default_rng(0).random(n)
    d = 0.7 * dbar
    for h in cost:
        opts, pairs = LgaOptions(hessian=h), []
        for k in range(25):      # slow clients: S = 2, 3, 4 of 5
            t0 = time.perf_counter()
            reference(d, dbar)
            t1 = time.perf_counter()
            correct(d, 2 + k % 3, 5, dbar, 0.01, opts)
            pairs.append((time.perf_counter() - t1) / (t1 - t0))
        cost[h].append(float(np.median(pairs)))
json.dump(cost, sys.stdout)
"""


@pytest.mark.timing
def test_A7_correction_is_linear_in_time():
    """The spec's law (each 10x step in n costs <= 20x time; an n x n operator costs 100x) at n = 1e5, 1e6,
    1e7, both hessian modes, with time measured in units of a known O(n) kernel of the same memory traffic.

    Raw wall-clock ratios are not a property of ``correct`` on a shared machine: the kernel alone measured
    7x for 1e5 -> 1e6 (1e5 fits in cache) and 14-23x for 1e6 -> 1e7 under another test worker's memory
    traffic, and the raw law failed CI once at 30x. So each of 25 corrections is timed right after one call
    of the reference kernel, the pair's ratio taken, and the median kept: load that slows both alike cancels,
    a spike falls out of the median. The law becomes: the median cost in kernel units grows <= 2x per 10x
    step in n (which is the spec's 20x where the kernel scales 10x). Measured here: 0.8-1.1x, idle or beside
    two memory-bound processes; with one extra O(n) pass per 1e5 elements (n^2 / 1e5 work) it is 2.8x.
    One BLAS thread (OpenBLAS's thread hand-offs dominate a 1e5 dot product on two busy cores); glibc's
    mmap threshold pinned at 128 KiB so every size allocates alike, whatever the process's history."""
    env = {**os.environ, "GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=131072", "OPENBLAS_NUM_THREADS": "1",
           "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", A7_TIMING], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    for h, (c5, c6, c7) in json.loads(out.stdout).items():
        assert c6 <= 2 * c5 and c7 <= 2 * c6, (h, c5, c6, c7)


@pytest.mark.parametrize("hessian", ["rank1", "diag"])
def test_A7_correction_memory_is_linear(hessian):
    """tracemalloc peak of one correction at n = 1e6, beyond its inputs: at least the (n,) result (so numpy's
    allocations are traced) and at most 4 n 8 bytes: ``correct`` keeps at most three (n,) temporaries (g, v
    or corr, and the result), never an n x n array (8 TB here)."""
    n = 10**6
    dbar = np.random.default_rng(0).random(n)
    d = 0.7 * dbar
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        correct(d, 2, 5, dbar, 0.01, LgaOptions(hessian=hessian))
        peak = tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()
    assert n * 8 <= peak <= 4 * n * 8, peak


def test_alpha_min_minus_inf_lifts_b_alg1s_guard_and_other_options_stay_finite():
    """alpha_min = -inf (TOML's -inf) is the paper's B_alg1 with no clip: alpha = -2 passes through, while the
    unset default clips it to 0 (hpcfl's guard). Other options still refuse an infinity."""
    d = np.array([1.0, 0.0])                   # a slow client, D = (1, 0), S = 1 of E = 2 steps, lr 1
    dbar = np.array([-2.0, 0.0])               # B: D + G(Dbar - D), G = g g^T, g = D / (lr S) = D:
    #                                            alpha = 1 + (D.Dbar - ||D||^2) = 1 + (-2 - 1) = -2
    free, a_free = correct(d, 1, 2, dbar, 1.0, LgaOptions(variant="B_alg1", alpha_min=-math.inf))
    guarded, a_guarded = correct(d, 1, 2, dbar, 1.0, LgaOptions(variant="B_alg1"))
    assert (a_free, a_guarded) == (-2.0, 0.0)
    np.testing.assert_array_equal(free, [-2.0, 0.0])
    np.testing.assert_array_equal(guarded, [0.0, 0.0])
    table = {"run": {"rounds": 1}, "data": {"dataset": "digits"}, "model": {"name": "logreg"},
             "algorithm": {"name": "fedlga", "lga": {"variant": "B_alg1", "alpha_min": -math.inf}}}
    assert config.from_dict(table).to_dict()["algorithm"]["lga"]["alpha_min"] == -math.inf
    with pytest.raises(config.ConfigError, match="lam = inf must be finite"):
        config.from_dict({**table, "algorithm": {"name": "fedlga", "lga": {"lam": math.inf}}})
