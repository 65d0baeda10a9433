"""FedNova (Wang et al. 2020; docs/algorithms/fednova.md): closed forms through the real engine,
and the algebra. Checks are labelled T1-T15 (in the test names and section comments).

Quadratic runs go through prepare/run exactly like a user's job (client loop, exact
reduction, server rule), in float64, on one rank.
"""

import copy

import numpy as np
import pytest
import torch
from mpi4py import MPI
from runner import run_memory

from hpcfl.algorithms.local import LocalSolver, SolverSpec
from hpcfl.algorithms.policies import ClientSteps, ClientStepsOptions, RandomEpochsOptions, RandomEpochSteps
from hpcfl.algorithms.server import AverageRule, NovaOptions, NovaRule

D = torch.float64
TWO = {
    "run": {"seed": 0, "rounds": 1000, "eval_every": 0},
    "data": {"dataset": "quadratic", "partition": "natural", "num_clients": 2,
             "quadratic": {"dim": 1, "centers": [1.0, -1.0]}},
    "model": {"name": "quadratic"},
    "algorithm": {"name": "fedavg", "lr": 0.01, "batch_size": 1, "steps": "client_steps",
                  "client_steps": {"steps": [2, 8]}},
    "runtime": {"dtype": "float64", "threads": 1, "progress": "none"},
}


def quad(name, lr, rounds, base=TWO, **alg):
    t = copy.deepcopy(base)
    t["algorithm"].update(name=name, lr=lr, **alg)
    t["run"]["rounds"] = rounds
    x, metrics, clients = run_memory(t, MPI.COMM_SELF)
    return x, metrics, clients


# ---------------------------------------------------------------- T5 / T7 / T12: closed forms
@pytest.mark.parametrize(
    "name,lr,rounds,extra,expected",
    [
        ("fedavg", 0.01, 1000, {}, -0.5903466129),
        ("fednova", 0.01, 1000, {}, 0.0149481359),
        ("fedavg", 0.1, 200, {}, -0.4996924359),
        ("fednova", 0.1, 200, {}, 0.1432587533),
        ("fedprox", 0.05, 400, {"mu": 1.0}, -0.4996924359),
        ("fednova", 0.05, 400, {"local": "prox", "mu": 1.0}, 0.0704779183),   # tau_eff = sum p tau (auto for prox)
        ("fedavg", 0.01, 3000, {"momentum": 0.9}, -0.8074261255),
        ("fednova", 0.01, 3000, {"momentum": 0.9}, 0.0272288644),
        ("fednova", 0.1, 1000, {"server_momentum": 0.5}, 0.1432587533),       # T12: same fixed point
    ],
)
def test_two_client_quadratic_fixed_points(name, lr, rounds, extra, expected):
    x, _, _ = quad(name, lr, rounds, **extra)
    assert x[0] == pytest.approx(expected, abs=1e-8)


def test_fixed_point_closed_form_T5():
    # s_i = 1 - (1 - lr)^tau_i; FedAvg: sum p s e / sum p s; FedNova: sum p (s/tau) e / sum p (s/tau)
    lr, tau, e = 0.01, np.array([2, 8]), np.array([1.0, -1.0])
    s = 1 - (1 - lr) ** tau
    assert (s * e).sum() / s.sum() == pytest.approx(-0.5903466129, abs=1e-10)
    assert (s / tau * e).sum() / (s / tau).sum() == pytest.approx(0.0149481359, abs=1e-10)


def test_server_momentum_zero_is_bitwise_plain_fednova():
    a, _, _ = quad("fednova", 0.1, 50)
    b, _, _ = quad("fednova", 0.1, 50, server_momentum=0.0)
    assert a.tobytes() == b.tobytes()


# ---------------------------------------------------------------- T3, T4
def test_fednova_equals_fedavg_with_equal_steps_T3():
    base = copy.deepcopy(TWO)
    base["data"]["quadratic"] = {"dim": 3, "num_clients": 5, "std": 0.3}
    base["data"]["num_clients"] = 5
    base["algorithm"]["client_steps"] = {"steps": [6]}
    a, _, _ = quad("fedavg", 0.05, 20, base)
    b, _, _ = quad("fednova", 0.05, 20, base)
    assert np.max(np.abs(a - b)) <= 1e-12 * np.max(np.abs(a))


def test_generalized_rule_reproduces_fedavg_T4():
    rng = np.random.default_rng(0)
    deltas, p, A = rng.standard_normal((4, 6)), rng.random(4), rng.uniform(1, 40, 4)
    s_avg = {"weight": p.sum()}
    fedavg = AverageRule(6).aggregate((p[:, None] * deltas).sum(0), s_avg)
    # Rule (4) with w_i = p_i A_i / sum_j p_j A_j and tau_eff = sum p A / sum p:
    # tau_eff * sum_i w_i Delta_i / A_i = sum p Delta / sum p, i.e. FedAvg (Wang et al. 2020, eqs. 5-6).
    w = p * A                        # the rule normalises by sum w itself
    nova = NovaRule(NovaOptions(tau_eff="const", value=(p * A).sum() / p.sum()), 6, prox=False)
    contrib = sum(nova.contribution(d.copy(), wi, a) for d, wi, a in zip(deltas, w, A))
    got = nova.aggregate(contrib, {"weight": w.sum()})
    assert np.allclose(got, fedavg, rtol=1e-12, atol=0)


def test_fednova_tau_eff_choices():
    s = {"weight": 2.0, "weight_anorm": 30.0, "weight_steps": 20.0}
    assert NovaRule(NovaOptions(), 1, prox=False).tau_eff(s) == 15.0
    assert NovaRule(NovaOptions(), 1, prox=True).tau_eff(s) == 10.0
    assert NovaRule(NovaOptions(tau_eff="const", value=4.0), 1, prox=False).tau_eff(s) == 4.0


def test_nova_buffers_are_averaged_not_normalised():
    rule = NovaRule(NovaOptions(), num_params=2, prox=False)
    c = rule.contribution(np.array([4.0, 8.0, 1.0]), weight=2.0, anorm=4.0)
    assert c.tolist() == [2.0, 4.0, 2.0]


# ---------------------------------------------------------------- T1, T2: the a_i identity
def coefficients(kind, tau, lr, mu=0.7, rho=0.9, gamma=0.95):
    k = np.arange(tau)
    if kind == "sgd":
        return np.ones(tau)
    if kind == "prox":
        return (1 - lr * mu) ** (tau - 1 - k)
    if kind == "momentum":
        return (1 - rho ** (tau - k)) / (1 - rho)
    return gamma**k


@pytest.mark.parametrize("kind", ["sgd", "prox", "momentum", "decay"])
def test_delta_is_linear_combination_of_gradients_T1(kind):
    tau, lr, d = 13, 0.03, 5
    spec = {"sgd": SolverSpec(lr), "prox": SolverSpec(lr, mu=0.7), "momentum": SolverSpec(lr, momentum=0.9),
            "decay": SolverSpec(lr, decay=0.95)}[kind]
    gen = np.random.default_rng(1)
    m = gen.standard_normal((d, d))
    H = torch.tensor(m @ m.T / d + np.eye(d), dtype=D)
    x = torch.tensor(gen.standard_normal(d), dtype=D)
    x0 = x.clone()
    solver = LocalSolver(spec)
    solver.begin(x0.clone())
    grads = []
    for _ in range(tau):
        g = H @ x + torch.tensor(gen.standard_normal(d), dtype=D)   # noisy gradient
        grads.append(g.clone())
        solver.step(x, g, None)
    a = coefficients(kind, tau, lr)
    combo = -lr * sum(ak * gk for ak, gk in zip(a, grads))
    assert torch.max(torch.abs((x - x0) - combo)).item() <= 1e-12
    assert solver.anorm() == pytest.approx(a.sum(), rel=1e-13)   # brute-force ||a||_1


def test_decayed_lr_normaliser_closed_form_T2():
    solver = LocalSolver(SolverSpec(0.1, decay=0.9))
    solver.begin(torch.zeros(1, dtype=D))
    for _ in range(7):
        solver.step(torch.zeros(1, dtype=D), torch.zeros(1, dtype=D), None)
    assert solver.anorm() == pytest.approx((1 - 0.9**7) / (1 - 0.9), rel=1e-14)


def test_sgd_normaliser_is_an_exact_integer():
    solver = LocalSolver(SolverSpec(0.05))
    solver.begin(torch.zeros(1, dtype=D))
    for _ in range(30):
        solver.step(torch.zeros(1, dtype=D), torch.zeros(1, dtype=D), None)
    assert solver.anorm() == 30.0


# ---------------------------------------------------------------- T11: variance reduction
# T11 at a tenth of the full work (10 clients, tau ~ N(10, 6) in [1, 30], 300 rounds
# instead of 30 clients, tau ~ N(30, 20) in [1, 96], 400 rounds): the property holds for any
# heterogeneous tau, and the full size costs ~5 minutes of tiny torch steps on 2 cores.
MANY = {
    "run": {"seed": 0, "rounds": 300, "eval_every": 0},
    "data": {"dataset": "quadratic", "partition": "natural", "num_clients": 10,
             "quadratic": {"dim": 20, "num_clients": 10, "std": 0.1, "seed": 7}},
    "model": {"name": "quadratic"},
    "algorithm": {"name": "fednova", "lr": 0.05, "batch_size": 1, "steps": "client_steps",
                  "client_steps": {"dist": "normal", "mean": 10, "std": 6, "low": 1, "high": 30}},
    "runtime": {"dtype": "float64", "threads": 1, "progress": "none"},
}


def optimum():
    gen = np.random.default_rng(7)
    return gen.normal(0.0, 0.1, size=(10, 20)).mean(axis=0)


def test_variance_reduction_removes_the_drift_T11():
    xstar = optimum()
    plain, _, _ = quad("fednova", 0.05, 300, MANY)
    vr, _, _ = quad("fednova", 0.05, 300, MANY, local="vr")
    assert np.linalg.norm(vr - xstar) <= 1e-10
    assert np.linalg.norm(plain - xstar) > 1e-3          # O(lr) drift of plain FedNova (~2e-2 at full size)


# ---------------------------------------------------------------- T14: generators
def test_random_epochs_uniform_on_2_to_5_and_keyed():
    pol = RandomEpochSteps(RandomEpochsOptions(low=2, high=5), batch_size=32, seed=3)
    e = np.concatenate([pol.epochs(t, np.arange(200)) for t in range(20)])
    counts = np.bincount(e, minlength=6)[2:]
    assert e.min() == 2 and e.max() == 5
    chi2 = ((counts - 1000) ** 2 / 1000).sum()
    assert chi2 < 16.27   # chi-square, 3 dof, p = 0.001
    # keyed by (seed, round, client): asking for a subset in another order gives the same draws
    assert pol.epochs(4, np.array([7, 3])).tolist() == pol.epochs(4, np.arange(10))[[7, 3]].tolist()
    assert pol(4, np.array([1]), np.array([33])).tolist() == [pol.epochs(4, np.array([1]))[0] * 2]


def test_quadratic_tau_generator_range_and_mean():
    pol = ClientSteps(ClientStepsOptions(dist="normal", mean=30, std=20, low=1, high=96), seed=0)
    tau = pol(0, np.arange(3000), np.ones(3000))
    assert tau.min() >= 1 and tau.max() <= 96 and 29 < tau.mean() < 33
    assert pol(5, np.arange(10), np.ones(10)).tolist() == tau[:10].tolist()   # fixed across rounds
    redraw = ClientSteps(ClientStepsOptions(dist="normal", mean=30, std=20, low=1, high=96, per_round=True), 0)
    assert redraw(1, np.arange(50), np.ones(50)).tolist() != redraw(2, np.arange(50), np.ones(50)).tolist()
