"""FedGSNR through the engine and the client layer: exact shortcuts, invariance, reductions to the base."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mpi4py import MPI
from runner import job, run_memory

from hpcfl import models
from hpcfl.algorithms import gsnr as gsnr_module
from hpcfl.client import stats
from hpcfl.params import FlatModel


def mlp(dtype):
    torch.manual_seed(0)
    m = models.build_model("mlp", models.model_options("mlp")(hidden=(16,)), (12,), 5)
    return FlatModel(m, torch.device("cpu"), dtype)


def test_linear_shortcut_equals_per_sample_vmap_in_float64():
    m = mlp(torch.float64)
    x, y = torch.randn(40, 12, dtype=torch.float64), torch.randint(0, 5, (40,))
    fast = stats.linear_moments(m.module, m.params, [x], [y], 64)[0]
    names = dict(m.module.named_parameters())
    grads = torch.func.vmap(torch.func.grad(
        lambda p, xb, yb: F.cross_entropy(torch.func.functional_call(m.module, p, (xb[None],)), yb[None])),
        in_dims=(None, 0, 0))({k: v.detach() for k, v in names.items()}, x, y)
    g = torch.cat([grads[k].reshape(40, -1) for k in names], 1)
    assert torch.allclose(fast[0], g.mean(0), rtol=1e-10, atol=1e-14)
    assert torch.allclose(fast[1], g.var(0, unbiased=False), rtol=1e-9, atol=1e-14)


@pytest.mark.parametrize("path", ["linear", "vmap"])
def test_a_clients_moments_do_not_depend_on_the_clients_sharing_its_call(path, monkeypatch):
    # each rank batches its own clients; 1, 2 and 3 ranks give different batches, the same values
    if path == "vmap":
        monkeypatch.setattr(stats, "_all_linear", lambda *a: False)
    m = mlp(torch.float32)
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(n, 12, generator=gen) for n in (64, 64, 30, 64, 64)]
    ys = [torch.randint(0, 5, (len(x),), generator=gen) for x in xs]
    together = stats.per_sample_moments_many(m.module, m.params, xs, ys, F.cross_entropy, 4096)
    for i in (0, 2, 4):
        alone = stats.per_sample_moments_many(m.module, m.params, [xs[i]], [ys[i]], F.cross_entropy, 64)[0]
        pair = stats.per_sample_moments_many(m.module, m.params, xs[i - 1 : i + 1] if i else xs[:2],
                                             ys[i - 1 : i + 1] if i else ys[:2], F.cross_entropy, 128)
        mine = pair[1] if i else pair[0]
        for a, b, c in zip(alone, together[i], mine):     # mu, then v: bit for bit
            assert a.numpy().tobytes() == b.numpy().tobytes() == c.numpy().tobytes()


def gsnr_job(**kw):
    return job(**{"algorithm.name": "fedgsnr", "algorithm.local_steps": 4, "algorithm.clients_per_round": 5,
                  "run.rounds": 3, **kw})


def test_budget_is_shared_exactly_every_round():   # B7
    _, metrics, clients = run_memory(gsnr_job(), MPI.COMM_SELF)
    for m, c in zip(metrics, clients):
        assert m["gsnr_sum_steps"] == 5 * 4 == int(c["steps"].sum())
        assert np.all(c["gsnr_nopt"] >= 0) and np.all(np.isfinite(c["gsnr"]))
        assert 0 < m["gsnr_entropy_norm"] <= 1 + 1e-12


def test_uniform_n_opt_reduces_to_the_base_algorithm_bitwise(monkeypatch):   # U11
    base = run_memory(job(**{"algorithm.local_steps": 4, "algorithm.clients_per_round": 5, "run.rounds": 3}),
                      MPI.COMM_SELF)
    real = gsnr_module.optimal_steps
    monkeypatch.setattr(gsnr_module, "optimal_steps", lambda *a, **k: {**real(*a, **k), "n_opt": 0.37})
    forced = run_memory(gsnr_job(), MPI.COMM_SELF)
    assert forced[0].tobytes() == base[0].tobytes()
    for m, b in zip(forced[1], base[1]):
        assert m["test_accuracy"] == b["test_accuracy"] and m["train_loss"] == b["train_loss"]


def test_observe_mode_measures_without_changing_training():
    base = run_memory(job(**{"algorithm.local_steps": 4, "algorithm.clients_per_round": 5, "run.rounds": 3}),
                      MPI.COMM_SELF)
    seen = run_memory(gsnr_job(**{"algorithm.gsnr.step_mode": "observe"}), MPI.COMM_SELF)
    assert seen[0].tobytes() == base[0].tobytes()
    assert all(np.all(c["gsnr"] > 0) for c in seen[2])


def test_clients_with_zero_n_opt_sit_out_and_weights_renormalise(monkeypatch):   # U4 in the engine
    real = gsnr_module.optimal_steps
    calls = {"n": 0}

    def half_zero(*a, **k):
        r = real(*a, **k)
        calls["n"] += 1
        return {**r, "n_opt": 0.0 if calls["n"] % 2 else r["n_opt"]}

    monkeypatch.setattr(gsnr_module, "optimal_steps", half_zero)
    _, _, clients = run_memory(gsnr_job(), MPI.COMM_SELF)
    for c in clients:
        out = c["gsnr_nopt"] == 0
        assert out.any() and np.all(c["steps"][out] == 0) and np.all(c["weight"][out] == 0)
        assert abs(c["weight"][~out].sum() - 1) < 1e-12 and int(c["steps"].sum()) == 20


def test_scaffold_control_variate_uses_each_clients_own_steps():
    # batch 64: less mini-batch noise in Theorem 3.7 than the job's 16, so the n_opt differ enough to give
    # the clients different step counts (with 16 all five got 4), which is what the check needs
    _, _, clients = run_memory(gsnr_job(**{"algorithm.local": "scaffold", "algorithm.batch_size": 64}), MPI.COMM_SELF)
    for c in clients:   # plain SGD: ||a_i||_1 = E_i, the denominator of c_i+ (option II)
        trained = c["steps"] > 0
        assert np.array_equal(c["anorm"][trained], c["steps"][trained].astype(float))
        assert len(set(c["steps"][trained].tolist())) > 1


def test_gsnr_without_a_budget_takes_local_epochs_worth():
    """local_steps unset: E_const = round(mean_i E ceil(n_i / B)), E = 1, B = 16 (the job's)."""
    from hpcfl import config
    from hpcfl.engine import simulation
    from hpcfl.algorithms.registry import epochs_worth

    cfg = config.from_dict(job(**{"algorithm.name": "fedgsnr", "algorithm.local_steps": 0}))
    setup = simulation.prepare(cfg, MPI.COMM_SELF)
    expected = int(np.rint(np.mean(-(-setup.sizes // 16))))
    assert setup.algo.steps_policy.e_const == expected == epochs_worth(1, 16, "ceil", setup.sizes)
    assert f"E_const = {expected} local steps" in setup.algo.notes[0]


def test_sat_out_clients_are_recorded_as_no_steps(monkeypatch):
    real = gsnr_module.optimal_steps
    monkeypatch.setattr(gsnr_module, "optimal_steps",
                        lambda *a, **k: {**real(*a, **k), "n_opt": 0.0 if a[0][0] > 0 else 0.5})
    _, _, clients = run_memory(gsnr_job(), MPI.COMM_SELF)
    for c in clients:
        assert np.array_equal(c["dropped"] == 4, c["steps"] == 0)


def test_scale_mode_with_every_n_opt_zero_runs_the_base_round(monkeypatch):
    real = gsnr_module.optimal_steps
    monkeypatch.setattr(gsnr_module, "optimal_steps", lambda *a, **k: {**real(*a, **k), "n_opt": 0.0})
    _, _, clients = run_memory(gsnr_job(**{"algorithm.gsnr.step_mode": "scale", "algorithm.gsnr.m": 9.0}),
                               MPI.COMM_SELF)
    assert all(c["steps"].tolist() == [4] * 5 for c in clients)


def test_min_steps_above_max_steps_is_a_config_error():
    from hpcfl import config
    from hpcfl.errors import ConfigError

    with pytest.raises(ConfigError, match="algorithm.gsnr: min_steps = 5 exceeds max_steps = 2"):
        config.from_dict(gsnr_job(**{"algorithm.gsnr.min_steps": 5, "algorithm.gsnr.max_steps": 2}))


def test_clients_with_zero_disco_weight_get_no_steps_and_the_budget_goes_to_the_rest():
    # NIID-2, a = 1, b = 0: each biased client q = 1/6 - 1/5 < 0, so p = 0; the unbiased one takes all
    table = {"run": {"name": "g", "seed": 0, "rounds": 2, "eval_every": 1},
             "data": {"dataset": "digits", "digits": {"test_per_class": 50}, "partition": "biased_unbiased",
                      "num_clients": 6, "biased_unbiased": {"num_unbiased": 1, "shard": 20}},
             "model": {"name": "mlp", "mlp": {"hidden": [16]}},
             "algorithm": {"name": "fedgsnr", "weights": "disco", "local_steps": 3, "disco": {"a": 1.0, "b": 0.0}},
             "runtime": {"threads": 1, "progress": "none"}}
    _, _, clients = run_memory(table, MPI.COMM_SELF)
    for c in clients:
        assert c["steps"].tolist() == [0] * 5 + [18] and c["weight"].tolist() == [0.0] * 5 + [1.0]


def test_recorded_values_are_eqs_8_9_and_theorem_3_7_of_the_clients_statistics(monkeypatch):
    """A real run (2 rounds, 5 of 7 Dirichlet clients of unequal sizes, size weights) records M_k, N_k,
    n_opt,k, r_k and L; recomputed here from the per-client statistics (mu_k, v_k) the run used, in another
    form of the same equations, they must agree to 1e-9:

    - eqs. 8-9 over the sampled set with p_k = n_k / sum n (the sizes, not the run's weights array):
      mu_g = sum p mu_k, v_g = sum p v_k + sum p (mu_k - mu_g)^2 (within- plus between-client variance);
    - Theorem 3.7 with B the SGD mini-batch (batch_size 16; the statistics use stat_batch = 24 samples):
      L = |mu_g|^2 + sum v_g / B, M_k = mu_k . mu_g + sum sqrt(v_k v_g) / B, N_k = |mu_k|^2 + sum v_k / B,
      n_opt = max(0, M / N), r = cot theta with cos theta = M / sqrt(L N).

    Uniform p, a dropped between-client term, local and global statistics swapped, or B = stat_batch each
    move these values by far more than the tolerance."""
    seen = []
    real = gsnr_module.GsnrSteps._moments

    def spy(self, ctx):
        out = real(self, ctx)
        seen.append((ctx.sizes.copy(), {j: (mu.copy(), v.copy()) for j, (mu, v) in out.items()}))
        return out

    monkeypatch.setattr(gsnr_module.GsnrSteps, "_moments", spy)
    table = gsnr_job(**{"run.rounds": 2, "algorithm.batch_size": 16, "algorithm.gsnr.stat_batch": 24})
    _, metrics, clients = run_memory(table, MPI.COMM_SELF)
    B = 16
    for (sizes, stats_), m, c in zip(seen, metrics, clients):
        assert len(set(sizes.tolist())) > 1                                   # unequal sizes: p is not uniform
        p = sizes / sizes.sum()
        mus = np.array([stats_[j][0] for j in range(len(sizes))], dtype=np.float64)
        vs = np.array([stats_[j][1] for j in range(len(sizes))], dtype=np.float64)
        mu_g = p @ mus
        v_g = p @ vs + p @ (mus - mu_g) ** 2
        L = mu_g @ mu_g + v_g.sum() / B
        M = mus @ mu_g + np.sqrt(vs * v_g).sum(1) / B
        N = (mus * mus).sum(1) + vs.sum(1) / B
        cos = M / np.sqrt(L * N)
        r = np.where(cos > 0, cos / np.sqrt(1 - cos ** 2), 0.0)
        np.testing.assert_allclose(m["gsnr_L"], L, rtol=1e-9)
        np.testing.assert_allclose(c["gsnr_M"], M, rtol=1e-9)
        np.testing.assert_allclose(c["gsnr_N"], N, rtol=1e-9)
        np.testing.assert_allclose(c["gsnr_nopt"], np.maximum(M / N, 0), rtol=1e-9)
        np.testing.assert_allclose(c["gsnr"], r, rtol=1e-7)
        assert np.ptp(c["gsnr_nopt"]) > 0.01 * c["gsnr_nopt"].max()           # the clients differ
