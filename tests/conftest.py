import os
import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

# Under mpiexec, only rank 0 prints pytest's report; other ranks print theirs only on failure.
from mpi_report import (pytest_configure, pytest_runtest_logreport, pytest_sessionstart,  # noqa: E402, F401
                        pytest_unconfigure)


def _private_dataset_cache():
    """Generated datasets go to a fresh folder per test process (and its children), removed at
    exit: tests never read a cache left by another version, nor fill the user's ~/.cache."""
    import atexit
    import os
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="hpcfl-test-cache-")
    os.environ["HPCFL_CACHE_DIR"] = folder
    atexit.register(shutil.rmtree, folder, True)
    # numba's compiled kernels (hpcfl keeps them in <cache>/numba) are kept across test sessions
    # and ranks, as they were in the package's __pycache__: compiling them per process would add
    # seconds to every MPI rank. Keyed by the source file, so never stale.
    if not os.environ.get("NUMBA_CACHE_DIR"):
        numba_cache = Path(__file__).resolve().parent.parent / "build" / "test-numba-cache"
        numba_cache.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.environ["NUMBA_CACHE_DIR"] = str(numba_cache)


_private_dataset_cache()
# On a machine with one GPU, the suite's runs of 2-4 ranks share it (runtime.share_gpus); their
# subprocesses inherit this. tests/*/test_gpus*.py test the refusal with it unset.
os.environ.setdefault("HPCFL_SHARE_GPUS", "1")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
ORIGINAL_HANDLERS = {s: signal.getsignal(s) for s in STOP_SIGNALS}   # pytest's, before any test ran


def restore_stop_signals():
    """Put back the stop-signal handlers this process started with.

    ``hpcfl run`` or ``hpcfl sweep`` run in-process (cli.main) leave their handlers installed,
    and a finished run even sets them to SIG_IGN. An ignored signal stays ignored in every
    child process, and a shell cannot trap it: tests/e2e/test_slurm_requeue.py's USR1 forwarding
    failed after such a run.
    """
    for s, handler in ORIGINAL_HANDLERS.items():
        signal.signal(s, handler)


@pytest.fixture(autouse=True)
def _restore_stop_signals_after_each_test():
    """After every test, and so also after module fixtures that ran cli.main before it."""
    yield
    restore_stop_signals()


@pytest.fixture(autouse=True)
def _no_run_lock_left_held():
    """cli.main run in-process must release the --out lock on every path that returns: a lock left
    held made a later test's lock checks fail, and would block hpcfl sweep's next point."""
    yield
    from hpcfl.io import rundir

    if rundir.holding():
        rundir.unlock()
        pytest.fail("this test (or a module fixture before it) returned from hpcfl with a run lock held")


@pytest.fixture(autouse=True)
def _hdf5_usable_again():
    """Tests that simulate a failed write (a mock that raises ENOSPC) mark this process's HDF5 as unsafe
    (hpcfl.io.h5check.FAILED_WRITE), which would refuse every later run in the same test worker: the
    library is not really damaged by a mock, so the mark is cleared after each test."""
    yield
    from hpcfl.io import h5check
    from hpcfl.parallel import exits

    h5check.FAILED_WRITE.clear()
    exits._UNSAFE.clear()


# Per-test time limits, so that a hang fails its own test in bounded time instead of running into
# setup.cfg's 600 s (the last resort, for tests/unit). A test in tests/mpi or tests/e2e without a
# timeout mark of its own (on the test or its module) gets the one here; a module whose fixture
# runs several jobs first marks itself longer. Chosen as 16x (MPI: 7 s) and 6x (e2e: 51 s) the
# slowest such test measured on the shared 2-core machine (docs/guide.md, "Time limits of the
# tests"), so that a 2-3x slower CI machine does not flake.
# Under mpiexec each rank has its own timer: the first rank past it prints its stacks and exits,
# and mpiexec then ends the others. An explicit --timeout (or PYTEST_TIMEOUT) on the command line
# replaces these defaults (e.g. --timeout=0 to debug).
DEFAULT_TIMEOUT_S = {"mpi": 120, "e2e": 300}


def pytest_collection_modifyitems(config, items):
    if config.getoption("timeout", None) is not None or os.environ.get("PYTEST_TIMEOUT"):
        return
    here = Path(__file__).resolve().parent
    for item in items:
        if item.get_closest_marker("timeout") is not None:
            continue
        try:
            part = Path(str(item.path)).resolve().relative_to(here).parts[0]
        except ValueError:
            continue
        if part in DEFAULT_TIMEOUT_S:
            item.add_marker(pytest.mark.timeout(DEFAULT_TIMEOUT_S[part]))
