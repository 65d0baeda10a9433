"""One GPU per rank: which GPU a rank takes on its node, whatever the site shows each rank.

Sites differ in what a rank sees. Under ``srun --gpus-per-task=1`` (Slurm binds a GPU to each
task) every rank sees one GPU, its own, as ``cuda:0``. Under ``mpiexec``, or a site that gives
every task all of the node's GPUs, every rank sees them all, and the first one is the same GPU
for everybody. So the ranks of a node first agree on who sees what (a shared-memory split of
the communicator gives the node's ranks; under ``srun`` its local rank is ``SLURM_LOCALID``),
then take GPUs in node-local rank order, each the least used of those it sees (:func:`assign`):
bound ranks keep their own, ranks that see all GPUs get one each, and a node with more ranks
than GPUs is refused (exit 2) unless ``runtime.share_gpus`` lets ranks share.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import torch

from ..errors import ConfigError
from .mpi import mpi_module


class GpuShortage(ConfigError):
    """More ranks on a node than GPUs its ranks see, and ``runtime.share_gpus`` is off."""


@dataclass(frozen=True)
class Placement:
    """Where one rank runs.

    ``gpu`` is the identity of its GPU (a UUID where CUDA gives one) or None on the CPU;
    ``sharing`` is the number of ranks of the node on that GPU (1: its own).
    """

    device: torch.device
    host: str
    local_rank: int
    local_size: int
    gpu: str | None = None
    sharing: int = 1

    def describe(self, rank: int) -> str:
        """One line for the run's log: rank, host, node-local rank, device."""
        where = f"rank {rank} on {self.host}: node-local rank {self.local_rank} of {self.local_size}, {self.device}"
        if self.gpu is None:
            return where
        shared = f", shared by {self.sharing} ranks" if self.sharing > 1 else ""
        return f"{where} ({self.gpu}{shared})"


def visible_gpus() -> list[str]:
    """Identities of the CUDA devices this process sees, in ``cuda:<i>`` order ([] without CUDA).

    A GPU's UUID names the physical device whatever index a rank sees it under; without one,
    the ``CUDA_VISIBLE_DEVICES`` entry, else the index. Call after
    :func:`hpcfl.parallel.runtime.configure_determinism` (this may start CUDA).
    """
    if not torch.cuda.is_available():
        return []
    listed = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    ids = []
    for i in range(torch.cuda.device_count()):
        uuid = getattr(torch.cuda.get_device_properties(i), "uuid", None)
        ids.append(f"GPU-{uuid}" if uuid else (listed[i] if i < len(listed) else str(i)))
    return ids


def assign(seen: list[list[str]], share: bool) -> list[int | None]:
    """Each node-local rank's GPU, as an index into the GPUs it sees.

    Parameters
    ----------
    seen : list of lists of str
        ``seen[r]``: identities of the GPUs node-local rank r sees, in its ``cuda:<i>`` order.
    share : bool
        Whether two ranks may take one GPU (``runtime.share_gpus``).

    Returns
    -------
    list
        ``out[r]``: i for ``cuda:i``, or None for a rank that sees no GPU.

    Ranks choose in node-local rank order, each the least used GPU it sees (the lowest index
    among equals). Without ``share``, a rank whose GPUs are all taken raises
    :class:`GpuShortage`, naming the counts and the fixes.
    """
    used: dict[str, int] = {}
    out: list[int | None] = []
    for r, ids in enumerate(seen):
        if not ids:
            out.append(None)
            continue
        k = min(range(len(ids)), key=lambda i: (used.get(ids[i], 0), i))
        if used.get(ids[k], 0) and not share:
            gpus = sorted({g for s in seen for g in s})
            raise GpuShortage(
                f"{len(seen)} ranks on this node but only {len(gpus)} GPU(s) for them (node-local rank {r} finds "
                f"every GPU it sees taken), and hpcfl runs one rank per GPU. Start at most {len(gpus)} ranks per node (e.g. srun "
                f"--ntasks-per-node={len(gpus)} --gpus-per-task=1), set runtime.share_gpus = true to let ranks "
                f"share GPUs (slower, same results), or runtime.device = \"cpu\"")
        used[ids[k]] = used.get(ids[k], 0) + 1
        out.append(k)
    return out


def place(comm, choice: str, share: bool = False, visible=visible_gpus) -> Placement:
    """This rank's device (a collective over ``comm``).

    Parameters
    ----------
    comm : MPI communicator
    choice : {"auto", "cpu", "cuda"}
        ``runtime.device``: ``auto`` takes a GPU when the rank sees one, else the CPU.
    share : bool
        ``runtime.share_gpus``; ``HPCFL_SHARE_GPUS=1`` in the environment shares too (a site's
        module file, or a test suite run on a machine with one GPU).
    visible : callable
        Returns the GPU identities this rank sees (:func:`visible_gpus`; tests fake it).

    Every rank of a node computes the same :func:`assign` from the same allgather, so a
    refusal is raised on all of them (the caller agrees on errors and exits 2).
    """
    MPI = mpi_module()
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    try:
        mine = [] if choice == "cpu" else list(visible())
        seen = local.allgather(mine)   # before any refusal: no rank of the node is left waiting in it
        lr, ls = local.rank, local.size
    finally:
        local.Free()
    if choice == "cuda" and not mine:
        raise ConfigError("runtime.device = 'cuda' but CUDA is not available on this node; use 'auto' or 'cpu'")
    picks = assign(seen, share or os.environ.get("HPCFL_SHARE_GPUS") == "1")
    host = socket.gethostname()
    if picks[lr] is None:
        return Placement(torch.device("cpu"), host, lr, ls)
    gpu = seen[lr][picks[lr]]
    sharing = sum(1 for s, k in zip(seen, picks) if k is not None and s[k] == gpu)
    return Placement(torch.device(f"cuda:{picks[lr]}"), host, lr, ls, gpu, sharing)
