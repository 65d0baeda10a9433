"""hpcfl.run called by every rank of the test's world (2 and 3 ranks): every rank gets the same
Results, equal to a one-rank run of the same job; an input error and a callback that raises reach
every rank as the same exception; the stopped run resumes to the uninterrupted one's bits."""

import sys
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from runner import job

import hpcfl
from hpcfl.errors import CallbackError, ConfigError

TABLE = job(**{"algorithm.name": "scaffold", "run.rounds": 4, "data.num_clients": 7})



def fingerprint(res) -> tuple:
    return (res.outcome, res.status, res.final_params.tobytes(), res.metrics["test_accuracy"].tobytes(),
            res.metrics["train_loss"].tobytes(), res.clients["weight"].tobytes(), res.client_eval["accuracy"].tobytes())


@pytest.mark.mpi(min_size=2)
def test_every_rank_gets_the_one_rank_results_and_the_same_errors(folder):
    comm = MPI.COMM_WORLD
    ref = hpcfl.run(TABLE, out=folder / "one", comm=MPI.COMM_SELF) if comm.rank == 0 else None
    ref = comm.bcast(fingerprint(ref) if ref is not None else None, root=0)
    got = hpcfl.run(TABLE, out=folder / "all")   # a dict job, on the whole world
    assert got.attrs["world_size"] == comm.size
    assert fingerprint(got) == ref                     # bitwise the one-rank run, on every rank
    assert comm.allgather(fingerprint(got)) == [ref] * comm.size

    with pytest.raises(ConfigError, match="algorithm.lr"):   # bad input: every rank, the same message
        hpcfl.run(TABLE, out=folder / "bad", overrides={"algorithm.lr": -1.0})
    assert not (folder / "bad").exists()

    def fails_in_round_2(event):
        if event.kind == "round" and event.round == 2:
            raise RuntimeError("logging failed")

    with pytest.raises(CallbackError) as err:
        hpcfl.run(TABLE, out=folder / "cb", callbacks=[fails_in_round_2])
    assert err.value.callback.endswith("fails_in_round_2") and "stopped after round 2" in str(err.value)
    assert isinstance(err.value.__cause__, RuntimeError) == (comm.rank == 0)   # the traceback stays on rank 0
    resumed = hpcfl.run(TABLE, out=folder / "cb")
    assert resumed.segments[-1]["start_round"] == 3
    assert fingerprint(resumed) == ref
    assert np.array_equal(resumed.clients["round"], np.repeat(np.arange(1, 5), 5))
