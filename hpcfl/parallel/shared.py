"""Read-only per-client tables held once per node, in MPI-3 shared memory windows.

Every rank needs some tables over all N clients: the partition (every client's sample
indices, so that any rank can train any client), each client's class counts (the
samplers' and FedDisco's inputs, the results file's partition record), and the per-client
evaluation's (test row, client) pairs. They are computed the same way on every rank, from
the same seeds, so R ranks of a node used to hold R identical copies: at 1M clients about
0.41 KB per client and rank (docs/performance.md, "Memory you can plan").

:class:`NodeTables` moves such a table into a window that the node's first rank allocates
with ``MPI.Win.Allocate_shared`` and fills; the others map the same pages, and each rank
drops its private copy. The views are read-only (numpy's writeable flag is off), so a stray
write raises instead of changing every rank's table at once. A table smaller than
:data:`MIN_BYTES` stays private (a window costs a page and a collective).

Every rank of the node must call :meth:`NodeTables.share` for the same tables in the same
order: the calls are collective over the node communicator. :func:`hpcfl.engine.setup.share_tables`
makes them after every rank's set-up succeeded (the run agrees on that first), so no rank waits
in a window that another will never reach; :func:`hpcfl.engine.setup.release_tables` frees them
when the run has ended on every rank, as do the run's other endings that every rank meets
together (one of :mod:`hpcfl.errors`); only an unexpected exception leaves them to ``MPI_Finalize``.

:meth:`NodeTables.share_first` does the same for arrays only the node's first rank has: the
dataset that rank loaded from the user's files (:func:`hpcfl.engine.dataload.load_per_node`); the
other ranks learn the shapes from it and map the windows it filled.
"""

from __future__ import annotations

import numpy as np

from .mpi import mpi_module

MIN_BYTES = 1 << 20   # tables under 1 MiB stay private


def _windowed(table: np.ndarray) -> bool:
    """Whether :meth:`NodeTables.share_first` puts ``table`` in a window (big enough, plain numbers)."""
    return table.nbytes >= MIN_BYTES and not table.dtype.hasobject


class NodeTables:
    """The node's shared windows for one run; :meth:`free` releases them (collective).

    Parameters
    ----------
    comm : MPI communicator
        The run's communicator; its ranks on one node share (``COMM_TYPE_SHARED``).
    """

    def __init__(self, comm):
        self.node = None
        self.windows: list = []
        if comm.size > 1:
            self.node = comm.Split_type(mpi_module().COMM_TYPE_SHARED, key=comm.rank)
        self.shared_bytes = 0   # bytes this node holds once instead of once per rank

    @property
    def on(self) -> bool:
        return self.node is not None and self.node.size > 1

    def share(self, table: np.ndarray) -> np.ndarray:
        """``table`` held once per node: a read-only view of a shared window, or ``table`` itself.

        Collective over the node's ranks, which must pass tables of the same shape and dtype
        (their values are taken from the node's first rank).
        """
        table = np.ascontiguousarray(table)
        if not self.on or table.nbytes < MIN_BYTES:
            return table
        return self._window(table.shape, table.dtype, table)

    def share_first(self, tables: list | None) -> list:
        """The node's first rank's ``tables`` on every rank of the node, which pass None.

        For arrays that only the first rank has (it loaded them; the others did not): each of
        at least :data:`MIN_BYTES` becomes a read-only view of a shared window, filled by the
        first rank, which drops its own copy when the caller does; each smaller one is sent
        over the node communicator (a private, writable copy on every rank). Collective over
        the node's ranks; without several ranks on the node (``on`` false), ``tables`` itself.

        Parameters
        ----------
        tables : list of numpy arrays on the node's first rank, None on the others

        Returns
        -------
        list of numpy arrays, the same length, shapes, dtypes and bytes on every rank
        """
        if not self.on:
            return list(tables)
        leader = self.node.rank == 0
        if leader:
            tables = [np.ascontiguousarray(t) for t in tables]
        # what each rank needs to map or hold the tables: (shape, dtype) of a shared one, a small one itself
        plan = self.node.bcast([(t.shape, t.dtype) if _windowed(t) else t for t in tables] if leader else None,
                               root=0)
        return [self._window(p[0], p[1], tables[i] if leader else None) if isinstance(p, tuple)
                else (tables[i] if leader else p) for i, p in enumerate(plan)]

    def _window(self, shape: tuple, dtype, fill) -> np.ndarray:
        """A read-only view of a new window of ``shape`` and ``dtype``, filled from ``fill`` by the
        node's first rank (collective over the node)."""
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        leader = self.node.rank == 0
        win = mpi_module().Win.Allocate_shared(nbytes if leader else 0, dtype.itemsize, comm=self.node)
        self.windows.append(win)
        buf, _ = win.Shared_query(0)
        view = np.ndarray(shape, dtype=dtype, buffer=buf)
        if leader:
            view[...] = fill
        self.node.Barrier()   # filled before anyone reads it
        view.flags.writeable = False
        self.shared_bytes += nbytes
        return view

    def holds(self, array: np.ndarray) -> bool:
        """Whether ``array`` (or the array it views) lies in one of these windows."""
        start = array.__array_interface__["data"][0]
        for win in self.windows:
            buf, _ = win.Shared_query(0)
            base = np.frombuffer(buf, dtype=np.uint8)
            lo = base.__array_interface__["data"][0]
            if lo <= start < lo + base.nbytes:
                return True
        return False

    def free(self) -> None:
        """Release the windows and the node communicator (collective over the node). Views handed
        out must not be used afterwards."""
        for win in self.windows:
            win.Free()
        self.windows = []
        if self.node is not None:
            self.node.Free()
            self.node = None
