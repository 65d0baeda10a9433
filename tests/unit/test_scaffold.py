"""SCAFFOLD through the real engine, against the paper's Algorithm 1 written out by hand.

Paper: Karimireddy et al. 2020, "SCAFFOLD: Stochastic Controlled Averaging for Federated
Learning", Algorithm 1 with control variate option II. In the paper's notation, one round:

    client i in S, y_i <- x, then K_i times   y_i <- y_i - eta_l (g_i(y_i) - c_i + c)      (3)
    option II                                 c_i+ <- c_i - c + (x - y_i) / (K_i eta_l)     (4)
    sent to the server                        (Delta y_i, Delta c_i) = (y_i - x, c_i+ - c_i) (5)
                                              c_i <- c_i+
    server    x <- x + eta_g (1/|S|) sum_S Delta y_i ;   c <- c + (|S|/N) (1/|S|) sum_S Delta c_i

hpcfl averages Delta y_i with the weights policy's p_i (docs/algorithms/scaffold.md): with
uniform weights, or size weights on the quadratic (every client holds one sample), that is
the paper's 1/|S|. eta_g is algorithm.server_lr.

Jobs are F_i(x) = 1/2 ||x - e_i||^2 (dataset and model "quadratic", batch 1), so g_i(y) = y - e_i
exactly; they run through prepare/run in float64 on one rank. The quadratic is separable, so
the reference below runs the paper's equations one coordinate at a time on plain floats.
x is read from the engine's checkpoint hook (called after every round with checkpoint.every = 1),
c and every c_i from the policy's declared state (``server.scaffold_c``, ``clients.scaffold_c_i``),
the same arrays a checkpoint stores.
"""

import copy

import numpy as np
import pytest
from mpi4py import MPI

from hpcfl import config
from hpcfl.engine import simulation

TWO = {
    "run": {"seed": 0, "rounds": 3, "eval_every": 0},
    "data": {"dataset": "quadratic", "partition": "natural", "num_clients": 2,
             "quadratic": {"dim": 1, "centers": [1.0, -1.0]}},
    "model": {"name": "quadratic"},
    "algorithm": {"name": "scaffold", "weights": "uniform", "lr": 0.1, "batch_size": 1, "steps": "client_steps",
                  "client_steps": {"steps": [2, 8]}},
    "runtime": {"dtype": "float64", "threads": 1, "progress": "none"},
    "checkpoint": {"every": 1},
}


def engine(table, rounds, **alg):
    """Run ``table`` for ``rounds``; per round (cohort, x, c, c_i rows) as float64 arrays
    (c and c_i are None without SCAFFOLD's state)."""
    t = copy.deepcopy(table)
    t["algorithm"].update(alg)
    t["run"]["rounds"] = rounds
    setup = simulation.prepare(config.from_dict(t), MPI.COMM_SELF)
    cohorts, trace = [], []

    def on_round(metrics, clients):
        cohorts.append(clients["client"].tolist())

    def checkpoint(done, x, sim_time):   # after the server step and the broadcast of c
        state = {item.name: np.array(item.get(), dtype=np.float64) for item in setup.algo.state()
                 if item.name.startswith("scaffold")}
        trace.append((x.astype(np.float64).copy(), state.get("scaffold_c"), state.get("scaffold_c_i")))

    simulation.run(setup, on_round=on_round, checkpoint=checkpoint)
    return [(s, *tr) for s, tr in zip(cohorts, trace)]


def paper_round(x, c, ci, cohort, centers, steps, lr, eta_g, num_clients):
    """One round of Alg. 1 (option II) on one coordinate; plain floats, ``ci`` updated in place."""
    dy, dc = [], []
    for i in cohort:
        y = x                                                 # y_i <- x
        for _ in range(steps[i]):
            y = y - lr * ((y - centers[i]) - ci[i] + c)       # eq. (3), g_i(y) = y - e_i
        ci_new = ci[i] - c + (x - y) / (steps[i] * lr)        # eq. (4), option II
        dy.append(y - x)                                      # eq. (5)
        dc.append(ci_new - ci[i])
        ci[i] = ci_new
    x = x + eta_g * sum(dy) / len(cohort)                     # server: x <- x + eta_g * mean Delta y_i
    c = c + (len(cohort) / num_clients) * (sum(dc) / len(cohort))   # c <- c + |S|/N * mean Delta c_i
    return x, c


@pytest.mark.parametrize("eta_g", [1.0, 0.5])
def test_two_clients_three_rounds_match_algorithm_1(eta_g):
    """x, c, c_1, c_2 after rounds 1-3 equal Alg. 1 option II to 1e-12 (steps 2 and 8, lr 0.1).

    Round 1 is also checked against closed forms: with c = c_i = 0 the clients run plain
    gradient descent, y_i = e_i (1 - 0.9^K_i): y_1 = 0.19, y_2 = -(1 - 0.9^8) = -0.56953279.
    Eq. (4): c_1 = -0.19 / (2 * 0.1) = -0.95, c_2 = 0.56953279 / 0.8 = 0.7119159875. Server:
    x = eta_g (0.19 - 0.56953279) / 2 = -0.189766395 eta_g, c = (c_1 + c_2) / 2 = -0.11904200625
    (|S| = N = 2). Rounds 2-3 then exercise the correction c - c_i of eq. (3), and eta_g != 1
    separates the model step from the control-variate step (c does not depend on eta_g).
    """
    got = engine(TWO, 3, server_lr=eta_g)
    x1, c1, ci1 = got[0][1:]
    assert x1[0] == pytest.approx(-0.189766395 * eta_g, abs=1e-12)
    assert c1[0] == pytest.approx(-0.11904200625, abs=1e-12)
    assert ci1[:, 0].tolist() == pytest.approx([-0.95, 0.7119159875], abs=1e-12)

    x, c, ci = 0.0, 0.0, [0.0, 0.0]
    for cohort, ex, ec, eci in got:
        assert cohort == [0, 1]
        x, c = paper_round(x, c, ci, cohort, [1.0, -1.0], [2, 8], 0.1, eta_g, 2)
        assert abs(ex[0] - x) <= 1e-12 and abs(ec[0] - c) <= 1e-12
        assert np.abs(eci[:, 0] - ci).max() <= 1e-12


def test_heterogeneous_steps_reach_the_true_optimum_where_fedavg_does_not():
    """SCAFFOLD's fixed point is x* = 0 with c_i = grad F_i(x*) = x* - e_i; FedAvg's is biased.

    At a fixed point c_i+ = c_i gives (x - y_i) / (K_i lr) = c for every client, and
    sum Delta y_i = 0 then forces c = 0, so each local run must stay at x: x - e_i - c_i = 0.
    With c = mean c_i (the server update keeps it so), x = mean e_i = 0. The reference
    iteration contracts at about 0.56 per round, so 60 rounds leave < 1e-13.
    FedAvg on the same job: y_i - x = s_i (e_i - x), s_i = 1 - (1 - lr)^K_i, so its fixed point
    is sum s_i e_i / sum s_i = (0.19 - 0.56953279) / 0.75953279 = -0.49969243587 (Wang et al.
    2020, objective inconsistency), reached at a rate 1 - mean s_i = 0.62 per round.
    """
    x, c, ci = engine(TWO, 60)[-1][1:]
    assert abs(x[0]) <= 1e-12 and abs(c[0]) <= 1e-12
    assert ci[:, 0].tolist() == pytest.approx([-1.0, 1.0], abs=1e-12)
    s1, s2 = 1 - 0.9**2, 1 - 0.9**8
    fedavg = engine(TWO, 60, name="fedavg")[-1][1]
    assert fedavg[0] == pytest.approx((s1 * 1.0 - s2 * 1.0) / (s1 + s2), abs=1e-10)
    assert fedavg[0] == pytest.approx(-0.49969243587, abs=1e-10)


FIVE = copy.deepcopy(TWO)
FIVE["data"].update(num_clients=5, quadratic={"dim": 2, "centers": [1.0, 0.0, -2.0, 1.0, 0.5, -1.0, 3.0, 2.0,
                                                                     -1.0, -0.5]})
FIVE["algorithm"].update(clients_per_round=2, weights="size", client_steps={"steps": [1, 3, 5, 7, 9]})


def test_partial_participation_keeps_c_the_mean_of_all_c_i():
    """Two of five clients per round, 12 rounds: c = (1/N) sum_i c_i over all N clients.

    The server adds (|S|/N) mean_S Delta c_i = (1/N) sum_S (c_i+ - c_i) while the clients
    outside S keep c_i, so (1/N) sum_i c_i moves by exactly the same amount; both start at 0.
    Dividing by |S| instead (a plain average over the cohort) breaks it. The whole trajectory
    (x, c, every c_i, stale ones included) is also checked against Alg. 1 with the engine's
    cohorts; size weights equal uniform ones here (one sample per client), so the model
    average is the paper's 1/|S|.
    """
    centers = np.array(FIVE["data"]["quadratic"]["centers"]).reshape(5, 2)
    steps = [1, 3, 5, 7, 9]
    got = engine(FIVE, 12)
    assert all(len(cohort) == 2 for cohort, *_ in got)
    assert len({tuple(cohort) for cohort, *_ in got}) > 3            # the cohorts vary
    ref = [(0.0, 0.0, [0.0] * 5) for _ in range(2)]                  # per coordinate: x, c, c_i
    for cohort, ex, ec, eci in got:
        assert np.abs(ec - eci.mean(axis=0)).max() <= 1e-12
        for d in range(2):
            x, c, ci = ref[d]
            x, c = paper_round(x, c, ci, cohort, centers[:, d].tolist(), steps, 0.1, 1.0, 5)
            ref[d] = (x, c, ci)
            assert abs(ex[d] - x) <= 1e-12 and abs(ec[d] - c) <= 1e-12
            assert np.abs(eci[:, d] - ci).max() <= 1e-12
