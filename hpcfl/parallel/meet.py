"""Start-up's agreement points: every rank meets there, and a refusal or a stop can never hang.

Before the first round no watchdog runs, and a rank blocked inside an MPI call never runs Python's
signal handlers: a rank waiting in a collective that the others never reach (they are in another
collective, or waiting for this rank in one) spins for ever, deaf to SIGTERM. So each agreement
point of start-up first waits for every rank in a non-blocking barrier that it polls, and only
then exchanges what each rank brings (:func:`meet`). While it waits:

- a rank that brings an error waits at most ``error_wait`` seconds for the others. If they have not
  come, they are held elsewhere (inside a collective of their own, perhaps waiting for this rank),
  and the error is final anyway: the rank prints it and ends every rank with the error's exit code
  through an MPI abort. A refusal is that exit on every rank within seconds, never a hang;
- a rank that received a stop signal waits ``stop_wait`` seconds for the others to come and agree
  on the stop cleanly; then it ends every rank with exit 75 (nothing was written: start-up only
  reads). Where they come, the caller's own check after the meeting says it once, on rank 0.

The barrier is polled with a growing sleep (1 ms to 50 ms), so a meeting of ranks that arrive
together costs about a millisecond, and a rank that waits long uses no CPU to speak of.
"""

from __future__ import annotations

import sys
import time

from ..errors import EXIT_RESUMABLE, HpcflError
from ..signals import stop_requested

ERROR_WAIT_S = 10.0   # a refusing rank waits this long for the others before it ends them all
STOP_WAIT_S = 10.0    # a stopped rank waits this long for the others to agree on the stop


class Abort:
    """How :func:`meet` ends every rank: ``undo()`` first (release what start-up took, the
    ``--out`` lock), then the message on stderr, then an MPI abort with ``code``. A class so that
    tests can see the decision without ending the test process."""

    def __init__(self, undo=None, pause: float = 1.0):
        self.undo, self.pause = undo, pause

    def __call__(self, comm, message: str, code: int) -> None:
        try:
            if self.undo is not None:
                self.undo()
        finally:
            print(message, file=sys.stderr, flush=True)
            # MPI_Abort tears mpiexec down at once: without a pause it may exit before it has
            # passed this line on (the watchdog pauses the same way).
            time.sleep(self.pause)
            comm.Abort(code)


def meet(comm, err: Exception | None, what: str, *, abort=None, error_wait: float = ERROR_WAIT_S,
         stop_wait: float = STOP_WAIT_S) -> list:
    """Collective: wait for every rank at the agreement point ``what``, then gather each rank's
    ``err`` (None where a rank found nothing wrong).

    Parameters
    ----------
    comm : MPI communicator
    err : exception or None
        What this rank found; one of :mod:`hpcfl.errors` for the exit code (others: exit 1).
    what : str
        The point, for the messages ("planning", "set-up", ...).
    abort : callable(comm, message, code), optional
        How to end every rank when the others do not come (default :class:`Abort` ()).

    Returns
    -------
    list, (comm.size,)
        Each rank's ``err``, in rank order, the same on every rank.
    """
    if comm.size > 1:
        _wait(comm, err, what, abort or Abort(), error_wait, stop_wait)
    return comm.allgather(err)


def _wait(comm, err, what: str, abort, error_wait: float, stop_wait: float) -> None:
    request = comm.Ibarrier()
    start, stopped_at, pause = time.monotonic(), None, 0.001
    while not request.Test():
        now = time.monotonic()
        if err is not None and now - start >= error_wait:
            code = err.exit_code if isinstance(err, HpcflError) else 1
            abort(comm, f"{err}\nhpcfl: rank {comm.rank}: the other ranks did not reach {what} within "
                        f"{error_wait:.0f} s of this error (they wait elsewhere, e.g. in a collective of "
                        f"their own); ended every rank with exit {code}. No results or checkpoints were written (a new "
                        f"--out may be left holding only its lock file, which the next run takes over).", code)
            return
        if stopped_at is None and stop_requested():
            stopped_at = now
        if stopped_at is not None and now - stopped_at >= stop_wait:
            abort(comm, f"hpcfl: rank {comm.rank}: stopped during start-up ({stop_requested()}); the other ranks "
                        f"did not reach {what} within {stop_wait:.0f} s, so every rank was ended at once "
                        f"(exit {EXIT_RESUMABLE}). No results or checkpoints were written; run the same command again "
                        f"to start", EXIT_RESUMABLE)
            return
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
