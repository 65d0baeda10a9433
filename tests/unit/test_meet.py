"""Start-up's agreement points (hpcfl/parallel/meet.py): a refusal or a stop never waits for ever.

A stand-in communicator whose barrier completes after a given number of polls (or never) stands for
ranks that arrive late or are held in a collective of their own.
"""

import time

import pytest

from hpcfl.errors import ConfigError, RunError
from hpcfl.parallel import meet as meet_mod
from hpcfl.parallel.meet import meet


class Barrier:
    def __init__(self, polls):
        self.polls = polls   # Test() calls before it completes; None: never

    def Test(self):
        if self.polls is None:
            return False
        self.polls -= 1
        return self.polls < 0


class Comm:
    def __init__(self, size=2, rank=1, polls=0, others=None):
        self.size, self.rank, self.polls, self.barriers = size, rank, polls, 0
        self.others = others or [None] * size

    def Ibarrier(self):
        self.barriers += 1
        return Barrier(self.polls)

    def allgather(self, obj):
        out = list(self.others)
        out[self.rank] = obj
        return out


class Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, comm, message, code):
        self.calls.append((message, code))


def test_one_rank_meets_no_one():
    comm = Comm(size=1, rank=0, polls=None, others=[None])
    err = ConfigError("bad key")
    assert meet(comm, err, "planning") == [err] and comm.barriers == 0


def test_ranks_that_come_late_are_waited_for_and_every_error_is_gathered():
    theirs = ConfigError("rank 0's refusal")
    comm = Comm(polls=20, others=[theirs, None])
    rec = Recorder()
    t = time.monotonic()
    assert meet(comm, None, "planning", abort=rec) == [theirs, None]
    assert rec.calls == [] and comm.barriers == 1
    assert time.monotonic() - t < 2.0     # 20 polls at 1 ms growing to 50 ms: well under a second


@pytest.mark.parametrize("err,code", [(ConfigError("data file missing"), 2), (RunError("disk", 74), 74),
                                      (RuntimeError("a bug"), 1)])
def test_a_rank_with_an_error_whose_peers_never_come_ends_them_all_with_its_code(err, code):
    rec = Recorder()
    t = time.monotonic()
    meet(Comm(polls=None), err, "the end of set-up", abort=rec, error_wait=0.3)
    waited = time.monotonic() - t
    assert 0.3 <= waited < 1.5
    (message, got), = rec.calls
    assert got == code
    assert message.startswith(str(err)) and "rank 1: the other ranks did not reach the end of set-up within" \
        in message and f"exit {code}" in message


def test_a_rank_without_an_error_waits_for_its_peers_as_long_as_they_take():
    rec = Recorder()
    meet(Comm(polls=60), None, "planning", abort=rec, error_wait=0.01)   # error_wait is for errors only
    assert rec.calls == []


def test_a_stop_while_waiting_ends_every_rank_with_75_after_the_grace(monkeypatch):
    monkeypatch.setattr(meet_mod, "stop_requested", lambda: "SIGTERM")
    rec = Recorder()
    t = time.monotonic()
    meet(Comm(polls=None), None, "the end of planning", abort=rec, stop_wait=0.3)
    assert 0.3 <= time.monotonic() - t < 1.5
    (message, code), = rec.calls
    assert code == 75 and "stopped during start-up (SIGTERM)" in message and "did not reach the end of planning" \
        in message and "run the same command again" in message


def test_a_stop_whose_peers_come_is_left_to_the_callers_check(monkeypatch):
    monkeypatch.setattr(meet_mod, "stop_requested", lambda: "SIGINT")
    rec = Recorder()
    assert meet(Comm(polls=5), None, "planning", abort=rec, stop_wait=5.0) == [None, None]
    assert rec.calls == []


def test_the_default_abort_releases_first_then_says_why_then_aborts(capsys):
    order = []

    class C:
        def Abort(self, code):
            order.append(("abort", code))

    meet_mod.Abort(undo=lambda: order.append("undo"), pause=0.0)(C(), "hpcfl: why", 2)
    assert order == ["undo", ("abort", 2)] and "hpcfl: why" in capsys.readouterr().err
