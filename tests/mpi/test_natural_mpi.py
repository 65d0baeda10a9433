"""A naturally partitioned LEAF job (each user a client, per-client evaluation on each user's own
test rows) is bitwise the same on 1 rank and on the world's ranks (run at 2 and 3): FEMNIST-like
images with an MLP, and Shakespeare-like characters with char_lstm."""

import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI
from runner import job

from hpcfl import config
from hpcfl.engine import simulation

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from natural_writers import random_leaf  # noqa: E402  (the loader tests' writers)

CASES = {
    "images_mlp": ({}, {"data.leaf.image_shape": [1, 4, 4], "model.name": "mlp", "model.mlp.hidden": [8],
                        "runtime.eval_batch_size": 5}),
    "chars_char_lstm": ({"chars": True, "width": 6}, {
        "data.leaf.features": "chars", "data.leaf.vocab": "abcdefgh ijkl,mnop.\n", "model.name": "char_lstm",
        "model.char_lstm.hidden": 8, "model.char_lstm.layers": 1, "model.char_lstm.embed_dim": 4,
        "runtime.eval_batch_size": 3, "algorithm.name": "scaffold"}),
}


def natural_job(root, over):
    table = job(**{"data.dataset": "leaf", "data.root": root, "data.partition": "natural", "data.num_clients": 7,
                   "algorithm.batch_size": 2, "algorithm.clients_per_round": 4, "algorithm.local_steps": 3,
                   "run.rounds": 3, **{k: v for k, v in over.items() if not k.startswith("model.")}})
    model = {"name": over["model.name"]}
    sub = {k.split(".")[2]: v for k, v in over.items() if k.startswith(f"model.{over['model.name']}.")}
    if sub:
        model[over["model.name"]] = sub
    table["model"] = model
    return table


def run(table, comm):
    setup = simulation.prepare(config.from_dict(table), comm)
    tests, evals = [], []
    x = simulation.run(setup, on_round=lambda m, c: tests.append((m["test_accuracy"], m["test_loss"])),
                       on_eval=lambda r, acc, loss: evals.append((r, acc.copy(), loss.copy())))
    return np.asarray(x), tests, evals, setup.client_eval.sizes.copy()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_natural_leaf_job_is_bitwise_the_same_on_any_rank_count(case):
    comm = MPI.COMM_WORLD
    writer, over = CASES[case]
    with tempfile.TemporaryDirectory() as tmp:
        root = comm.bcast(random_leaf(tmp, **writer) if comm.rank == 0 else None)
        table = natural_job(root, over)
        ref = run(table, MPI.COMM_SELF) if comm.rank == 0 else None
        comm.Barrier()
        x, tests, evals, sizes = run(table, comm)
        comm.Barrier()   # every rank has read the files before rank 0 removes them
    if comm.rank != 0:
        return
    rx, rtests, revals, rsizes = ref
    assert x.tobytes() == rx.tobytes()
    assert np.array(tests).tobytes() == np.array(rtests).tobytes()
    assert sizes.tolist() == rsizes.tolist() and sizes.sum() > 0 and len(sizes) == 7
    assert [r for r, _, _ in evals] == [1, 2, 3]
    for (r, acc, loss), (_, racc, rloss) in zip(evals, revals):
        assert acc.tobytes() == racc.tobytes() and loss.tobytes() == rloss.tobytes(), f"{case}: round {r}"
        assert np.isnan(acc[sizes == 0]).all() and np.isfinite(acc[sizes > 0]).all()
