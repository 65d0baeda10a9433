import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

# Under mpiexec, only rank 0 prints pytest's report; other ranks print theirs only on failure.
from mpi_report import pytest_configure, pytest_sessionstart, pytest_unconfigure  # noqa: E402, F401
