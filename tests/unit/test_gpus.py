"""One GPU per rank (hpcfl.parallel.gpus): who takes which GPU, for what each site shows a rank.

No GPU is needed: the GPUs a rank sees are faked (``visible``), and a device is only named.
"""

import pytest
import torch
from mpi4py import MPI

from hpcfl.parallel import gpus
from hpcfl.parallel.gpus import GpuShortage, Placement, assign, place

ALL4 = ["GPU-a", "GPU-b", "GPU-c", "GPU-d"]



@pytest.fixture(autouse=True)
def _no_sharing_from_the_environment(monkeypatch):
    monkeypatch.delenv("HPCFL_SHARE_GPUS", raising=False)   # tests/conftest.py sets it for the other tests


def test_ranks_that_see_every_gpu_take_one_each():
    # mpiexec, or srun without binding: 4 ranks see the node's 4 GPUs; before, rank r took cuda:r mod 4 too,
    # but a rank bound to its GPU (below) and a fifth rank were not told apart
    assert assign([ALL4] * 4, share=False) == [0, 1, 2, 3]
    assert assign([ALL4] * 2, share=False) == [0, 1]


def test_ranks_bound_to_their_own_gpu_each_keep_cuda_0():
    # srun --gpus-per-task=1: every rank sees one GPU, a different one, as cuda:0: no sharing, no refusal
    assert assign([["GPU-c"], ["GPU-a"], ["GPU-d"]], share=False) == [0, 0, 0]


def test_partly_overlapping_views_still_give_distinct_gpus():
    # --gpu-bind=closest: ranks see the GPUs near their socket, two ranks a socket
    seen = [["GPU-a", "GPU-b"], ["GPU-a", "GPU-b"], ["GPU-c", "GPU-d"], ["GPU-c", "GPU-d"]]
    assert assign(seen, share=False) == [0, 1, 0, 1]
    picked = [s[k] for s, k in zip(seen, assign(seen, share=False))]
    assert sorted(picked) == ALL4
    # sockets interleaved over local ranks: "node-local rank mod GPUs seen" gave ranks 0 and 2 GPU-a
    seen = [["GPU-a", "GPU-b"], ["GPU-c", "GPU-d"], ["GPU-a", "GPU-b"], ["GPU-c", "GPU-d"]]
    assert assign(seen, share=False) == [0, 0, 1, 1]


def test_more_ranks_than_gpus_is_refused_naming_counts_and_fixes():
    with pytest.raises(GpuShortage, match=r"3 ranks on this node but only 2 GPU\(s\) for them \(node-local rank 2 .*"
                                          r"--ntasks-per-node=2 --gpus-per-task=1.*runtime.share_gpus = true.*"
                                          r'runtime.device = "cpu"'):
        assign([["GPU-a", "GPU-b"]] * 3, share=False)
    # every rank bound to "its" GPU, but it is the same GPU (CUDA_VISIBLE_DEVICES=0 for all): refused too
    with pytest.raises(GpuShortage, match=r"2 ranks on this node but only 1 GPU\(s\)"):
        assign([["GPU-a"], ["GPU-a"]], share=False)


def test_sharing_spreads_ranks_over_the_least_used_gpus():
    assert assign([["GPU-a", "GPU-b"]] * 5, share=True) == [0, 1, 0, 1, 0]
    assert assign([["GPU-a"], ["GPU-a"], ["GPU-a"]], share=True) == [0, 0, 0]
    assert assign([["GPU-a", "GPU-b"], ["GPU-a"], ["GPU-a", "GPU-b"]], share=True) == [0, 0, 1]   # b was idle


def test_a_rank_without_gpus_runs_on_the_cpu():
    assert assign([[], ["GPU-a"]], share=False) == [None, 0]
    assert assign([[], []], share=False) == [None, None]


def test_place_on_one_rank_names_host_local_rank_and_gpu():
    p = place(MPI.COMM_SELF, "auto", False, visible=lambda: ["GPU-x", "GPU-y"])
    assert (p.device, p.local_rank, p.local_size, p.gpu, p.sharing) == (torch.device("cuda:0"), 0, 1, "GPU-x", 1)
    assert p.describe(5) == f"rank 5 on {p.host}: node-local rank 0 of 1, cuda:0 (GPU-x)"
    assert place(MPI.COMM_SELF, "cpu", False, visible=lambda: ["GPU-x"]).device == torch.device("cpu")
    assert place(MPI.COMM_SELF, "auto", False, visible=list).device == torch.device("cpu")
    with pytest.raises(Exception, match="runtime.device = 'cuda' but CUDA is not available on this node"):
        place(MPI.COMM_SELF, "cuda", False, visible=list)


def test_describe_says_when_a_gpu_is_shared():
    p = Placement(torch.device("cuda:1"), "n7", 3, 4, "GPU-b", 2)
    assert p.describe(11) == "rank 11 on n7: node-local rank 3 of 4, cuda:1 (GPU-b, shared by 2 ranks)"
    assert Placement(torch.device("cpu"), "n7", 0, 1).describe(0) == "rank 0 on n7: node-local rank 0 of 1, cpu"


def test_visible_gpus_without_cuda_is_empty(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpus.visible_gpus() == []


def test_visible_gpus_falls_back_to_cuda_visible_devices(monkeypatch):
    class Props:   # a torch without the uuid field
        pass

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert gpus.visible_gpus() == ["3", "1"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert gpus.visible_gpus() == ["0", "1"]

    class WithUuid:
        uuid = "1234-abcd"

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: WithUuid())
    assert gpus.visible_gpus() == ["GPU-1234-abcd"] * 2
