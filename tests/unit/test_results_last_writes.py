"""The last writes to results.h5 and what a failed write says (hpcfl/io/results.py, results_final.py,
results_h5.py): the final model's and the diverged status's records, per-client summaries and the
controller events built at the end, a moved run folder followed and a deleted file refused, a full
disk named with the bytes it needs, every failure leaving the file as it was and the writer closed,
and file locking."""

import errno

import h5py
import numpy as np
import pytest

from hpcfl.algorithms.gift import TAU_FIELDS
from hpcfl.errors import HpcflError
from hpcfl.io import reader, results_h5
from hpcfl.io.results import FinalModel, ResultsWriter, load
from hpcfl.state import Field
from test_results_file import ATTRS, row

MODEL = FinalModel(["param:a", "buffer:b"], [(2,), (1,)], "float32")   # /final's layout
MODEL2 = FinalModel(["param:a", "param:b"], [(2,), (1,)], "float32")
MODEL3 = FinalModel(["param:w"], [(1,)], "float32")

COUNTS = np.arange(6, dtype=np.int64).reshape(2, 3)

# ---- the last writes --------------------------------------------------------------------------------

def test_the_final_model_is_described_and_diverged_runs_say_where(tmp_path):
    path = tmp_path / "results.h5"
    w = ResultsWriter(path, ATTRS, COUNTS, model=MODEL)
    w.append_round(*row(1))
    w.write_final(np.arange(3, dtype=np.float32))
    w.close()
    with h5py.File(path, "r") as f:
        p, n = f["final/params"], f["final/param_names"]
        assert p.attrs["unit"] == "1"
        assert p.attrs["description"] == ("final flat model: parameters, then float buffers, in the order of "
                                          "param_names (NaN until status is finished)")
        assert n.attrs["unit"] == "name"
        assert n.attrs["description"] == '"param:<module path>" or "buffer:<module path>" of each entry of params'
    d = tmp_path / "d.h5"
    w = ResultsWriter(d, ATTRS, COUNTS)
    w.append_round(*row(1))
    w.mark_diverged(4)
    w.close()
    with h5py.File(d, "r") as f:
        assert f.attrs["status"] == b"diverged"   # fixed-size bytes: rewritten in place (schema 3)
        assert bool(f.attrs["diverged"]) and int(f.attrs["diverged_round"]) == 4


def test_a_full_disk_at_the_last_write_names_what_and_how_much(tmp_path, monkeypatch):
    """The final write needs room for the controller events' first chunk and metadata only: /final and the
    summaries were made with the file. The diverged status rewrites attributes in place: it needs none."""
    path = tmp_path / "results.h5"
    w = ResultsWriter(path, ATTRS, COUNTS, model=MODEL2)
    w.append_round(*row(1))
    d = ResultsWriter(tmp_path / "d.h5", ATTRS, COUNTS)
    d.append_round(*row(1))
    seen = {}

    def need_space(p, need, what_, fix):
        seen.update(need=need, what=what_)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("hpcfl.io.results_final.safefs.need_space", need_space)
    message = r"^cannot write the final results to .*results\.h5 \(No space left on device\): .* it needs about"
    with pytest.raises(HpcflError, match=message):
        w.write_final(np.zeros(3, dtype=np.float32))
    assert seen["what"] == "the final results" and seen["need"] == (64 << 10) + 256 * 34   # a chunk of 34-byte rows
    assert w.file is None
    w.close()                                               # closing after the failure is a no-op
    res = load(tmp_path)
    assert res.metrics["round"].tolist() == [1] and res.status == "running" and res.final_params is None
    seen.clear()
    d.mark_diverged(1)                                       # "full" disk: nothing to allocate
    d.close()
    assert seen == {} and reader.status(tmp_path / "d.h5")[0] == "diverged"


# ---- the messages of a failed write -----------------------------------------------------------------

def _writer(tmp_path):
    w = ResultsWriter(tmp_path / "results.h5", ATTRS, COUNTS)
    w.close()
    return w


def test_a_full_disk_reason_is_the_errnos_text_or_the_first_line_of_an_hdf5_message(tmp_path):
    w = _writer(tmp_path)
    e = w._error("the rows", tmp_path / "x", OSError(errno.ENOSPC, "ignored text"), 12345)
    assert str(e).startswith(f"cannot write the rows to {w.path} (No space left on device): ")
    assert "it needs about 12,345 bytes" in str(e)
    e = w._error("the rows", tmp_path / "x", RuntimeError("Disk quota exceeded here\nsecond line"), 10)
    assert str(e).startswith(f"cannot write the rows to {w.path} (Disk quota exceeded here): ")


def test_another_write_error_names_what_where_and_its_first_line(tmp_path):
    w = _writer(tmp_path)
    e = w._error("the rows", tmp_path / "x", OSError(errno.EIO, "Input/output error\nmore"), 1)
    assert str(e) == f"cannot write the rows ({tmp_path / 'x'}): [Errno 5] Input/output error. {results_h5._FULL_FIX}"
    e = w._error("the rows", tmp_path / "x", ValueError(), 1)   # no text: its repr
    assert str(e) == f"cannot write the rows ({tmp_path / 'x'}): ValueError(). {results_h5._FULL_FIX}"
    own = HpcflError("already worded")
    assert w._error("the rows", tmp_path / "x", own, 1) is own


def test_a_failed_new_file_leaves_no_partial_file_behind(tmp_path, monkeypatch):
    """The new file is built under a temporary name; a failure there removes it and closes it."""
    def boom(*a, **k):
        raise OSError(errno.EIO, "Input/output error")
    monkeypatch.setattr("hpcfl.io.results._segments", boom)
    with pytest.raises(HpcflError, match=r"^cannot write the new results file \(.*\.results\.h5\.new-tmp\)"):
        ResultsWriter(tmp_path / "results.h5", ATTRS, COUNTS)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# ---- file locking ------------------------------------------------------------------------------------

def test_configure_sets_locking_for_the_writer_and_the_reader(tmp_path, monkeypatch):
    monkeypatch.setitem(results_h5.LOCKING, "locking", True)
    monkeypatch.setitem(reader.LOCKING, "locking", True)
    results_h5.configure(False)
    assert results_h5.LOCKING == {"locking": False} and reader.LOCKING["locking"] is False
    seen = {}
    monkeypatch.setattr(results_h5.h5py, "File", lambda path, mode, **kw: seen.update(kw) or "f")
    assert results_h5._open(tmp_path / "x.h5", "r") == "f" and seen == {"locking": False}
    results_h5.configure(True)
    seen.clear()
    results_h5._open(tmp_path / "x.h5", "r")
    assert seen == {} and reader.LOCKING["locking"] is True


# ---- per-client summaries and controller events at the end ----------------------------------------

def test_the_final_write_stores_each_clients_summary_over_rounds_with_its_unit(tmp_path):
    score = {"score": Field(np.float64, "1", "a per-client score", summary="median")}
    w = ResultsWriter(tmp_path / "results.h5", ATTRS, np.ones((5, 3), dtype=np.int64), client_fields=score, model=MODEL3)
    for r, (clients, scores) in enumerate([((1, 4), (1.0, 7.0)), ((1, 2), (3.0, 5.0)), ((1, 4), (8.0, 9.0))], 1):
        m, c = row(r, clients)
        w.append_round(m, {**c, "score": np.array(scores)})
    w.write_final(np.zeros(1, dtype=np.float32))
    w.close()
    with h5py.File(tmp_path / "results.h5", "r") as f:
        ds = f["clients_summary/score_median"]
        assert ds.shape == (5,)                                  # one per client of the partition
        assert np.array_equal(ds[()], [np.nan, 3.0, 5.0, np.nan, 8.0], equal_nan=True)
        assert ds.attrs["unit"] == "1" and ds.attrs["description"] == "median over rounds of: a per-client score"
        assert list(f["clients_summary"]) == ["score_median"]     # fields without a summary get none


def test_the_final_write_rebuilds_the_controller_events_from_the_tau_columns(tmp_path):
    w = ResultsWriter(tmp_path / "results.h5", ATTRS, COUNTS, metric_fields=TAU_FIELDS, model=MODEL3)
    taus = [(8, 8, 0), (8, 4, 1), (4, 4, 0), (4, 2, 3)]   # (tau_used, tau_next, tau_event) per round
    for r, (used, nxt, event) in enumerate(taus, 1):
        m, c = row(r)
        m.update({k: 0 for k in TAU_FIELDS}, tau_used=used, tau_next=nxt, tau_event=event)
        w.append_round(m, c)
    w.write_final(np.zeros(1, dtype=np.float32))
    w.close()
    res = load(tmp_path)
    assert res.events.tolist() == [(2, 8, 4, b"stagnation"), (4, 4, 2, b"literal")]
    with h5py.File(tmp_path / "results.h5", "r") as f:
        assert f["controller_events"].attrs["unit"] == "round, steps, steps, name"
        assert f["controller_events"].attrs["description"].startswith("changes of tau: (round, old_tau, new_tau")
    w = ResultsWriter(tmp_path / "p.h5", ATTRS, COUNTS, model=MODEL3)   # no tau columns: no table
    w.append_round(*row(1))
    w.write_final(np.zeros(1, dtype=np.float32))
    w.close()
    with h5py.File(tmp_path / "p.h5", "r") as f:
        assert "controller_events" not in f


# ---- the run's folder moved or its file deleted before the last write -------------------------------

def test_the_last_write_follows_a_moved_folder_and_refuses_a_deleted_file(tmp_path):
    (tmp_path / "a").mkdir()
    w = ResultsWriter(tmp_path / "a" / "results.h5", ATTRS, COUNTS, model=MODEL3)
    w.append_round(*row(1))
    (tmp_path / "a").rename(tmp_path / "b")                     # --out moved mid-run
    w.write_final(np.zeros(1, dtype=np.float32))
    w.close()
    assert w.moved_from == tmp_path / "a" / "results.h5" and w.path == tmp_path / "b" / "results.h5"
    assert not (tmp_path / "a").exists() and sorted(p.name for p in (tmp_path / "b").iterdir()) == ["results.h5"]
    assert load(tmp_path / "b").attrs["status"] == "finished"

    w = ResultsWriter(tmp_path / "c.h5", ATTRS, COUNTS)
    w.append_round(*row(1))
    (tmp_path / "c.h5").unlink()
    with pytest.raises(HpcflError, match=rf"^{tmp_path / 'c.h5'} was deleted while the run was writing it: the "
                                         r"rounds written there are lost, and the checkpoints are not \(pass "
                                         r"--force to start over, or restore the file and run the same command "
                                         r"again\)$"):
        w.mark_diverged(1)
    assert w.moved_from is None


def test_an_unmoved_file_keeps_its_path(tmp_path):
    w = ResultsWriter(tmp_path / "results.h5", ATTRS, COUNTS)
    w.append_round(*row(1))
    w.mark_diverged(1)
    w.close()
    assert w.moved_from is None and w.path == tmp_path / "results.h5" and w.file is None


def test_a_failed_last_write_leaves_the_writer_closed_and_the_file_running(tmp_path, monkeypatch):
    w = ResultsWriter(tmp_path / "results.h5", ATTRS, COUNTS)
    w.append_round(*row(1))

    def fail():
        raise OSError(errno.EIO, "Input/output error")
    monkeypatch.setattr(w.file, "flush", fail)
    with pytest.raises(HpcflError, match=r"^cannot write the diverged status \(.*results\.h5\): \[Errno 5\] Input/output error"):
        w.mark_diverged(1)
    assert w.file is None and sorted(p.name for p in tmp_path.iterdir()) == ["results.h5"]
    w.close()
    assert load(tmp_path).attrs["status"] == "running"


def test_a_moved_runs_last_write_goes_to_the_file_where_it_is_now(tmp_path):
    (tmp_path / "a").mkdir()
    w = ResultsWriter(tmp_path / "a" / "results.h5", ATTRS, COUNTS)
    w.append_round(*row(1))
    (tmp_path / "a").rename(tmp_path / "b")
    w.mark_diverged(1)
    assert w.path == tmp_path / "b" / "results.h5" and w.moved_from == tmp_path / "a" / "results.h5"
    w.close()
    assert reader.status(tmp_path / "b" / "results.h5")[0] == "diverged"


def test_the_controller_events_describe_every_reason(tmp_path):
    w = ResultsWriter(tmp_path / "results.h5", ATTRS, COUNTS, metric_fields=TAU_FIELDS, model=MODEL3)
    m, c = row(1)
    w.append_round({**m, **{k: 0 for k in TAU_FIELDS}, "tau_used": 4, "tau_next": 2, "tau_event": 6}, c)
    w.write_final(np.zeros(1, dtype=np.float32))
    w.close()
    with h5py.File(tmp_path / "results.h5", "r") as f:
        assert f["controller_events"].attrs["description"] == (
            "changes of tau: (round, old_tau, new_tau, reason), reason in stagnation, relax, literal, "
            "adacomm, saturation, afl; the new tau is used from round + 1")
        assert f["controller_events"][()].tolist() == [(1, 4, 2, b"afl")]
