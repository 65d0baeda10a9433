"""FedGSNR through the vmap path (a model with its own loss) on 1 rank and the world's ranks."""

import sys
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from runner import run_memory  # noqa: E402

QUADRATIC = {
    "run": {"name": "q", "seed": 1, "rounds": 4, "eval_every": 1},
    "data": {"dataset": "quadratic", "partition": "natural", "num_clients": 7,
             "quadratic": {"num_clients": 7, "dim": 5, "std": 0.1}},
    "model": {"name": "quadratic"},
    "algorithm": {"name": "fedgsnr", "lr": 0.05, "batch_size": 1, "local_steps": 6, "clients_per_round": 5},
    "runtime": {"threads": 1, "progress": "none", "dtype": "float64"},
}


@pytest.mark.mpi(min_size=2)
def test_gsnr_vmap_path_is_bitwise_identical_to_one_rank():
    comm = MPI.COMM_WORLD
    ref = run_memory(QUADRATIC, MPI.COMM_SELF) if comm.rank == 0 else None
    comm.Barrier()
    x, metrics, clients = run_memory(QUADRATIC, comm)
    if comm.rank != 0:
        return
    assert x.tobytes() == ref[0].tobytes()
    for c, r in zip(clients, ref[2]):
        for k in ("steps", "gsnr", "gsnr_nopt", "gsnr_M", "gsnr_N", "weight"):
            assert np.asarray(c[k]).tobytes() == np.asarray(r[k]).tobytes(), k
    assert any(len(set(c["steps"].tolist())) > 1 for c in clients)   # the allocation did something
