"""The requeue rule, the USR1 forwarding and the second launch after a PMI misread of
slurm/hpcfl_srun.sh, which every template sources, run without Slurm through each template
(stand-ins from tests/e2e/test_slurm.py): 75 requeues within MAX_REQUEUES, anything else does
not, USR1 to the batch shell reaches the program, a launch whose ranks never started because
Slurm's pmi2 plugin misread a line is started again (at most HPCFL_LAUNCH_RETRIES times)."""

import os
import re
import resource
import shutil
import signal
import subprocess
import time

import pytest

from test_slurm import SLURM, TEMPLATES, Stand


@pytest.fixture
def stand(tmp_path):
    return Stand(tmp_path)


# ---- requeue ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", TEMPLATES)
def test_requeue_on_75(stand, name):
    p = stand.run(name, STANDIN_EXIT=75, SLURM_RESTART_COUNT=0)
    assert stand.argv("scontrol") == ["requeue", "12345"]
    assert p.returncode == 75, p.output


@pytest.mark.parametrize("name", TEMPLATES)
def test_requeue_without_restart_count_counts_as_first_attempt(stand, name):
    p = stand.run(name, STANDIN_EXIT=75, SLURM_RESTART_COUNT=None)
    assert stand.argv("scontrol") == ["requeue", "12345"]
    assert p.returncode == 75


@pytest.mark.parametrize("name", TEMPLATES)
def test_no_requeue_when_finished(stand, name):
    p = stand.run(name, STANDIN_EXIT=0, SLURM_RESTART_COUNT=0)
    assert p.returncode == 0, p.output
    assert stand.argv("scontrol") is None


@pytest.mark.parametrize("code", [2, 1, 137])
@pytest.mark.parametrize("name", TEMPLATES)
def test_no_requeue_on_bad_input_or_failure(stand, name, code):
    p = stand.run(name, STANDIN_EXIT=code, SLURM_RESTART_COUNT=0)
    assert p.returncode == code, p.output
    assert stand.argv("scontrol") is None


@pytest.mark.parametrize("name", TEMPLATES)
def test_a_stall_ended_by_the_watchdog_requeues(stand, name):
    """Under srun the watchdog's exit 75 reads 137 (MPI_Abort: srun kills every task); the note it
    leaves where the launcher said, naming this launch, makes it a requeue."""
    out = stand.dir / "out"
    out.mkdir()                           # made by the run before its first round
    p = stand.run(name, STANDIN_MODE="stall", SLURM_RESTART_COUNT=0, OUT=out)
    assert p.returncode == 75, p.output
    assert stand.argv("scontrol") == ["requeue", "12345"]
    assert "rank 1 stalled in phase train of round 7" in p.output


@pytest.mark.parametrize("code", [0, 2])
@pytest.mark.parametrize("name", TEMPLATES)
def test_a_stall_note_never_turns_a_finish_or_bad_input_into_a_requeue(stand, name, code):
    """This launch's own note (a watchdog that fired as the run ended), but the job's exit code is 0
    (finished) or 2 (bad input: the same command would fail the same way): that exit code stands."""
    out = stand.dir / "out"
    out.mkdir()
    p = stand.run(name, STANDIN_MODE="stall", STANDIN_EXIT=code, SLURM_RESTART_COUNT=0, OUT=out)
    assert p.returncode == code, p.output
    assert stand.argv("scontrol") is None and "after the watchdog ended a stalled run" not in p.output


@pytest.mark.parametrize("code", [1, 137])
@pytest.mark.parametrize("where", [".hpcfl-stalled", "checkpoints/.hpcfl-stalled", "replaced-1/.hpcfl-stalled",
                                   "fedavg_seed-0/.hpcfl-stalled"])
def test_a_stale_or_planted_note_never_turns_a_crash_into_a_requeue(stand, where, code):
    """A note this launch did not write: an earlier attempt's (the right words, another token),
    or one in a subfolder. The crash stays a crash, and a note at $OUT's top is removed."""
    out = stand.dir / "out"
    note = out / where
    note.parent.mkdir(parents=True)
    note.write_text("hpcfl-stalled attempt=12345.0.0.99.1 run=r1\nrank 1 stalled in phase train of round 7\n")
    p = stand.run("requeue", STANDIN_EXIT=code, SLURM_RESTART_COUNT=0, OUT=out)
    assert p.returncode == code, p.output
    assert stand.argv("scontrol") is None and "stalled" not in p.output
    assert note.exists() == (where != ".hpcfl-stalled")


@pytest.mark.parametrize("mode", ["empty_note", "fifo_note", "foreign_note", "link_note"])
def test_a_note_left_during_the_run_that_is_not_this_launchs_is_no_stall(stand, mode):
    """Written while the job ran, so not removed at its start: an empty file, a FIFO (reading it would
    block the batch script for ever), another launch's note, or a link (to a note with the right words:
    a link is never followed). The 137 stays a crash."""
    out = stand.dir / "out"
    out.mkdir()
    p = stand.run("requeue", STANDIN_MODE=mode, SLURM_RESTART_COUNT=0, OUT=out)
    assert p.returncode == 137, p.output
    assert stand.argv("scontrol") is None and "after the watchdog ended a stalled run" not in p.output


def test_a_note_that_is_a_link_is_neither_followed_nor_printed(stand):
    out = stand.dir / "out"
    out.mkdir()
    secret = stand.dir / "secret"
    secret.write_text("hpcfl-stalled attempt=x run=r\nTOP SECRET\n")
    (out / ".hpcfl-stalled").symlink_to(secret)
    p = stand.run("requeue", STANDIN_EXIT=137, SLURM_RESTART_COUNT=0, OUT=out)
    assert p.returncode == 137 and "TOP SECRET" not in p.output
    assert not (out / ".hpcfl-stalled").is_symlink() and secret.read_text().endswith("TOP SECRET\n")


@pytest.mark.parametrize("name, value, launches", [("HPCFL_LAUNCH_RETRIES", "100", 101),
                                                   ("HPCFL_LAUNCH_RETRIES", "000003", 4),
                                                   ("MAX_REQUEUES", "10000", 1)])
def test_counts_at_their_bounds_and_six_digits_are_taken(stand, name, value, launches):
    """The upper bounds are inclusive, and a count is read as the number its (at most 6) digits make."""
    p = stand.run("requeue", STANDIN_PMI_MISREAD=launches - 1, SLURM_RESTART_COUNT=0, **{name: value})
    assert p.returncode == 0 and calls(stand) == launches, p.output


@pytest.mark.parametrize("name,value", [("HPCFL_LAUNCH_RETRIES", "abc"), ("HPCFL_LAUNCH_RETRIES", "0000003"), ("HPCFL_LAUNCH_RETRIES", "2.5"),
                                        ("HPCFL_LAUNCH_RETRIES", "-1"), ("HPCFL_LAUNCH_RETRIES", "101"),
                                        ("MAX_REQUEUES", "five"), ("MAX_REQUEUES", "1e3")])
def test_counts_that_are_not_whole_numbers_in_range_are_exit_2(stand, name, value):
    p = stand.run("requeue", STANDIN_PMI_MISREAD=1000, SLURM_RESTART_COUNT=0, **{name: value})
    assert p.returncode == 2, p.output
    assert f"hpcfl: {name}={value} is not a whole number from 0 to" in p.output
    assert stand.argv("srun") is None      # nothing was launched


@pytest.mark.parametrize("name", TEMPLATES)
def test_cap_reached(stand, name):
    p = stand.run(name, STANDIN_EXIT=75, SLURM_RESTART_COUNT=5)
    assert p.returncode == 75
    assert stand.argv("scontrol") is None
    assert "NOT FINISHED after 5 requeue(s) (MAX_REQUEUES=5)" in p.output


@pytest.mark.parametrize("name", TEMPLATES)
def test_cap_from_environment(stand, name):
    p = stand.run(name, STANDIN_EXIT=75, SLURM_RESTART_COUNT=1, MAX_REQUEUES=2)
    assert stand.argv("scontrol") == ["requeue", "12345"]
    (stand.dir / "scontrol.argv").unlink()
    p = stand.run(name, STANDIN_EXIT=75, SLURM_RESTART_COUNT=2, MAX_REQUEUES=2)
    assert p.returncode == 75 and stand.argv("scontrol") is None
    assert "MAX_REQUEUES=2" in p.output


@pytest.mark.parametrize("name", TEMPLATES)
def test_requeue_command_failing_is_reported(stand, name):
    p = stand.run(name, STANDIN_EXIT=75, STANDIN_SCONTROL_RC=1)
    assert stand.argv("scontrol") == ["requeue", "12345"]
    assert p.returncode == 75
    assert "scontrol requeue failed" in p.output


def usr1_once(stand, name, marker, never, **extra):
    """(exit code, output) of template ``name`` sent USR1 once ``marker`` appears in the stand's folder;
    ``never``: the failure if it does not within 10 s."""
    proc = subprocess.Popen(["bash", str(SLURM / f"{name}.sbatch")], cwd=stand.dir, env=stand.environ(**extra),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 10
        while not (stand.dir / marker).exists():
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, never
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGUSR1)  # the batch shell, as Slurm does with B:
        out, _ = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, out


@pytest.mark.parametrize("stop_delay", [0, 0.5])
@pytest.mark.parametrize("name", TEMPLATES)
def test_usr1_is_forwarded_and_the_job_requeued(stand, name, stop_delay):
    """sbatch --signal=B:USR1 signals only the batch shell: it must reach the program, and the
    75 that follows must requeue. stop_delay: the program takes a while to checkpoint."""
    code, out = usr1_once(stand, name, "ready", "stand-in program never started",
                          STANDIN_MODE="wait_usr1", STANDIN_STOP_DELAY=stop_delay, SLURM_RESTART_COUNT=0)
    assert (stand.dir / "got_usr1").exists(), out
    assert code == 75, out
    assert stand.argv("scontrol") == ["requeue", "12345"]
    assert "got USR1" in out


def test_usr1_after_srun_ended_goes_to_no_process(stand):
    """srun has ended and the launcher still waits for tee (here: 3 s after its input closed): a USR1
    then is noted (the run is stopping) but sent nowhere. The ended srun's number is forgotten, so
    it is never signalled (it may belong to another process by then)."""
    tee = stand.dir / "bin" / "tee"
    tee.write_text(f'#!/bin/bash\n{shutil.which("tee")} "$@"\ntouch "{stand.dir}/tee_drained"\nsleep 3\n')
    tee.chmod(0o755)
    code, out = usr1_once(stand, "cpu_only", "tee_drained", "srun's stderr never closed",
                          STANDIN_EXIT=0, SLURM_RESTART_COUNT=0)
    assert "got USR1" in out and "No such process" not in out and "kill:" not in out, out
    assert code == 0 and "hpcfl: finished" in out, out
    assert calls(stand) == 1


# ---- a launch that failed in Slurm's pmi2 plugin ---------------------------------------------

def calls(stand):
    return int((stand.dir / "srun.calls").read_text())


@pytest.mark.parametrize("name", TEMPLATES)
def test_a_pmi_misread_launches_again_and_the_job_finishes(stand, name):
    p = stand.run(name, STANDIN_PMI_MISREAD=1, STANDIN_EXIT=0, SLURM_RESTART_COUNT=0)
    assert p.returncode == 0, p.output
    assert calls(stand) == 2 and stand.argv("hpcfl") is not None
    assert "launching again (1 of at most 2, HPCFL_LAUNCH_RETRIES)" in p.stderr
    # srun's own lines still reach the job's log, as they came
    assert "mpi/pmi2: invalid client request" in p.stderr
    assert "hpcfl: finished" in p.stdout and stand.argv("scontrol") is None


def netmods(stand):
    return (stand.dir / "srun.netmod").read_text().splitlines()


@pytest.mark.parametrize("name", TEMPLATES)
def test_a_launch_after_a_misread_uses_mpichs_ofi_netmod(stand, name):
    """The same job misreads again and again (the bytes after the UCX address go out too): the next
    launch asks MPICH for its OFI netmod, whose address fits one PMI line, and says so."""
    p = stand.run(name, STANDIN_PMI_MISREAD=1, STANDIN_EXIT=0, SLURM_RESTART_COUNT=0)
    assert p.returncode == 0, p.output
    assert netmods(stand) == ["", "ofi"]
    assert "the next launch uses MPICH's OFI netmod (MPIR_CVAR_CH4_NETMOD=ofi)" in p.stderr


@pytest.mark.parametrize("name", TEMPLATES)
def test_a_launch_hung_after_a_misread_is_ended_and_started_again(stand, name):
    """A lost line can leave the ranks waiting in MPI_Init for ever (seen in CI: no rank ended, so
    srun's --wait never counted): the launcher ends that srun with TERM a few seconds after the
    misread and launches again, on the OFI netmod."""
    t0 = time.monotonic()
    p = stand.run(name, STANDIN_PMI_MISREAD=1, STANDIN_PMI_HANG=1, STANDIN_EXIT=0, SLURM_RESTART_COUNT=0)
    took = time.monotonic() - t0
    assert p.returncode == 0, p.output
    assert (stand.dir / "srun.signals").read_text() == "TERM\n"
    assert calls(stand) == 2 and netmods(stand) == ["", "ofi"]
    assert "the ranks are waiting in MPI_Init for what it lost; ending this launch" in p.stderr
    assert "launching again (1 of at most 2, HPCFL_LAUNCH_RETRIES)" in p.stderr
    assert "hpcfl: finished" in p.stdout
    assert 5 <= took < 20, took      # 5 s for the ranks to abort by themselves, not the stand-in's 30


def test_a_launch_after_a_misread_is_not_ended_for_the_last_launchs_lines(stand):
    """Seen in CI: the second launch, on OFI, was ended as a misread 5 s in, for the first launch's
    lines still in the kept stderr (tee empties it only once it has started). Here tee starts 1 s
    late and the second launch runs 7 s: it must finish, not be ended."""
    tee = stand.dir / "bin" / "tee"
    tee.write_text(f'#!/bin/bash\nsleep 1\nexec {shutil.which("tee")} "$@"\n')
    tee.chmod(0o755)
    p = stand.run("cpu_only", STANDIN_PMI_MISREAD=1, STANDIN_EXIT=0, STANDIN_RUN_S=7, SLURM_RESTART_COUNT=0)
    assert p.returncode == 0, p.output
    assert calls(stand) == 2 and netmods(stand) == ["", "ofi"]
    assert "ending this launch" not in p.stderr and not (stand.dir / "srun.signals").exists()
    assert "hpcfl: finished" in p.stdout


def test_an_srun_that_ignores_term_after_a_misread_is_killed_20_s_later(stand):
    """srun does not end on TERM (it waits on tasks that do not answer): KILL follows 20 s later,
    not the stand-in's 30 s of waiting, and the next launch runs."""
    t0 = time.monotonic()
    p = stand.run("cpu_only", STANDIN_PMI_MISREAD=1, STANDIN_PMI_HANG=1, STANDIN_PMI_STUBBORN=1, STANDIN_EXIT=0,
                  SLURM_RESTART_COUNT=0, timeout=60)
    took = time.monotonic() - t0
    assert p.returncode == 0 and calls(stand) == 2, p.output
    assert (stand.dir / "srun.signals").read_text() == "TERM\n"
    assert 24 <= took < 29, took


def test_a_netmod_the_user_chose_is_kept_on_the_next_launch(stand):
    p = stand.run("cpu_only", STANDIN_PMI_MISREAD=1, STANDIN_EXIT=0, SLURM_RESTART_COUNT=0,
                  MPIR_CVAR_CH4_NETMOD="ucx")
    assert p.returncode == 0, p.output
    assert netmods(stand) == ["ucx", "ucx"] and "OFI netmod" not in p.stderr


@pytest.mark.parametrize("retries, launches", [(None, 3), ("0", 1), ("4", 5)])
def test_pmi_misreads_are_launched_again_at_most_the_retries(stand, retries, launches):
    p = stand.run("cpu_only", STANDIN_PMI_MISREAD=10, SLURM_RESTART_COUNT=0, HPCFL_LAUNCH_RETRIES=retries)
    assert p.returncode == 16, p.output
    assert calls(stand) == launches
    assert p.stderr.count("launching again") == launches - 1
    assert "exit code 16, not requeueing" in p.stderr and stand.argv("scontrol") is None


@pytest.mark.parametrize("code", [1, 2, 75, 137])
def test_other_failures_are_not_launched_again(stand, code):
    """Only the pmi2 misread is started again: a failure, bad input (2) or a stop (75) is not."""
    p = stand.run("cpu_only", STANDIN_EXIT=code, SLURM_RESTART_COUNT=0)
    assert p.returncode == code and calls(stand) == 1, p.output
    assert "launching again" not in p.output


def test_a_failure_that_prints_is_not_taken_for_a_misread(stand):
    """A failed run prints (a traceback, an error): only srun's pmi2 lines make a launch start
    again, not any line on stderr."""
    p = stand.run("cpu_only", STANDIN_EXIT=1, STANDIN_STDERR="RuntimeError: rank 0 lost its GPU",
                  SLURM_RESTART_COUNT=0)
    assert p.returncode == 1 and calls(stand) == 1, p.output
    assert "RuntimeError: rank 0 lost its GPU" in p.stderr and "launching again" not in p.output


def test_the_launcher_sleeps_while_srun_runs(stand):
    """The batch shell and its misread watcher wait on srun and sleep between looks instead of
    polling: a 5 s run costs them a few hundredths of a second of CPU (a polling loop burns a core
    of the batch node for the whole job; even sharing a loaded core it takes well over 0.3 s)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = stand.run("cpu_only", STANDIN_EXIT=0, STANDIN_RUN_S=5, SLURM_RESTART_COUNT=0)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert p.returncode == 0, p.output
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert cpu < 0.3, f"{cpu:.2f} s of CPU for a 5 s run"


@pytest.mark.parametrize("code", [0, 2, 75])
def test_a_run_that_ended_by_itself_is_not_launched_again_whatever_srun_printed(stand, code):
    """pmi2's complaint on stderr, but the run finished (0), refused its input (2) or stopped with a
    checkpoint (75): its own exit code stands, with no second launch."""
    p = stand.run("requeue", STANDIN_PMI_NOISE=1, STANDIN_EXIT=code, SLURM_RESTART_COUNT=0)
    assert p.returncode == code and calls(stand) == 1, p.output
    assert "launching again" not in p.output


def test_each_launch_has_its_own_attempt_token(stand):
    """HPCFL_ATTEMPT = job.requeues.launch.pid.random, the launch counted from 0: a stall note names
    the launch that wrote it."""
    p = stand.run("cpu_only", STANDIN_PMI_MISREAD=1, STANDIN_EXIT=0, SLURM_RESTART_COUNT=3)
    assert p.returncode == 0, p.output
    first, second = (stand.dir / "srun.attempts").read_text().splitlines()
    assert re.fullmatch(r"12345\.3\.0\.\d+\.\d+", first) and re.fullmatch(r"12345\.3\.1\.\d+\.\d+", second)
    assert first.split(".")[3] == second.split(".")[3]          # the same batch shell


def test_the_kept_srun_stderr_is_removed_at_the_end(stand):
    tmp = stand.dir / "tmp"
    tmp.mkdir()
    p = stand.run("cpu_only", STANDIN_PMI_MISREAD=1, STANDIN_EXIT=0, SLURM_RESTART_COUNT=0, TMPDIR=tmp)
    assert p.returncode == 0 and calls(stand) == 2, p.output
    assert list(tmp.iterdir()) == []


def test_a_stop_with_a_note_is_a_plain_stop(stand):
    """Exit 75 is the run's own checkpointed stop: requeued as such, not reported as a stall."""
    out = stand.dir / "out"
    out.mkdir()
    p = stand.run("requeue", STANDIN_MODE="stall", STANDIN_EXIT=75, SLURM_RESTART_COUNT=0, OUT=out)
    assert p.returncode == 75 and stand.argv("scontrol") == ["requeue", "12345"], p.output
    assert "after the watchdog ended a stalled run" not in p.output


def test_a_long_stall_note_is_cut_to_300_bytes(stand):
    out = stand.dir / "out"
    out.mkdir()
    p = stand.run("requeue", STANDIN_MODE="stall", SLURM_RESTART_COUNT=0, OUT=out,
                  STANDIN_STALL_TEXT="x" * 400)
    assert p.returncode == 75, p.output
    line = next(ln for ln in p.stdout.splitlines() if "after the watchdog ended a stalled run" in ln)
    assert line.endswith(": " + "x" * 300)


@pytest.mark.parametrize("name, value, example", [("MAX_REQUEUES", "10001", "5"), ("HPCFL_LAUNCH_RETRIES", "101", "2")])
def test_a_count_out_of_range_is_told_its_range_and_an_example(stand, name, value, example):
    p = stand.run("requeue", SLURM_RESTART_COUNT=0, **{name: value})
    top = "10000" if name == "MAX_REQUEUES" else "100"
    assert p.returncode == 2 and (f"hpcfl: {name}={value} is not a whole number from 0 to {top}; set it to one "
                                  f"(e.g. {name}={example}) or unset it") in p.stderr, p.output


def test_no_requeues_at_all_is_a_count(stand):
    p = stand.run("requeue", STANDIN_EXIT=75, SLURM_RESTART_COUNT=0, MAX_REQUEUES=0)
    assert p.returncode == 75 and stand.argv("scontrol") is None
    assert "NOT FINISHED after 0 requeue(s) (MAX_REQUEUES=0)" in p.output
