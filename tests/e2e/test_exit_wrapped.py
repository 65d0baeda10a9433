"""A finished run exits 0 however its ranks were launched (hpcfl/parallel/exits.py).

The process used to end with MPI_Finalize and ``os._exit``, which skips C's exit handlers, where
MPICH sends its PMI "finalize" to the launcher. Hydra then took each rank's exit for a crash and
killed the other ranks: harmless for bare ranks (reported as 0), exit 9 for ranks started through
a wrapper (3 of 8 launches of ``hpcfl run``). The first test is deterministic: hydra's verbose log
shows whether the finalize reached it. The others launch wrapped ranks several times.
"""

import subprocess
import sys

import pytest
from clirun import ROOT, digits_job

HPCFL = f"{sys.executable} -m mpi4py -m hpcfl"


def mpiexec(*argv, timeout=120):
    return subprocess.run(["mpiexec", *argv], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_every_rank_tells_the_launcher_it_finalised():
    p = mpiexec("-verbose", "-n", "2", sys.executable, "-m", "mpi4py", "-m", "hpcfl", "info")
    assert p.returncode == 0, p.stderr[-2000:]
    said = p.stdout + p.stderr   # hydra prints each PMI command it gets, and its answer
    assert said.count("cmd=finalize_ack") == 2, "a rank ended without sending PMI finalize"


@pytest.mark.parametrize("wrapper", [["sh", "-c"], ["env"]])
def test_wrapped_ranks_of_hpcfl_info_exit_0(wrapper):
    codes = []
    for _ in range(5):
        cmd = [*wrapper, f"{HPCFL} info"] if wrapper[0] == "sh" else [*wrapper, *HPCFL.split(), "info"]
        p = mpiexec("-n", "2", *cmd)
        codes.append(p.returncode)
        assert "BAD TERMINATION" not in p.stdout + p.stderr, p.stdout[-2000:]
    assert codes == [0] * 5


def test_wrapped_ranks_of_a_finished_run_exit_0(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(digits_job("wrapped", 3, 2))
    codes = []
    for i in range(3):
        p = mpiexec("-n", "2", "sh", "-c", f"{HPCFL} run {job} --out {tmp_path / f'out{i}'}")
        codes.append(p.returncode)
        assert "final test accuracy" in p.stdout and "BAD TERMINATION" not in p.stdout + p.stderr, p.stderr[-2000:]
    assert codes == [0] * 3
