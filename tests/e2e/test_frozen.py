"""A frozen rank (SIGSTOP: a hung node, a stuck file system) ends the job with exit 75, and the
rerun resumes bitwise, with the watchdog's default, derived limits.

The floor is lowered to 5 s (default 60 s) so that the tests wait seconds, not minutes; all the
rest is the default (``watchdog.timeout_s`` unset). The job's rounds take about 0.1 s, so the
derived limit is the floor: the job must end between 5 s and a few seconds more after the stop.
"""

import os
import signal
import time
from pathlib import Path

import pytest
from clirun import assert_same_run, hpcfl, kill_group, reference_run, start

JOB = """
[run]
name = "frozen"
seed = 3
rounds = 40
eval_every = 1
[data]
dataset = "digits"
partition = "dirichlet"
num_clients = 6
[model]
name = "mlp"
[model.mlp]
hidden = [16]
[algorithm]
name = "scaffold"
clients_per_round = 4
lr = 0.05
local_steps = 8
[runtime]
threads = 1
progress = "line"
[checkpoint]
every = 2
"""
FLOOR = 5.0
LOW = ("--set", f"watchdog.floor_s={FLOOR:g}")


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    return reference_run(tmp_path_factory, JOB, "frozen_ref")


def rank_pids(marker: str) -> dict[int, int]:
    """{MPI rank: pid} of the processes whose command line holds ``marker`` (hydra sets PMI_RANK)."""
    pids = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if marker.encode() not in (d / "cmdline").read_bytes():
                continue
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for e in env:
            if e.startswith(b"PMI_RANK="):
                pids[int(e[len("PMI_RANK="):])] = int(d.name)
    return pids


def gone(pid: int, within: float = 10.0) -> bool:
    end = time.time() + within
    while time.time() < end:
        if not Path(f"/proc/{pid}").exists():
            return True
        time.sleep(0.1)
    return False


def resumes_bitwise(ref, jobfile, out, ranks):
    # what a batch script requeues on under srun, whose exit code is 137 after MPI_Abort
    assert "stuck in phase" in (out / ".hpcfl-stalled").read_text()
    p = hpcfl("run", jobfile, "--out", str(out), *LOW, ranks=ranks, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "resuming from ckpt-" in p.stdout
    assert not (out / ".hpcfl-stalled").exists()                       # the rerun did not stall
    assert_same_run(ref / "out", out)


def test_rank_stopped_in_training_ends_two_ranks_with_exit_75_then_resumes_bitwise(ref, tmp_path):
    (tmp_path / "job.toml").write_text(JOB)
    jobfile, out, stamp = str(tmp_path / "job.toml"), tmp_path / "out", tmp_path / "stopped_at"
    p = hpcfl("run", jobfile, "--out", str(out), *LOW, ranks=2, timeout=300,
              env={"HPCFL_FAULT": "1:train:6:stop", "HPCFL_FAULT_STAMP": str(stamp)})
    waited = p.ended - float(stamp.read_text())
    assert p.returncode == 75, p.stdout + p.stderr
    assert "rank 0 stuck in phase 'train' of round 7" in p.stderr      # waiting for rank 1's rows (migration)
    assert "rank 1 stuck" not in p.stderr                               # the frozen rank says nothing
    assert "resume from the checkpoint after round 6" in p.stderr
    assert FLOOR - 0.5 < waited < FLOOR + 12, waited                    # the floor, then the abort
    resumes_bitwise(ref, jobfile, out, ranks=2)


def test_rank_stopped_from_outside_ends_three_ranks_with_exit_75_then_resumes_bitwise(ref, tmp_path):
    (tmp_path / "job.toml").write_text(JOB)
    jobfile, out = str(tmp_path / "job.toml"), tmp_path / "out"
    p = start("run", jobfile, "--out", str(out), *LOW, ranks=3)
    stopped = None
    try:
        seen = ""
        for line in p.stdout:          # `kill -STOP` of rank 2 once round 3 is done: mid-run, no fault hook
            seen += line
            if line.startswith("round  3/"):
                break
        assert line.startswith("round  3/"), seen + p.stderr.read()
        stopped = rank_pids(str(out))[2]
        os.kill(stopped, signal.SIGSTOP)
        t_stop = time.time()
        rc = p.wait(timeout=120)
        waited = time.time() - t_stop
        err = p.stderr.read()
        assert rc == 75, err
        assert "stuck in phase" in err and "exit 75" in err
        assert FLOOR - 0.5 < waited < FLOOR + 12, waited
        assert gone(stopped), "the stopped rank outlived the job"
    finally:
        kill_group(p)
        if stopped is not None and Path(f"/proc/{stopped}").exists():
            os.kill(stopped, signal.SIGKILL)
    resumes_bitwise(ref, jobfile, out, ranks=3)
