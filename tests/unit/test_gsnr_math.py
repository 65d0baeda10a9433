"""FedGSNR math: Theorem 3.7, Definition 4.1, eqs. 8-9, the step allocation, and the
per-sample gradient statistics (checks U1-U9; docs/algorithms/fedgsnr.md).

Reference: FedGSNR (Accelerating FL on non-iid data via maximum gradient signal-to-noise
ratio), Theorem 3.7 / Definition 4.1 / eqs. 8-9.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hpcfl.algorithms.gsnr_math import (
    allocate_steps,
    allocation_entropy,
    global_moments,
    optimal_steps,
    scaled_steps,
)
from hpcfl.client.stats import per_sample_moments, stats_sample
from hpcfl.models import build_model, model_options
from hpcfl.params import FlatModel

B = 64
D = 50


def _random_stats(seed: int, d: int = D):
    """(mu_l, v_l, mu_g, v_g): mu_g = a mu_l + noise with a in [-1.5, 2] (aligned or
    opposed), variances up to order B so that the sqrt(v / B) block can matter as much as
    the means (it always adds positive alignment to M)."""
    rng = np.random.default_rng(seed)
    mu_l = rng.normal(size=d)
    mu_g = rng.uniform(-1.5, 2.0) * mu_l + rng.normal(scale=0.7, size=d)
    scale = rng.uniform(0.02, 1.0)
    v_l = rng.gamma(2.0, B / 2, size=d) * scale
    v_g = rng.gamma(2.0, B / 2, size=d) * scale * rng.uniform(0.2, 3.0)
    return mu_l, v_l, mu_g, v_g


def _w2(n, mu_l, v_l, mu_g, v_g):
    """Brute-force ||mu_g - n mu_l||^2 + sum (sqrt(v_g/B) - n sqrt(v_l/B))^2; n shape (G,)."""
    n = np.asarray(n, dtype=np.float64)[:, None]
    return ((mu_g - n * mu_l) ** 2).sum(1) + ((np.sqrt(v_g / B) - n * np.sqrt(v_l / B)) ** 2).sum(1)


# U1 -- Theorem 3.7 against a grid search over n in [0, 5] (step 1e-3).
@pytest.mark.parametrize("seed", range(8))
def test_u1_nopt_is_grid_argmin(seed):
    stats = _random_stats(seed)
    res = optimal_steps(*stats, B)
    grid = np.arange(0, 5001) * 1e-3
    w2 = _w2(grid, *stats)
    assert res["n_opt"] < 5.0
    assert abs(grid[np.argmin(w2)] - res["n_opt"]) <= 1e-3
    assert np.isclose(w2.min(), res["delta2"], rtol=1e-6, atol=0)
    # At n_opt itself the objective is Delta^2 up to rounding.
    assert np.isclose(_w2([res["n_opt"]], *stats)[0], res["delta2"], rtol=1e-12)


def test_u1_covers_both_branches():
    # The seeds above include clients with n_opt = 0 (M <= 0) and n_opt > 0; keep it so.
    n = [optimal_steps(*_random_stats(s), B)["n_opt"] for s in range(8)]
    assert min(n) == 0.0 and max(n) > 0.1


# U2 -- identical statistics: one local step is one global step.
def test_u2_identity():
    mu, v, _, _ = _random_stats(11)
    res = optimal_steps(mu, v, mu, v, B, r_max=1e6)
    assert abs(res["n_opt"] - 1.0) <= 1e-12
    assert res["delta2"] <= 1e-12 * res["L"]
    assert res["gsnr"] == 1e6


# U3 -- scaling the client's gradients by c divides n_opt by c; the GSNR is an angle.
@pytest.mark.parametrize("c", [0.3, 2.5, 7.0])
def test_u3_scaling(c):
    mu_l, v_l, mu_g, v_g = _random_stats(4)
    base = optimal_steps(mu_l, v_l, mu_g, v_g, B)
    scaled = optimal_steps(c * mu_l, c * c * v_l, mu_g, v_g, B)
    assert base["n_opt"] > 0
    assert np.isclose(scaled["n_opt"], base["n_opt"] / c, rtol=1e-9)
    assert np.isclose(scaled["gsnr"], base["gsnr"], rtol=1e-9)


# U4 -- a client pulling the opposite way gets no steps.
def test_u4_opposition():
    rng = np.random.default_rng(4)
    mu_g, zero = rng.normal(size=D), np.zeros(D)
    res = optimal_steps(-mu_g, zero, mu_g, zero, B)
    assert res["n_opt"] == 0.0 and res["gsnr"] == 0.0
    assert res["M"] < 0 and res["delta2"] == res["L"]
    steps = allocate_steps(np.array([res["n_opt"], 0.4, 0.1]), e_const=5)
    np.testing.assert_array_equal(steps, [0, 12, 3])


# U5 -- r = cot(angle(a_l, a_g)) and r^2 = L / Delta^2 - 1.
@pytest.mark.parametrize("seed", range(20, 26))
def test_u5_gsnr_identities(seed):
    mu_l, v_l, mu_g, v_g = _random_stats(seed)
    mu_l = np.sign(mu_l @ mu_g) * mu_l   # into mu_g's half-space: M > 0
    res = optimal_steps(mu_l, v_l, mu_g, v_g, B)
    assert res["M"] > 0
    a_l = np.concatenate([mu_l, np.sqrt(v_l / B)])
    a_g = np.concatenate([mu_g, np.sqrt(v_g / B)])
    theta = np.arccos(a_l @ a_g / (np.linalg.norm(a_l) * np.linalg.norm(a_g)))
    assert np.isclose(res["gsnr"], 1.0 / np.tan(theta), rtol=1e-9)
    assert np.isclose(res["gsnr"] ** 2, res["L"] / res["delta2"] - 1.0, rtol=1e-9)
    assert np.isclose(res["L"], a_g @ a_g, rtol=1e-12)
    assert np.isclose(res["N"], a_l @ a_l, rtol=1e-12)


# U6 -- eqs. 8-9 are the law of total variance.
def test_u6_global_moments_pool_samples():
    rng = np.random.default_rng(6)
    sizes = [5, 17, 64, 30]
    G = rng.normal(loc=0.3, size=(sum(sizes), 20)) * rng.uniform(0.5, 2.0, size=20)
    parts = np.split(G, np.cumsum(sizes)[:-1])
    # p_k = B_k (unnormalised on purpose: global_moments divides by sum p).
    sum_pmu = sum(len(g) * g.mean(0) for g in parts)
    sum_pq = sum(len(g) * (g.var(0) + g.mean(0) ** 2) for g in parts)
    mu_g, v_g = global_moments(sum_pmu, sum_pq, float(sum(sizes)))
    np.testing.assert_allclose(mu_g, G.mean(0), rtol=1e-10)
    np.testing.assert_allclose(v_g, G.var(0), rtol=1e-10)


def test_u6_global_moments_weighted_mixture():
    rng = np.random.default_rng(7)
    sizes, p = [8, 3, 20], np.array([0.5, 1.7, 0.8])   # arbitrary, unnormalised weights
    parts = [rng.normal(loc=k, size=(s, 12)) for k, s in enumerate(sizes)]
    mus, vs = [g.mean(0) for g in parts], [g.var(0) for g in parts]
    mu_g, v_g = global_moments(sum(pk * m for pk, m in zip(p, mus)),
                               sum(pk * (v + m * m) for pk, v, m in zip(p, vs, mus)), float(p.sum()))
    # The mixture puts mass p_k / sum p on client k, spread evenly over its rows.
    rows = np.concatenate(parts)
    w = np.concatenate([np.full(s, pk / s) for s, pk in zip(sizes, p)])
    mean = np.average(rows, axis=0, weights=w)
    np.testing.assert_allclose(mu_g, mean, rtol=1e-10)
    np.testing.assert_allclose(v_g, np.average((rows - mean) ** 2, axis=0, weights=w), rtol=1e-10)


def test_u6_clamps_cancellation():
    mu_g, v_g = global_moments(np.array([3.0]), np.array([9.0 - 1e-15]), 1.0)
    assert v_g[0] == 0.0 and mu_g[0] == 3.0


# U7 -- per-sample statistics with torch.func.
@pytest.fixture(scope="module")
def lenet():
    torch.manual_seed(0)
    net = build_model("lenet5", model_options("lenet5")(), (3, 32, 32), 10)
    flat = FlatModel(net, torch.device("cpu"), torch.float64)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(B, 3, 32, 32, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 10, (B,), generator=gen)
    mu, v = per_sample_moments(flat.module, flat.params, x, y, F.cross_entropy, chunk=64)
    return flat, x, y, mu, v


def test_u7_mean_is_full_batch_gradient(lenet):
    flat, x, y, mu, v = lenet
    assert mu.dtype == v.dtype == torch.float64 and mu.shape == v.shape == (flat.num_params,) == (62006,)
    grad = flat.grad(F.cross_entropy(flat.module(x), y))
    torch.testing.assert_close(mu, grad, rtol=0, atol=1e-12)


def test_u7_variance_is_per_sample_loop(lenet):
    flat, x, y, mu, v = lenet
    rows = torch.stack([flat.grad(F.cross_entropy(flat.module(x[b : b + 1]), y[b : b + 1])) for b in range(B)])
    torch.testing.assert_close(mu, rows.mean(0), rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(v, rows.var(0, unbiased=False), rtol=1e-5, atol=1e-14)
    assert (v > 0).sum() > 0.5 * flat.num_params


def test_u7_chunking_does_not_change_result(lenet):
    flat, x, y, mu, v = lenet
    mu7, v7 = per_sample_moments(flat.module, flat.params, x, y, F.cross_entropy, chunk=7)
    torch.testing.assert_close(mu7, mu, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(v7, v, rtol=1e-12, atol=1e-15)


def test_u7_custom_loss_quadratic():
    # F(x; e) = 1/2 ||x - e||^2: per-sample gradient x - e, so mu = x - mean(e), v = var(e).
    net = build_model("quadratic", model_options("quadratic")(), (5,), 1)
    flat = FlatModel(net, torch.device("cpu"), torch.float64)
    flat.load(np.arange(5.0))
    e = torch.randn(10, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    mu, v = per_sample_moments(flat.module, flat.params, e, torch.zeros(10), flat.module.loss, chunk=3)
    torch.testing.assert_close(mu, flat.weights - e.mean(0), rtol=0, atol=1e-14)
    torch.testing.assert_close(v, e.var(0, unbiased=False), rtol=1e-12, atol=1e-14)


def test_u7_eval_mode_and_flags_restored():
    torch.manual_seed(3)
    net = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6), torch.nn.Dropout(0.5),
                              torch.nn.Linear(6, 3)).double()
    net[1].running_mean.normal_()
    net.train()
    net[2].eval()   # a mixed state must come back as it was
    x = torch.randn(9, 4, dtype=torch.float64)
    y = torch.randint(0, 3, (9,))
    mu, v = per_sample_moments(net, list(net.parameters()), x, y, F.cross_entropy, chunk=4)
    assert [m.training for m in net.modules()] == [True, True, True, False, True]
    net.eval()   # the statistics equal an eval-mode per-sample loop: running stats, no dropout
    rows = []
    for b in range(9):
        g = torch.autograd.grad(F.cross_entropy(net(x[b : b + 1]), y[b : b + 1]), list(net.parameters()))
        rows.append(torch.cat([t.reshape(-1) for t in g]))
    rows = torch.stack(rows)
    torch.testing.assert_close(mu, rows.mean(0), rtol=1e-10, atol=1e-14)
    torch.testing.assert_close(v, rows.var(0, unbiased=False), rtol=1e-10, atol=1e-14)


def test_stats_sample():
    pos = stats_sample(100, B, torch.Generator().manual_seed(5))
    assert pos.shape == (B,) and len(set(pos.tolist())) == B and 0 <= int(pos.min()) and int(pos.max()) < 100
    torch.testing.assert_close(pos, stats_sample(100, B, torch.Generator().manual_seed(5)))
    assert sorted(stats_sample(10, B, torch.Generator().manual_seed(5)).tolist()) == list(range(10))


# U8 -- the budget allocation.
@pytest.mark.parametrize("seed", range(5))
def test_u8_budget_is_exact_without_clipping(seed):
    rng = np.random.default_rng(seed)
    n_opt = rng.exponential(size=13) * (rng.uniform(size=13) > 0.2)
    steps = allocate_steps(n_opt, e_const=10, e_min=0)
    assert steps.dtype == np.int64 and steps.sum() == 13 * 10
    assert np.all(np.abs(steps - 13 * 10 * n_opt / n_opt.sum()) < 1)
    assert np.all(steps[n_opt == 0] == 0)


def test_u8_uniform_and_all_zero():
    np.testing.assert_array_equal(allocate_steps(np.full(7, 0.05), e_const=20), np.full(7, 20))
    np.testing.assert_array_equal(allocate_steps(np.zeros(4), e_const=20), np.full(4, 20))
    np.testing.assert_array_equal(allocate_steps(np.zeros(4), 20, exclude_zero=False), np.full(4, 20))


def test_u8_bounds():
    n_opt = np.array([1.0, 0.001, 0.5, 0.0, 3.0])
    steps = allocate_steps(n_opt, e_const=4, e_min=2, e_max=8)
    assert np.all(steps[n_opt > 0] >= 2) and np.all(steps[n_opt > 0] <= 8) and steps[3] == 0
    # budget 20, shares 20 n / 4.501 = [4.443, 0.004, 2.222, 0, 13.330]: floors [4, 0, 2, 0, 13]
    # = 19, the step left goes to the largest remainder (client 0): [5, 0, 2, 0, 13]; then
    # e_min lifts client 1 to 2 and e_max caps client 4 at 8 (sum 17: clipping breaks the budget).
    np.testing.assert_array_equal(steps, [5, 2, 2, 0, 8])
    np.testing.assert_array_equal(allocate_steps(n_opt, 4, e_min=2, e_max=8, exclude_zero=False), [5, 2, 2, 2, 8])


def test_u8_ties_go_to_lower_index():
    # budget 3 * 2 = 6; shares [1.5, 1.5, 3]: floors [1, 1, 3] leave one step for a tie.
    np.testing.assert_array_equal(allocate_steps(np.array([0.25, 0.25, 0.5]), e_const=2), [2, 1, 3])
    np.testing.assert_array_equal(allocate_steps(np.array([0.5, 0.25, 0.25]), e_const=2), [3, 2, 1])


def test_u8_hand_computed():
    # N = 4, budget 4 * 10 = 40, sum n_opt = 0.6: shares 40 * [1/6, 2/6, 3/6, 0] =
    # [6.667, 13.333, 20, 0]. Exactly: floors [6, 13, 20, 0] = 39, the one step left goes to
    # the largest remainder (client 0): [7, 13, 20, 0]. In float64 the third share is
    # 19.999999999999996 -> floor 19, two steps left, remainders [0.667, 0.333, ~1, 0]:
    # clients 2 and 0 get them -> the same [7, 13, 20, 0].
    np.testing.assert_array_equal(allocate_steps(np.array([0.1, 0.2, 0.3, 0.0]), e_const=10), [7, 13, 20, 0])


def test_scaled_steps():
    n_opt = np.array([0.04, 0.17, 0.26, 0.0, 2.0])
    # m n_opt = [0.4, 1.7, 2.6, 0, 20] -> rint [0, 2, 3, 0, 20] -> e_min = 1 lifts the first
    np.testing.assert_array_equal(scaled_steps(n_opt, 10.0), [1, 2, 3, 0, 20])
    np.testing.assert_array_equal(scaled_steps(n_opt, 10.0, e_max=10, exclude_zero=False), [1, 2, 3, 1, 10])
    assert scaled_steps(n_opt, 10.0).dtype == np.int64


# U9 -- allocation entropy.
def test_u9_entropy():
    h, h_norm = allocation_entropy(np.full(6, 0.3))
    assert np.isclose(h, np.log(6), rtol=1e-12) and np.isclose(h_norm, 1.0, rtol=1e-12)
    assert allocation_entropy(np.array([0.0, 0.7, 0.0])) == (0.0, 0.0)
    assert allocation_entropy(np.zeros(3)) == (0.0, 0.0)
    assert allocation_entropy(np.array([0.2])) == (0.0, 1.0)
    h, h_norm = allocation_entropy(np.array([0.1, 0.1, 0.0]))
    assert np.isclose(h, np.log(2), rtol=1e-12) and np.isclose(h_norm, np.log(2) / np.log(3), rtol=1e-12)


def test_input_validation():
    with pytest.raises(ValueError):
        allocate_steps(np.array([0.1, -0.2]), 10)
    with pytest.raises(ValueError):
        allocate_steps(np.array([0.1, 0.2]), 10, e_min=5, e_max=3)
    with pytest.raises(ValueError):
        optimal_steps(np.zeros(3), np.zeros(3), np.zeros(4), np.zeros(4), B)
    with pytest.raises(ValueError):
        global_moments(np.zeros(3), np.zeros(3), 0.0)
