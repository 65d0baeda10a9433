"""results.h5 writer: SWMR reads while writing, resume trimming, disk-full message, the
round convention, segments, schema 1 files, units everywhere, the final model's dtype."""

import errno
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcfl.errors import HpcflError
from hpcfl.io.results import FinalModel, CLIENT_FIELDS, METRICS, ResultsWriter, load, status

MODEL = FinalModel(["param:w"], [(2, 2)], "float32")   # /final's layout
MODEL2 = FinalModel(["param:w"], [(2, 2)], "float64", (1, 2), 2)
ATTRS = {"config": {"run": {"rounds": 3}}, "config_sha256": "x", "versions": {"hpcfl": "t"}, "world_size": 1,
         "devices": ["cpu"], "seed": 0}


def row(r, clients=(1, 4)):
    m = {k: float(r) for k in METRICS}
    m["round"] = r
    c = {k: np.full(len(clients), r) for k in CLIENT_FIELDS}
    c["client"] = np.array(clients)
    return m, c


def test_reader_sees_flushed_rounds_while_the_writer_is_open(tmp_path):
    w = ResultsWriter(tmp_path / "results.h5", ATTRS, np.ones((2, 3), dtype=np.int64), model=MODEL)
    for r in range(1, 4):
        w.append_round(*row(r))
        seen = load(tmp_path)                       # SWMR read of an open file
        assert seen.metrics["round"].tolist() == list(range(1, r + 1))
        assert seen.clients["client"].tolist() == [1, 4] * r
    assert status(tmp_path / "results.h5")[0] == "running"
    w.write_final(np.arange(4, dtype=np.float32))
    w.close()
    res = load(tmp_path)
    assert res.attrs["status"] == "finished" and res.state_dict()["w"].tolist() == [[0, 1], [2, 3]]


def test_resume_trims_rows_past_the_checkpoint(tmp_path):
    w = ResultsWriter(tmp_path / "results.h5", ATTRS, np.ones((2, 3), dtype=np.int64))
    for r in range(1, 6):
        w.append_round(*row(r))
    w.close()
    w = ResultsWriter(tmp_path / "results.h5", {**ATTRS, "world_size": 2}, None, resume_at=3)
    res = load(tmp_path)
    assert res.metrics["round"].tolist() == [1, 2, 3] and res.clients["round"].tolist() == [1, 1, 2, 2, 3, 3]
    assert res.attrs["world_size"] == 2 and res.attrs["resumed_at_round"] == 3
    w.append_round(*row(4))
    w.close()
    assert load(tmp_path).metrics["round"].tolist() == [1, 2, 3, 4]


KILLED_IN_WRITE_FINAL = """
import os, signal, sys
import numpy as np
sys.path.insert(0, {tests!r})
from test_results_file import ATTRS, MODEL, row
from hpcfl.io.results import ResultsWriter
w = ResultsWriter({path!r}, ATTRS, np.ones((2, 3), dtype=np.int64), model=MODEL)
for r in (1, 2):
    w.append_round(*row(r))
flush = w.file.flush
w.file.flush = lambda: os.kill(os.getpid(), signal.SIGKILL)   # killed in the last write, before its first flush
w.{call}
"""


@pytest.mark.parametrize("call", ["write_final(np.zeros(4, dtype=np.float32))", "mark_diverged(3)"])
def test_a_kill_during_the_last_write_leaves_a_file_that_opens_and_resumes(tmp_path, call):
    """HDF5 cannot open a file killed while open in normal (non-SWMR) mode (CI once killed a run there: its
    resume failed with 'file is not already open for SWMR writing'). The last writes stay in SWMR mode, into
    objects made with the file: killed in them, the file is a killed run's, "running", and resumes.
    (tests/unit/test_results_end.py kills at every step of the last write.)"""
    path = tmp_path / "results.h5"
    code = KILLED_IN_WRITE_FINAL.format(tests=str(Path(__file__).parent), path=str(path), call=call)
    assert subprocess.run([sys.executable, "-c", code]).returncode == -9
    assert status(path)[0] == "running" and load(tmp_path).metrics["round"].tolist() == [1, 2]
    w = ResultsWriter(path, ATTRS, None, resume_at=2, model=MODEL)      # the resume of such a run
    w.append_round(*row(3))
    w.write_final(np.arange(4, dtype=np.float32))
    w.close()
    res = load(tmp_path)
    assert res.attrs["status"] == "finished" and res.metrics["round"].tolist() == [1, 2, 3]
    assert res.final_params.tolist() == [0, 1, 2, 3] and sorted(p.name for p in tmp_path.iterdir()) == ["results.h5"]


def test_disk_full_names_the_file_and_the_space(tmp_path, monkeypatch):
    w = ResultsWriter(tmp_path / "results.h5", ATTRS, np.ones((2, 3), dtype=np.int64))
    w.append_round(*row(1))

    def full():
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(w.file, "flush", full)
    with pytest.raises(HpcflError) as info:
        w.append_round(*row(2))
    msg = str(info.value)
    assert str(tmp_path / "results.h5") in msg and "No space left" in msg and "bytes are free" in msg
    assert "resume" in msg


def test_segments_record_each_start_and_drop_undone_ones(tmp_path):
    path = tmp_path / "results.h5"
    w = ResultsWriter(path, {**ATTRS, "devices": ["cpu"]}, np.ones((2, 3), dtype=np.int64))
    for r in range(1, 6):
        w.append_round(*row(r))
    w.close()
    w = ResultsWriter(path, {**ATTRS, "world_size": 3, "devices": ["cpu"] * 3}, None, resume_at=4)
    w.append_round(*row(5))
    w.close()
    # resumed again from the checkpoint after round 2: the segment that began at round 5 is undone
    w = ResultsWriter(path, {**ATTRS, "world_size": 2, "devices": ["cuda:0", "cuda:1"]}, None, resume_at=2)
    w.close()
    seg = load(tmp_path).segments
    assert [s["start_round"] for s in seg] == [1, 3] and [s["world_size"] for s in seg] == [1, 2]
    # decoded as .attrs decodes them (issue 38: they were JSON text)
    assert seg[1]["devices"] == ["cuda:0", "cuda:1"] and seg[1]["started"].endswith("Z")
    assert isinstance(seg[1]["versions"], dict) and seg[0]["devices"] == ["cpu"]


def test_every_dataset_has_a_unit_and_a_description_and_the_schema_version(tmp_path):
    w = ResultsWriter(tmp_path / "results.h5", ATTRS, np.ones((2, 3), dtype=np.int64), model=MODEL2)
    w.append_round(*row(1))
    w.write_final(np.arange(4, dtype=np.float64))
    w.close()
    seen = []
    with h5py.File(tmp_path / "results.h5", "r") as f:   # plain h5py: a closed file needs no SWMR
        assert f.attrs["schema_version"] == 3
        f.visititems(lambda name, obj: seen.append((name, dict(obj.attrs))) if isinstance(obj, h5py.Dataset) else None)
    assert len(seen) > 20
    assert [n for n, a in seen if not a.get("unit") or not a.get("description")] == []


def test_final_params_keep_the_run_dtype(tmp_path):
    for dtype in (np.float32, np.float64):
        d = tmp_path / np.dtype(dtype).name
        d.mkdir()
        model = FinalModel(["param:w"], [(2,)], dtype, (2,), 2)
        w = ResultsWriter(d / "results.h5", ATTRS, np.ones((2, 3), dtype=np.int64), model=model)
        w.append_round(*row(1))
        x = np.array([1 / 3, 2 / 3], dtype=dtype)
        w.write_final(x)
        w.close()
        r = load(d)
        assert r.final_params.dtype == dtype and r.final_params.tobytes() == x.tobytes()
        assert r.input_shape == (2,) and r.num_classes == 2


def _schema1_file(path, rounds):
    """A results file as hpcfl wrote it before schema 2: rounds from 0, no version, no segments."""
    w = ResultsWriter(path, ATTRS, np.ones((2, 3), dtype=np.int64))
    for r in range(rounds):
        w.append_round(*row(r))
    w.close()
    with h5py.File(path, "r+") as f:
        del f.attrs["schema_version"]
        del f["segments"]


def test_schema1_files_read_and_resume_with_rounds_from_1(tmp_path):
    path = tmp_path / "results.h5"
    _schema1_file(path, 4)                                   # rows 0, 1, 2, 3
    assert load(tmp_path).metrics["round"].tolist() == [1, 2, 3, 4]
    w = ResultsWriter(path, ATTRS, None, resume_at=3)       # keeps the rows of rounds 1..3
    w.append_round(*row(4))
    w.close()
    r = load(tmp_path)
    assert r.metrics["round"].tolist() == [1, 2, 3, 4] and r.clients["round"].tolist() == [1, 1, 2, 2, 3, 3, 4, 4]
    assert r.attrs["schema_version"] == 3 and [s["start_round"] for s in r.segments] == [1, 4]
    with h5py.File(path, "r") as f:   # the converted columns describe themselves as today's
        assert f["metrics/round"].attrs["description"] == METRICS["round"].description
        assert f["clients/round"].attrs["description"] == CLIENT_FIELDS["round"].description


def test_a_live_file_needs_swmr_with_plain_h5py_and_the_reader_just_works(tmp_path):
    w = ResultsWriter(tmp_path / "results.h5", ATTRS, np.ones((2, 3), dtype=np.int64))
    w.append_round(*row(1))
    with h5py.File(tmp_path / "results.h5", "r", swmr=True) as f:     # as docs/results.md says
        assert f["metrics/round"][()].tolist() == [1]
    plain = [sys.executable, "-c", f"import h5py; h5py.File({str(tmp_path / 'results.h5')!r}, 'r')"]
    p = subprocess.run(plain, capture_output=True, text=True)         # another process, as a user's
    assert p.returncode != 0 and "already open for write" in p.stderr
    assert load(tmp_path).metrics["round"].tolist() == [1]
    w.close()
    with h5py.File(tmp_path / "results.h5", "r") as f:                # closed: plain open works
        assert f["metrics/round"][()].tolist() == [1]


def test_print_of_a_loaded_run_is_a_short_summary(tmp_path):
    """print(load(run)) names the run and its quality in a few lines instead of every array.
    Rows r = 1..3 hold the value r in every metric: test accuracy final 3 (round 3), best 3."""
    attrs = {**ATTRS, "config": {"run": {"name": "q", "seed": 4, "rounds": 5}, "algorithm": {"name": "fedavg"},
                                 "data": {"dataset": "digits", "partition": "iid", "num_clients": 5},
                                 "model": {"name": "mlp"}}}
    w = ResultsWriter(tmp_path / "results.h5", attrs, np.ones((2, 3), dtype=np.int64))
    for r in range(1, 4):
        w.append_round(*row(r))
    w.close()
    text = repr(load(tmp_path))
    assert text.splitlines()[:3] == [
        "Results of run 'q' (seed 4): fedavg on digits (iid), 5 clients, model mlp, 1 rank(s)",
        "  running: 3 of 5 rounds",
        "  final test accuracy 3.0000 (round 3), best 3.0000 (round 3)"]
    assert "train_loss, test_accuracy, test_loss" in text and len(text.splitlines()) == 6
    # every array counted once: the total is the names shown plus "N more" (issue 38: "23 ... (22 in all)")
    line = next(ln for ln in text.splitlines() if ln.startswith("  .metrics:"))
    total = int(line.split()[1])
    shown, _, more = line[line.index("(") + 1 : -1].partition(" and ")
    assert total == len(METRICS) and len(shown.split(", ")) + int(more.split()[0]) == total
    assert shown.startswith("round, train_loss")


def test_a_resume_at_the_round_a_segment_began_keeps_that_segment(tmp_path):
    """The run resumed after round 4 began its segment at round 5; its checkpoint after round 5 holds
    that round, so a resume from it keeps the segment (it ran round 5) and starts one at round 6."""
    path = tmp_path / "results.h5"
    w = ResultsWriter(path, ATTRS, np.ones((2, 3), dtype=np.int64))
    for r in range(1, 5):
        w.append_round(*row(r))
    w.close()
    w = ResultsWriter(path, {**ATTRS, "world_size": 2}, None, resume_at=4)
    w.append_round(*row(5))
    w.close()
    w = ResultsWriter(path, {**ATTRS, "world_size": 3}, None, resume_at=5)
    w.close()
    res = load(tmp_path)
    assert [(s["start_round"], s["world_size"]) for s in res.segments] == [(1, 1), (5, 2), (6, 3)]
    assert res.metrics["round"].tolist() == [1, 2, 3, 4, 5]


def test_rounds_are_written_once_the_batch_reaches_its_row_count(tmp_path):
    """batch_rows = 4, two client rows a round: rounds 1-2 are written together when round 2 brings the
    batch to exactly 4 rows, not one round later; round 3 waits for round 4."""
    w = ResultsWriter(tmp_path / "results.h5", ATTRS, np.ones((2, 3), dtype=np.int64), batch_seconds=3600,
                      batch_rows=4)
    seen = []
    for r in range(1, 5):
        w.append_round(*row(r))
        seen.append(load(tmp_path).metrics["round"].tolist())
    w.close()
    assert seen == [[], [1, 2], [1, 2], [1, 2, 3, 4]]
