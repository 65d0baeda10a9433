"""hpcfl run, report and sweep against a hostile or broken environment: links planted in --out, two
runs started at once, foreign and damaged results files, a full disk, Ctrl-C during start-up.
Nothing written is lost, nothing outside --out is touched, nothing hangs, every refusal names the file."""

import os
import shutil
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import pytest

from hpcfl import config
from hpcfl.engine import planning
from hpcfl.io import rundir
from hpcfl.results import load

from clirun import ROOT, assert_same_run, digits_job, hpcfl, kill_group, reference_run, start

JOB = digits_job("hostile", 4, 3, '[checkpoint]\nevery = 1\n')
PARTIAL = (".results.h5.new-tmp", ".results.h5.resume-tmp")


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 3-round run (checkpoints after rounds 1, 2, 3); tests copy it, never change it."""
    return reference_run(tmp_path_factory, JOB, "hostile")


@pytest.fixture
def victim(tmp_path):
    v = tmp_path / "victim.txt"
    v.write_text("precious")
    return v


def job(tmp_path, text=JOB):
    (tmp_path / "job.toml").write_text(text)
    return str(tmp_path / "job.toml")


def copy_run(finished, tmp_path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(finished / "out", out)
    marker = rundir.read_marker(out / "checkpoints")
    rundir.claim(out / "checkpoints", marker["run_id"], out / "results.h5")   # this copy is now its own run
    return out


# ---- planted links -----------------------------------------------------------------------------

def test_a_planted_lock_link_is_refused_and_its_target_kept(tmp_path, victim):
    """`ln -s ../v.txt s/.hpcfl-lock; hpcfl run ... --out s` exited 0 and v.txt was gone."""
    out = tmp_path / "s"
    out.mkdir()
    (out / rundir.LOCK).symlink_to(victim)
    p = hpcfl("run", job(tmp_path), "--out", str(out))
    assert p.returncode == 2 and f"{out / rundir.LOCK} is a symbolic link" in p.stderr, p.stderr
    assert victim.read_text() == "precious" and sorted(x.name for x in out.iterdir()) == [rundir.LOCK]


def test_links_planted_at_every_temporary_name_are_never_followed(tmp_path, finished, victim):
    """The resume rebuild, the final copy, a new file and the marker all went through fixed names."""
    out = copy_run(finished, tmp_path)
    for name in (*PARTIAL, "checkpoints/.hpcfl-run.tmp"):
        (out / name).symlink_to(victim)
    p = hpcfl("run", job(tmp_path), "--out", str(out), "--set", "run.rounds=5", "--allow-change", "run.rounds")
    assert p.returncode == 0 and "resuming from ckpt-00000003.h5" in p.stdout, p.stderr
    assert victim.read_text() == "precious"
    assert load(out).metrics["round"].tolist() == [1, 2, 3, 4, 5] and load(out).attrs["status"] == "finished"
    assert not (out / ".results.h5.resume-tmp").is_symlink() and not (out / "results.h5.final").is_symlink()
    p = hpcfl("run", job(tmp_path), "--out", str(out), "--force")      # a fresh start: a new results.h5
    assert p.returncode == 0, p.stderr
    assert victim.read_text() == "precious" and not (out / ".results.h5.new-tmp").is_symlink()
    assert_same_run(finished / "out", out)


def test_a_results_link_or_a_foreign_file_is_never_overwritten_without_force(tmp_path, victim):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.h5").symlink_to(victim)
    p = hpcfl("run", job(tmp_path), "--out", str(out))
    assert p.returncode == 2 and "results.h5 is a symbolic link" in p.stderr and "--force" in p.stderr
    (out / "results.h5").unlink()
    (out / "results.h5").write_text("precious notes")       # treated as "unreadable" and overwritten before
    p = hpcfl("run", job(tmp_path), "--out", str(out))
    assert p.returncode == 2 and "is not an HDF5 file" in p.stderr and "does not overwrite it" in p.stderr
    assert (out / "results.h5").read_text() == "precious notes" and victim.read_text() == "precious"


def test_results_without_a_job_do_not_let_another_job_resume(tmp_path, finished):
    """A results.h5 without a config attribute let a different job resume from its checkpoint."""
    out = copy_run(finished, tmp_path)
    with h5py.File(out / "results.h5", "r+") as f:
        del f.attrs["config"]
    before = (out / "results.h5").read_bytes()
    p = hpcfl("run", job(tmp_path), "--out", str(out), "--set", "run.seed=5")
    assert p.returncode == 2 and "no config attribute, so it is not an hpcfl results file" in p.stderr, p.stderr
    assert (out / "results.h5").read_bytes() == before


# ---- two runs at once ----------------------------------------------------------------------------

def test_a_run_planning_into_a_new_out_holds_it(tmp_path):
    """The lock was taken only when --out existed at planning time: two jobs started at once into one
    new --out both planned a fresh start and the second truncated the first's finished results. Here
    one run is planning (in this process, holding the lock it took on the new --out) when another starts."""
    out = tmp_path / "new"
    cfg = config.load(job(tmp_path))
    plan = planning.plan_run(cfg, out, force=False)
    try:
        assert plan.mode == "fresh" and rundir.holding()
        p = hpcfl("run", job(tmp_path), "--out", str(out), "--set", "run.seed=9")
        assert p.returncode == 2 and f"{out} is in use by another hpcfl run (pid {os.getpid()}" in p.stderr
        assert not (out / "results.h5").exists()
    finally:
        rundir.abandon()
    assert not out.exists()   # the planning run did not start: it leaves nothing behind


# ---- damaged results files -----------------------------------------------------------------------

def test_a_truncated_results_file_stops_the_resume_naming_it(tmp_path, finished):
    out = copy_run(finished, tmp_path)
    data = (out / "results.h5").read_bytes()
    (out / "results.h5").write_bytes(data[: len(data) // 100])
    p = hpcfl("run", job(tmp_path), "--out", str(out), "--set", "run.rounds=5", "--allow-change", "run.rounds",
              timeout=120)
    assert p.returncode == 2 and f"{out / 'results.h5'} is truncated" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and len((out / "results.h5").read_bytes()) == len(data) // 100


def test_report_skips_damaged_runs_naming_each(tmp_path, finished):
    runs = tmp_path / "runs"
    shutil.copytree(finished / "out", runs / "good")
    (runs / "text").mkdir()
    (runs / "text" / "results.h5").write_text("not a results file")
    (runs / "cut").mkdir()
    data = (finished / "out" / "results.h5").read_bytes()
    (runs / "cut" / "results.h5").write_bytes(data[: len(data) // 100])
    p = hpcfl("report", str(runs), timeout=120)
    assert p.returncode == 0, p.stderr
    assert "1  " in p.stdout.splitlines()[2]                                  # one run in the table
    assert f"skipped {runs / 'cut' / 'results.h5'}" in p.stderr and "truncated" in p.stderr
    assert f"skipped {runs / 'text' / 'results.h5'}" in p.stderr and "not an HDF5 file" in p.stderr
    p = hpcfl("report", str(runs / "cut"))
    assert p.returncode == 2 and "no run could be read" in p.stderr



def test_a_run_whose_file_gives_a_read_error_is_skipped_and_the_others_reported(tmp_path, finished):
    """A results.h5 linked to /proc/self/mem gave OSError EIO from os.pread in the superblock
    check: report and plot exited 1 with a traceback and the good run beside it was not reported
    (issue 37.4). Any read error of one run is now that run's problem."""
    runs = tmp_path / "runs"
    shutil.copytree(finished / "out", runs / "good")
    (runs / "eio").mkdir()
    (runs / "eio" / "results.h5").symlink_to("/proc/self/mem")    # a regular file whose reads fail (EIO)
    p = hpcfl("report", str(runs), timeout=120)
    assert p.returncode == 0, p.stderr
    assert "1  " in p.stdout.splitlines()[2]                                  # the good run, in the table
    assert "skipped" in p.stderr and "mem" in p.stderr and "Input/output error" in p.stderr
    assert "Traceback" not in p.stderr
    p = hpcfl("plot", str(runs), "--out", str(tmp_path / "curves.png"), timeout=120)
    assert p.returncode == 0 and (tmp_path / "curves.png").stat().st_size > 0, p.stderr
    assert "Input/output error" in p.stderr and "Traceback" not in p.stderr
    p = hpcfl("report", str(runs / "eio"))                                   # alone: nothing to report
    assert p.returncode == 2 and "no run could be read" in p.stderr and "Input/output error" in p.stderr


# ---- a full disk ---------------------------------------------------------------------------------

LIMITED = """
import resource, sys
from mpi4py import MPI   # MPI's shared-memory files first: the limit is for hpcfl's own writes
resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
from hpcfl.cli import finish, main
finish(main({argv!r}), {argv!r})   # as the hpcfl command ends
"""


def run_limited(limit: int, *argv):
    """hpcfl in a process whose files cannot grow past ``limit`` bytes: writes fail as on a full disk
    (EFBIG for ENOSPC), on any machine, without root."""
    code = LIMITED.format(limit=limit, argv=list(argv))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)


def assert_no_partial_files(out: Path):
    left = [p.name for p in out.rglob("*") if p.name in PARTIAL or ".tmp" in p.name]
    assert not left, left


def test_a_full_disk_exits_74_with_one_message_and_the_rerun_finishes_bitwise(tmp_path, finished):
    """A full disk gave HDF5 tracebacks or a segfault (139) and left partial copies behind."""
    out = tmp_path / "out"
    p = run_limited(100_000, "run", job(tmp_path), "--out", str(out))   # round 1 cannot be appended
    assert p.returncode == 74, (p.returncode, p.stderr[-2000:])
    assert "is full" in p.stderr and "resume from the last checkpoint" in p.stderr
    # the rounds are written in batches (results.flush_seconds): the first batch, from round 1, fails
    assert re.search(r"rounds? 1\b", p.stderr), p.stderr
    assert "Traceback" not in p.stderr and p.stderr.count("hpcfl: ") == 1, p.stderr
    assert_no_partial_files(out)
    q = hpcfl("run", job(tmp_path), "--out", str(out))
    assert q.returncode == 0, q.stderr
    assert "resuming from ckpt" not in q.stdout
    assert_same_run(finished / "out", out)


def test_the_end_of_a_run_needs_no_room_beyond_the_file(tmp_path, finished):
    """The final records are created with the file and filled in place (docs/results.md, "At the
    end"): a run whose files cannot grow past the finished results.h5's size still ends, bitwise,
    where the end used to need a whole second copy."""
    size = (finished / "out" / "results.h5").stat().st_size
    out = tmp_path / "out"
    p = run_limited(size, "run", job(tmp_path), "--out", str(out))
    assert p.returncode == 0, (p.returncode, p.stderr[-2000:])
    assert (out / "results.h5").stat().st_size <= size
    assert_no_partial_files(out)
    assert_same_run(finished / "out", out)


def _tmpfs(path: Path, size: str) -> bool:
    path.mkdir()
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def test_a_small_full_filesystem(tmp_path, finished):
    """The same on a real filesystem that fills up (a 4 MB tmpfs; needs root and mount rights: skipped
    elsewhere): with room for the run's files and 200 kB, not for a second copy of results.h5 (what
    the end of a run took before it wrote in place), the run ends and nothing partial is left; full
    to the last 64 kB, the next run is refused up front with the space it needs."""
    mnt = tmp_path / "mnt"
    if not _tmpfs(mnt, "4m"):
        pytest.skip("cannot mount a tmpfs here (not root, or no mount rights in this container)")
    try:
        size = sum(f.stat().st_size for f in (finished / "out").rglob("*") if f.is_file())
        filler = mnt / "filler"
        with open(filler, "wb") as f:   # room for the run's files, not for a copy of results.h5
            f.write(b"\0" * (shutil.disk_usage(mnt).free - size - 200_000))
        out = mnt / "out"
        p = hpcfl("run", job(tmp_path), "--out", str(out))
        assert p.returncode == 0, p.stderr
        assert_no_partial_files(out)
        assert_same_run(finished / "out", out)
        with open(mnt / "filler2", "wb") as f:   # now full
            f.write(b"\0" * max(0, shutil.disk_usage(mnt).free - (32 << 10)))
        p = hpcfl("run", job(tmp_path), "--out", str(mnt / "second"))
        assert p.returncode == 74 and "cannot write the new results file" in p.stderr, p.stderr   # not a crash
        assert "checked before writing" in p.stderr and "Traceback" not in p.stderr
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


def test_a_run_on_a_filesystem_with_no_space_left_exits_74_not_2(tmp_path):
    """Full to the last byte, the probe of --out fails before anything is read: that is a full disk
    (74: free space, the same command works), not bad input (2: the templates would not requeue it
    and the message would ask for another directory)."""
    mnt = tmp_path / "mnt"
    if not _tmpfs(mnt, "1m"):
        pytest.skip("cannot mount a tmpfs here (not root, or no mount rights in this container)")
    try:
        with open(mnt / "filler", "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
        p = hpcfl("run", job(tmp_path), "--out", str(mnt / "out"))
        assert p.returncode == 74, (p.returncode, p.stderr)
        assert "is full" in p.stderr and "run the same command again" in p.stderr and "Traceback" not in p.stderr
        assert not (mnt / "out").exists()
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


# ---- values no run can use --------------------------------------------------------------------------

@pytest.mark.parametrize("bad,words", [
    (["--set", "algorithm.lr=1e308"], "algorithm.lr = 1e+308 is too large"),
    (["--set", "run.seed=18446744073709551616"], "run.seed = 18446744073709551616 does not fit a 64-bit integer"),
    (["--set", "algorithm.batch_size=1000000000000"], "algorithm.batch_size = 1000000000000 exceeds the whole "
                                                      "training set"),
    (["--set", "model.mlp.hidden=" + "[" * 50000 + "]" * 50000], "nests arrays too deeply"),
])
def test_values_no_run_can_use_exit_2_before_anything_is_written(tmp_path, bad, words):
    """These gave tracebacks (exit 1); seed = 2**64 after creating results.h5. The batch size is
    checked against the data, after the lock was taken on the new --out: the folder goes again."""
    out = tmp_path / "o"
    p = hpcfl("run", job(tmp_path), "--out", str(out), *bad)
    assert p.returncode == 2 and words in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert not out.exists()


# ---- bad input on two ranks, Ctrl-C --------------------------------------------------------------

def test_a_job_file_that_is_not_utf8_exits_2_on_two_ranks(tmp_path):
    """UnicodeDecodeError, and MPI_Abort on two ranks."""
    path = tmp_path / "latin.toml"
    path.write_bytes(JOB.replace('"hostile"', '"caf\xe9"').encode("latin-1"))
    p = hpcfl("run", str(path), "--out", str(tmp_path / "o"), ranks=2)
    assert p.returncode == 2 and p.stderr.count("is not UTF-8 text") == 1, p.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("ranks", [0, 2])
def test_ctrl_c_during_start_up_is_acknowledged_and_a_second_stops_at_once(tmp_path, ranks):
    """Ctrl-C during start-up was not acknowledged: data generation, the cache write and round 1 ran
    first. Now the first says so at once and the run stops before writing anything (exit 75); a second
    Ctrl-C stops it at once. Ctrl-C signals the whole process group, as a terminal does."""
    out = tmp_path / "o"
    p = start("run", job(tmp_path), "--out", str(out), ranks=ranks)
    time.sleep(1.0)                       # past the handler's installation, before torch is imported
    kill_group(p, signal.SIGINT)
    stdout, stderr = p.communicate(timeout=120)
    assert p.returncode == 75, (p.returncode, stderr)
    assert stderr.count("SIGINT received") == 1 and "press Ctrl-C again to stop at once" in stderr
    assert "stopped during start-up; nothing was written" in stderr
    assert not out.exists()
    if ranks:
        return
    # The second Ctrl-C must meet a start-up still going: set-up is held (the test hook sleeps in it),
    # so the run cannot end first on its own. Measured: an unheld start-up can reach its stop 0.2 s after
    # the first Ctrl-C on a quiet machine, and the second then found the run gone (exit 75).
    stamp = tmp_path / "in_setup"
    p = start("run", job(tmp_path), "--out", str(out),
              env={"HPCFL_FAULT": "0:setup:0:hang", "HPCFL_FAULT_STAMP": str(stamp)})
    deadline = time.monotonic() + 60
    while not stamp.exists():
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.05)
    kill_group(p, signal.SIGINT)
    t = time.time()
    time.sleep(0.2)                       # the blocked start-up's own stop comes 3 s after the first at the soonest
    kill_group(p, signal.SIGINT)
    _, stderr = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGINT and time.time() - t < 2, (p.returncode, stderr)
    assert stderr.count("SIGINT received") == 1 and "press Ctrl-C again to stop at once" in stderr
