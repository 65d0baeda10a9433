"""results.clients = "sampled" on the test's world (2 and 3 ranks): the results file's per-client rows
and its panel are bitwise those of a one-rank run of the same job (the panel is drawn from the seed
alone, and rank 0 keeps the panel's rows of records that do not depend on the rank count)."""

import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from runner import job

import hpcfl

TABLE = job(**{"algorithm.name": "scaffold", "run.rounds": 3, "data.num_clients": 40, "algorithm.clients_per_round": 20,
               "data.dirichlet.alpha": 5.0, "results.clients": "sampled", "results.client_sample": 0.25})



def stored(path: Path) -> dict:
    """Every /clients column and /clients_panel of a results file, as bytes."""
    with h5py.File(path, "r") as f:
        out = {f"clients/{k}": f["clients"][k][()].tobytes() for k in f["clients"]}
        out["clients_panel"] = f["clients_panel"][()].tobytes()
        out["rows"] = len(f["clients/round"])
    return out


@pytest.mark.mpi(min_size=2)
def test_a_sampled_file_is_the_one_rank_file_bitwise(folder):
    comm = MPI.COMM_WORLD
    if comm.rank == 0:
        hpcfl.run(TABLE, out=folder / "one", comm=MPI.COMM_SELF)
    comm.Barrier()
    got = hpcfl.run(TABLE, out=folder / "world")
    assert got.attrs["world_size"] == comm.size
    if comm.rank != 0:
        return
    one, world = stored(folder / "one" / "results.h5"), stored(folder / "world" / "results.h5")
    assert world == one
    assert 0 < one["rows"] < 3 * 20   # a part of each cohort: 10 panel clients of 40, cohorts of 20
    assert np.frombuffer(one["clients_panel"], dtype=np.int64).size == 10
