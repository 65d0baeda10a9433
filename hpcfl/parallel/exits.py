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


def exit_all(code: int) -> None:
    """Exit with ``code`` on a path every rank takes together.

    A plain ``sys.exit`` under ``python -m mpi4py`` becomes ``MPI_Abort`` (noisy, and it
    kills the other ranks before they print); since all ranks agreed, finalise cleanly.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    mpi_module().Finalize()
    os._exit(code)
