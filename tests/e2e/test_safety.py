"""Nothing written is lost from the CLI: --force, bad paths, shared checkpoint directories,
checkpoints on a wall-clock interval, and a longer run.rounds on resume."""

import json
import os
import random
import shutil
import signal
import time
from pathlib import Path

import h5py
import numpy as np
import pytest
from hpcfl.io import rundir

from clirun import assert_same_run, digits_job, hpcfl, kill_group, reference_run, start

JOB = digits_job("safe", 2, 6)


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished run; tests copy nothing from it and only read it."""
    return reference_run(tmp_path_factory, JOB, "finished")


def job(tmp_path, text=JOB):
    (tmp_path / "job.toml").write_text(text)
    return str(tmp_path / "job.toml")


def snapshot(out: Path) -> dict:
    """Every file under ``out`` with its bytes (but the lock file, which names the last holder)."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.name != rundir.LOCK}


@pytest.mark.parametrize("bad", [
    ["--set", "data.dataset=cifar10", "--set", "data.root=/nonexistent"],   # data not found
    ["--set", "algorithm.lr=-1"],                                            # invalid config
    ["--set", "data.num_clients=1"],                                         # more clients per round than clients
])
def test_force_with_a_bad_job_leaves_the_old_run_intact(tmp_path, finished, bad):
    jobfile, out = job(tmp_path), tmp_path / "out"
    shutil.copytree(finished / "out", out)     # a finished run, as if it had been made here:
    marker = json.loads((out / "checkpoints" / rundir.MARKER).read_text())
    rundir.claim(out / "checkpoints", marker["run_id"], out / "results.h5")
    before = snapshot(out)
    assert "results.h5" in before and "checkpoints/ckpt-00000006.h5" in before
    p = hpcfl("run", jobfile, "--out", str(out), "--force", *bad)
    assert p.returncode == 2 and "belongs to another run" not in p.stderr, p.stderr
    assert snapshot(out) == before, "a rejected --force changed the old run"


def test_force_sets_the_old_run_aside_until_the_new_one_has_a_checkpoint(tmp_path, finished):
    jobfile, out = job(tmp_path), tmp_path / "out"
    assert hpcfl("run", jobfile, "--out", str(out)).returncode == 0
    old = snapshot(out)
    # The new run dies in its first round, before any checkpoint: the old run must survive whole.
    p = hpcfl("run", jobfile, "--out", str(out), "--force", "--set", "algorithm.lr=0.1",
              env={"HPCFL_FAULT": "0:train:0:kill"})
    assert p.returncode == -signal.SIGKILL
    aside = [d for d in out.iterdir() if d.name.startswith("replaced-")]
    assert len(aside) == 1
    assert snapshot(aside[0]) == old, "the set-aside copy is not the old run"
    # A --force that reaches its first checkpoint deletes only the copy it set aside itself.
    p = hpcfl("run", jobfile, "--out", str(out), "--force")
    assert p.returncode == 0, p.stderr
    assert "set aside in" in p.stdout and "deleted the previous run set aside" in p.stdout
    assert [d for d in out.iterdir() if d.name.startswith("replaced-")] == aside
    assert_same_run(finished / "out", out)


def test_out_that_is_a_file_exits_2_naming_it(tmp_path):
    f = tmp_path / "results_here"
    f.write_text("not a directory")
    p = hpcfl("run", job(tmp_path), "--out", str(f))
    assert p.returncode == 2 and f"--out {f} is a file" in p.stderr and "Traceback" not in p.stderr
    p = hpcfl("run", job(tmp_path), "--out", str(f / "sub"))
    assert p.returncode == 2 and f"{f} is a file" in p.stderr and "Traceback" not in p.stderr
    p = hpcfl("run", job(tmp_path), "--out", str(tmp_path / "o"), "--set", f"checkpoint.dir={f}")
    assert p.returncode == 2 and f"checkpoint.dir {f} is a file" in p.stderr
    assert f.read_text() == "not a directory" and not (tmp_path / "o").exists()


def _read_only_dir(tmp_path) -> Path:
    """A directory nobody can create files in. Root ignores permission bits, so as root
    this is a path under /sys (a read-only mount in containers), skipped where writable."""
    if os.geteuid() != 0:
        d = tmp_path / "ro"
        d.mkdir()
        d.chmod(0o555)
        return d
    probe = Path("/sys/hpcfl-probe")
    try:
        probe.mkdir()
    except OSError:
        return Path("/sys")
    probe.rmdir()
    pytest.skip("running as root and /sys is writable: no read-only directory to test with")


def test_out_in_a_read_only_place_exits_2_naming_it(tmp_path):
    ro = _read_only_dir(tmp_path)
    out = ro / "run1"
    p = hpcfl("run", job(tmp_path), "--out", str(out))
    assert p.returncode == 2, p.stderr
    assert f"--out {out} cannot be written" in p.stderr and "Traceback" not in p.stderr
    p = hpcfl("run", job(tmp_path), "--out", str(tmp_path / "o"), "--set", f"checkpoint.dir={out}")
    assert p.returncode == 2 and f"checkpoint.dir {out} cannot be written" in p.stderr


def test_two_runs_sharing_a_checkpoint_directory_are_refused(tmp_path, finished):
    jobfile, shared = job(tmp_path), tmp_path / "ckpts"
    a, b = tmp_path / "a", tmp_path / "b"
    assert hpcfl("run", jobfile, "--out", str(a), "--set", f"checkpoint.dir={shared}").returncode == 0
    before = snapshot(shared)
    for extra in ([], ["--force"]):
        p = hpcfl("run", jobfile, "--out", str(b), "--set", f"checkpoint.dir={shared}", *extra)
        assert p.returncode == 2 and f"checkpoint directory {shared} belongs to another run" in p.stderr
        assert str(a / "results.h5") in p.stderr
    assert snapshot(shared) == before and not b.exists()
    # Run a still owns it: a --force of a starts over in its own directory.
    assert hpcfl("run", jobfile, "--out", str(a), "--set", f"checkpoint.dir={shared}", "--force").returncode == 0
    assert_same_run(finished / "out", a)


@pytest.mark.parametrize("name", ["../escape", "a/b", "..", "has space", ""])
def test_run_names_are_plain_names(tmp_path, name):
    p = hpcfl("run", job(tmp_path), "--set", f"run.name={name!r}".replace("'", '"'))
    assert p.returncode == 2 and "run.name" in p.stderr and "plain name" in p.stderr, p.stderr


TIMED = JOB.replace("rounds = 6", "rounds = 400").replace('progress = "line"', 'progress = "none"') + """
[checkpoint]
every_minutes = 0.005
keep = 3
"""


@pytest.fixture(scope="module")
def timed_ref(tmp_path_factory):
    return reference_run(tmp_path_factory, TIMED, "timed_ref")


@pytest.mark.parametrize("ranks", [0, 2])   # 2: rank 0's clock decides for both ranks
def test_time_based_checkpoint_loses_at_most_one_interval(timed_ref, tmp_path, ranks):
    ref = timed_ref
    jobfile, out = job(tmp_path, TIMED), tmp_path / "out"
    interval = 0.005 * 60
    p = start("run", jobfile, "--out", str(out), ranks=ranks)
    ckpts = out / "checkpoints"
    deadline = time.time() + 60
    while not list(ckpts.glob("ckpt-*.h5")) and p.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(random.Random(7).uniform(0.2, 0.8))
    kill_group(p)
    killed = time.time()
    p.wait(timeout=30)
    assert p.returncode == -signal.SIGKILL, "the run finished before it could be killed; give it more rounds"
    saved = sorted(ckpts.glob("ckpt-*.h5"))
    last = max(saved, key=lambda q: q.stat().st_mtime)
    with h5py.File(out / "results.h5", "r", swmr=True) as f:
        done = len(f["metrics/round"])
        slowest = float(np.max(f["metrics/time_round"][()]))
    ckpt_round = int(last.stem.split("-")[1])
    assert 0 < ckpt_round <= done < 400   # every = 0: only the clock can have written it
    print(f"killed after {done} rounds; newest checkpoint after round {ckpt_round}, "
          f"{killed - last.stat().st_mtime:.2f} s before the kill (interval {interval:.1f} s)")
    # A checkpoint is taken at the first round end after the interval has passed.
    assert killed - last.stat().st_mtime <= interval + 2 * slowest + 1.0
    p = hpcfl("run", jobfile, "--out", str(out), ranks=3 if ranks else 0)
    assert p.returncode == 0 and f"resuming from {last.name}" in p.stdout, p.stderr
    assert_same_run(ref / "out", out)


def test_partition_png_in_a_missing_directory_exits_2(tmp_path):
    png = tmp_path / "missing" / "p.png"
    p = hpcfl("partition", job(tmp_path), "--png", str(png))
    assert p.returncode == 2 and f"--png {png} cannot be written" in p.stderr and "Traceback" not in p.stderr


STEP = JOB.replace('lr = 0.05', 'lr = 0.05\nlr_schedule = "step"\nlr_milestones = [0.5, 0.75]')


def test_longer_run_rounds_keeps_the_lr_schedule_or_refuses(tmp_path_factory, tmp_path):
    jobfile, out = job(tmp_path, STEP), tmp_path / "out"
    assert hpcfl("run", jobfile, "--out", str(out)).returncode == 0      # 6 rounds: x0.1 from 3, x0.01 from 4
    before = (out / "results.h5").read_bytes()
    p = hpcfl("run", jobfile, "--out", str(out), "--set", "run.rounds=10", "--allow-change", "run.rounds")
    assert p.returncode == 2
    assert "would move from rounds [3, 4] to [5, 7]" in p.stderr
    assert "--set algorithm.lr_milestone_rounds=[3,4]" in p.stderr
    assert (out / "results.h5").read_bytes() == before
    keep = ["--set", "run.rounds=10", "--set", "algorithm.lr_milestone_rounds=[3,4]"]
    p = hpcfl("run", jobfile, "--out", str(out), *keep, "--allow-change", "run.rounds")
    assert p.returncode == 0 and "resuming from ckpt-00000006.h5" in p.stdout, p.stderr
    lr = h5py.File(out / "results.h5", "r")["metrics/lr"][()]
    assert np.allclose(lr, [0.05] * 3 + [0.005] + [0.0005] * 6, rtol=1e-12)
    ref = tmp_path_factory.mktemp("long")
    assert hpcfl("run", jobfile, "--out", str(ref / "out"), *keep).returncode == 0
    assert_same_run(ref / "out", out)


def test_a_second_run_into_a_live_out_is_refused(tmp_path, timed_ref):
    jobfile, out = job(tmp_path, TIMED), tmp_path / "out"
    p = start("run", jobfile, "--out", str(out))
    deadline = time.time() + 60
    while not (out / "results.h5").exists() and p.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    # Frozen, the first run stays alive and keeps its lock however fast its 400 rounds are (it
    # once finished while the second run was starting, and the second then resumed a finished run).
    kill_group(p, signal.SIGSTOP)
    try:
        assert p.poll() is None, "the first run ended too early"
        for extra in ([], ["--force"]):
            q = hpcfl("run", jobfile, "--out", str(out), *extra)
            assert q.returncode == 2 and f"{out} is in use by another hpcfl run (pid {p.pid}" in q.stderr, q.stderr
            assert not [d for d in out.iterdir() if d.name.startswith("replaced-")]
    finally:
        kill_group(p, signal.SIGTERM)     # stops at the next round end with a checkpoint, exit 75
        kill_group(p, signal.SIGCONT)
    assert p.wait(timeout=60) == 75
    q = hpcfl("run", jobfile, "--out", str(out))   # the lock went with the process
    assert q.returncode == 0 and "resuming from" in q.stdout, q.stderr
    assert_same_run(timed_ref / "out", out)
