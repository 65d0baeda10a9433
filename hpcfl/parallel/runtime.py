"""Per-rank runtime: deterministic kernels, torch threads, the global model's
transport between host and device, library versions."""

from __future__ import annotations

import os
import platform

import numpy as np
import torch

from ..errors import ConfigError

CUBLAS_CONFIG = ":4096:8"   # cuBLAS's documented setting for deterministic results with several streams


def configure_determinism(on: bool) -> None:
    """``runtime.deterministic``: deterministic kernels on a GPU, or torch's fastest (process-wide).

    Call before CUDA is first used: cuBLAS reads ``CUBLAS_WORKSPACE_CONFIG`` when it starts, so
    it is set here (a value the user exported is kept). On the CPU every kernel hpcfl uses is
    deterministic anyway, and a CPU run's bits do not depend on this switch.
    """
    if on:
        late = torch.cuda.is_initialized() and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_CONFIG)
        if late:
            import warnings

            warnings.warn(f"CUDA was started before hpcfl set CUBLAS_WORKSPACE_CONFIG={CUBLAS_CONFIG}; export it "
                          f"before starting Python to be sure of bitwise reproducible cuBLAS results", stacklevel=2)
    torch.use_deterministic_algorithms(on)
    torch.backends.cudnn.deterministic = on
    torch.backends.cudnn.benchmark = False   # its timing-based choice of kernels differs from run to run


class NondeterministicOp(ConfigError):
    """An operation has no deterministic kernel on this device while ``runtime.deterministic`` is on."""

    MARK = "does not have a deterministic implementation"

    @classmethod
    def match(cls, exc: BaseException, where: str):
        """The error to raise for torch's RuntimeError ``exc``, or None if it is another error."""
        text = str(exc)
        if not isinstance(exc, RuntimeError) or cls.MARK not in text:
            return None
        op = text.split(cls.MARK)[0].strip() or "an operation"
        return cls(f"runtime.deterministic = true, but torch has no deterministic kernel for {op} ({where}): this "
                   f"run cannot be bitwise reproducible. Set runtime.deterministic = false to run it anyway (faster "
                   f"on a GPU, but results then differ from run to run), or use a model without that operation")


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


def sums_device(device: torch.device):
    """Where the round's contributions are summed: ``device`` when it is not the CPU (the device
    form of the exact sum, :mod:`hpcfl.parallel.gridsum_torch`), else None (the host form, compiled).

    ``HPCFL_DEVICE_SUMS=1`` takes the device form on the CPU too: the GPU path's code, tested on a
    machine without one (same bits as the host form).
    """
    if device.type != "cpu" or os.environ.get("HPCFL_DEVICE_SUMS") == "1":
        return device
    return None


def sync(device: torch.device) -> None:
    """Wait for ``device``'s queued work (CUDA); phase timings then count their own work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def to_host(x) -> np.ndarray:
    """A host array of the global model: ``x`` itself when it is one, else a copy of the tensor."""
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x


def all_finite(x) -> bool:
    return bool(torch.isfinite(x).all()) if isinstance(x, torch.Tensor) else bool(np.isfinite(x).all())


def bcast_model(comm, x):
    """Rank 0's ``x`` on every rank (in place where it can be); returns the rank's ``x``.

    A tensor on a device goes through the host (MPI reads host memory); one rank copies nothing.
    """
    if comm.size == 1:
        return x
    if not isinstance(x, torch.Tensor):
        comm.Bcast(x, root=0)
        return x
    host = x.detach().cpu().numpy() if comm.rank == 0 else np.empty(tuple(x.shape), dtype=_numpy_dtype(x.dtype))
    comm.Bcast(host, root=0)
    if comm.rank != 0:
        x.copy_(torch.from_numpy(host))
    return x


def _numpy_dtype(dtype: torch.dtype):
    return torch.empty((), dtype=dtype).numpy().dtype


def versions() -> dict:
    """Versions of everything that can change a result."""
    import h5py
    import mpi4py
    import numpy
    from mpi4py import MPI

    from ..version import __version__

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
