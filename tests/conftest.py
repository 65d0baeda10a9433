import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

# Under mpiexec, only rank 0 prints pytest's report; other ranks print theirs only on failure.
from mpi_report import pytest_configure, pytest_sessionstart, pytest_unconfigure  # noqa: E402, F401


@pytest.fixture(autouse=True)
def _restore_stop_signals():
    """A test that runs ``hpcfl run`` or ``hpcfl sweep`` in-process (cli.main) leaves its stop-signal
    handlers installed, and a finished run even sets them to SIG_IGN. An ignored signal stays ignored
    in every child process, and a shell cannot trap it (tests/e2e/test_slurm.py's USR1 forwarding then
    failed after such a test): put this process's handlers back after every test."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)
