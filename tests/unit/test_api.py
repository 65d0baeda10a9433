"""hpcfl.run's contract, on one rank in this process (docs/python.md): the job's three forms, the
overrides' three forms, what callbacks see and cannot change, a callback that raises at the start,
in a round and at the end, stop signals from Python, and errors that travel between ranks."""

import os
import pickle
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from runner import job

import hpcfl
from hpcfl import signals
from hpcfl.config.tomltext import toml_document
from hpcfl.errors import CallbackError, ConfigError, HpcflError, RunStopped, WriteError
from hpcfl.io import reader
from hpcfl.results import load

TABLE = job(**{"run.rounds": 3})


def same(a, b) -> bool:
    """Final model and every metric but the timings, bitwise."""
    return a.final_params.tobytes() == b.final_params.tobytes() and all(
        np.array_equal(a.metrics[k], b.metrics[k], equal_nan=True) for k in a.metrics if not k.startswith("time_"))


def test_a_job_as_a_dict_toml_text_or_a_file_is_the_same_run(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text(toml_document(TABLE, "a test job"))
    runs = [hpcfl.run(j, out=tmp_path / name) for j, name in ((TABLE, "dict"), (path.read_text(), "text"),
                                                               (path, "file"), (str(path), "str"))]
    assert all(same(runs[0], r) for r in runs[1:])
    assert TABLE == job(**{"run.rounds": 3})   # the caller's dict is not changed


def test_overrides_as_texts_one_text_or_a_dict_with_numpy_values(tmp_path):
    a = hpcfl.run(TABLE, out=tmp_path / "a", overrides=["algorithm.lr=0.2", "run.rounds=2"])
    b = hpcfl.run(TABLE, out=tmp_path / "b", overrides={"algorithm.lr": np.float64(0.2), "run.rounds": np.int64(2)})
    c = hpcfl.run(TABLE, out=tmp_path / "c", overrides="algorithm.lr=0.2")
    assert a.config["algorithm"]["lr"] == b.config["algorithm"]["lr"] == c.config["algorithm"]["lr"] == 0.2
    assert len(a.metrics["round"]) == len(b.metrics["round"]) == 2 and same(a, b)
    with pytest.raises(HpcflError, match="overrides holds 3"):
        hpcfl.run(TABLE, out=tmp_path / "d", overrides=["run.rounds=2", 3])
    assert not (tmp_path / "d").exists()


def test_a_callback_that_is_not_callable_is_refused_before_anything_is_made(tmp_path):
    with pytest.raises(HpcflError, match="callbacks must be callables"):
        hpcfl.run(TABLE, out=tmp_path / "x", callbacks=[print, "log"])
    assert not (tmp_path / "x").exists()


def test_callbacks_see_every_event_in_order_and_cannot_change_the_run(tmp_path):
    ref = hpcfl.run(TABLE, out=tmp_path / "ref")
    refused = []

    def meddle(event):
        for attempt in (lambda: event.metrics.__setitem__("train_loss", 0.0),
                        lambda: event.clients["weight"].__setitem__(0, 123.0),
                        lambda: event.accuracy.fill(0.0)):
            try:
                attempt()
            except (TypeError, ValueError, AttributeError, KeyError):
                refused.append(event.kind)

    events = []
    got = hpcfl.run(TABLE, out=tmp_path / "cb", callbacks=[events.append, meddle])
    kinds = [e.kind for e in events]
    assert kinds == ["start", "round", "eval", "round", "eval", "round", "eval", "end"]
    assert [e.round for e in events if e.kind == "round"] == [1, 2, 3]
    assert refused.count("round") == 3 * 3 and refused.count("eval") == 3 * 3   # every attempt failed
    assert same(got, ref)
    for name in ref.clients:
        assert np.array_equal(got.clients[name], ref.clients[name], equal_nan=True), name
    start, end = events[0], events[-1]
    assert (start.rounds, start.start_round, start.world_size, start.classifier) == (3, 0, 1, True)
    assert start.job["algorithm"]["name"] == "fedavg" and start.out == tmp_path / "cb"
    assert (end.status, end.rounds_done, end.message) == ("finished", 3, None)
    ev = events[2]
    assert ev.accuracy.shape == ev.samples.shape == (7,) and np.array_equal(
        ev.accuracy, got.client_eval["accuracy"][:7], equal_nan=True)
    assert events[1].metrics["test_accuracy"] == got.metrics["test_accuracy"][0]


def test_a_callback_that_raises_at_the_start_or_at_the_end(tmp_path):
    def at(kind):
        def fail(event):
            if event.kind == kind:
                raise KeyError(kind)
        return fail

    with pytest.raises(CallbackError, match="before its first round") as err:
        hpcfl.run(TABLE, out=tmp_path / "s", callbacks=[at("start")])
    assert isinstance(err.value.__cause__, KeyError)
    assert load(tmp_path / "s").metrics["round"].size == 0
    assert hpcfl.run(TABLE, out=tmp_path / "s").outcome == "finished"   # fixed (no callback): runs
    with pytest.raises(CallbackError, match="the run had ended: results.h5 is complete"):
        hpcfl.run(TABLE, out=tmp_path / "e", callbacks=[at("end")])
    assert load(tmp_path / "e").status == "finished"
    assert hpcfl.run(TABLE, out=tmp_path / "e").outcome == "already finished"


def test_a_stop_signal_from_python_checkpoints_and_the_next_call_resumes(tmp_path):
    before = signal.getsignal(signal.SIGTERM)

    def stop_in_round_2(event):
        if event.kind == "round" and event.round == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(RunStopped, match=r"stopped by SIGTERM after round 2 with a checkpoint \(resumable") as err:
        hpcfl.run(TABLE, out=tmp_path / "a", callbacks=[stop_in_round_2])
    assert err.value.exit_code == 75
    assert signal.getsignal(signal.SIGTERM) is before and signals.stop_requested() is None   # given back, cleared
    resumed = hpcfl.run(TABLE, out=tmp_path / "a")   # not stopped at once by the old request
    assert resumed.outcome == "finished" and [s["start_round"] for s in resumed.segments] == [1, 3]
    assert same(resumed, hpcfl.run(TABLE, out=tmp_path / "b"))


def test_a_diverged_run_is_returned_not_raised(tmp_path):
    ends = []
    res = hpcfl.run(TABLE, out=tmp_path / "d", overrides={"algorithm.lr": 1e6},
                    callbacks=lambda e: e.kind == "end" and ends.append(e.status))
    assert (res.outcome, res.status, ends) == ("diverged", "diverged", ["diverged"])
    again = hpcfl.run(TABLE, out=tmp_path / "d", overrides={"algorithm.lr": 1e6})
    assert again.outcome == "already diverged"


def test_errors_travel_between_ranks_with_their_class_message_and_attributes():
    for err in (ConfigError(["a.b is wrong; fix it", "c.d too"]), WriteError("disk full"),
                CallbackError("callback f raised", "mod.f"), HpcflError("plain")):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err) and back.exit_code == err.exit_code
        assert back.__dict__ == err.__dict__
    assert [e.exit_code for e in (HpcflError("x"), WriteError("x"), RunStopped("x"), CallbackError("x"))] == \
        [2, 74, 75, 1]


def test_results_read_lazily_hold_their_tables_until_used(tmp_path, monkeypatch):
    hpcfl.run(TABLE, out=tmp_path / "r")
    eager = load(tmp_path / "r")
    reads = []
    real = reader._columns
    monkeypatch.setattr(reader, "_columns", lambda f, group, *a: reads.append(group) or real(f, group, *a))
    lazy = load(tmp_path / "r", lazy=True)
    assert reads == ["metrics"]                                   # the per-client tables are not read
    assert sorted(lazy.clients) == sorted(eager.clients) and lazy.clients.rows == len(eager.clients["client"])
    copy = pickle.loads(pickle.dumps(lazy))                       # what the other ranks receive: no rows
    assert len(pickle.dumps(lazy.clients)) < 2000 and reads == ["metrics"]
    for name in eager.clients:
        assert np.array_equal(copy.clients[name], eager.clients[name], equal_nan=True)
    assert reads == ["metrics", "clients"]                        # read on first use
    lazy.clients["weight"], lazy.clients["steps"], lazy.clients["weight"]
    assert reads == ["metrics", "clients", "clients"]             # and once for each object
    assert repr(lazy) == repr(eager)


@pytest.mark.parametrize("eval_clients", [True, False])
def test_a_callback_that_raises_in_a_round_stops_the_run_there(tmp_path, eval_clients):
    """With and without per-client evaluation (whose event comes after the round's)."""
    def fail(event):
        if event.kind == "round" and event.round == 2:
            raise ZeroDivisionError("x")

    with pytest.raises(CallbackError, match="stopped after round 2 with a checkpoint"):
        hpcfl.run(TABLE, out=tmp_path / "a", overrides={"run.eval_clients": eval_clients}, callbacks=[fail])
    assert load(tmp_path / "a").metrics["round"].tolist() == [1, 2]


def test_an_unexpected_error_closes_the_results_and_sends_end(tmp_path, monkeypatch):
    """Not one of hpcfl's endings (here the evaluation raises in round 2): the error comes out as it is,
    the callbacks get End ("failed"), and results.h5 is closed with round 1 in it, so that the same
    process can run again (an open writer would hold the file)."""
    from hpcfl.engine import simulation

    real, calls = simulation.evaluate, []

    def evaluate(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real(*args, **kwargs)

    monkeypatch.setattr(simulation, "evaluate", evaluate)
    ends = []
    with pytest.raises(RuntimeError, match="illegal memory access"):
        hpcfl.run(TABLE, out=tmp_path / "a", callbacks=lambda e: e.kind == "end" and ends.append(e))
    assert [(e.status, e.rounds_done) for e in ends] == [("failed", 1)] and "RuntimeError" in ends[0].message
    assert load(tmp_path / "a").metrics["round"].tolist() == [1]
    monkeypatch.setattr(simulation, "evaluate", real)
    assert hpcfl.run(TABLE, out=tmp_path / "a").outcome == "finished"
    assert sys.stdout is not None and type(sys.stdout).__name__ != "_AfterBar"
