"""One GPU per rank at 2 and 3 ranks on one node, with a faked GPU count (no GPU needed)."""

import sys
from pathlib import Path

import pytest
import torch
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from runner import job  # noqa: E402

from hpcfl import config  # noqa: E402
from hpcfl.engine import simulation  # noqa: E402
from hpcfl.errors import ConfigError  # noqa: E402
from hpcfl.parallel.gpus import GpuShortage, place  # noqa: E402



@pytest.fixture(autouse=True)
def _no_sharing_from_the_environment(monkeypatch):
    monkeypatch.delenv("HPCFL_SHARE_GPUS", raising=False)   # tests/conftest.py sets it for the other tests


def gpus(n):
    return lambda: [f"GPU-{i}" for i in range(n)]


@pytest.mark.mpi(min_size=2)
def test_each_rank_of_a_node_takes_its_own_gpu():
    comm = MPI.COMM_WORLD
    p = place(comm, "auto", False, visible=gpus(comm.size))   # every rank sees all of the node's GPUs
    rows = comm.allgather((p.host, p.local_rank, p.local_size, str(p.device), p.gpu, p.sharing))
    assert len({h for h, *_ in rows}) == 1                                  # the test's ranks share one host
    assert [r[1:] for r in rows] == [(r, comm.size, f"cuda:{r}", f"GPU-{r}", 1) for r in range(comm.size)]


@pytest.mark.mpi(min_size=2)
def test_ranks_bound_to_one_gpu_each_all_use_cuda_0():
    comm = MPI.COMM_WORLD
    p = place(comm, "auto", False, visible=lambda: [f"GPU-{comm.rank}"])   # srun --gpus-per-task=1
    assert (str(p.device), p.gpu, p.sharing) == ("cuda:0", f"GPU-{comm.rank}", 1)


@pytest.mark.mpi(min_size=2)
def test_more_ranks_than_gpus_is_refused_on_every_rank_unless_shared(monkeypatch):
    comm = MPI.COMM_WORLD
    with pytest.raises(GpuShortage, match=rf"{comm.size} ranks on this node but only 1 GPU\(s\)"):
        place(comm, "auto", False, visible=gpus(1))
    p = place(comm, "auto", True, visible=gpus(comm.size - 1))
    expect = 0 if comm.rank == comm.size - 1 else comm.rank   # the last rank joins the least used, the first
    assert (str(p.device), p.sharing) == (f"cuda:{expect}", 2 if expect == 0 else 1)
    monkeypatch.setenv("HPCFL_SHARE_GPUS", "1")                # the same, from the environment
    assert str(place(comm, "auto", False, visible=gpus(comm.size - 1)).device) == f"cuda:{expect}"


@pytest.mark.mpi(min_size=2)
def test_a_run_with_too_few_gpus_stops_in_prepare_on_every_rank(monkeypatch):
    comm = MPI.COMM_WORLD
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)   # a node whose one GPU the ranks all see
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: type("P", (), {"uuid": "only"})())
    with pytest.raises(ConfigError, match="runtime.share_gpus = true"):
        simulation.prepare(config.from_dict(job()), comm)
