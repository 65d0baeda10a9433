"""Catch ``srun`` starting N separate 1-rank runs instead of one N-rank run.

When ``srun`` starts a step's tasks without a PMI that the MPI library understands (the site's
``MpiDefault`` is often ``none``), every task initialises MPI on its own and sees a world of 1.
hpcfl would then run the same job N times into the same ``--out``: one run finishes, the
others are refused or race it. This module recognises that case from Slurm's environment, so
that every task can stop with exit 2 and the fix before anything is read or written.

Slurm sets ``SLURM_STEP_NUM_TASKS`` only in the tasks of a step (``srun``), to the step's task
count. It is not set in the batch shell (where ``SLURM_NTASKS`` is the allocation's count,
although the shell is one process: running hpcfl there directly is a valid 1-rank run), and
inside ``srun -n 1`` or ``mpiexec -n N`` within an allocation it is 1 (mpiexec's ranks see a
world of N anyway). So a world of 1 in a step of N > 1 tasks is the mistake, and nothing else.
One exception: an interactive shell from ``srun -n N --pty bash`` carries the step's variables
(and ``SLURM_PTY_PORT``) to everything started in it, where a 1-rank run is legitimate.
"""

from __future__ import annotations

import os

# Set to 1 where each task of a step is meant to be its own 1-rank run (with its own --out).
INDEPENDENT = "HPCFL_INDEPENDENT_TASKS"


def step_tasks(environ=os.environ) -> int | None:
    """The number of tasks Slurm started in this step, or None outside an ``srun`` step."""
    try:
        n = int(environ.get("SLURM_STEP_NUM_TASKS", ""))
    except ValueError:
        return None
    return n if n > 0 else None


def split_world(world_size: int, environ=os.environ) -> str | None:
    """The error message when Slurm started several tasks that MPI did not join, else None.

    Parameters
    ----------
    world_size : int
        ``MPI.COMM_WORLD.Get_size()`` in this process.
    environ : mapping
        The process environment (a parameter for the tests).
    """
    n = step_tasks(environ)
    if n is None or n < 2 or world_size != 1 or environ.get(INDEPENDENT) == "1" or "SLURM_PTY_PORT" in environ:
        return None
    return (f"Slurm started {n} tasks in this step (SLURM_STEP_NUM_TASKS={n}) but MPI sees a world of 1 rank "
            f"in each: srun did not connect them to MPI, so each task would run the whole job on its own, "
            f"into the same --out. Fix: tell srun which PMI your MPI library uses: srun --mpi=pmi2 (the "
            f"mpich wheel, MPICH, Intel MPI) or srun --mpi=pmix (Open MPI); in slurm/*.sbatch that is "
            f"HPCFL_MPI. `srun --mpi=list` shows what this Slurm offers. Or start the ranks with "
            f"mpiexec -n $SLURM_NTASKS inside the allocation (slurm/README.md, Launching ranks). If each "
            f"task is meant to be its own 1-rank run, each with its own --out, set {INDEPENDENT}=1.")


def first_task(environ=os.environ) -> bool:
    """Whether this is the step's task 0 (the one that prints a message all tasks share)."""
    return environ.get("SLURM_PROCID", "0") == "0"
