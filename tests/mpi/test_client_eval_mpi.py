"""Per-client evaluation (run.eval_clients, /client_eval) is bitwise the same on 1 rank and on the
world's ranks (run at 2 and 3): each chunk of the test set gives the same per-client sums whichever
rank evaluates it, and the chunks are summed exactly."""

import numpy as np
import pytest
from mpi4py import MPI
from runner import job

from hpcfl import config
from hpcfl.engine import simulation

CASES = {
    # eval_batch_size 40: the 360 test samples make 9 chunks, dealt over the ranks
    "fedavg": {"runtime.eval_batch_size": 40},
    "scaffold_float64_eval_every_2": {"algorithm.name": "scaffold", "runtime.dtype": "float64",
                                      "run.eval_every": 2, "runtime.eval_batch_size": 33},
    "min_rows_25": {"run.eval_clients_min": 25, "runtime.eval_batch_size": 50, "data.num_clients": 9},
}


def run_evals(table, comm):
    """(final model, test metrics, [(round, accuracies, losses)]) of an in-memory run; rank 0's."""
    setup = simulation.prepare(config.from_dict(table), comm)
    tests, evals = [], []
    x = simulation.run(setup, on_round=lambda m, c: tests.append((m["test_accuracy"], m["test_loss"])),
                       on_eval=lambda r, acc, loss: evals.append((r, acc.copy(), loss.copy())))
    return np.asarray(x), tests, evals


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("case", sorted(CASES))
def test_per_client_evaluation_is_bitwise_the_same_on_any_rank_count(case):
    comm = MPI.COMM_WORLD
    table = job(**CASES[case])
    ref = run_evals(table, MPI.COMM_SELF) if comm.rank == 0 else None
    comm.Barrier()
    x, tests, evals = run_evals(table, comm)
    if comm.rank != 0:
        return
    rx, rtests, revals = ref
    assert x.tobytes() == rx.tobytes()
    assert np.array(tests).tobytes() == np.array(rtests).tobytes()
    rounds = table["run"]["rounds"]
    every = table["run"]["eval_every"]
    assert [r for r, _, _ in evals] == [r for r in range(1, rounds + 1) if r % every == 0 or r == rounds]
    for (r, acc, loss), (rr, racc, rloss) in zip(evals, revals):
        assert r == rr and acc.shape == (table["data"]["num_clients"],)
        assert acc.tobytes() == racc.tobytes() and loss.tobytes() == rloss.tobytes(), f"{case}: round {r}"
        assert np.isfinite(acc).all() and ((acc >= 0) & (acc <= 1)).all()
