"""The end of a run writes results.h5 in place (hpcfl/io/results_final.py, schema 3): no copy, bytes that do
not grow with the file, a kill at each step of the last write leaving a readable file, and files of the
layout before (schema 2: /final added at the end in normal mode) read as before."""

import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcfl.io import reader
from hpcfl.io.results import FinalModel, ResultsWriter, load, status
from hpcfl.state import Field
from test_results_file import ATTRS, row

MODEL = FinalModel(["param:w", "buffer:b"], [(2, 3), (4,)], "float32", (2,), 3)   # 10 values
SCORE = {"s": Field(np.float64, "1", "a score", summary="median")}


def _written() -> int:
    """Bytes this process has passed to write calls so far (Linux: /proc/self/io, wchar)."""
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("wchar")).split()[1])


def _end_of(tmp_path, name, rounds, clients=1000):
    """(bytes the final write and close wrote, file size) for a file of ``rounds`` rounds of ``clients`` rows."""
    path = tmp_path / name / "results.h5"
    path.parent.mkdir()
    w = ResultsWriter(path, ATTRS, np.ones((clients, 3), dtype=np.int64), client_fields=SCORE, model=MODEL,
                      batch_rows=1 << 30, batch_seconds=1e9)
    ids = np.arange(clients)
    for r in range(1, rounds + 1):
        m, c = row(r, ids)
        w.append_round(m, {**c, "s": ids * 0.5 + r})
    w.write_pending()
    inode, size = path.stat().st_ino, path.stat().st_size
    before = _written()
    w.write_final(np.arange(10, dtype=np.float32))
    w.close()
    spent = _written() - before
    assert path.stat().st_ino == inode and sorted(p.name for p in path.parent.iterdir()) == ["results.h5"]
    res = load(path)
    assert res.status == "finished" and res.final_params.tolist() == list(range(10))
    assert res.summaries["s_median"].tolist() == [i * 0.5 + (rounds + 1) / 2 for i in range(clients)]
    return spent, size


def test_the_end_of_a_run_writes_in_place_and_not_with_the_file(tmp_path):
    """4 rounds (0.6 MB) and 200 rounds (16.5 MB) of 1,000 clients: the end writes the same few KB into the same
    inode (before schema 3 it wrote a copy: the file's size again)."""
    small, small_size = _end_of(tmp_path, "small", 4)
    big, big_size = _end_of(tmp_path, "big", 200)
    assert big_size > 25 * small_size and big_size > 14_000_000
    print(f"end of run: {small:,} bytes written (file {small_size:,}), {big:,} (file {big_size:,})")
    assert small < 64 << 10 and big < 64 << 10, (small, big)
    assert abs(big - small) < 8 << 10, (small, big)


KILLED = """
import os, signal, sys
import numpy as np
sys.path.insert(0, {tests!r})
from test_results_end import MODEL, SCORE
from test_results_file import ATTRS, row
from hpcfl.io import results_final
from hpcfl.io.results import ResultsWriter
from hpcfl.algorithms.gift import TAU_FIELDS
w = ResultsWriter({path!r}, ATTRS, np.ones((3, 3), dtype=np.int64), client_fields=SCORE, model=MODEL,
                  metric_fields=TAU_FIELDS)
for r in (1, 2, 3):
    m, c = row(r, (0, 2))
    m = {{**m, **{{k: 0 for k in TAU_FIELDS}}, "tau_used": 4, "tau_next": 4 - (r == 2), "tau_event": 6}}
    w.append_round(m, {{**c, "s": c["client"] * 1.0}})
calls = {{"flush": 0, "fsync": 0}}
kind, at = {kill!r}

def counted(name, real):
    def call(*a):
        calls[name] += 1
        if (name, calls[name]) == (kind, at):
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*a)
    return call
w.file.flush = counted("flush", w.file.flush)
results_final.os.fsync = counted("fsync", os.fsync)
w.{call}
if kind == "close":
    os.kill(os.getpid(), signal.SIGKILL)   # after every write, before the file is closed
"""


@pytest.mark.parametrize("call, final", [("write_final(np.arange(10, dtype=np.float32))", "finished"),
                                         ("mark_diverged(3)", "diverged")])
@pytest.mark.parametrize("kill, ended", [(("flush", 1), False),   # the data written, not flushed
                                         (("fsync", 1), False),   # the data flushed, status not changed
                                         (("flush", 2), False),   # status changed in memory, not flushed
                                         (("fsync", 2), True),    # status flushed, not fsynced
                                         (("close", 0), True)])   # all written, the file not closed
def test_a_kill_at_each_step_of_the_last_write_leaves_a_readable_file(tmp_path, call, final, kill, ended):
    """Killed anywhere in the last write the file is a killed SWMR writer's: every round reads, and the
    status is "running" (the run resumes and writes its end again) or the end is whole."""
    path = tmp_path / "results.h5"
    code = KILLED.format(tests=str(Path(__file__).parent), path=str(path), call=call, kill=kill)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == -9, p.stderr
    res = load(path)
    assert res.metrics["round"].tolist() == [1, 2, 3] and res.clients["client"].tolist() == [0, 2] * 3
    assert status(path)[0] == (final if ended else "running") and sorted(os.listdir(tmp_path)) == ["results.h5"]
    if ended and final == "finished":
        median = res.summaries["s_median"]   # client 1 never took part: NaN
        assert res.final_params.tolist() == list(range(10)) and median[[0, 2]].tolist() == [0, 2]
        assert np.isnan(median[1])
        assert res.events.tolist() == [(2, 4, 3, b"afl")]
    elif ended:
        assert reader.diverged_round(path) == 3 and res.final_params is None
    else:
        assert res.final_params is None and res.summaries == {} and res.events is None
        assert reader.diverged_round(path) is None
        from hpcfl.algorithms.gift import TAU_FIELDS
        w = ResultsWriter(path, ATTRS, None, resume_at=3, client_fields=SCORE, model=MODEL, metric_fields=TAU_FIELDS)
        w.write_final(np.arange(10, dtype=np.float32))   # the resumed run's end
        w.close()
        assert load(path).final_params.tolist() == list(range(10)) and status(path)[0] == "finished"


def _schema2_file(path: Path, end: str | None) -> None:
    """A results file as hpcfl wrote it with schema 2: status a variable-length string, /final, /clients_summary
    and the diverged attributes added at the end (then in normal mode, in a copy renamed over the file)."""
    w = ResultsWriter(path, ATTRS, np.ones((2, 3), dtype=np.int64))
    for r in (1, 2):
        w.append_round(*row(r))
    w.close()
    with h5py.File(path, "r+") as f:
        for k in ("status", "diverged", "diverged_round"):
            del f.attrs[k]
        f.attrs["schema_version"] = 2
        f.attrs["status"] = "running" if end is None else end
        if end == "finished":
            f.create_dataset("final/params", data=np.arange(4, dtype=np.float32))
            f.create_dataset("final/param_names", data=np.array(["param:w"], dtype=h5py.string_dtype()))
            f["final"].attrs["shapes"] = "[[2, 2]]"
            f.create_dataset("clients_summary/s_median", data=np.array([0.5, 1.5]))
        elif end == "diverged":
            f.attrs["diverged"], f.attrs["diverged_round"] = True, 2


@pytest.mark.parametrize("end", [None, "finished", "diverged"])
def test_files_of_the_layout_before_read_as_before(tmp_path, end):
    path = tmp_path / "results.h5"
    _schema2_file(path, end)
    with h5py.File(path, "r") as f:
        assert isinstance(f.attrs["status"], str) and "final" not in f if end != "finished" else "final" in f
    res = load(path)
    assert res.status == (end or "running") and status(path)[0] == (end or "running")
    assert res.metrics["round"].tolist() == [1, 2]
    if end == "finished":
        assert res.state_dict()["w"].tolist() == [[0, 1], [2, 3]] and res.summaries["s_median"].tolist() == [0.5, 1.5]
    else:
        assert res.final_params is None and res.summaries == {}
    assert reader.diverged_round(path) == (2 if end == "diverged" else None)
    if end != "diverged":   # a resume (more rounds after finished) rebuilds it in today's layout
        w = ResultsWriter(path, ATTRS, None, resume_at=2, model=FinalModel(["param:w"], [(2, 2)], "float32"))
        w.append_round(*row(3))
        w.write_final(np.arange(4, dtype=np.float32) + 1)
        w.close()
        res = load(path)
        assert res.attrs["schema_version"] == 3 and res.metrics["round"].tolist() == [1, 2, 3]
        assert res.state_dict()["w"].tolist() == [[1, 2], [3, 4]] and status(path)[0] == "finished"


def test_a_final_model_that_does_not_fit_its_layout_is_refused(tmp_path):
    w = ResultsWriter(tmp_path / "results.h5", ATTRS, np.ones((2, 3), dtype=np.int64), model=MODEL)
    w.append_round(*row(1))
    with pytest.raises(Exception, match=r"the final model is float64 \(10,\), and /final/params was created for "
                                        r"float32 \(10,\)"):
        w.write_final(np.zeros(10))
    w.close()
    assert status(tmp_path / "results.h5")[0] == "running"
