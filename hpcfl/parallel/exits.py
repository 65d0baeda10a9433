"""Exit codes, and how every rank of a job ends together.

The codes are defined beside the errors that carry them (:mod:`hpcfl.errors`, each error's
``exit_code``) and are the ones docs/guide.md and slurm/README.md list:

==  ======================================================================================
0   finished (or already finished)
2   bad input: the job, its data, a foreign or damaged file (nothing was started or changed)
3   stopped by the update guard (``guard.policy = "stop"``)
4   diverged: the model became NaN or Inf; results up to that round are kept, marked so
74  results or a checkpoint could not be written (full disk, quota, I/O error): free space,
    run again; nothing written before is lost
75  stopped by a signal with a checkpoint written, or ended by the watchdog (a rank froze; the
    checkpoints on disk are intact): run the same command again to resume
==  ======================================================================================
"""

from __future__ import annotations

import os
import sys

from ..errors import EXIT_DIVERGED, EXIT_GUARD, EXIT_INPUT, EXIT_RESUMABLE, EXIT_WRITE  # noqa: F401 (found here)
from .mpi import mpi_module


# How the process ends after MPI_Finalize. MPICH sends its PMI "finalize" to the launcher from a C
# exit handler, not from MPI_Finalize itself. ``os._exit`` skips C's exit handlers, so the message
# never went out: hydra (mpiexec) then saw the rank's PMI socket close as a crash and killed the
# job's other processes with SIGKILL. A bare rank killed after its own finalise is reported as
# exit 0, but a rank started through a wrapper (``sh -c "..."``, as GPU-selection and profiling
# wrappers are) is the wrapper, and its SIGKILL is reported: exit 9 after a run that finished
# (3 of 8 launches of ``hpcfl run``). C's ``exit`` runs those handlers (strace shows
# ``cmd=finalize`` sent, and 0 of 10 wrapped launches killed) and still skips Python's teardown,
# the seconds of freeing torch's memory that ``os._exit`` was there to save.


_UNSAFE: list = []   # why C's exit handlers must not run in this process (see exit_handlers_unsafe)


def exit_handlers_unsafe(why: str) -> None:
    """From now on this process ends with ``os._exit``, skipping C's exit handlers: after an HDF5
    write failed (a full disk), HDF5's own handler retries it and crashes the process (SIGSEGV).
    A launcher may then take the exit for a crash (see above): the exit code still says 74."""
    _UNSAFE.append(why)


def _c_exit(code: int) -> None:
    """End the process through C's ``exit``: C's exit handlers run (MPICH's PMI finalize), Python's
    teardown does not. ``os._exit`` where the C library cannot be reached, or where its handlers
    are unsafe (:func:`exit_handlers_unsafe`)."""
    if _UNSAFE:
        os._exit(code)
    try:
        import ctypes

        libc = ctypes.PyDLL(None)   # holds the GIL: no Python thread runs while C's exit handlers do
        libc.exit.argtypes = [ctypes.c_int]
        libc.exit(code)
    except (OSError, AttributeError):
        pass
    os._exit(code)


def exit_all(code: int) -> None:
    """Exit with ``code`` on a path every rank takes together.

    A plain ``sys.exit`` under ``python -m mpi4py`` becomes ``MPI_Abort`` (noisy, and it
    kills the other ranks before they print); since all ranks agreed, finalise cleanly, then end
    through C's ``exit`` (see above): the launcher hears every rank's finalize, and Python's
    teardown is skipped.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    mpi_module().Finalize()
    _c_exit(code)
