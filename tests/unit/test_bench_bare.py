"""The bare loop of ``hpcfl bench`` is FedAvg: clients start from the same global model."""

import numpy as np
from mpi4py import MPI

from hpcfl.bench.bare import run_bare
from hpcfl.bench.workloads import workload


def tiny():
    job = workload("W", rounds=2)
    job["data"].update(num_clients=6, cache="off", synthetic_images={"num_train": 384, "num_test": 64,
                                                                     "image_shape": [3, 32, 32]})
    job["algorithm"].update(clients_per_round=4, local_epochs=1)
    job["run"]["eval_every"] = 0
    return job


def test_client_order_does_not_matter_and_the_model_moves():
    """Every client trains from the round's global model, so training them in reverse order gives
    the same FedAvg model up to the float32 order of the sum; a loop that let clients see each
    other's updates (sequential SGD) would differ by the size of an update."""
    a = run_bare(tiny(), MPI.COMM_SELF)
    b = run_bare(tiny(), MPI.COMM_SELF, reverse=True)
    start = run_bare(dict(tiny(), run={**tiny()["run"], "rounds": 1}), MPI.COMM_SELF)
    moved = np.abs(a["final"] - start["final"]).max()
    assert moved > 1e-3
    assert np.abs(a["final"] - b["final"]).max() < 1e-5 * max(1.0, moved)
    assert sum(r["steps"] for r in a["rounds"]) == sum(r["steps"] for r in b["rounds"]) > 0


def test_torch_layers_change_no_bit():
    """The bare loop with torch's own ReLU and pooling (its default) and with the zoo's compiled
    layer trains bitwise the same model: the layers compute one function."""
    import torch

    from hpcfl import models
    from hpcfl.bench.bare import torch_layers
    from hpcfl.models.pool import MaxPool2x2, ReLUMaxPool2x2

    net = torch_layers(models.build_model("lenet5", models.model_options("lenet5")(), (3, 32, 32), 10))
    assert [[type(m) for m in seq] for seq in net.conv if isinstance(seq, torch.nn.Sequential)] == [
        [torch.nn.ReLU, torch.nn.MaxPool2d]] * 2
    assert not any(isinstance(m, (MaxPool2x2, ReLUMaxPool2x2)) for m in net.modules())
    a = run_bare(tiny(), MPI.COMM_SELF, layers="torch")
    b = run_bare(tiny(), MPI.COMM_SELF, layers="zoo")
    assert np.array_equal(a["final"].view(np.int32), b["final"].view(np.int32))


def test_the_vmapped_bare_loop_trains_the_same_model():
    """``--bare-vmap``: a round's clients as one vmap(grad) computation on padded batches, the same
    batches and SGD steps as the loop one client at a time, so the same model within float32 rounding."""
    a = run_bare(tiny(), MPI.COMM_SELF)
    b = run_bare(tiny(), MPI.COMM_SELF, vmap=True)
    start = run_bare(dict(tiny(), run={**tiny()["run"], "rounds": 1}), MPI.COMM_SELF)
    moved = np.abs(a["final"] - start["final"]).max()
    assert moved > 1e-3
    assert np.abs(a["final"] - b["final"]).max() < 1e-4 * max(1.0, moved)
    assert [r["steps"] for r in a["rounds"]] == [r["steps"] for r in b["rounds"]]
