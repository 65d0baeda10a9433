"""Policy algebra with hand-computed values: FedAvg mean, FedProx step, SCAFFOLD, ||a||_1."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from mpi4py import MPI

from hpcfl.algorithms import SCALARS, Algorithm
from hpcfl.algorithms.local import LocalSolver, SolverSpec
from hpcfl.algorithms.policies import EpochSteps, FixedSteps, SizeWeights, UniformWeights
from hpcfl.algorithms.server import ServerOptimizer
from hpcfl.algorithms.variates import Scaffold
from hpcfl.client.trainer import ClientResult
from hpcfl.parallel.comm import ExactSum
from hpcfl.config import AlgorithmSection

D = torch.float64


def result(delta, steps=4, loss=1.0):
    return ClientResult(torch.tensor(delta, dtype=D), steps, float(steps), loss, steps * 8)


def full(alg, server_options=None):
    """A Config-shaped object around an AlgorithmSection (what Algorithm reads)."""
    opts = {} if server_options is None else {"server": server_options}
    return SimpleNamespace(algorithm=alg, run=SimpleNamespace(seed=0), policy_options=opts)


def aggregate(cfg, deltas, weights, x, num_clients=3, anorms=None, server_options=None):
    algo = Algorithm(full(cfg, server_options), len(x), len(x), len(deltas), torch.device("cpu"), D,
                     np.ones(num_clients, dtype=np.int64))
    ctx = SimpleNamespace(lr=algo.lr)
    acc = ExactSum(algo.layout.length)
    for slot, (d, w) in enumerate(zip(deltas, weights)):
        res = result(d)
        if anorms is not None:
            res.anorm = anorms[slot]
            res.steps = int(anorms[slot])
        acc.add(algo.pack(ctx, slot, slot, res, w))
    sums = acc.reduce(MPI.COMM_SELF, total=len(deltas))
    new_x, _ = algo.server_step(ctx, np.asarray(x, dtype=np.float64), sums)
    return algo, new_x, sums


def test_fedavg_weighted_mean_three_clients():
    # weights n = 16, 16, 32: agg = (16*[1,2] + 16*[3,-1] + 32*[0,4]) / 64 = [1.0, 2.25]
    cfg = AlgorithmSection(local="sgd", steps="epochs", weights="size", server="average")
    _, x, sums = aggregate(cfg, [[1, 2], [3, -1], [0, 4]], [16, 16, 32], [0.5, -0.5])
    assert x.tolist() == [1.5, 1.75]
    assert dict(zip(SCALARS, sums[-len(SCALARS):]))["weight"] == 64


def test_fedavg_uniform_two_clients_and_server_lr():
    # uniform: agg = ([2, 0] + [0, -4]) / 2 = [1, -2]; server_lr 0.5 -> x + 0.5 agg
    cfg = AlgorithmSection(local="sgd", steps="epochs", weights="uniform", server="average", server_lr=0.5)
    _, x, _ = aggregate(cfg, [[2, 0], [0, -4]], [1, 1], [1.0, 1.0])
    assert x.tolist() == [1.5, 0.0]


def test_server_momentum_by_hand():
    opt = ServerOptimizer(lr=1.0, momentum=0.5)
    x = opt.apply(np.array([0.0]), np.array([1.0]))   # buf = -1, x = 1
    x = opt.apply(x, np.array([1.0]))                 # buf = 0.5*-1 - 1 = -1.5, x = 2.5
    assert x.tolist() == [2.5]


def test_one_fedprox_step_by_hand():
    # g~ = g + mu (x - x0) = [0.2 + 0.5*0.5, -0.4 + 0.5*(-1)] = [0.45, -0.9]; x -= 0.1 g~
    solver = LocalSolver(SolverSpec(lr=0.1, mu=0.5))
    solver.begin(torch.tensor([1.0, 2.0], dtype=D))
    x = torch.tensor([1.5, 1.0], dtype=D)
    solver.step(x, torch.tensor([0.2, -0.4], dtype=D), None)
    assert torch.allclose(x, torch.tensor([1.455, 1.09], dtype=D), rtol=0, atol=1e-15)


def test_momentum_and_weight_decay_step_by_hand():
    # wd 0.1: g~ = [1 + 0.1*2] = 1.2; u = 1.2; x = 2 - 0.5*1.2 = 1.4
    # next: g~ = 1 + 0.1*1.4 = 1.14; u = 0.9*1.2 + 1.14 = 2.22; x = 1.4 - 0.5*2.22 = 0.29
    solver = LocalSolver(SolverSpec(lr=0.5, momentum=0.9, weight_decay=0.1))
    x = torch.tensor([2.0], dtype=D)
    solver.begin(x.clone())
    solver.step(x, torch.tensor([1.0], dtype=D), None)
    assert x.item() == pytest.approx(1.4, abs=1e-15)
    solver.step(x, torch.tensor([1.0], dtype=D), None)
    assert x.item() == pytest.approx(0.29, abs=1e-15)


@pytest.mark.parametrize("tau,expected", [(1, 1.0), (2, 2.9), (10, 41.381059609), (30, 213.81520424476952)])
def test_momentum_normaliser_matches_fednova_spec(tau, expected):
    solver = LocalSolver(SolverSpec(lr=0.05, momentum=0.9))
    x = torch.zeros(1, dtype=D)
    solver.begin(x.clone())
    for _ in range(tau):
        solver.step(x, torch.zeros(1, dtype=D), None)
    assert solver.anorm() == pytest.approx(expected, rel=1e-10)


def test_prox_normaliser_matches_closed_form():
    lr, mu, tau = 0.05, 0.01, 30
    solver = LocalSolver(SolverSpec(lr=lr, mu=mu))
    x = torch.zeros(1, dtype=D)
    solver.begin(x.clone())
    for _ in range(tau):
        solver.step(x, torch.zeros(1, dtype=D), None)
    alpha = lr * mu
    assert solver.anorm() == pytest.approx((1 - (1 - alpha) ** tau) / alpha, rel=1e-12)
    assert solver.anorm() == pytest.approx(29.78351158325987, rel=1e-12)


def test_scaffold_control_variates_by_hand():
    st = Scaffold(num_local=2, num_params=2, device=torch.device("cpu"), dtype=D)
    st.c.copy_(torch.tensor([0.1, 0.2], dtype=D))
    st._table()[1] = torch.tensor([0.3, -0.1], dtype=D)
    assert torch.allclose(st.correction(1), torch.tensor([-0.2, 0.3], dtype=D))
    # c_i+ = c_i - c + (x0 - y)/(K lr) = [0.3-0.1+0.4/0.4, -0.1-0.2-0.2/0.4] = [1.2, -0.8]
    dc = st.update(1, torch.tensor([-0.4, 0.2], dtype=D), anorm=4.0, lr=0.1)
    assert torch.allclose(dc, torch.tensor([0.9, -0.7], dtype=D), atol=1e-15)
    assert torch.allclose(st._table()[1], torch.tensor([1.2, -0.8], dtype=D), atol=1e-15)
    assert st._table()[0].abs().sum() == 0


def test_scaffold_server_update_by_hand():
    # Two clients, N = 4, lr 0.1, K = 4, c = 0, c_i = 0: dc_i = -delta_i/(K lr) = -2.5 delta_i
    # deltas [-0.4, 0.2] and [0.4, 0.6]: sum dc = -2.5*[0, 0.8] = [0, -2]; c = sum/N = [0, -0.5]
    cfg = AlgorithmSection(local="scaffold", steps="fixed", local_steps=4, weights="uniform", server="average", lr=0.1)
    algo, x, _ = aggregate(cfg, [[-0.4, 0.2], [0.4, 0.6]], [1, 1], [0.0, 0.0], num_clients=4)
    assert np.allclose(x, [0.0, 0.4], atol=1e-15)
    assert torch.allclose(algo.extras[0].c, torch.tensor([0.0, -0.5], dtype=D), atol=1e-15)


def test_steps_and_weights_policies():
    sizes = np.array([1, 32, 33, 100])
    ids = np.arange(4)
    assert EpochSteps(2, 32)(0, ids, sizes).tolist() == [2, 2, 4, 8]
    # the paper's floor(E n / B), at least one step: 2/32 -> 1, 64/32 = 2, 66/32 -> 2, 200/32 -> 6
    assert EpochSteps(2, 32, "floor")(0, ids, sizes).tolist() == [1, 2, 2, 6]
    assert FixedSteps(5)(0, ids, sizes).tolist() == [5, 5, 5, 5]
    assert SizeWeights()(0, ids, sizes).tolist() == [1, 32, 33, 100]
    assert UniformWeights()(0, ids, sizes).tolist() == [1, 1, 1, 1]


@pytest.mark.parametrize("server", ["average", "nova"])
def test_pack_into_a_dirty_buffer_equals_the_row_built_by_hand(server):
    """The row written in place (over garbage, float32 update from the 'device') is bitwise
    [float64(delta) * w (/ ||a||_1 over the parameters for nova) | SCAFFOLD's Delta c_i | scalars]."""
    cfg = AlgorithmSection(local="scaffold", steps="epochs", weights="size", server=server)
    from hpcfl.algorithms.server import NovaOptions

    opts = NovaOptions() if server == "nova" else None
    algo = Algorithm(full(cfg, opts), 3, 3, 1, torch.device("cpu"), D, np.ones(4, dtype=np.int64))
    ctx = SimpleNamespace(lr=0.1)
    delta32 = torch.tensor([0.1, -0.7, 3e-8], dtype=torch.float32)
    res = ClientResult(delta32, 3, 2.5, 0.75, 24)
    out = np.full(algo.layout.length, 7.0)
    algo.pack_into(ctx, 0, 0, res, 0.3, out)
    want = delta32.double().numpy() * 0.3
    if server == "nova":
        want = want / 2.5
    seg = algo.layout.split(out)
    assert seg["delta"].tobytes() == want.tobytes()
    # SCAFFOLD option II from c = c_i = 0: Delta c_i = -delta / (||a||_1 lr), in the model's dtype
    assert seg["extra"].tobytes() == (-delta32.double() / (2.5 * 0.1)).numpy().tobytes()
    assert seg["scalars"].tolist() == [0.3, 0.3 * 3, 0.3 * 2.5, 0.3 * 0.75, 1.0, 24.0, 0.0]
    assert seg.keys() == {"delta", "extra", "scalars"}
    assert algo.pack(ctx, 0, 0, ClientResult(delta32, 3, 2.5, 0.75, 24), 0.3).shape == out.shape


def test_exact_sum_claim_commit_refuses_nan_and_keeps_the_max():
    acc = ExactSum(3)
    acc.claim()[:] = [1.0, -4.0, 0.5]
    acc.commit()
    acc.claim()[:] = [np.inf, 0.0, 0.0]
    with pytest.raises(FloatingPointError):
        acc.commit()
    acc.claim()[:] = [np.nan, 0.0, 0.0]
    with pytest.raises(FloatingPointError):
        acc.commit()
    acc.claim()[:] = [-2.0, 1.0, 0.25]
    acc.commit()
    assert acc.count == 2 and acc.maxabs.tolist() == [2.0, 4.0, 0.5]
    assert acc.reduce(MPI.COMM_SELF, total=2).tolist() == [-1.0, -3.0, 0.75]
