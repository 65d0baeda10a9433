"""A rank's share of the checkpointed state: which items there are, and where its clients' rows are.

Used by the checkpoint's two ways of writing and reading rows: through rank 0
(:mod:`hpcfl.engine.resume`) and a shard per rank (:mod:`hpcfl.engine.shards`).
"""

from __future__ import annotations

import numpy as np

from ..state import ClientTable, ServerArray
from .simulation import accumulator


def state_items(s) -> list:
    """The policies' state and the engine's own (the exact sum's grid)."""
    return s.algo.state() + list(getattr(accumulator(s), "state", list)())


def server_arrays(s, x) -> dict:
    """The checkpoint's arrays apart from the client tables: ``model`` (x) and ``server.<name>`` of each
    server array that holds a value."""
    arrays = {"model": np.asarray(x)}
    for it in state_items(s):
        if isinstance(it, ServerArray) and it.get() is not None:
            arrays[f"server.{it.name}"] = np.asarray(it.get())
    return arrays


def _segments(owner: np.ndarray) -> list[tuple[int, int, int]]:
    """``[(lo, hi, rank)]``: the runs of consecutive client ids with one owner, in id order."""
    if owner.size == 0:
        return []
    cut = np.flatnonzero(np.diff(owner)) + 1
    los = np.concatenate([[0], cut])
    his = np.concatenate([cut, [owner.size]])
    return [(int(lo), int(hi), int(owner[lo])) for lo, hi in zip(los, his)]


def _tables(s) -> list:
    return sorted((it for it in state_items(s) if isinstance(it, ClientTable)), key=lambda t: t.name)


def _home_row(s, lo: int) -> int:
    """This rank's row in its tables of client ``lo``, the first of a run of clients it owns (the
    run's rows follow it in order)."""
    return int(s.slot[lo])


def _dtype(table) -> np.dtype:
    """A table's dtype, without copying a table held on a device to the host."""
    if table.rows is not None:
        return np.dtype(table.rows(np.zeros(0, dtype=np.int64)).dtype)
    return np.dtype(table.get().dtype)


def _put(table, first: int, rows: np.ndarray) -> None:
    """Rows ``first ..`` of this rank's table."""
    if table.put is not None:
        table.put(np.arange(first, first + len(rows), dtype=np.int64), rows)
    else:   # a table without put: its whole home block at once (written in one block)
        whole = np.array(table.get(), copy=True)
        whole[first:first + len(rows)] = rows
        table.set(whole)
