"""hpcfl.engine.watchdog beyond test_watchdog.py: the exact limit boundaries (held == limit, limit
under a second, limit 0), the slowest round kept as a maximum, the start-up state, both whole
messages, the note and memory writers' threads, the watching loop driven step by step, and the
bounds of the remembered rounds."""

import sys
import threading
from types import SimpleNamespace

import pytest
from test_control_mutants import Stream
from test_watchdog import Clock, Comm

from hpcfl.engine import watchdog
from hpcfl.engine.watchdog import PAUSE_GAP_S, Limits, Watchdog, remembered_rounds
from hpcfl.parallel.exits import EXIT_RESUMABLE


def dog(limits=None, **kw):
    clock = Clock()
    return Watchdog(Comm(), Limits() if limits is None else limits, clock=clock, start=False, **kw), clock


def test_of_passes_every_field_of_the_section():
    """Limits.of keeps the section's startup_s (not the default 600) along with the others."""
    s = SimpleNamespace(timeout_s=None, floor_s=5.0, factor=3.0, startup_s=123.0)
    assert Limits.of(s, ranks=2) == Limits(None, 5.0, 3.0, 123.0)


def test_start_up_is_round_0_phase_start_up_and_tick_works_before_any_round():
    """Before enter(), the phase is 'start-up' (round index -1, said as round 0) and startup_s applies."""
    w, clock = dog(Limits(floor_s=60.0, factor=10.0, startup_s=600.0))
    clock.t += 600.0
    assert w.tick(600.0) is None                                 # held == limit: not over
    clock.t += 0.5
    assert w.tick(0.5) == (600.5, 600.0)
    assert w.message(600.5, 600.0).startswith("hpcfl watchdog: rank 1 stuck in phase 'start-up' of round 0 for 600 s")
    w.enter("decide", 0)
    assert w.slowest is None and w.finished == {"start-up"}     # start-up is not a round


def test_held_exactly_the_limit_is_not_over_and_a_limit_under_a_second_still_watches():
    """Over means held > limit; a fixed 0.5 s limit fires at 0.75 s; fixed 0 never fires."""
    w, clock = dog(Limits(fixed=7.0))
    w.enter("train", 0)
    clock.t += 7.0
    assert w.tick(7.0) is None                                   # a wake-up on time: nothing paused
    clock.t += 0.5
    assert w.tick(0.5) == (7.5, 7.0)
    half, clock = dog(Limits(fixed=0.5))
    half.enter("train", 0)
    clock.t += 0.75
    assert half.tick(0.125) == (0.75, 0.5) and half.period() == 0.125
    off, clock = dog(Limits(fixed=0.0))
    off.enter("train", 0)
    clock.t += 1e6
    assert off.tick(1.0) is None and off.period() == 1.0


def test_derived_limits_wake_every_second():
    """Derived limits (fixed None) use a 1 s period."""
    assert dog()[0].period() == 1.0


def test_the_slowest_round_is_a_maximum_not_the_latest():
    """A 30 s round then a 5 s round: the limit stays 10 x 30 s."""
    w, clock = dog()
    w.enter("train", 0)
    clock.t += 30.0
    w.enter("train", 1)
    clock.t += 5.0
    w.enter("train", 2)
    assert w.slowest == 30.0 and w.limit() == 300.0


def test_a_new_kind_under_a_known_phase_name_gets_the_allowance():
    """kind tells phases apart: 'eval-record' has not finished although 'eval' has; no kind means the phase."""
    w, clock = dog()
    for rnd in (0, 1):
        w.enter("train", rnd)
        clock.t += 1.0
        w.enter("eval", rnd, "eval")
        clock.t += 1.0
    w.enter("eval", 2, "eval-record")
    assert w.kind == "eval-record" and w.limit() == 600.0
    w.enter("train", 2)
    assert w.kind == "train" and w.limit() == 60.0


def test_with_no_finished_round_the_floor_not_one_second_is_the_base():
    """No slowest round yet: the base is this round's own time (0 here), not 1 s: floor 0.5, startup 1 give 1."""
    w, _ = dog(Limits(floor_s=0.5, factor=10.0, startup_s=1.0))
    w.enter("train", 0)
    assert w.limit() == 1.0


def test_two_pauses_add_up():
    """Each stop of the process is added to the time not counted."""
    w, clock = dog()
    w.enter("reduce", 0)
    clock.t += 1.0 + PAUSE_GAP_S + 2.0
    w.tick(1.0)
    clock.t += 1.0 + PAUSE_GAP_S + 3.0
    w.tick(1.0)
    assert w.paused == 2 * PAUSE_GAP_S + 5.0 and w._now() - w.since == 2.0


def test_the_whole_derived_message_for_a_remembered_round():
    """Derived limit, slowest 0.06 s, round 7 ended before, resumed at 3 with no new checkpoint."""
    w, clock = dog(remembered={6})
    w.resumed_from = 3
    w.enter("train", 5)
    clock.t += 0.06
    w.enter("reduce", 6)
    assert w.message(700.4, 600.0) == (
        "hpcfl watchdog: rank 1 stuck in phase 'reduce' of round 7 for 700 s (limit 600 s, derived: "
        "max(watchdog.floor_s = 60, watchdog.factor = 10 x the slowest round (0.06 s)), at least "
        "watchdog.startup_s = 600 in a first round or phase; the watchdog ended round 7 in an earlier attempt "
        "too, so it had watchdog.startup_s in every phase this time). A rank that does not print this line is "
        "frozen, lost with its node, or stuck in its own work. Ending the job with exit 75: run the same "
        "command again to resume from the checkpoint after round 3. If round 7 is only slow, raise "
        "watchdog.floor_s or watchdog.startup_s, or set watchdog.timeout_s (0: off)")


def test_the_fixed_message_of_a_fresh_run_in_its_first_round():
    """Fixed limit: it names watchdog.timeout_s; no round finished and no checkpoint: resume from round 1."""
    w, _ = dog(Limits(fixed=7.0))
    w.enter("decide", 0)
    msg = w.message(8.0, 7.0)
    assert msg.startswith("hpcfl watchdog: rank 1 stuck in phase 'decide' of round 1 for 8 s "
                          "(limit 7 s, watchdog.timeout_s = 7). A rank")
    assert msg.endswith("resume from round 1 (this run has written no checkpoint yet). If round 1 is only slow, "
                        "raise watchdog.floor_s or watchdog.startup_s, or set watchdog.timeout_s (0: off)")


def test_no_finished_round_is_said_and_a_checkpoint_beats_the_resumed_round():
    """'(none finished yet)' before any round ends; the newest checkpoint (5) wins over resumed_from (3)."""
    w, _ = dog()
    w.resumed_from = 3
    w.enter("train", 3)
    assert "x the slowest round (none finished yet)), at least" in w.message(601.0, 600.0)
    assert "resume from the checkpoint after round 3." in w.message(601.0, 600.0)
    w.last_checkpoint = 5
    assert "resume from the checkpoint after round 5." in w.message(601.0, 600.0)


def test_the_note_without_a_header_starts_with_hpcfl_stalled(tmp_path):
    """The default header is exactly 'hpcfl-stalled'."""
    w, _ = dog(marker=tmp_path / "note")
    w.leave_marker("stuck")
    assert (tmp_path / "note").read_text() == "hpcfl-stalled\nstuck\n"


def test_round_1_is_remembered_and_start_up_is_not(tmp_path):
    """remember(0) writes '1'; remember(-1) (stuck in start-up) writes nothing."""
    w, _ = dog(memory=tmp_path / "memory")
    w.remember(-1)
    assert not (tmp_path / "memory").exists()
    w.remember(0)
    assert (tmp_path / "memory").read_text() == "1\n"


class Threads:
    """watchdog's ``threading``: Thread records its arguments and its join timeout, and runs in start()."""

    def __init__(self):
        self.made = []
        outer = self

        class Thread:
            def __init__(self, **kw):
                self.kw, self.joined = kw, []
                outer.made.append(self)

            def start(self):
                self.kw["target"]()

            def join(self, timeout=None):
                self.joined.append(timeout)

        self.Thread, self.Event, self.current_thread = Thread, threading.Event, threading.current_thread


@pytest.mark.parametrize("call, name", [("leave_marker", "hpcfl-stall-marker"), ("remember", "hpcfl-watchdog-memory")])
def test_the_writers_run_in_a_named_daemon_thread_given_2_s(tmp_path, monkeypatch, call, name):
    """A stuck file system cannot hold the process (daemon) or the abort (joined for 2 s); named for stack dumps."""
    w, _ = dog(marker=tmp_path / "note", memory=tmp_path / "memory")
    fake = Threads()
    monkeypatch.setattr(watchdog, "threading", fake)
    getattr(w, call)(4) if call == "remember" else w.leave_marker("stuck")
    (t,) = fake.made
    assert (t.kw["name"], t.kw["daemon"], t.joined) == (name, True, [2.0])
    assert (tmp_path / ("memory" if call == "remember" else "note")).exists()


def test_the_thread_starts_by_default_named_and_daemon_and_stop_joins_it():
    """start defaults to True: a live daemon thread 'hpcfl-watchdog' running _watch; stop() waits for it."""
    w = Watchdog(Comm(), Limits(fixed=3600.0))
    t = w._thread
    try:
        assert t.is_alive() and t.name == "hpcfl-watchdog" and t.daemon is True
    finally:
        w.stop()
    assert not t.is_alive()


def test_start_false_or_off_starts_no_thread():
    """start=False (tests) or limits off: no thread."""
    assert Watchdog(Comm(), Limits(), start=False)._thread is None
    assert Watchdog(Comm(), 0.0)._thread is None


def test_stop_from_the_watching_thread_itself_does_not_join_it():
    """stop() called on the watchdog's own thread must not try to join itself (RuntimeError)."""
    w, _ = dog()
    w._thread = threading.current_thread()
    w.stop()
    assert w._stopped.is_set()


class Aborted(Exception):
    pass


class Event:
    """The watch loop's stop event on the fake clock: wait(t) moves the clock by t and records t."""

    def __init__(self, clock, stop_at=None):
        self.clock, self.waits, self.stop_at = clock, [], stop_at

    def wait(self, t):
        self.waits.append(t)
        if len(self.waits) > 50:
            raise AssertionError("the loop never fired")
        self.clock.t += t or 0.0
        return t == self.stop_at

    def set(self):
        pass


class AbortComm:
    rank, size = 1, 2

    def __init__(self):
        self.codes = []

    def Abort(self, code):
        self.codes.append(code)
        raise Aborted


def watched(tmp_path, stop_at=None):
    comm, clock = AbortComm(), Clock()
    w = Watchdog(comm, Limits(fixed=2.0), clock=clock, start=False, marker=tmp_path / "note",
                 memory=tmp_path / "memory", header="head")
    w._stopped = Event(clock, stop_at)
    w.enter("reduce", 4)
    return w, comm


def test_the_loop_prints_leaves_the_note_remembers_pauses_1_s_then_aborts_75(tmp_path, monkeypatch):
    """Limit 2 s, period 0.5 s: over at the 5th wake-up (2.5 s); then stderr (flushed), note, memory, 1 s, Abort(75)."""
    w, comm = watched(tmp_path)
    err = Stream()
    monkeypatch.setattr(sys, "stderr", err)
    with pytest.raises(Aborted):
        w._watch()
    text = w.message(2.5, 2.0)
    assert text.startswith("hpcfl watchdog: rank 1 stuck in phase 'reduce' of round 5 for 2 s (limit 2 s")
    assert err.events == [("write", text), ("write", "\n"), ("flush",)]
    assert (tmp_path / "note").read_text() == f"head\n{text}\n"
    assert (tmp_path / "memory").read_text() == "5\n"
    assert w._stopped.waits == [0.5] * 5 + [1.0] and comm.codes == [EXIT_RESUMABLE]


def test_a_run_that_ends_in_the_pause_is_not_aborted(tmp_path, monkeypatch):
    """The 1 s pause sees the stop: the loop returns without Abort, the note and memory written."""
    w, comm = watched(tmp_path, stop_at=1.0)
    monkeypatch.setattr(sys, "stderr", Stream())
    w._watch()
    assert comm.codes == [] and (tmp_path / "memory").read_text() == "5\n"


def test_remembered_rounds_bounds(tmp_path):
    """Round 1 (index 0) is kept; 2**40 and above are not rounds, 2**40 - 1 is."""
    p = tmp_path / "rounds"
    p.write_text(f"1\n{(1 << 40) - 1}\n{1 << 40}\n{(1 << 40) + 5}\n{1 << 41}\n")
    assert remembered_rounds(p) == {0, (1 << 40) - 2}
