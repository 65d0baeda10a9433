"""Checkpoints written by every rank (``checkpoint.shards``, docs/reliability.md "Checkpoints of any size").

:func:`write` is the collective save: every rank writes, fsyncs, reads back and hashes the rows of the
clients it owns into its own shard file, all at once; rank 0 then checks that each shard is in the
checkpoint folder it holds and writes the manifest (the model, the server's arrays and every shard's
checksum) with the store's atomic rename, last. :func:`read` is the collective resume: rank 0 sends the
model, the server's arrays and the verified shard list; each rank reads the rows of the clients it owns
now from whichever shards hold them, so any rank count and placement resume bitwise, and no row passes
through rank 0. The file layout is :mod:`hpcfl.io.ckptshards`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import HpcflError
from ..io import ckptshards
from ..io.checkpoint import open_loaded
from ..io.ckptblocks import Streamed, row_blocks
from ..state import ServerArray
from .staterows import _dtype, _home_row, _put, _segments, _tables, server_arrays, state_items


def own_runs(s) -> np.ndarray:
    """(k, 2) int64: the runs [lo, hi) of client ids this rank owns, ascending."""
    runs = [(lo, hi) for lo, hi, rank in _segments(s.owner) if rank == s.comm.rank]
    return np.array(runs, dtype=np.int64).reshape(-1, 2)


def _own_table(s, runs: np.ndarray, rows: np.ndarray) -> Streamed:
    """A table's rows for this rank's clients, run after run, a block at a time from its home rows."""
    width = rows.shape[1]

    def blocks():
        done = 0
        for lo, hi in runs:
            a = _home_row(s, int(lo))
            for r0, r1 in row_blocks(int(hi - lo), width * rows.itemsize):
                yield done + r0, done + r1, rows[a + r0:a + r1]
            done += int(hi - lo)

    return Streamed((int((runs[:, 1] - runs[:, 0]).sum()), width), rows.dtype, blocks)


def write(s, x: np.ndarray, store, round: int, meta: dict, manifest: dict, before=None) -> HpcflError | None:
    """Collective: checkpoint ``round``, every rank writing its own clients' rows.

    ``store`` is rank 0's :class:`hpcfl.io.checkpoint.CheckpointStore` (None elsewhere); ``before`` is
    called on rank 0 first (the results file's sync). Returns, on rank 0, None or the error of a
    failed save (older checkpoints untouched, this save's shards removed); None elsewhere.
    """
    comm = s.comm
    failure, start = None, None
    if comm.rank == 0:
        try:
            if before is not None:
                before()
            store.check_folder()   # the folder was swapped: stop before any rank writes a byte
            start = (ckptshards.new_token(), str(store.directory))
        except HpcflError as exc:
            failure = exc
    start = comm.bcast(start, root=0)
    if start is None:
        return failure
    token, folder = start[0], Path(start[1])
    runs = own_runs(s)
    arrays = {"rows": runs, **{f"clients.{t.name}": _own_table(s, runs, t.get()) for t in _tables(s)}}
    try:
        mine = ckptshards.write(folder, round, token, comm.rank, arrays, manifest)
    except HpcflError as exc:
        mine = {"error": str(exc)}
    entries = comm.gather(mine, root=0)
    if comm.rank == 0:
        bad = [e["error"] for e in entries if "error" in e]
        try:
            if bad:
                raise HpcflError(f"the checkpoint of round {round} was not written: {'; '.join(bad)}. Older "
                                 f"checkpoints were left untouched")
            store.save(round, server_arrays(s, x), meta=meta,
                       manifest={**manifest, "shards": entries, "shard_token": token, "shard_clients": len(s.owner)})
        except HpcflError as exc:
            failure = exc
    if not comm.bcast(failure is None, root=0) and "name" in mine:
        (folder / mine["name"]).unlink(missing_ok=True)   # a save that failed leaves no shard behind
    return failure


def read(s, loaded) -> np.ndarray:
    """Collective: load the sharded checkpoint ``loaded`` (rank 0's, verified with its shards and checked
    with :func:`hpcfl.engine.resume.problems`) into every rank; returns the model x."""
    comm, payload = s.comm, None
    if comm.rank == 0:
        source = open_loaded(loaded)
        try:
            server = {it.name: source.array(f"server.{it.name}") for it in state_items(s)
                      if isinstance(it, ServerArray) and source.spec(f"server.{it.name}") is not None}
            payload = (source.array("model"), server, loaded.shards)
        finally:
            source.close()
    x, server, shards = comm.bcast(payload, root=0)
    for it in state_items(s):
        if isinstance(it, ServerArray) and it.name in server:
            it.set(server[it.name])
    rows, err = ckptshards.ShardRows(shards), None
    try:
        for table in _tables(s):
            name, width, dtype = f"clients.{table.name}", table.width, _dtype(table)
            for lo, hi in own_runs(s):
                home = _home_row(s, int(lo))
                for c0, c1, shard, first in rows.pieces(int(lo), int(hi)):
                    for r0, r1 in row_blocks(c1 - c0, width * dtype.itemsize):   # one block in memory
                        _put(table, home + (c0 - int(lo)) + r0, rows.block(shard, name, first + r0, first + r1))
    except HpcflError as exc:   # a shard changed since rank 0 verified it: every rank stops, none waits
        err = str(exc)
    finally:
        rows.close()
    failed = [e for e in comm.allgather(err) if e]
    if failed:
        raise HpcflError(failed[0])
    return np.array(x, copy=True)
