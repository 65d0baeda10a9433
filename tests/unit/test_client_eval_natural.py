"""Per-client evaluation on natural clients' own test rows (LEAF's and TFF's test files, npz's
client_test): the pairs, a hand count of each client's accuracy on a tiny LEAF job, NaN for a client
without rows (said once), and drawn rows for any other partition."""

import numpy as np
import torch
from mpi4py import MPI
from natural_writers import write_leaf_images
from runner import job

from hpcfl import config
from hpcfl.data.client_test import client_test_pairs, own_test_pairs
from hpcfl.data.partition import Groups
from hpcfl.engine import simulation


def test_own_rows_as_sorted_row_client_pairs():
    sizes, sample, client = own_test_pairs(([3], [], [0, 2]))
    assert sizes.tolist() == [1, 0, 2] and sample.tolist() == [0, 2, 3] and client.tolist() == [2, 2, 0]
    sizes, sample, client = own_test_pairs(Groups(np.array([4, 1, 0, 2], dtype=np.int64), np.array([2, 0, 2])))
    assert sizes.tolist() == [2, 0, 2] and sample.tolist() == [0, 1, 2, 4] and client.tolist() == [2, 0, 2, 0]


def leaf_job(root, **over):
    """The tiny LEAF set (natural_writers) with logistic regression, every client in every round."""
    table = job(**{"data.dataset": "leaf", "data.root": str(root), "data.partition": "natural", "data.num_clients": 3,
                   "algorithm.batch_size": 2, "algorithm.clients_per_round": 3, "algorithm.local_steps": 2,
                   "runtime.dtype": "float64", "run.rounds": 2, **over})
    table["model"] = {"name": "logreg"}
    return table


def test_each_clients_accuracy_is_a_hand_count_over_its_own_test_rows(tmp_path):
    setup = simulation.prepare(config.from_dict(leaf_job(write_leaf_images(tmp_path))), MPI.COMM_SELF)
    assert setup.client_eval.sizes.tolist() == [1, 0, 2]
    assert setup.notes == (("per-client evaluation uses each client's own test rows; 1 of 3 clients have none in "
                            "the test file(s): their /client_eval accuracy and loss are NaN"),)
    evals = []
    x = simulation.run(setup, on_eval=lambda r, acc, loss: evals.append((r, acc.copy(), loss.copy())))
    assert [r for r, _, _ in evals] == [1, 2]
    _, acc, loss = evals[-1]
    # by hand: logits = x W^T + b of the final model, hits on each client's own rows
    w = np.asarray(x)[:5 * 4].reshape(5, 4)
    b = np.asarray(x)[5 * 4:5 * 4 + 5]
    ds = setup.dataset
    pred = (ds.x_test.astype(np.float64) @ w.T + b).argmax(axis=1)
    hit = pred == ds.y_test
    # u1 owns test row 3, u10 none, u2 rows 0 and 1 (natural_writers: the rows as the files list them)
    assert [list(t) for t in ds.natural_test] == [[3], [], [0, 1]]
    assert acc[0] == hit[3] / 1 and np.isnan(acc[1]) and acc[2] == (hit[0] + hit[1]) / 2
    logits = torch.from_numpy(ds.x_test.astype(np.float64) @ w.T + b)
    each = torch.nn.functional.cross_entropy(logits, torch.from_numpy(ds.y_test), reduction="none").numpy()
    assert loss[0] == np.float64(each[3]) and np.isnan(loss[1])
    assert abs(loss[2] - (each[0] + each[1]) / 2) < 1e-12


def test_another_partition_draws_the_rows_with_the_clients_label_mix(tmp_path):
    table = leaf_job(write_leaf_images(tmp_path), **{"data.partition": "iid", "run.eval_clients_min": 2})
    setup = simulation.prepare(config.from_dict(table), MPI.COMM_SELF)
    drawn = client_test_pairs(setup.dataset.y_test, setup.class_counts, 3, 2)
    assert setup.notes == () and setup.client_eval.sizes.tolist() == drawn[0].tolist()
    assert setup.client_eval.sample.tolist() == drawn[1].tolist()
