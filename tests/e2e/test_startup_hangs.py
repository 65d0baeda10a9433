"""Start-up on several ranks never hangs (docs/reliability.md, "Start-up on several ranks").

Each case hung for ever before: rank 0 refusing at planning while the others were in set-up's
collectives; one rank refusing in set-up while the others waited in the placement's; SIGTERM while
a rank was frozen in start-up (the others, blocked in an MPI call, never ran Python's handler).
Each now ends every rank with the promised exit within seconds; the bound here is 60 s.
"""

import signal
import subprocess
import time

import pytest
from clirun import digits_job, hpcfl, kill_group, start

BOUND = 60


def ended(p: subprocess.Popen, timeout: float = BOUND):
    """(exit code, stdout, stderr, seconds) of ``p``; a run still going after ``timeout`` is killed
    with its whole process group and fails the test."""
    t = time.monotonic()
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(p)
        out, err = p.communicate()
        pytest.fail(f"still running after {timeout} s (killed):\n{out[-2000:]}\n{err[-2000:]}")
    return p.returncode, out, err, time.monotonic() - t


def write(tmp_path, name="sh", seed=5, extra=""):
    path = tmp_path / f"{name}.toml"
    path.write_text(digits_job(name, seed, 3, extra))
    return str(path)


@pytest.mark.parametrize("ranks", [2, 3])
def test_another_jobs_results_in_out_is_exit_2_on_every_rank(tmp_path, ranks):
    out = tmp_path / "out"
    assert hpcfl("run", write(tmp_path, seed=5), "--out", str(out)).returncode == 0
    before = (out / "results.h5").read_bytes()
    code, stdout, stderr, seconds = ended(start("run", write(tmp_path, "other", seed=6), "--out", str(out),
                                                ranks=ranks))
    assert code == 2, (stdout, stderr)
    assert stderr.count("holds results of a different job") == 1, stderr   # said once, by rank 0
    assert (out / "results.h5").read_bytes() == before


@pytest.mark.parametrize("ranks", [2, 3])
def test_one_rank_refusing_while_the_others_wait_in_a_collective_ends_them_all(tmp_path, ranks):
    out = tmp_path / "out"
    p = start("run", write(tmp_path), "--out", str(out), ranks=ranks, env={"HPCFL_FAULT": "1:setup:0:refuse"})
    code, stdout, stderr, seconds = ended(p)
    assert code == 2, (stdout, stderr)
    assert "injected refusal on rank 1 in phase setup" in stderr
    assert "rank 1: the other ranks did not reach the end of set-up within 10 s of this error" in stderr
    assert seconds < 30
    assert not (out / "results.h5").exists() and not (out / "checkpoints").exists()


def test_sigterm_while_a_rank_is_frozen_in_start_up_ends_every_rank_with_75(tmp_path):
    out, stamp = tmp_path / "out", tmp_path / "stamp"
    p = start("run", write(tmp_path), "--out", str(out), ranks=2,
              env={"HPCFL_FAULT": "1:setup:0:stop", "HPCFL_FAULT_STAMP": str(stamp)})
    deadline = time.monotonic() + 30
    while not stamp.exists() and time.monotonic() < deadline:   # written as rank 1 freezes
        time.sleep(0.1)
    time.sleep(1.0)                       # rank 0 is in the placement's collective by now
    p.send_signal(signal.SIGTERM)         # mpiexec passes it on to both ranks
    code, stdout, stderr, seconds = ended(p)
    assert code == 75, (stdout, stderr)
    assert "rank 0: start-up is blocked" in stderr and "after SIGTERM" in stderr
    assert seconds < 20
    assert not out.exists()               # the lock rank 0 took, and the folder it made, taken back
