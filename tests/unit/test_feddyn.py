"""FedDyn (Acar et al. 2021, Alg. 1; docs/algorithms/feddyn.md) through the real engine.

Spec ids: D4 is the FedLGA spec's FedDyn round-0 identity; the others check the local
objective, the server's h, FedDisco weights and the configuration rules. Every run goes
through ``simulation.prepare``/``run`` like a user's job, on one rank, in float64.
"""

import copy

import numpy as np
import pytest
from mpi4py import MPI
from runner import job

from hpcfl import config
from hpcfl.engine import simulation
from hpcfl.errors import ConfigError

ALPHA, LR, STEPS = 0.5, 0.1, 3
CENTERS = np.array([[1.0, 0.0], [0.0, 2.0], [-1.0, 1.0], [2.0, -1.0]])   # e_i of F_i(x) = 1/2 ||x - e_i||^2
QUAD = {
    "run": {"seed": 1, "rounds": 1, "eval_every": 0},
    "data": {"dataset": "quadratic", "partition": "natural", "num_clients": 4,
             "quadratic": {"dim": 2, "centers": CENTERS.ravel().tolist()}},
    "model": {"name": "quadratic"},
    "algorithm": {"name": "feddyn", "lr": LR, "batch_size": 1, "local_steps": STEPS, "clients_per_round": 3,
                  "dyn": {"alpha": ALPHA}},
    "runtime": {"dtype": "float64", "threads": 1, "progress": "none"},
}


def engine(table):
    """Run ``table`` on one rank; returns (final model, client records per round, {state name: array})."""
    s = simulation.prepare(config.from_dict(table), MPI.COMM_SELF)
    records = []
    x = simulation.run(s, on_round=lambda m, c: records.append(c))
    return np.asarray(x), records, {it.name: np.array(it.get(), copy=True) for it in s.algo.state()}


def dyn_round(x, cohort, grad, h):
    """One FedDyn round by hand: plain SGD on F_i(theta) - <grad_i, theta> + alpha/2 ||theta - x||^2.

    The quadratic's one sample is the whole local data set, so every step's gradient is
    exact: theta - e_i. Updates ``grad`` in place; returns (x^{t+1}, h^{t+1}).
    """
    thetas = []
    for i in cohort:
        theta = x.copy()
        for _ in range(STEPS):
            theta = theta - LR * ((theta - CENTERS[i]) + ALPHA * (theta - x) - grad[i])
        grad[i] = grad[i] - ALPHA * (theta - x)
        thetas.append(theta)
    thetas = np.array(thetas)
    h = h - ALPHA / len(CENTERS) * (thetas - x).sum(axis=0)
    return thetas.mean(axis=0) - h / ALPHA, h


def test_two_rounds_match_the_hand_computation_on_a_quadratic():
    """Rounds 1 and 2 of FedDyn (N = 4, K = 3, alpha = 0.5, 3 local steps) on F_i = 1/2||x - e_i||^2.

    The expected models, h and the gradient table come from Alg. 1 written out in numpy
    (``dyn_round``), with the cohorts the engine recorded. Round 2's cohort keeps two
    round-1 clients (their linear term -<grad_i, theta> is non-zero) and brings a fresh
    one (grad_i = 0), so both branches of the local objective and h's accumulation over
    rounds are checked. Float64 with O(1) values: agreement to 1e-12.
    """
    grad, h, x = np.zeros_like(CENTERS), np.zeros(2), np.zeros(2)   # the quadratic model starts at 0
    for rounds in (1, 2):
        table = copy.deepcopy(QUAD)
        table["run"]["rounds"] = rounds
        got, records, state = engine(table)
        cohort = records[-1]["client"]
        if rounds == 1:
            assert cohort.tolist() == [0, 1, 3]
            assert np.abs(got - [0.4501875, 0.1500625]).max() <= 1e-12
        if rounds == 2:   # the set-up the docstring relies on
            before = set(records[0]["client"].tolist())
            assert len(before & set(cohort.tolist())) == 2 and len(set(cohort.tolist()) - before) == 1
        x, h = dyn_round(x, cohort, grad, h)
        assert np.abs(got - x).max() <= 1e-12, f"round {rounds}"
        assert np.abs(state["feddyn_h"] - h).max() <= 1e-12
        assert np.abs(state["feddyn_grad"] - grad).max() <= 1e-12
    assert np.abs(h).min() > 1e-3 and np.abs(grad).sum(axis=1).min() > 0   # the state really moved


@pytest.fixture(scope="module")
def one_round():
    """x^0 and x^1 of one-round digits runs (N = 7, K = 5, float64), by name."""
    def run(**overrides):
        s = simulation.prepare(config.from_dict(job(**{"runtime.dtype": "float64", "run.rounds": 1, **overrides})),
                               MPI.COMM_SELF)
        x0 = s.model.numpy()
        return x0, np.asarray(simulation.run(s))

    dyn = {"algorithm.name": "feddyn", "algorithm.dyn.alpha": 0.05}
    prox = {"algorithm.name": "fedprox", "algorithm.mu": 0.05, "algorithm.weights": "uniform"}
    tiny = {"algorithm.name": "feddyn", "algorithm.dyn.alpha": 1e-9}
    return {"dyn": run(**dyn), "prox": run(**prox), "dyn_disco": run(**dyn, **{"algorithm.weights": "disco"}),
            "prox_disco": run(**{**prox, "algorithm.weights": "disco"}), "tiny": run(**tiny),
            "fedavg": run(**{"algorithm.weights": "uniform"})}


def test_D4_round_zero_is_the_mean_plus_the_h_term(one_round):
    """Spec D4: with h = 0 and grad_i = 0, x^1 = mean_K theta_i + (1/N) sum_K (theta_i - x^0).

    In round 0 the linear term is zero, so FedDyn's local problem is FedProx's with
    mu = alpha: the same batches give the same theta_i, bit for bit, and FedProx with
    uniform weights returns x_p = mean theta_i. Hence sum_K (theta_i - x^0) = K (x_p - x^0)
    and x^1 = x_p + (K/N)(x_p - x^0), with K = 5 of N = 7 clients (partial participation,
    so the 1/N of h is not the 1/K of the mean).
    """
    x0, dyn = one_round["dyn"]
    _, prox = one_round["prox"]
    expected = prox + 5 / 7 * (prox - x0)
    assert np.abs(dyn - expected).max() <= 1e-12 * np.abs(expected).max()
    assert np.abs(dyn - prox).max() > 1e-3        # the h term is not negligible


def test_D4_round_zero_is_not_fedavg_even_for_tiny_alpha(one_round):
    """Spec D4: h^1/alpha = -(1/N) sum (theta_i - x^0) does not vanish as alpha -> 0.

    With alpha = 1e-9 the local models are FedAvg's to about 1e-9, so FedDyn's x^1 minus
    FedAvg's x^1 (uniform weights) must be (K/N)(x_avg - x^0): a step 5/7 as long as
    FedAvg's own, not zero.
    """
    x0, tiny = one_round["tiny"]
    _, avg = one_round["fedavg"]
    step = avg - x0
    assert np.linalg.norm(tiny - avg) > 0.5 * np.linalg.norm(step)
    assert np.abs(tiny - avg - 5 / 7 * step).max() <= 1e-6 * np.abs(step).max()


def test_disco_weights_enter_the_mean_and_not_h(one_round):
    """FedDyn with FedDisco weights: x^1 = sum p_i theta_i / sum p_i - h^1/alpha.

    h sums the updates unweighted (paper), so changing the weights from uniform to
    FedDisco's moves x^1 exactly as it moves FedProx's (mu = alpha) weighted mean:
    x_dyn,disco - x_dyn,uniform == x_prox,disco - x_prox,uniform (1e-12), and the move is
    not zero (the Dirichlet clients have different label discrepancies).
    """
    _, dyn = one_round["dyn"]
    _, dyn_disco = one_round["dyn_disco"]
    _, prox = one_round["prox"]
    _, prox_disco = one_round["prox_disco"]
    move = prox_disco - prox
    assert np.abs(move).max() > 1e-4
    assert np.abs((dyn_disco - dyn) - move).max() <= 1e-12 * np.abs(dyn).max()


def test_disco_with_drawn_copies_is_refused_naming_the_fix():
    """sampling = 'with_replacement' trains a drawn-twice client as two instances, which
    FedDyn's per-client gradient state cannot follow; FedDisco weights are defined over the
    sampled set only. Both problems are reported, each with the setting that fixes it."""
    with pytest.raises(ConfigError) as info:
        config.from_dict(job(**{"algorithm.name": "feddyn", "algorithm.weights": "disco",
                                "algorithm.sampling": "with_replacement"}))
    text = str(info.value)
    assert "local = 'dyn'" in text and "use sampling = 'with_replacement_merged'" in text
    assert "not 'disco'" in text and "use algorithm.sampling = 'uniform'" in text


@pytest.mark.parametrize("slots,got", [({"algorithm.local": "dyn"}, "local = 'dyn', server = 'average'"),
                                       ({"algorithm.server": "dyn"}, "local = 'sgd', server = 'dyn'")])
def test_local_and_server_dyn_come_together(slots, got):
    """The client's grad_i and the server's h are two halves of one method: either alone is
    a different, unintended algorithm, so the config names both keys and the preset."""
    with pytest.raises(ConfigError) as info:
        config.from_dict(job(**slots))
    text = str(info.value)
    assert "FedDyn needs both algorithm.local = 'dyn' and algorithm.server = 'dyn'" in text
    assert got in text and "algorithm.name = 'feddyn'" in text
