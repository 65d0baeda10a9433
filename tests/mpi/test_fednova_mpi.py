"""FedNova check T9: the rank count and the client placement do not change a run.

Run at 2 and 3 ranks (``mpiexec -n 2 python -m mpi4py -m pytest --with-mpi tests/mpi/test_fednova_mpi.py``).
Rank 0 first runs the job alone on COMM_SELF (the 1-rank reference); then all ranks run it
together. The experiment is a float64 quadratic with unequal client sizes (so p_i is not
uniform), random local epochs E_i(t) ~ U{2..5} (tau_i(t) = E_i(t) ceil(n_i / B), different per
client and round) and partial participation (4 of 7 clients per round, different cohorts).
The spec asks for <= 1e-12 relative on the global model; every draw is keyed by (seed, round,
client) and the reduction is exact, so the models are compared bit for bit, and so are the
sampled cohorts S_t and the recorded tau_i(t).
"""

import json

import numpy as np
import pytest
from mpi4py import MPI
from runner import run_memory

from hpcfl import config

BASE = {
    "run": {"seed": 2, "rounds": 6, "eval_every": 0},
    "data": {"dataset": "quadratic", "partition": "quantity_skew", "num_clients": 7,
             "quadratic": {"dim": 3, "num_clients": 30, "std": 1.0, "seed": 5},
             "quantity_skew": {"alpha": 1.0, "min_samples": 2}},
    "model": {"name": "quadratic"},
    "algorithm": {"name": "fednova", "lr": 0.05, "batch_size": 2, "steps": "random_epochs",
                  "random_epochs": {"low": 2, "high": 5}, "clients_per_round": 4},
    "runtime": {"dtype": "float64", "threads": 1, "progress": "none"},
}
CASES = {
    "block": {},
    "round_robin": {"runtime.placement": "round_robin"},
    "prox_server_momentum_round_robin": {"algorithm.local": "prox", "algorithm.mu": 0.1,
                                         "algorithm.server_momentum": 0.5, "runtime.placement": "round_robin"},
    "momentum_unbiased": {"algorithm.momentum": 0.9, "algorithm.lr": 0.01, "algorithm.sampling": "unbiased"},
    "with_replacement": {"algorithm.sampling": "with_replacement"},
}


def setkeys(base, keys):
    return config.apply_overrides(base, [f"{k}={json.dumps(v)}" for k, v in keys.items()])


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("case", sorted(CASES))
def test_T9_world_run_equals_one_rank(case):
    """Final model bitwise equal to the 1-rank run's, on every rank; per round the same cohort and
    the same tau_i(t). The reference must exercise what is compared: more than one distinct cohort
    and more than two distinct step counts, and clients of more than one size."""
    comm = MPI.COMM_WORLD
    table = setkeys(BASE, CASES[case])
    ref = run_memory(table, MPI.COMM_SELF) if comm.rank == 0 else None
    comm.Barrier()
    x, _, clients = run_memory(table, comm)
    assert all(m == x.tobytes() for m in comm.allgather(x.tobytes()))
    if comm.rank != 0:
        return
    rx, _, rclients = ref
    assert np.abs(x - rx).max() <= 1e-12 * np.abs(rx).max()
    assert x.tobytes() == rx.tobytes(), f"{case}: final model differs"
    assert len(clients) == len(rclients) == BASE["run"]["rounds"]
    for c, r in zip(clients, rclients):
        assert c["client"].tolist() == r["client"].tolist()
        assert c["steps"].tolist() == r["steps"].tolist()
        assert c["weight"].tobytes() == r["weight"].tobytes()
    assert len({tuple(r["client"].tolist()) for r in rclients}) > 1
    assert len(set(np.concatenate([r["steps"] for r in rclients]).tolist())) > 2


@pytest.mark.mpi(min_size=2)
def test_T9_placements_agree():
    """Block and round-robin placement of the clients on the world's ranks give the same model."""
    comm = MPI.COMM_WORLD
    a, _, _ = run_memory(BASE, comm)
    b, _, _ = run_memory(setkeys(BASE, {"runtime.placement": "round_robin"}), comm)
    if comm.rank == 0:
        assert a.tobytes() == b.tobytes()
