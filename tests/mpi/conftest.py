"""Fixtures of the MPI tests (run under ``mpiexec``, every rank collecting the same tests)."""

import sys
from pathlib import Path

import pytest
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from runner import rank0_folder  # noqa: E402


@pytest.fixture
def folder():
    """A temporary folder shared by every rank (one filesystem here), removed after the test."""
    with rank0_folder(MPI.COMM_WORLD, "hpcfl-mpi-") as path:
        yield path
