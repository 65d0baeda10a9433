"""One pytest report per MPI run (imported by tests/conftest.py).

Under ``mpiexec -n N python -m mpi4py -m pytest --with-mpi ...`` every rank is a whole pytest
session, and each would print its banner, progress dots and summary into the same terminal.
Here ranks other than 0 write their terminal report into a buffer instead; rank 0 prints as
usual. A rank whose session fails (exit status not 0) prints its buffered report to stderr at
the end, every line prefixed with ``[rank R/N]``, so a failure seen only on that rank is
still shown. Output that bypasses the terminal reporter (pytest-timeout's stack dumps, MPI
aborts) is untouched.

A test that fails on some ranks only would leave the others waiting in its collectives (or in
the next test's) until the timeout: so under MPI a failing test prints its report to stderr,
prefixed with its rank, and calls ``MPI_Abort``, which ends every rank at once with a failure.

The rank comes from the launcher's environment (MPICH/Intel MPI hydra: PMI_RANK/PMI_SIZE,
Open MPI: OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE, MVAPICH: MV2_COMM_WORLD_RANK/SIZE);
only with ``--with-mpi`` and none of those set is mpi4py asked. A plain ``python -m pytest``
does nothing here and imports no MPI.
"""

from __future__ import annotations

import io
import os
import sys

import pytest

_ENV = (
    ("PMI_RANK", "PMI_SIZE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE"),
)
_STATE = pytest.StashKey[dict]()


def rank_and_size(config) -> tuple[int, int]:
    for rank_var, size_var in _ENV:
        try:
            return int(os.environ[rank_var]), int(os.environ[size_var])
        except (KeyError, ValueError):
            pass
    if config.getoption("with_mpi", default=False):
        from mpi4py import MPI  # the MPI tests import it anyway

        return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    return 0, 1


_WORLD = {}   # rank and size under MPI (set in pytest_configure), for the abort on failure


@pytest.hookimpl(trylast=True)  # after the terminal reporter is registered
def pytest_configure(config):
    rank, size = rank_and_size(config)
    _WORLD.update(rank=rank, size=size, mpi=config.getoption("with_mpi", default=False))
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    tw = getattr(reporter, "_tw", None)
    if size <= 1 or rank == 0 or not hasattr(tw, "_file"):
        return
    buf = io.StringIO()
    tw._file = buf  # the reporter's own writer: keeps its width and markup settings
    reporter.isatty = type(reporter.isatty)(False)  # no "\r" rewrites into the buffer
    config.stash[_STATE] = {"rank": rank, "size": size, "buf": buf, "session": None}


def pytest_runtest_logreport(report):
    """Under MPI with several ranks: a failed test ends every rank, its report shown (see module doc)."""
    if not report.failed or _WORLD.get("size", 1) <= 1 or not _WORLD.get("mpi"):
        return
    prefix = f"[rank {_WORLD['rank']}/{_WORLD['size']}] "
    text = f"{report.nodeid} failed ({report.when}) on this rank; aborting every rank:\n{report.longreprtext}"
    sys.stderr.write("".join(f"{prefix}{line}\n" for line in text.split("\n")))
    sys.stderr.flush()
    from mpi4py import MPI

    MPI.COMM_WORLD.Abort(1)


def pytest_sessionstart(session):
    state = session.config.stash.get(_STATE, None)
    if state is not None:
        state["session"] = session


@pytest.hookimpl(trylast=True)  # after everything else has written its part of the report
def pytest_unconfigure(config):
    state = config.stash.get(_STATE, None)
    if state is None:
        return
    session = state["session"]
    status = getattr(session, "exitstatus", None)
    if status == 0:
        return
    prefix = f"[rank {state['rank']}/{state['size']}] "
    code = "unknown" if status is None else int(status)
    head = f"pytest on rank {state['rank']} of {state['size']} exited with status {code}; its report:"
    lines = [head, *state["buf"].getvalue().rstrip("\n").split("\n")]
    sys.stderr.write("".join(f"{prefix}{line}\n" for line in lines))
    sys.stderr.flush()
