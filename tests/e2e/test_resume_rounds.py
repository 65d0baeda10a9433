"""results.h5, the newest checkpoint and run.rounds agree before a run resumes (exit 2 otherwise), and
results.h5 is synced before every checkpoint, so a kill never leaves it behind one.

Before these checks a resume from a results.h5 older than its checkpoint finished with exit 0 and
rounds [1, 2, 5, 6]; a checkpoint claiming round 99 of a 6-round job gave the same silent gap; and
run.rounds lowered below the checkpoint's round printed "resuming", ran nothing and marked the run
finished with 4 rounds.
"""

import shutil

import h5py
import pytest
from clirun import assert_same_run, hpcfl

from hpcfl.results import load

T = 600   # seconds for one small run: generous, the suite runs under load on 2 cores

JOB = """
[run]
name = "rr"
seed = 2
rounds = 6
[data]
dataset = "digits"
partition = "iid"
num_clients = 6
[model]
name = "logreg"
[algorithm]
name = "fedavg"
clients_per_round = 3
lr = 0.05
local_steps = 2
[runtime]
threads = 1
progress = "none"
[checkpoint]
every = 2
keep = 3
"""


def kill_before_round(jobfile, out, rnd, *sets):
    """Run until the start of round ``rnd`` + 1 (the loop's index ``rnd``), then SIGKILL."""
    p = hpcfl("run", jobfile, "--out", str(out), *sets, env={"HPCFL_FAULT": f"0:decide:{rnd}:kill"}, timeout=T)
    assert p.returncode == -9, p.stderr
    return p


@pytest.fixture(scope="module")
def killed(tmp_path_factory):
    """A run killed after ckpt-4 (ckpt-2 and ckpt-4 on disk), and its results.h5 as it was after round 2."""
    d = tmp_path_factory.mktemp("killed")
    (d / "job.toml").write_text(JOB)
    out = d / "out"
    kill_before_round(d / "job.toml", out, 2)
    shutil.copy2(out / "results.h5", d / "results-after-round-2.h5")
    kill_before_round(d / "job.toml", out, 4)
    assert sorted(p.name for p in (out / "checkpoints").glob("ckpt-*.h5")) == ["ckpt-00000002.h5",
                                                                                "ckpt-00000004.h5"]
    return d


def copy_of(killed, tmp_path):
    shutil.copytree(killed / "out", tmp_path / "out")
    return str(killed / "job.toml"), tmp_path / "out"


def test_results_behind_the_checkpoint_exits_2_and_changes_nothing(killed, tmp_path):
    jobfile, out = copy_of(killed, tmp_path)
    shutil.copy2(killed / "results-after-round-2.h5", out / "results.h5")   # an older copy put back
    before = (out / "results.h5").read_bytes()
    p = hpcfl("run", jobfile, "--out", str(out), timeout=T)
    assert p.returncode == 2, p.stdout + p.stderr
    assert f"{out / 'results.h5'} holds rounds 1-2 but checkpoint {out / 'checkpoints' / 'ckpt-00000004.h5'} was " \
           f"written after round 4" in p.stderr
    assert "rounds 3-4 are missing" in p.stderr and "remove the checkpoints after round 2" in p.stderr
    assert (out / "results.h5").read_bytes() == before and load(out).attrs["status"] == "running"
    # the fix the message gives: without ckpt-4 the run resumes from ckpt-2 and finishes whole
    (out / "checkpoints" / "ckpt-00000004.h5").unlink()
    p = hpcfl("run", jobfile, "--out", str(out), timeout=T)
    assert p.returncode == 0 and "resuming from ckpt-00000002.h5" in p.stdout, p.stderr
    assert load(out).metrics["round"].tolist() == [1, 2, 3, 4, 5, 6]


def test_a_checkpoint_ahead_of_the_job_exits_2(killed, tmp_path):
    jobfile, out = copy_of(killed, tmp_path)
    ahead = out / "checkpoints" / "ckpt-00000099.h5"
    shutil.copy2(out / "checkpoints" / "ckpt-00000004.h5", ahead)
    with h5py.File(ahead, "r+") as f:   # a checkpoint that claims round 99 of this 6-round job
        f.attrs["round"] = 99
    p = hpcfl("run", jobfile, "--out", str(out), timeout=T)
    assert p.returncode == 2, p.stdout + p.stderr
    assert f"checkpoint {ahead} claims round 99, beyond the job's run.rounds = 6" in p.stderr
    assert f"Remove it from {out / 'checkpoints'}" in p.stderr
    assert load(out).metrics["round"].tolist() == [1, 2, 3, 4]


def test_rounds_lowered_below_the_checkpoint_exits_2(killed, tmp_path):
    jobfile, out = copy_of(killed, tmp_path)
    p = hpcfl("run", jobfile, "--out", str(out), "--set", "run.rounds=2", timeout=T)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "resuming from" not in p.stdout
    assert f"run.rounds = 2 is below the round of checkpoint {out / 'checkpoints' / 'ckpt-00000004.h5'} " \
           f"(written after round 4; its job has run.rounds = 6)" in p.stderr
    assert "--set run.rounds=6" in p.stderr
    res = load(out)
    assert res.attrs["status"] == "running" and res.metrics["round"].tolist() == [1, 2, 3, 4]


def test_a_kill_after_a_checkpoint_never_leaves_results_behind_it(killed, tmp_path):
    """Rounds are buffered on rank 0 (here for 1000 s: nothing is written by the clock), and
    results.h5 is written and fsynced before each checkpoint: killed at the start of round 5,
    the file holds rounds 1-4, as ckpt-4 does; the resumed run equals one never stopped."""
    jobfile, out = str(killed / "job.toml"), tmp_path / "out"
    kill_before_round(jobfile, out, 4, "--set", "results.flush_seconds=1000")
    assert load(out).metrics["round"].tolist() == [1, 2, 3, 4]
    p = hpcfl("run", jobfile, "--out", str(out), "--set", "results.flush_seconds=1000", timeout=T)
    assert p.returncode == 0 and "resuming from ckpt-00000004.h5" in p.stdout, p.stderr
    ref = tmp_path / "ref"   # every round written as it ends, never stopped
    assert hpcfl("run", jobfile, "--out", str(ref), "--set", "results.flush_seconds=0", timeout=T).returncode == 0
    assert_same_run(ref, out)
