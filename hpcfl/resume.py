"""Engine state to and from checkpoints (docs/reliability.md).

:func:`capture` and :func:`restore` are collectives. Per-client state (SCAFFOLD c_i,
FedNova-VR h_i) is gathered from the owning ranks in client-id order, so a run can
resume on any number of ranks and any placement.
"""

from __future__ import annotations

import numpy as np
import torch

from .algorithms.local import ScaffoldState, VRState


def _client_table(algo):
    """This rank's per-client state tensor (clients on rank, P), or None."""
    st = algo.state
    if isinstance(st, ScaffoldState):
        return st._table()
    if isinstance(st, VRState):
        return st.h_local
    return None


def capture(s, x: np.ndarray) -> dict | None:
    """Arrays of the checkpoint after the current round; on rank 0, None elsewhere."""
    comm, algo = s.comm, s.algo
    table = _client_table(algo)
    mine = np.flatnonzero(s.owner == comm.rank)
    local = None if table is None else (mine, table.detach().cpu().numpy())
    gathered = comm.gather(local, root=0)
    if comm.rank != 0:
        return None
    arrays = {"model": np.asarray(x)}
    if algo.server_opt.buf is not None:
        arrays["server_buf"] = algo.server_opt.buf
    if algo.state is not None:
        arrays["server_c"] = algo.state.c.detach().cpu().numpy()
        full = np.zeros((len(s.owner), algo.num_params), dtype=gathered[0][1].dtype)
        for ids, rows in gathered:
            full[ids] = rows
        arrays["client_state"] = full
    return arrays


def restore(s, arrays: dict | None) -> np.ndarray:
    """Load a checkpoint's arrays (given on rank 0) into every rank; returns the model x."""
    comm, algo = s.comm, s.algo
    payload = parts = None
    if comm.rank == 0:
        if "server_buf" in arrays:
            algo.server_opt.buf = arrays["server_buf"]
        if "client_state" in arrays:   # rows of each rank's clients, for the new placement
            parts = [arrays["client_state"][s.owner == r] for r in range(comm.size)]
        payload = (arrays["model"], arrays.get("server_c"))
    x, server_c = comm.bcast(payload, root=0)
    rows = comm.scatter(parts, root=0)
    if algo.state is not None and server_c is not None:
        algo.state.c.copy_(torch.from_numpy(server_c))
        table = _client_table(algo)
        if rows is not None:
            table.copy_(torch.from_numpy(rows))
    return np.array(x, copy=True)
