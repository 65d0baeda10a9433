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


def pick_threads(configured: int, ranks_on_node: int) -> int:
    """Torch intra-op threads: configured, else cores on the node / ranks on the node.

    Capped by the cores this process may run on: under ``srun --cpus-per-task=c`` with
    binding, a rank sees only its c cores (``os.cpu_count`` would report the whole node).
    """
    if configured:
        return configured
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
