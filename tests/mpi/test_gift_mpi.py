"""GIFT, AdaComm and AFL on several ranks: spec E1 (rank-layout invariance), E2 (one reduction, no
policy collective, idle ranks) and E3 (the engine against an independent Algorithm 1).

Run at 2 and 3 ranks (``mpiexec -n 3 python -m mpi4py -m pytest --with-mpi tests/mpi/test_gift_mpi.py``).
E1 and E2: rank 0 first runs the job alone on COMM_SELF (the 1-rank reference), then all ranks run it
together. Every draw is keyed by (seed, round, client) and the reduction is exact, so the spec's
tolerances (1e-6 on C, 1e-5 on the model) are replaced by bitwise equality. E3: the engine against
a plain numpy loop of the GIFT paper's Algorithm 1 (C. Chen et al., "GIFT: Toward Accurate and
Efficient Federated Learning With Gradient-Instructed Frequency Tuning", 2023) that calls only
:class:`hpcfl.algorithms.tau_control.GiftController` for its decisions.
"""

import json

import numpy as np
import pytest
from mpi4py import MPI
from runner import run_memory

from hpcfl.parallel import comm as hcomm
from hpcfl import config, data
from hpcfl.engine import simulation
from hpcfl.algorithms import SCALARS
from hpcfl.algorithms.tau_control import GiftController
from hpcfl.parallel.gridsum import GridSum

# Ten noisy heterogeneous quadratics; the clock keeps the 4 earliest reports (ceil(0.4 * 10)) out of
# all ten, with exponential delays, so the reporters change from round to round. lr 0.2 and short
# patience / warm-up make C level off and tau halve twice within 18 rounds.
E1 = {
    "run": {"seed": 3, "rounds": 18, "eval_every": 0},
    "data": {"dataset": "quadratic", "partition": "natural", "num_clients": 10,
             "quadratic": {"dim": 4, "num_clients": 10, "std": 3.0, "curvature_low": 0.5, "curvature_high": 2.0,
                           "noise": 0.5, "samples": 8}},
    "model": {"name": "quadratic", "quadratic": {"init": -10.0}},
    "algorithm": {"name": "gift", "lr": 0.2, "batch_size": 2, "local_steps": 16,
                  "gift": {"patience": 2, "warmup": 2, "eps_abs": 0.01}},
    "system": {"enabled": True, "compute_s": 0.01, "delay_dist": "exponential", "delay_s": 1.0,
               "earliest_fraction": 0.4},
    "runtime": {"dtype": "float64", "threads": 1, "progress": "none"},
}
# combinations chosen through the job file alone; the vectorised client blocks keep them cheap
CASES = {
    "gift": {},
    "gift_fedprox": {"algorithm.local": "prox", "algorithm.mu": 0.01, "runtime.vectorize": "on"},
    "gift_fednova": {"algorithm.server": "nova", "runtime.vectorize": "on"},
    "adacomm": {"algorithm.name": "adacomm", "algorithm.adacomm.interval_rounds": 3},
    "afl": {"algorithm.name": "afl", "algorithm.afl.trial_rounds": 3, "algorithm.afl.stat_batch": 4},
}
ROUND_KEYS = ("tau_used", "tau_next", "tau_event", "local_iters_cum", "gift_C", "sim_time", "sim_time_round",
              "clients_participating", "train_loss", "afl_beta", "afl_rho", "afl_delta")
CLIENT_KEYS = ("client", "dropped", "steps", "weight", "sim_time")


def table(base, keys):
    """``base`` with dotted overrides; [algorithm.gift] is dropped for the other tau policies."""
    t = json.loads(json.dumps(base))
    if keys.get("algorithm.name", "gift") != "gift":
        t["algorithm"].pop("gift", None)
    return config.apply_overrides(t, [f"{k}={json.dumps(v)}" for k, v in keys.items()])


def reference_then_world(t):
    """(1-rank reference on rank 0 or None, the world's run); the world's model is checked to be
    the same on every rank."""
    comm = MPI.COMM_WORLD
    ref = run_memory(t, MPI.COMM_SELF) if comm.rank == 0 else None
    comm.Barrier()
    got = run_memory(t, comm)
    assert all(b == got[0].tobytes() for b in comm.allgather(got[0].tobytes()))
    return ref, got


def assert_bitwise(got, ref):
    """Final model, every round record of ROUND_KEYS and every client record of CLIENT_KEYS, bit for bit."""
    x, metrics, clients = got
    rx, rmetrics, rclients = ref
    assert x.tobytes() == rx.tobytes(), "final model differs"
    assert len(metrics) == len(rmetrics) and len(clients) == len(rclients)
    for m, r in zip(metrics, rmetrics):
        for k in ROUND_KEYS:
            if k in r:
                assert np.asarray(m[k]).tobytes() == np.asarray(r[k]).tobytes(), (k, r["round"])
    for c, r in zip(clients, rclients):
        for k in CLIENT_KEYS:
            assert np.asarray(c[k]).tobytes() == np.asarray(r[k]).tobytes(), (k, r["round"][0])


def reporters(clients):
    """Per round, the ids of the clients whose update was used (dropped code 0)."""
    return [tuple(c["client"][c["dropped"] == 0].tolist()) for c in clients]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("case", sorted(CASES))
def test_E1_world_run_equals_one_rank(case):
    """Spec E1: the same participants per round, identical tau trajectories, C, simulated time and
    final model as the 1-rank run, bit for bit; GIFT also through the job file's FedProx solver and
    FedNova rule, and AdaComm and AFL on the clock. The reference must exercise what is compared:
    tau changes (twice for GIFT's stagnation rule), and the 4 reporters of 10 differ between rounds."""
    ref, got = reference_then_world(table(E1, CASES[case]))
    if MPI.COMM_WORLD.rank != 0:
        return
    assert_bitwise(got, ref)
    _, rmetrics, rclients = ref
    changes = [m["round"] for m in rmetrics if m["tau_used"] != m["tau_next"]]
    assert len(changes) >= (2 if case.startswith("gift") else 1), (case, changes)
    rep = reporters(rclients)
    assert len(set(rep)) > 1 and all(len(r) == 4 for r in rep), rep
    assert all(m["clients_participating"] == 4 for m in rmetrics)


class CountingComm:
    """The world communicator, recording (method, buffer length) of every collective it is asked for."""

    def __init__(self, comm):
        self._comm, self.log = comm, []

    def __getattr__(self, name):
        attr = getattr(self._comm, name)
        if not callable(attr) or name in ("Get_rank", "Get_size"):
            return attr

        def call(*args, **kwargs):
            buf = next((a for a in args if isinstance(a, np.ndarray)), None)
            self.log.append((name, None if buf is None else buf.size))
            return attr(*args, **kwargs)

        return call


@pytest.mark.mpi(min_size=2)
def test_E2_one_training_reduction_per_round_and_idle_ranks_send_zeros(monkeypatch):
    """Spec E2: per round, the training rows travel in exactly one exact reduction of length
    L + P + len(SCALARS) (here L = P = 4 quadratic coordinates and GIFT's one segment |u|): one
    Allreduce of its block exponents (MAX; segments this short have one block per element, so
    it has that length too) and one SUM per limb in use
    (hpcfl.parallel.gridsum.GridSum: one limb on a predicted grid, more in the first round), with no
    policy collective. Broadcasts per round: the model (L values) and the tau controller's
    scalars (tau, iterations, then GiftController's 10 named scalars and its o + 1 = 11 C values:
    23); the EMA pools (2P) stay on rank 0. Evaluation (last round only, eval_every = 0) reduces 4
    values. With K = ceil(0.2 * 10) = 2 reporters, some rank trains nobody in some round: it adds
    no row (count 0), does not deadlock, and the run still equals the 1-rank run bit for bit."""
    world = MPI.COMM_WORLD
    # seed 1: the reporters of round 5 are clients 1 and 3, both on rank 0 at 2 and at 3 ranks when clients
    # train on their home blocks (balanced placement would deal the two reporters to two ranks)
    t = table(E1, {"system.earliest_fraction": 0.2, "run.rounds": 6, "run.seed": 1, "runtime.placement": "block"})
    ref = run_memory(t, MPI.COMM_SELF) if world.rank == 0 else None
    world.Barrier()
    reduces, policy = [], []
    real = GridSum.reduce
    limbs = []

    def counted(self, comm, total, root=0):
        reduces.append((self.length, self.count))
        before = list(self.wire)
        out = real(self, comm, total, root)
        limbs.append(1 + [a != b for a, b in zip(before, self.wire)].index(True))
        return out

    class Collectives(hcomm.Collectives):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.calls = policy

    monkeypatch.setattr(GridSum, "reduce", counted)
    monkeypatch.setattr(simulation, "Collectives", Collectives)
    counting = CountingComm(world)
    x, metrics, clients = run_memory(t, counting)
    monkeypatch.undo()

    rounds, L, P = 6, 4, 4
    buf = L + P + len(SCALARS)
    assert policy == []
    assert [n for n, _ in reduces] == [buf] * rounds            # training, once per round
    allreduce = [n for name, n in counting.log if name == "Allreduce"]
    assert allreduce.count(buf) == rounds + sum(limbs)
    assert limbs[0] > 1 and limbs[1:] == [1] * (rounds - 1)     # the first round has no grid history
    assert allreduce.count(4) == 2 and set(allreduce) == {buf, 4}   # + the final evaluation (ExactSum)
    bcasts = sorted(n for name, n in counting.log if name == "Bcast")
    assert bcasts == sorted([L] * (rounds + 1) + [2 + 10 + 11] * rounds)   # + the model's start broadcast
    assert not any(name in ("Reduce", "Gather", "Allgather", "Scatter") for name, _ in counting.log)
    idle = world.allgather([r for r, (_, count) in enumerate(reduces) if count == 0])
    if world.rank != 0:
        return
    assert any(idle), "the job must leave some rank without a reporter in some round"
    assert_bitwise((x, metrics, clients), ref)
    owner = hcomm.owners(10, world.size)
    for rank, rounds_idle in enumerate(idle):   # a rank with count 0 owns none of the round's reporters
        for r in rounds_idle:
            assert not any(owner[c] == rank for c in reporters(clients)[r])


# -- E3: the paper's Fig. 1 toy and a D-like problem against a plain Algorithm 1 ----------------------------

TOY = {
    "run": {"seed": 1, "rounds": 140, "eval_every": 1},
    "data": {"dataset": "quadratic", "partition": "natural", "num_clients": 2,
             "quadratic": {"dim": 1, "centers": [-2.0, 10.0], "curvatures": [2.0, 0.4]}},
    "model": {"name": "quadratic", "quadratic": {"init": -100.0}},
    "algorithm": {"name": "gift", "lr": 0.05, "batch_size": 1, "local_steps": 64},
    "runtime": {"dtype": "float64", "threads": 1, "progress": "none", "vectorize": "on"},
}
D_LIKE = {
    "run": {"seed": 4, "rounds": 60, "eval_every": 1},
    "data": {"dataset": "quadratic", "partition": "natural", "num_clients": 6,
             "quadratic": {"dim": 20, "num_clients": 6, "std": 5.0, "curvature_low": 0.1, "curvature_high": 2.0}},
    "model": {"name": "quadratic", "quadratic": {"init": -20.0}},
    "algorithm": {"name": "gift", "lr": 0.05, "batch_size": 1, "local_steps": 16,
                  "gift": {"patience": 4, "warmup": 4, "eps_abs": 0.01}},
    "runtime": {"dtype": "float64", "threads": 1, "progress": "none", "vectorize": "on"},
}


def algorithm1(centres, curv, w0, lr, tau0, rounds, **gift):
    """FedAvg with GIFT's controller, Algorithm 1 with full-batch GD, in plain numpy.

    Every client starts from w, runs tau steps w_i <- w_i - lr h_i (w_i - c_i) on
    L_i = 1/2 sum_j h_ij (w_j - c_ij)^2, and reports u_i = w_i - w; the server sets w <- w + mean_i u_i
    (line 9) and gives S = sum_i u_i, A = sum_i |u_i| to the controller (Eq. 1's pools, via
    P = (A + S)/2, N = (S - A)/2), whose tau the next round uses. Returns per round the tau used,
    the tau decided, C, and the loss mean_i L_i at the new w, and the final w.
    """
    n, dim = centres.shape
    w = np.full(dim, float(w0))
    ctl = GiftController(tau0, size=dim, **gift)
    used, nxt, C, loss = [], [], [], []
    for _ in range(rounds):
        tau, ups = ctl.tau, []
        for c, h in zip(centres, curv):
            wi = w.copy()
            for _ in range(tau):
                wi = wi - lr * (h * (wi - c))
            ups.append(wi - w)
        ups = np.array(ups)
        d = ctl.step(ups.sum(axis=0), np.abs(ups).sum(axis=0))
        w = w + ups.mean(axis=0)
        used.append(tau), nxt.append(d.tau_next), C.append(d.C)
        loss.append(float(np.mean(0.5 * (curv * (w - centres) ** 2).sum(axis=1))))
    return np.array(used), np.array(nxt), np.array(C), np.array(loss), w


def engine_vs_algorithm1(t, centres, curv, ranks, **gift):
    """Run ``t`` on the first ``ranks`` world ranks; on rank 0 return (engine records, reference)."""
    world = MPI.COMM_WORLD
    sub = world.Split(0 if world.rank < ranks else MPI.UNDEFINED, world.rank)
    if sub == MPI.COMM_NULL:
        return None
    x, metrics, _ = run_memory(t, sub)
    sub.Free()
    if world.rank != 0:
        return None
    a = t["algorithm"]
    ref = algorithm1(centres, curv, t["model"]["quadratic"]["init"], a["lr"], a["local_steps"],
                     t["run"]["rounds"], **gift)
    got = tuple(np.array([m[k] for m in metrics]) for k in ("tau_used", "tau_next", "gift_C", "test_loss"))
    return got + (x,), ref


def assert_matches(got, ref, min_changes):
    """tau used and decided identical every round; C, the loss at w_r and the final w within 1e-12."""
    used, nxt, C, loss, x = got
    rused, rnxt, rC, rloss, rw = ref
    assert used.tolist() == rused.tolist() and nxt.tolist() == rnxt.tolist()
    assert int((rused != rnxt).sum()) >= min_changes, rused
    np.testing.assert_allclose(C, rC, rtol=0, atol=1e-12)
    np.testing.assert_allclose(loss, rloss, rtol=1e-12, atol=0)
    np.testing.assert_allclose(x, rw, rtol=1e-12, atol=1e-12)


@pytest.mark.mpi(min_size=2)
def test_E3_fig1_toy_matches_algorithm1():
    """Spec E3 on the Fig. 1 toy: L1 = (w + 2)^2 (h = 2, c = -2), L2 = (w - 10)^2 / 5 (h = 0.4, c = 10),
    w0 = -100, lr 0.05, full-batch GD, tau0 64, theta 0.9, stagnation defaults, 140 rounds, on 2 ranks
    (one client each; a third rank has no client to own and sits out). The reference's own trajectory
    must leave tau = 64 at least twice (the paper's prototype: rounds 89 and 133, spec C4)."""
    got = engine_vs_algorithm1(TOY, np.array([[-2.0], [10.0]]), np.array([[2.0], [0.4]]), 2)
    if got is not None:
        assert_matches(*got, min_changes=2)


@pytest.mark.mpi(min_size=2)
def test_E3_d_like_quadratics_match_algorithm1():
    """Spec E3 on a D-like problem without noise: 6 clients, dim 20, h ~ U(0.1, 2), c ~ N(0, 5^2),
    w0 = -20, tau0 16, 60 rounds, on all ranks; patience and warm-up 4 with eps_abs 0.01 so that tau
    halves at least twice within them. The reference reads the centres and curvatures from the
    engine's own dataset (rows [c; h; 0] per client) and runs full-batch GD itself."""
    cfg = config.from_dict(D_LIKE)
    ds = data.load_dataset(cfg.data.dataset, cfg.dataset_options, cfg.data.root, cfg.run.seed)
    assert ds.x_train.shape == (6, 3, 20) and not ds.x_train[:, 2].any()
    got = engine_vs_algorithm1(D_LIKE, ds.x_train[:, 0], ds.x_train[:, 1], MPI.COMM_WORLD.size,
                               patience=4, warmup=4, eps_abs=0.01)
    if got is not None:
        assert_matches(*got, min_changes=2)
