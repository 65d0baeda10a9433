"""Per-rank runtime: device choice, torch threads, library versions."""

from __future__ import annotations

import os
import platform

import torch

from .errors import ConfigError


def pick_device(choice: str, local_rank: int) -> torch.device:
    """``cuda:<node-local rank mod GPUs on the node>`` when CUDA is there, else CPU.

    Parameters
    ----------
    choice : {"auto", "cpu", "cuda"}
    local_rank : int
        Rank within the node (from a shared-memory split of the communicator).
    """
    has_cuda = torch.cuda.is_available()
    if choice == "cuda" and not has_cuda:
        raise ConfigError("runtime.device = 'cuda' but CUDA is not available on this node; use 'auto' or 'cpu'")
    if choice in ("auto", "cuda") and has_cuda:
        return torch.device(f"cuda:{local_rank % torch.cuda.device_count()}")
    return torch.device("cpu")


# A model with fewer parameters than this trains on one torch thread per rank when
# runtime.threads = 0. Measured with bench/threads_bench.py (docs/performance.md, "Torch
# threads"): one SGD step of the quickstart's MLP, LeNet-5, the keyword LSTM and FedLGA's
# 318k-parameter MLP took 7-33x longer on two threads than on one while other processes kept
# the two cores busy (the threads wait on each other), and gained 0-26% on two idle cores;
# VGG-11 and ResNet-18 (about 10M) took 0.58x and 0.50x the time on two idle cores. A small
# model gains little where the cores are free and loses much where they are not.
SMALL_MODEL_PARAMS = 1_000_000


def pick_threads(configured: int, ranks_on_node: int, num_params: int | None = None) -> int:
    """Torch intra-op threads: configured, else 1 for a small model, else cores on the node / ranks on the node.

    Parameters
    ----------
    configured : int
        ``runtime.threads``; 0 picks.
    ranks_on_node : int
    num_params : int, optional
        The model's trainable parameters; below ``SMALL_MODEL_PARAMS`` one thread.

    The share of the cores is capped by the cores this process may run on: under
    ``srun --cpus-per-task=c`` with binding, a rank sees only its c cores (``os.cpu_count``
    would report the whole node).
    """
    if configured:
        return configured
    if num_params is not None and num_params < SMALL_MODEL_PARAMS:
        return 1
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(usable, (os.cpu_count() or 1) // max(1, ranks_on_node)))


def versions() -> dict:
    """Versions of everything that can change a result."""
    import h5py
    import mpi4py
    import numpy
    from mpi4py import MPI

    from . import __version__

    return {
        "hpcfl": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "h5py": h5py.version.version,
        "hdf5": h5py.version.hdf5_version,
        "mpi4py": mpi4py.__version__,
        "mpi": MPI.Get_library_version().strip().splitlines()[0],
        "cuda": torch.version.cuda or "none",
    }
