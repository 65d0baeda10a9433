"""Stop requests from SIGTERM, SIGINT and SIGUSR1 (no heavy imports: installed first).

A signal only sets a flag; the round loop agrees on it at the next round boundary,
writes a checkpoint and exits 75 (docs/reliability.md). Installed before numpy and
torch are imported, so that a signal during start-up is not lost (Python's default for
SIGUSR1 is to die, which a requeue script would see as 138).

The first signal is acknowledged at once on stderr (by one process: rank 0 of an MPI job,
read from the launcher's environment), since start-up and a round can take minutes. A
second Ctrl-C (SIGINT) stops the process at once: the first one gives SIGINT back its
default action, death, which is safe at any moment (a run resumes from its last
checkpoint as after a kill). SIGTERM and SIGUSR1 keep waiting for the checkpoint, which
is what a batch system's warning signal is for.
"""

import os
import signal

STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1")
_requested: list = []   # names of the signals received by this process
RUN_STOP = "stopping at the end of start-up or of the round in progress (a checkpoint is written then)"
_stopping = [RUN_STOP]   # what the acknowledgement says happens next (install() sets it)


RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")


def _rank() -> str:
    for name in RANK_VARIABLES:
        if os.environ.get(name):
            return os.environ[name]
    return "0"


def _on_signal(signum, frame) -> None:
    name = signal.Signals(signum).name
    first = not _requested
    _requested.append(name)
    if signum == signal.SIGINT:
        signal.signal(signal.SIGINT, signal.SIG_DFL)   # a second Ctrl-C stops at once
    if first and _rank() == "0":
        again = "; press Ctrl-C again to stop at once" if signum == signal.SIGINT else ""
        # os.write: print() could be interrupted in the middle of writing to the same stream
        os.write(2, f"\nhpcfl: {name} received: {_stopping[0]}{again}\n".encode())


def install(stopping: str = RUN_STOP) -> None:
    """Make the stop signals stop requests; ``stopping`` is what the acknowledgement says happens next
    (a run's default; ``hpcfl sweep`` says its planning stops at once)."""
    _stopping[0] = stopping
    for name in STOP_SIGNALS:
        signal.signal(getattr(signal, name), _on_signal)


def stop_requested():
    """Name of the first stop signal received, or None."""
    return _requested[0] if _requested else None


def ignore() -> None:
    """Once the run's results are complete: a late stop signal must not turn exit 0 into a kill.

    At interpreter shutdown CPython resets Python-level handlers to the default (death by
    the signal, 143 for SIGTERM, which a requeue script reads as a failure); an explicit
    SIG_IGN is left alone.
    """
    for name in STOP_SIGNALS:
        signal.signal(getattr(signal, name), signal.SIG_IGN)
