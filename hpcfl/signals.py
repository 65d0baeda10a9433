"""Stop requests from SIGTERM, SIGINT and SIGUSR1 (no heavy imports: installed first).

A signal only sets a flag; the round loop agrees on it at the next round boundary,
writes a checkpoint and exits 75 (docs/reliability.md). Installed before numpy and
torch are imported, so that a signal during start-up is not lost (Python's default for
SIGUSR1 is to die, which a requeue script would see as 138).
"""

import signal

STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1")
_requested: list = []   # names of the signals received by this process


def _on_signal(signum, frame) -> None:
    _requested.append(signal.Signals(signum).name)


def install() -> None:
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
