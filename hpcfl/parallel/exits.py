"""Exit codes, and how every rank of a job ends together.

One low module that the command line (:mod:`hpcfl.cli`) and run control
(:mod:`hpcfl.engine.control`) both use, so neither imports the other for them. The codes
are the ones docs/guide.md and slurm/README.md list:

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

from .mpi import mpi_module

EXIT_INPUT = 2
EXIT_GUARD = 3
EXIT_DIVERGED = 4
EXIT_WRITE = 74
EXIT_RESUMABLE = 75


def exit_all(code: int) -> None:
    """Exit with ``code`` on a path every rank takes together.

    A plain ``sys.exit`` under ``python -m mpi4py`` becomes ``MPI_Abort`` (noisy, and it
    kills the other ranks before they print); since all ranks agreed, finalise cleanly.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    mpi_module().Finalize()
    os._exit(code)
