"""The watchdog's limit (hpcfl.engine.watchdog): fixed, off, or derived from the run's own rounds.

A fake clock drives it; ``tick`` is what the thread runs every second.
"""

import os

from hpcfl import config
from hpcfl.engine.watchdog import PAUSE_GAP_S, Limits, Watchdog, remembered_rounds
from hpcfl.io.rundir import stall_header, stall_marker
from hpcfl.parallel.exits import EXIT_RESUMABLE


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


class Comm:
    rank, size = 1, 2


def dog(limits=None):
    clock = Clock()
    return Watchdog(Comm(), limits or Limits(), clock=clock, start=False), clock


def run_round(w, clock, rnd, seconds, kinds=("decide", "train", "reduce", "server", "record")):
    for k in kinds:
        w.enter(k, rnd)
        clock.t += seconds / len(kinds)


def test_defaults_are_derived_limits_with_a_generous_floor():
    s = config.from_dict({"data": {"dataset": "digits"}, "model": {"name": "mlp"}}).watchdog
    assert (s.timeout_s, s.floor_s, s.factor, s.startup_s) == (None, 60.0, 10.0, 600.0)
    assert Limits.of(s, ranks=2) == Limits(None, 60.0, 10.0, 600.0)
    assert not Limits.of(s, ranks=1).on                         # one process: no other rank to wait for


def test_an_explicit_timeout_is_fixed_and_zero_is_off():
    s = config.from_dict({"data": {"dataset": "digits"}, "model": {"name": "mlp"}, "watchdog": {"timeout_s": 7}})
    w, clock = dog(Limits.of(s.watchdog, ranks=1))              # fixed: watches one process too
    assert w.limit() == 7.0
    run_round(w, clock, 0, 100.0)
    assert w.limit() == 7.0 and w.period() == 1.0
    assert Watchdog(Comm(), 2.0, start=False).period() == 0.5  # a float is a fixed limit, as before
    off = config.from_dict({"data": {"dataset": "digits"}, "model": {"name": "mlp"}, "watchdog": {"timeout_s": 0}})
    assert not Limits.of(off.watchdog, ranks=4).on


def test_first_round_gets_the_start_up_allowance_then_the_floor():
    w, clock = dog()
    w.enter("decide", 0)
    assert w.limit() == 600.0                                   # no round finished yet
    clock.t += 0.01
    w.enter("train", 0)
    assert w.limit() == 600.0
    run_round(w, clock, 0, 0.05, ("reduce", "server", "record"))
    w.enter("decide", 1)                                        # round 0 took 0.06 s
    assert abs(w.slowest - 0.06) < 1e-9
    assert w.limit() == 60.0                                    # max(floor 60, 10 x 0.06)


def test_slow_rounds_scale_the_limit_and_a_first_evaluation_or_checkpoint_gets_the_allowance():
    w, clock = dog()
    run_round(w, clock, 0, 30.0)                                # a VGG round: 30 s
    w.enter("decide", 1)
    assert w.limit() == 300.0                                   # 10 x 30 s
    clock.t += 1.0
    w.enter("eval", 1, "eval")                                  # the run's first evaluating round
    assert w.limit() == 600.0
    clock.t += 100.0                                            # it takes 100 s
    w.enter("checkpoint", 1)                                    # and the first checkpoint: timed apart from
    assert w.limit() == 600.0                                   # the round (its size is not known yet here)
    clock.t += 5.0
    w.enter("decide", 2)
    assert abs(w.slowest - 101.0) < 1e-9 and abs(w.limit() - 1010.0) < 1e-9   # the 5 s checkpoint left out
    w.enter("eval", 2, "eval")
    assert abs(w.limit() - 1010.0) < 1e-9                       # evaluation has finished once: no allowance


def test_a_rank_waits_for_the_others_factor_times_its_own_work_in_the_round():
    w, clock = dog()
    run_round(w, clock, 0, 1.0)
    w.enter("train", 1)
    clock.t += 50.0                                             # this round's share is 50 x the last round
    w.enter("reduce", 1)
    assert w.limit() == 500.0


def test_a_frozen_peer_is_found_past_the_floor_and_the_message_says_what_to_do():
    w, clock = dog()
    run_round(w, clock, 0, 0.2)
    w.enter("decide", 1)
    w.enter("reduce", 1)
    for _ in range(59):
        clock.t += 1.0
        assert w.tick(1.0) is None
    clock.t += 1.5
    held, limit = w.tick(1.0)
    assert (round(held, 6), limit) == (60.5, 60.0)
    w.last_checkpoint = 1
    msg = w.message(held, limit)
    assert msg.startswith("hpcfl watchdog: rank 1 stuck in phase 'reduce' of round 2 for 60 s (limit 60 s, derived")
    assert f"exit {EXIT_RESUMABLE}" in msg and "resume from the checkpoint after round 1" in msg
    assert "raise watchdog.floor_s or watchdog.startup_s, or set watchdog.timeout_s (0: off)" in msg


def test_time_this_process_was_stopped_is_not_counted():
    w, clock = dog()
    run_round(w, clock, 0, 0.2)
    w.enter("reduce", 1)
    clock.t += 1.0
    assert w.tick(1.0) is None
    clock.t += 300.0                                            # scontrol suspend, Ctrl-Z: the thread slept too
    assert w.tick(1.0) is None
    clock.t += 1.0 + PAUSE_GAP_S - 0.5                          # a late wake-up on a loaded machine still counts
    assert w.tick(1.0) is None
    assert abs((w._now() - w.since) - (1.0 + 1.0 + 1.0 + PAUSE_GAP_S - 0.5)) < 1e-9   # 299 s of the 300 left out
    for _ in range(60):
        clock.t += 1.0
        over = w.tick(1.0)
    assert over is not None and over[0] > 60.0


def test_the_stall_note_is_left_for_a_batch_script(tmp_path, monkeypatch):
    monkeypatch.setenv("HPCFL_ATTEMPT", "77.0.1.42.9")
    w = Watchdog(Comm(), Limits(), start=False, marker=tmp_path / ".hpcfl-stalled", header=stall_header("run5"))
    w.leave_marker("hpcfl watchdog: rank 1 stuck")
    assert (tmp_path / ".hpcfl-stalled").read_text() == \
        "hpcfl-stalled attempt=77.0.1.42.9 run=run5\nhpcfl watchdog: rank 1 stuck\n"
    w.leave_marker("hpcfl watchdog: rank 2 stuck")              # the next rank's: the first note stays whole
    assert "rank 1 stuck" in (tmp_path / ".hpcfl-stalled").read_text()
    gone = Watchdog(Comm(), Limits(), start=False, marker=tmp_path / "no" / "such" / "folder" / "x")
    gone.leave_marker("text")                                   # an unwritable place: ignored, no raise
    assert not (tmp_path / "no").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".hpcfl-stalled"]   # no temporary file left


def test_a_planted_link_at_the_note_is_never_written_through(tmp_path):
    target = tmp_path / "victim"
    target.write_text("precious\n")
    (tmp_path / ".hpcfl-stalled").symlink_to(target)
    Watchdog(Comm(), Limits(), start=False, marker=tmp_path / ".hpcfl-stalled").leave_marker("stuck")
    assert target.read_text() == "precious\n" and (tmp_path / ".hpcfl-stalled").is_symlink()


def test_the_launcher_says_where_the_note_goes(tmp_path, monkeypatch):
    monkeypatch.delenv("HPCFL_STALL_NOTE", raising=False)
    assert stall_marker(tmp_path / "point") == tmp_path / "point" / ".hpcfl-stalled"
    monkeypatch.setenv("HPCFL_STALL_NOTE", str(tmp_path / ".hpcfl-stalled"))
    assert stall_marker(tmp_path / "point") == tmp_path / ".hpcfl-stalled"     # a sweep's point: $OUT's top


def test_a_round_the_watchdog_ended_before_gets_the_start_up_allowance_next_time(tmp_path):
    """A round that is only slow (a large client sampled for the first time) was ended on every
    attempt: each resume reached it with the same short history. Remembered in the run folder, it
    gets watchdog.startup_s in every phase on the next attempt, and the message says so."""
    lim = Limits(floor_s=60.0, factor=10.0, startup_s=600.0)
    memory = tmp_path / ".hpcfl-watchdog-rounds"
    first = Watchdog(Comm(), lim, clock=Clock(), start=False, memory=memory)
    first.remember(6)                                       # ended round 7 (index 6)
    assert memory.read_text() == "7\n" and remembered_rounds(memory) == {6}
    again = Watchdog(Comm(), lim, clock=Clock(), start=False, memory=memory, remembered=remembered_rounds(memory))
    clock = again.clock
    for rnd in range(5, 7):
        run_round(again, clock, rnd, 0.5)                    # rounds of half a second: the derived limit is 60 s
    again.enter("train", 7)
    assert again.limit() == 60.0                             # an ordinary round
    again.enter("train", 6)
    assert again.limit() == 600.0                            # the remembered one
    assert "ended round 7 in an earlier attempt too" in again.message(700.0, 600.0)
    again.remember(9)
    assert remembered_rounds(memory) == {6, 9} and memory.read_text() == "7\n10\n"


def test_the_memory_is_read_safely(tmp_path):
    assert remembered_rounds(tmp_path / "none") == set()
    (tmp_path / "bad").write_text("x\n-3\n0\n12\n")
    assert remembered_rounds(tmp_path / "bad") == {11}
    os.mkfifo(tmp_path / "fifo")
    assert remembered_rounds(tmp_path / "fifo") == set()     # never blocks, never trusted
    (tmp_path / "link").symlink_to(tmp_path / "bad")
    assert remembered_rounds(tmp_path / "link") == set()


def test_only_a_resumed_run_remembers_and_says_so(tmp_path, capsys):
    from hpcfl.engine.control import RunControl

    class Rank0:
        rank, size = 0, 1

    (tmp_path / ".hpcfl-watchdog-rounds").write_text("3\n8\n")
    lim = Limits(floor_s=60.0, factor=10.0, startup_s=600.0)
    fresh = RunControl(Rank0(), None, lim, resumed_from=0, out=tmp_path)
    assert fresh.watchdog.remembered == frozenset()
    resumed = RunControl(Rank0(), None, lim, resumed_from=5, out=tmp_path)
    assert resumed.watchdog.remembered == frozenset({7})     # round 3 is behind the checkpoint
    assert "the watchdog ended round(s) 8 in an earlier attempt; each gets watchdog.startup_s = 600 s" \
        in capsys.readouterr().out
    for c in (fresh, resumed):
        c.close()


def test_a_late_wake_up_of_exactly_the_pause_gap_still_counts():
    # PAUSE_GAP_S is the largest lateness still counted against the phase: only a wake-up
    # later than that means this process was stopped.
    w, clock = dog()
    w.enter("reduce", 0)
    since = w.since
    clock.t += 1.0 + PAUSE_GAP_S                                # asked for 1 s, woke exactly 5 s late
    assert w.tick(1.0) is None
    assert w.paused == 0.0 and w._now() - since == 1.0 + PAUSE_GAP_S
    clock.t += 1.0 + PAUSE_GAP_S + 0.5                          # half a second more: stopped, not counted
    w.tick(1.0)
    assert w.paused == PAUSE_GAP_S + 0.5 and w._now() - since == 2.0 + PAUSE_GAP_S


def _in_a_thread(call, deadline):
    """Run ``call()`` in a thread; seconds it took, or None if still running after ``deadline``."""
    import threading
    import time

    t0 = time.monotonic()
    t = threading.Thread(target=call, daemon=True)
    t.start()
    t.join(deadline)
    return None if t.is_alive() else time.monotonic() - t0


def test_a_stuck_note_or_memory_write_does_not_hold_up_the_abort(tmp_path, monkeypatch):
    import threading

    from hpcfl.io import safefs

    stuck = threading.Event()       # a file system that never answers, until the test lets go
    monkeypatch.setattr(safefs, "write_once", lambda *a, **k: stuck.wait(60))
    monkeypatch.setattr(safefs, "write_new", lambda *a, **k: stuck.wait(60))
    w = Watchdog(Comm(), Limits(), start=False, marker=tmp_path / ".hpcfl-stalled", memory=tmp_path / "memory")
    try:
        took = _in_a_thread(lambda: w.leave_marker("stuck"), deadline=10.0)
        assert took is not None and 1.5 < took < 10.0, took           # gave up after its 2 s
        took = _in_a_thread(lambda: w.leave_marker("stuck", wait=0.2), deadline=10.0)
        assert took is not None and took < 5.0, took
        took = _in_a_thread(lambda: w.remember(3, wait=0.2), deadline=10.0)
        assert took is not None and took < 5.0, took
    finally:
        stuck.set()
