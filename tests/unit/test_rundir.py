"""Run-directory rules: writable-path checks, checkpoint-directory ownership, set-aside;
and the wall-clock checkpoint decision of the round boundary."""

import json
import os
import time

import pytest

from hpcfl.engine.control import RunControl
from hpcfl.config import GuardSection
from hpcfl.errors import CallbackError, HpcflError, WriteError
from hpcfl.io import rundir


def test_check_writable_creates_nothing_and_names_the_path(tmp_path):
    rundir.check_writable(tmp_path / "a" / "b", "--out", "fix it")
    assert list(tmp_path.iterdir()) == []                       # the probe file is gone, nothing made
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(HpcflError, match=rf"--out {f} is a file, not a directory; fix it"):
        rundir.check_writable(f, "--out", "fix it")
    with pytest.raises(HpcflError, match=rf"--out {f}/deeper: {f} is a file"):
        rundir.check_writable(f / "deeper", "--out", "fix it")


def test_ownership_marker(tmp_path):
    d, mine, other = tmp_path / "ck", tmp_path / "a" / "results.h5", tmp_path / "b" / "results.h5"
    rundir.check_owner(d, None, mine)                           # no directory, no marker: free
    rundir.claim(d, "id-a", mine)
    marker = json.loads((d / rundir.MARKER).read_text())
    assert marker["run_id"] == "id-a" and marker["results"] == str(mine.resolve())
    rundir.check_owner(d, "id-a", mine)                         # the owner resumes
    rundir.check_owner(d, None, mine)                           # the same --out starts over
    with pytest.raises(HpcflError, match="belongs to another run"):
        rundir.check_owner(d, "id-b", other)
    with pytest.raises(HpcflError, match="belongs to another run"):
        rundir.check_owner(d, None, other)
    with pytest.raises(HpcflError, match="belongs to another run"):
        rundir.check_owner(d, "id-b", mine)                     # another run's id in the same place
    (d / rundir.MARKER).write_text("{not json")
    with pytest.raises(HpcflError, match="cannot be read"):
        rundir.check_owner(d, "id-a", mine)


def test_set_aside_keeps_every_file(tmp_path):
    out, ck = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    ck.mkdir()
    (out / "results.h5").write_bytes(b"R")
    (ck / "ckpt-00000002.h5").write_bytes(b"C")
    (ck / "unrelated.txt").write_text("not ours")
    aside = rundir.set_aside(out, [out / "results.h5", ck / "ckpt-00000002.h5", ck / "missing.h5"])
    assert aside.parent == out and aside.name.startswith(rundir.ASIDE_PREFIX)
    assert (aside / "results.h5").read_bytes() == b"R"
    assert (aside / "checkpoints" / "ckpt-00000002.h5").read_bytes() == b"C"
    assert not (out / "results.h5").exists() and (ck / "unrelated.txt").exists()
    assert rundir.set_aside(out, [out / "results.h5"]) is None


def test_set_aside_moves_export_folders_and_never_follows_a_link(tmp_path):
    out, victim, tb = tmp_path / "out", tmp_path / "victim", "tensorboard"
    out.mkdir()
    victim.mkdir()
    (victim / "keep.txt").write_text("theirs")
    (out / tb).symlink_to(tmp_path / "nowhere")   # a dangling link is moved too (the old code left it)
    aside = rundir.set_aside(out, [out / tb])
    assert aside is not None and os.readlink(aside / tb) == str(tmp_path / "nowhere")
    (out / tb).symlink_to(victim)   # a link is moved as the link; its target is not touched
    aside = rundir.set_aside(out, [out / name for name in rundir.EXPORT_FOLDERS])
    assert os.readlink(aside / tb) == str(victim) and not os.path.lexists(out / tb)
    assert os.listdir(victim) == ["keep.txt"] and (victim / "keep.txt").read_text() == "theirs"
    (out / tb).mkdir()
    (out / tb / "events.out.tfevents.1.hpcfl").write_bytes(b"E")
    aside = rundir.set_aside(out, [out / tb])
    assert (aside / tb / "events.out.tfevents.1.hpcfl").read_bytes() == b"E" and not os.path.lexists(out / tb)


class FakeComm:
    """allgather over a fixed set of other ranks' (stop flag, due) pairs."""

    rank = 0

    def __init__(self, others):
        self.others = others

    def allgather(self, mine):
        return [mine] + self.others


def test_boundary_takes_rank_0s_clock_and_any_ranks_stop():
    c = RunControl(FakeComm([(None, True, None)]), GuardSection(), 0.0, checkpoint_minutes=10)
    assert c.boundary() == (None, False)        # rank 1 thinks it is due; only rank 0's clock counts
    c.last_checkpoint -= 601
    assert c.boundary() == (None, True)
    c.checkpointed()
    assert c.boundary() == (None, False)
    c = RunControl(FakeComm([("SIGTERM", False, None)]), GuardSection(), 0.0, checkpoint_minutes=0)
    c.last_checkpoint = time.monotonic() - 1e6
    assert c.boundary() == ("SIGTERM", False)   # 0 minutes: the clock never triggers


class FakeCommRank1:
    """allgather as rank 1 sees it: rank 0's (stop flag, due, trouble) first, then its own."""

    rank = 1

    def __init__(self, rank0):
        self.rank0 = rank0

    def allgather(self, mine):
        return [self.rank0, mine]


def test_a_non_zero_rank_takes_rank_0s_clock_for_the_checkpoint():
    """Clocks disagree: every rank must take rank 0's decision, or ranks would checkpoint (a collective)
    in different rounds and block."""
    c = RunControl(FakeCommRank1((None, True, None)), GuardSection(), 0.0, checkpoint_minutes=10)
    assert c.boundary() == (None, True)         # its own clock says not due (0 of 600 s); rank 0's says due
    c.last_checkpoint -= 601
    c.comm.rank0 = (None, False, None)
    assert c.boundary() == (None, False)        # its own clock says due; rank 0's does not


def test_boundary_agrees_on_a_failed_write_and_a_callback_that_raised():
    """Rank 1 (here the fake's other rank) reported a failed write: this rank raises the same error at
    the boundary. A callback's error is a stop with a checkpoint: the boundary says so and keeps it."""
    c = RunControl(FakeComm([(None, False, WriteError("disk full writing round 3"))]), GuardSection(), 0.0)
    with pytest.raises(WriteError, match="disk full writing round 3") as got:
        c.boundary()
    assert got.value.exit_code == 74
    own = CallbackError("callback f raised ValueError: x", "f")
    c = RunControl(FakeComm([(None, False, None)]), GuardSection(), 0.0)
    c.report(own)
    c.report(CallbackError("a second one", "g"))      # only the first is kept
    assert c.boundary() == ("a callback", False) and c.trouble is own
    c = RunControl(FakeComm([("SIGUSR1", False, CallbackError("callback f raised", "f"))]), GuardSection(), 0.0)
    assert c.boundary() == ("SIGUSR1", False) and c.trouble.callback == "f"


# ---- planted links and files, the lock before planning, a checkpoint of another job ---------------------

@pytest.fixture
def victim(tmp_path):
    v = tmp_path / "victim.txt"
    v.write_text("precious")
    return v


def _locked_elsewhere(out) -> bool:
    """Whether another process fails to take the lock on ``out`` (it is held here)."""
    import subprocess
    import sys
    code = f"from hpcfl.io import rundir\ntry:\n    rundir.lock(__import__('pathlib').Path({str(out)!r}))\n" \
           f"    print('got it')\nexcept Exception as e:\n    print(e)"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    return "in use by another hpcfl run" in p.stdout


@pytest.mark.parametrize("plant", ["symlink", "fifo", "hardlink", "dangling"])
def test_the_lock_file_is_never_a_link_or_a_special_file(tmp_path, victim, plant):
    out = tmp_path / "out"
    out.mkdir()
    lock = out / rundir.LOCK
    if plant == "symlink":
        lock.symlink_to(victim)
    elif plant == "dangling":
        lock.symlink_to(tmp_path / "would-be-created")
    elif plant == "fifo":
        os.mkfifo(lock)
    else:
        os.link(victim, lock)
    with pytest.raises(HpcflError, match=rf"{lock} is (a symbolic link|not a regular file|a hard link)"):
        rundir.lock(out)
    assert victim.read_text() == "precious" and not (tmp_path / "would-be-created").exists()
    assert not rundir.holding()


def test_the_lock_is_taken_on_a_new_out_and_abandon_removes_it(tmp_path):
    """The lock used to be taken only when --out already existed at planning time: two runs started at
    once into a new --out both planned a fresh start, and one truncated the other's finished results."""
    out = tmp_path / "new" / "deeper"
    rundir.lock(out)
    try:
        assert out.is_dir() and rundir.holding()
        assert _locked_elsewhere(out)                          # a second run is refused while we plan
    finally:
        rundir.abandon()                                       # the run did not start: nothing is left
    assert not (tmp_path / "new").exists() and not rundir.holding()
    (tmp_path / "kept").mkdir()                                # a folder the lock did not create stays
    rundir.lock(tmp_path / "kept")
    rundir.abandon()
    assert (tmp_path / "kept").is_dir()


def test_the_marker_is_written_through_a_fresh_name(tmp_path, victim):
    d = tmp_path / "ck"
    d.mkdir()
    (d / f"{rundir.MARKER}.tmp").symlink_to(victim)            # the temporary name it used to write through
    rundir.claim(d, "id-a", tmp_path / "results.h5")
    assert victim.read_text() == "precious" and rundir.read_marker(d)["run_id"] == "id-a"
    (d / rundir.MARKER).unlink()
    os.mkfifo(d / rundir.MARKER)                               # a FIFO as the marker: refused, not waited on
    with pytest.raises(HpcflError, match="cannot be read"):
        rundir.read_marker(d)


def test_existing_results_refuses_links_and_foreign_files(tmp_path, victim):
    path = tmp_path / "results.h5"
    assert rundir.existing_results(path) is None
    path.symlink_to(victim)
    with pytest.raises(HpcflError, match="symbolic link .*pass --force"):
        rundir.existing_results(path)
    path.unlink()
    path.write_text("precious")
    with pytest.raises(HpcflError, match=r"not an HDF5 file \(no HDF5 signature\); hpcfl does not overwrite it"):
        rundir.existing_results(path)
    path.unlink()
    import h5py
    with h5py.File(path, "w") as f:                            # HDF5, but no job in it
        f["metrics/round"] = [1, 2]
    with pytest.raises(HpcflError, match="no config attribute, so it is not an hpcfl results file"):
        rundir.existing_results(path)


def test_a_checkpoint_of_another_job_is_never_resumed_from(tmp_path):
    from types import SimpleNamespace

    from hpcfl import config
    from hpcfl.engine import resume

    job = tmp_path / "job.toml"
    job.write_text("[run]\nseed = 1\nrounds = 4\n[data]\ndataset = \"digits\"\n[model]\nname = \"mlp\"\n")
    cfg = config.load(job)

    def ckpt(c, digest=None):
        return SimpleNamespace(meta={"config": c.to_json()}, path=tmp_path / "ckpt-00000002.h5",
                               manifest={"config_sha256": digest or c.digest()})

    resume.check_job(ckpt(cfg), cfg)                                              # its own
    resume.check_job(ckpt(config.load(job, ["run.rounds=9"])), cfg)               # a safe change
    with pytest.raises(HpcflError, match=r"written by a different job \(it differs in run.seed\)"):
        resume.check_job(ckpt(config.load(job, ["run.seed=2"])), cfg)
    with pytest.raises(HpcflError, match="config and config_sha256 differ"):
        resume.check_job(ckpt(config.load(job, ["run.seed=2"]), digest=cfg.digest()), cfg)  # job edited in


def test_the_update_guard_lets_a_norm_of_exactly_max_norm_through():
    """guard.max_norm bounds the norm: an update of norm exactly max_norm is within the bound."""
    import numpy as np

    c = RunControl(FakeComm([]), GuardSection(max_norm=2.0), 0.0)
    assert c.check_update(3, 0, 2.0) is None
    assert c.check_update(3, 0, float(np.nextafter(2.0, 3.0))) == \
        "client 3 in round 1: update norm 2 exceeds guard.max_norm = 2"
    assert c.check_update(3, 4, float("nan")) == "client 3 in round 5: its update holds NaN or Inf"
    assert RunControl(FakeComm([]), GuardSection(max_norm=0.0), 0.0).check_update(3, 0, 1e300) is None   # 0: no bound
