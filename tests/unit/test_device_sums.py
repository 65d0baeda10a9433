"""The GPU path's round on the CPU: rows written on the training device, the device form of the exact
sum, the global model kept there and updated there (HPCFL_DEVICE_SUMS=1), against the host path.

A whole run through the device path ends bitwise where the host path ends, for every algorithm
(each policy writes its segments into a device row, and the server step runs on the device or on
host copies), so the GPU's code is checked here where no GPU is.
"""

import numpy as np
import pytest
import torch
from mpi4py import MPI

from hpcfl import config
from hpcfl.algorithms.protocol import Policy
from hpcfl.engine import simulation
from hpcfl.parallel.gridsum import GridSum
from hpcfl.parallel.gridsum_torch import TorchFloatSum, TorchGridSum
from runner import job, run_memory

LGA = {"algorithm.name": "fedlga", "algorithm.steps": "straggler", "algorithm.local_steps": 0,
       "algorithm.local_epochs": 2, "algorithm.straggler.tau_max": 2, "algorithm.straggler.tau_min": 2}
CASES = {
    "fedavg": {},
    "fedavg-float": {"runtime.reduce": "float"},
    "fedprox": {"algorithm.name": "fedprox", "algorithm.mu": 0.1},
    "fednova-momentum": {"algorithm.name": "fednova", "algorithm.server_momentum": 0.5},
    "scaffold": {"algorithm.name": "scaffold"},
    "feddyn": {"algorithm.name": "feddyn"},
    "gift": {"algorithm.name": "gift"},
    "fedlga-rank1": LGA,
    "fedlga-diag": {**LGA, "algorithm.lga.hessian": "diag"},
    "fedgsnr": {"algorithm.name": "fedgsnr"},
    "feddisco-vr": {"algorithm.name": "feddisco", "algorithm.local": "vr", "algorithm.clients_per_round": 0},
}


def both(monkeypatch, overrides):
    monkeypatch.delenv("HPCFL_DEVICE_SUMS", raising=False)
    host = run_memory(job(**overrides), MPI.COMM_SELF)
    monkeypatch.setenv("HPCFL_DEVICE_SUMS", "1")
    device = run_memory(job(**overrides), MPI.COMM_SELF)
    return host, device


@pytest.mark.parametrize("name", list(CASES))
def test_the_device_path_ends_where_the_host_path_ends(monkeypatch, name):
    (xh, mh, ch), (xd, md, cd) = both(monkeypatch, CASES[name])
    assert isinstance(xd, np.ndarray) and xh.dtype == xd.dtype
    assert xh.tobytes() == xd.tobytes(), "final model differs"
    assert len(mh) == len(md) == 3
    for a, b in zip(mh, md):
        assert a.keys() == b.keys()
        for k in a:
            assert np.array_equal(a[k], b[k], equal_nan=True), k
    for a, b in zip(ch, cd):
        for k in a:
            assert np.array_equal(a[k], b[k], equal_nan=True), k


def test_the_device_path_uses_the_device_forms_and_moves_the_model_once_per_run(monkeypatch):
    monkeypatch.setenv("HPCFL_DEVICE_SUMS", "1")
    s = simulation.prepare(config.from_dict(job()), MPI.COMM_SELF)
    assert isinstance(simulation.accumulator(s), TorchGridSum)
    seen = []
    s.algo.add(_Probe(seen))
    simulation.run(s)
    assert all(isinstance(x0, torch.Tensor) for x0 in seen) and len(seen) == 3
    assert seen[1].data_ptr() != seen[0].data_ptr()   # the server made a new model, on the device
    monkeypatch.setenv("HPCFL_DEVICE_SUMS", "0")
    s = simulation.prepare(config.from_dict(job(**{"runtime.reduce": "float"})), MPI.COMM_SELF)
    assert not isinstance(simulation.accumulator(s), (TorchGridSum, TorchFloatSum))
    assert isinstance(simulation.accumulator(simulation.prepare(config.from_dict(job()), MPI.COMM_SELF)), GridSum)


class _Probe(Policy):
    """Records each round's start model as the policies see it (every other hook: Policy's no-op)."""

    def __init__(self, seen):
        self.seen = seen

    def statistics(self, ctx):
        self.seen.append(ctx.clients.x0)
