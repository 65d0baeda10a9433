"""The one place (with the CLI's entry) that imports mpi4py, and only when called.

Everything else takes a ``comm`` argument; the collectives' constants (``MPI.SUM``,
``MPI.IN_PLACE``, ...) come from :func:`mpi_module`. Kept apart from :mod:`hpcfl.parallel.comm` so
that the exact sum (:mod:`hpcfl.parallel.gridsum`), which :mod:`hpcfl.parallel.comm` builds, can reach MPI
without importing it back: no import circle.
"""

from __future__ import annotations


def world():
    """The world communicator (works without mpiexec: a singleton MPI world)."""
    from mpi4py import MPI

    return MPI.COMM_WORLD


def mpi_module():
    """The ``mpi4py.MPI`` module, imported on first use."""
    from mpi4py import MPI

    return MPI
