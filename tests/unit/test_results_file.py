"""results.h5 writer: SWMR reads while writing, resume trimming, disk-full message."""

import errno

import numpy as np
import pytest

from hpcfl.errors import HpcflError
from hpcfl.io.results import CLIENT_FIELDS, METRICS, ResultsWriter, load, status

ATTRS = {"config": {"run": {"rounds": 3}}, "config_sha256": "x", "versions": {"hpcfl": "t"}, "world_size": 1,
         "devices": ["cpu"], "seed": 0}


def row(r, clients=(1, 4)):
    m = {k: float(r) for k in METRICS}
    m["round"] = r
    c = {k: np.full(len(clients), r) for k in CLIENT_FIELDS}
    c["client"] = np.array(clients)
    return m, c


def test_reader_sees_flushed_rounds_while_the_writer_is_open(tmp_path):
    w = ResultsWriter(tmp_path / "results.h5", ATTRS, np.ones((2, 3), dtype=np.int64))
    for r in range(3):
        w.append_round(*row(r))
        seen = load(tmp_path)                       # SWMR read of an open file
        assert seen.metrics["round"].tolist() == list(range(r + 1))
        assert seen.clients["client"].tolist() == [1, 4] * (r + 1)
    assert status(tmp_path / "results.h5")[0] == "running"
    w.write_final(np.arange(4, dtype=np.float32), ["param:w"], [(2, 2)])
    w.close()
    res = load(tmp_path)
    assert res.attrs["status"] == "finished" and res.state_dict()["w"].tolist() == [[0, 1], [2, 3]]


def test_resume_trims_rows_past_the_checkpoint(tmp_path):
    w = ResultsWriter(tmp_path / "results.h5", ATTRS, np.ones((2, 3), dtype=np.int64))
    for r in range(5):
        w.append_round(*row(r))
    w.close()
    w = ResultsWriter(tmp_path / "results.h5", {**ATTRS, "world_size": 2}, None, resume_at=3)
    res = load(tmp_path)
    assert res.metrics["round"].tolist() == [0, 1, 2] and res.clients["round"].tolist() == [0, 0, 1, 1, 2, 2]
    assert res.attrs["world_size"] == 2 and res.attrs["resumed_at_round"] == 3
    w.append_round(*row(3))
    w.close()
    assert load(tmp_path).metrics["round"].tolist() == [0, 1, 2, 3]


def test_disk_full_names_the_file_and_the_space(tmp_path, monkeypatch):
    w = ResultsWriter(tmp_path / "results.h5", ATTRS, np.ones((2, 3), dtype=np.int64))
    w.append_round(*row(0))

    def full():
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(w.file, "flush", full)
    with pytest.raises(HpcflError) as info:
        w.append_round(*row(1))
    msg = str(info.value)
    assert str(tmp_path / "results.h5") in msg and "No space left" in msg and "bytes are free" in msg
    assert "resume" in msg
