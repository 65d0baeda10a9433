"""hpcfl.engine.control beyond test_run_control.py: what each fault kind does (stamp, stderr line,
exit code, signal, endless sleep), how RunControl wires its watchdog (comm, note, memory, header,
remembered rounds from the resumed round on), the wall-clock checkpoint boundary, and which rank's
write error :func:`write_failed` broadcasts."""

import os
import re
import signal
import sys

import pytest

from hpcfl.engine import control
from hpcfl.engine.control import FaultInjector, RunControl, write_failed
from hpcfl.engine.watchdog import Limits
from hpcfl.errors import EXIT_INPUT, EXIT_WRITE, HpcflError, RunError, WriteError
from hpcfl.io import rundir
from hpcfl.io.h5check import BadFile


class Stream:
    """A stand-in for sys.stderr or sys.stdout that records what is written and each flush after it."""

    def __init__(self):
        self.events = []

    def write(self, text):
        self.events.append(("write", text))

    def flush(self):
        self.events.append(("flush",))

    @property
    def text(self):
        return "".join(e[1] for e in self.events if e[0] == "write")


class Stop(Exception):
    """Raised by the fake sleep so that the endless 'hang' loop can be observed and left."""


class FakeTime:
    """The control module's ``time``: a settable monotonic clock, a fixed wall clock, a sleep that records."""

    def __init__(self, now=1000.0, sleeps_before_stop=2):
        self.now, self.sleeps, self.left = now, [], sleeps_before_stop

    def monotonic(self):
        return self.now

    def time(self):
        return 1234.5

    def sleep(self, s):
        self.sleeps.append(s)
        self.left -= 1
        if self.left <= 0:
            raise Stop


@pytest.fixture
def inject(monkeypatch, tmp_path):
    """An injector on rank 1 for ``1:reduce:3:<kind>``, with stderr, os.kill and time recorded."""
    err, kills, clock = Stream(), [], FakeTime()
    monkeypatch.setattr(os, "kill", lambda pid, sig: kills.append((pid, sig)))
    monkeypatch.setattr(control, "time", clock)
    monkeypatch.delenv("HPCFL_FAULT_STAMP", raising=False)

    def make(kind):   # called in the test itself: pytest's capture resets sys.stderr between set-up and call
        monkeypatch.setattr(sys, "stderr", err)
        monkeypatch.setenv("HPCFL_FAULT", f"1:reduce:3:{kind}")
        return FaultInjector(1)
    make.err, make.kills, make.clock = err, kills, clock
    return make


LINE = "hpcfl: HPCFL_FAULT: injecting '{}' on rank 1 in phase 'reduce' of round 4\n"


def test_raise_says_so_on_stderr_flushed_and_counts_rounds_from_1(inject):
    """The stderr line (rounds counted from 1) is written and flushed before the exception, whose text names round 3."""
    with pytest.raises(RuntimeError, match=r"^injected fault in phase reduce of round 3$"):
        inject("raise").check("reduce", 3)
    assert inject.err.events == [("write", LINE.format("raise")[:-1]), ("write", "\n"), ("flush",)]


def test_the_stamp_file_gets_the_wall_time_of_the_fault(inject, monkeypatch, tmp_path):
    """HPCFL_FAULT_STAMP names a file that is (over)written with repr(time.time()) before the fault."""
    stamp = tmp_path / "stamp"
    stamp.write_text("an older, longer stamp 99999999")
    monkeypatch.setenv("HPCFL_FAULT_STAMP", str(stamp))
    with pytest.raises(RuntimeError):
        inject("raise").check("reduce", 3)
    assert stamp.read_text() == "1234.5"


def test_refuse_is_an_input_error_naming_the_rank_and_phase(inject):
    """'refuse' raises HpcflError (exit 2), with its exact message, and kills or exits nothing."""
    with pytest.raises(HpcflError, match=r"^injected refusal on rank 1 in phase reduce \(HPCFL_FAULT\)$") as e:
        inject("refuse").check("reduce", 3)
    assert e.value.exit_code == EXIT_INPUT and inject.kills == []
    assert inject.err.text == LINE.format("refuse")


def test_exit_is_exit_code_1(inject):
    """'exit' is sys.exit(1): not an input error, not a signal."""
    with pytest.raises(SystemExit) as e:
        inject("exit").check("reduce", 3)
    assert e.value.code == 1 and inject.kills == []


def test_kill_sends_sigkill_to_its_own_process_only(inject):
    """'kill' is one SIGKILL to os.getpid(): no SIGSTOP after it, no sleep, no exit."""
    inject("kill").check("reduce", 3)
    assert inject.kills == [(os.getpid(), signal.SIGKILL)] and inject.clock.sleeps == []
    assert inject.err.text == LINE.format("kill")


def test_stop_sends_sigstop_to_its_own_process_only(inject):
    """'stop' is one SIGSTOP to os.getpid() (a frozen rank), nothing else."""
    inject("stop").check("reduce", 3)
    assert inject.kills == [(os.getpid(), signal.SIGSTOP)] and inject.clock.sleeps == []


def test_hang_sleeps_an_hour_at_a_time_forever(inject):
    """'hang' loops on sleep(3600): it sleeps again after a wake-up and never signals."""
    with pytest.raises(Stop):
        inject("hang").check("reduce", 3)
    assert inject.clock.sleeps == [3600, 3600] and inject.kills == []


def test_another_phase_or_round_injects_nothing(inject):
    """Only the target's (phase, round) fires: the same round in another phase, or the next round, is quiet."""
    f = inject("kill")
    f.check("train", 3)
    f.check("reduce", 4)
    assert inject.kills == [] and inject.err.events == []


# ---- RunControl -------------------------------------------------------------------------------------------


class Comm:
    def __init__(self, rank=0, others=()):
        self.rank, self.size, self.others = rank, 1 + len(others), list(others)

    def allgather(self, x):
        return [x] + self.others if self.rank == 0 else self.others[:1] + [x]


@pytest.fixture
def quiet_env(monkeypatch):
    for name in ("HPCFL_FAULT", "HPCFL_STALL_NOTE", "HPCFL_ATTEMPT"):
        monkeypatch.delenv(name, raising=False)


def test_the_watchdog_gets_the_comm_note_memory_and_header(tmp_path, quiet_env):
    """The run's --out gives the note (<out>/.hpcfl-stalled) and memory; run_id is in the note's header."""
    comm = Comm()
    rc = RunControl(comm, None, Limits(), out=tmp_path, run_id="run7")
    w = rc.watchdog
    assert w.comm is comm and w.marker == tmp_path / ".hpcfl-stalled"
    assert w.memory == tmp_path / rundir.WATCHDOG_ROUNDS and w.header == "hpcfl-stalled attempt= run=run7"
    rc.close()


def test_defaults_fresh_run_no_clock_no_note_no_run_id(tmp_path, quiet_env, monkeypatch, capsys):
    """Defaults: no wall-clock checkpoints, resumed_from 0 (the message says round 1), run id ''."""
    clock = FakeTime()
    monkeypatch.setattr(control, "time", clock)
    rc = RunControl(Comm(), None, Limits(), out=tmp_path)
    assert rc.interval == 0.0 and rc.watchdog.resumed_from == 0 and rc.watchdog.header.endswith(" run=")
    assert "resume from round 1 (this run has written no checkpoint yet)" in rc.watchdog.message(700.0, 600.0)
    clock.now += 1e9
    assert rc.boundary() == (None, False)
    assert capsys.readouterr().out == ""                   # a fresh run with derived limits says nothing
    rc.close()


def test_without_out_there_is_no_note_and_no_memory(quiet_env):
    """No --out (an API call): the watchdog has neither a note nor a memory file."""
    rc = RunControl(Comm(), None, Limits())
    assert rc.watchdog.marker is None and rc.watchdog.memory is None
    rc.close()


def write_memory(tmp_path, *rounds):
    (tmp_path / rundir.WATCHDOG_ROUNDS).write_text("".join(f"{r}\n" for r in rounds))


def test_the_round_resumed_at_is_remembered_and_the_note_is_flushed(tmp_path, quiet_env, monkeypatch):
    """Resumed after 5 rounds: round 6 (index 5, the first to run) is still remembered; the note lists 6, 8."""
    write_memory(tmp_path, 5, 6, 8)
    out = Stream()
    monkeypatch.setattr(sys, "stdout", out)
    rc = RunControl(Comm(), None, Limits(startup_s=42.0), resumed_from=5, out=tmp_path)
    assert rc.watchdog.remembered == frozenset({5, 7}) and rc.watchdog.resumed_from == 5
    note = ("hpcfl: note: the watchdog ended round(s) 6, 8 in an earlier attempt; each gets watchdog.startup_s "
            "= 42 s in every phase this time")
    assert out.events == [("write", note), ("write", "\n"), ("flush",)]
    assert "resume from the checkpoint after round 5" in rc.watchdog.message(1.0, 1.0)
    rc.close()


@pytest.mark.parametrize("rank, limits", [(1, Limits()), (0, Limits(fixed=30.0))])
def test_only_rank_0_with_derived_limits_prints_the_note(tmp_path, quiet_env, capsys, rank, limits):
    """Rank 1 remembers silently; a fixed timeout_s is the user's, so no startup_s note either."""
    write_memory(tmp_path, 8)
    rc = RunControl(Comm(rank, [(None, False, None)]), None, limits, resumed_from=5, out=tmp_path)
    assert rc.watchdog.remembered == frozenset({7}) and capsys.readouterr().out == ""
    rc.close()


def test_phase_enters_the_watchdog_and_fires_the_fault_of_this_rank(quiet_env, monkeypatch):
    """phase() passes (name, round, kind) to the watchdog and checks the fault of comm.rank."""
    monkeypatch.setenv("HPCFL_FAULT", "1:train:2:raise")
    rc = RunControl(Comm(1, [(None, False, None)]), None, Limits())
    rc.phase("eval", 2, "eval-record")
    assert rc.watchdog.where == ("eval", 2) and rc.watchdog.kind == "eval-record"
    with pytest.raises(RuntimeError, match=r"^injected fault in phase train of round 2$"):
        rc.phase("train", 2)
    assert rc.watchdog.where == ("train", 2) and rc.watchdog.kind == "train"
    rc.close()


def test_a_checkpoint_is_due_at_exactly_the_interval_even_under_a_second(quiet_env, monkeypatch):
    """checkpoint_minutes = 0.0125 is 0.75 s: due at exactly 0.75 s (>=), not before; checkpointed() restarts it."""
    clock = FakeTime(now=1000.0)
    monkeypatch.setattr(control, "time", clock)
    rc = RunControl(Comm(), None, 0.0, checkpoint_minutes=0.0125)
    assert rc.interval == 0.75
    clock.now = 1000.5
    assert rc.boundary() == (None, False)
    clock.now = 1000.75
    assert rc.boundary() == (None, True)
    rc.checkpointed()
    assert rc.boundary() == (None, False)
    rc.close()


def test_checkpointed_tells_the_watchdog_the_rounds_done_only_when_given(quiet_env):
    """checkpointed(4) sets the watchdog's last checkpoint to 4; checkpointed() leaves it at 4."""
    rc = RunControl(Comm(), None, 0.0)
    rc.checkpointed(4)
    assert rc.watchdog.last_checkpoint == 4
    rc.checkpointed()
    assert rc.watchdog.last_checkpoint == 4
    assert "resume from the checkpoint after round 4" in rc.watchdog.message(9.0, 8.0)
    rc.close()


# ---- write_failed -----------------------------------------------------------------------------------------


class BcastComm:
    """Rank ``rank`` of a job whose rank 0 broadcasts ``from_root``; records what this rank sent."""

    def __init__(self, rank, from_root=None):
        self.rank, self.from_root, self.sent = rank, from_root, []

    def bcast(self, obj, root=0):
        self.sent.append((obj, root))
        return obj if self.rank == 0 else self.from_root


def test_rank_0_turns_an_io_error_into_a_write_error_with_its_text():
    """A full disk on rank 0 becomes WriteError (exit 74) with the OSError's own text, broadcast from 0."""
    comm = BcastComm(0)
    got = write_failed(comm, OSError("No space left on device: results.h5"))
    assert type(got) is WriteError and str(got) == "No space left on device: results.h5"
    assert got.exit_code == EXIT_WRITE and comm.sent == [(got, 0)]


def test_rank_0_turns_a_damaged_file_into_an_input_error():
    """A results file found damaged (BadFile) is RunError with exit 2, not a WriteError."""
    got = write_failed(BcastComm(0), BadFile("results.h5 is truncated"))
    assert type(got) is RunError and str(got) == "results.h5 is truncated" and got.exit_code == EXIT_INPUT


def test_no_error_on_rank_0_is_none_everywhere():
    """Nothing failed: rank 0 broadcasts None."""
    comm = BcastComm(0)
    assert write_failed(comm, None) is None and comm.sent == [(None, 0)]


def test_the_other_ranks_raise_rank_0s_error_not_their_own():
    """Rank 1 returns what rank 0 broadcast, untouched; its own argument is not converted."""
    sent = WriteError("disk full")
    comm = BcastComm(1, from_root=sent)
    assert write_failed(comm, None) is sent
    mine = OSError("rank 1's own")
    assert write_failed(BcastComm(1, from_root=None), mine) is None


def test_the_write_error_message_is_the_text_of_the_error_only():
    """No prefix or repr is added: the caller prints it after 'hpcfl:'."""
    got = write_failed(BcastComm(0), OSError(28, "No space left on device"))
    assert re.fullmatch(r"\[Errno 28\] No space left on device", str(got))
