"""Run-directory rules: writable-path checks, checkpoint-directory ownership, set-aside;
and the wall-clock checkpoint decision of the round boundary."""

import json
import time

import pytest

from hpcfl.control import RunControl
from hpcfl.config import GuardSection
from hpcfl.errors import HpcflError
from hpcfl.io import rundir


def test_check_writable_creates_nothing_and_names_the_path(tmp_path):
    rundir.check_writable(tmp_path / "a" / "b", "--out", "fix it")
    assert list(tmp_path.iterdir()) == []                       # the probe file is gone, nothing made
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(HpcflError, match=rf"--out {f} is a file, not a directory; fix it"):
        rundir.check_writable(f, "--out", "fix it")
    with pytest.raises(HpcflError, match=rf"--out {f}/deeper: {f} is a file"):
        rundir.check_writable(f / "deeper", "--out", "fix it")


def test_ownership_marker(tmp_path):
    d, mine, other = tmp_path / "ck", tmp_path / "a" / "results.h5", tmp_path / "b" / "results.h5"
    rundir.check_owner(d, None, mine)                           # no directory, no marker: free
    rundir.claim(d, "id-a", mine)
    marker = json.loads((d / rundir.MARKER).read_text())
    assert marker["run_id"] == "id-a" and marker["results"] == str(mine.resolve())
    rundir.check_owner(d, "id-a", mine)                         # the owner resumes
    rundir.check_owner(d, None, mine)                           # the same --out starts over
    with pytest.raises(HpcflError, match="belongs to another run"):
        rundir.check_owner(d, "id-b", other)
    with pytest.raises(HpcflError, match="belongs to another run"):
        rundir.check_owner(d, None, other)
    with pytest.raises(HpcflError, match="belongs to another run"):
        rundir.check_owner(d, "id-b", mine)                     # another run's id in the same place
    (d / rundir.MARKER).write_text("{not json")
    with pytest.raises(HpcflError, match="cannot be read"):
        rundir.check_owner(d, "id-a", mine)


def test_set_aside_keeps_every_file(tmp_path):
    out, ck = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    ck.mkdir()
    (out / "results.h5").write_bytes(b"R")
    (ck / "ckpt-00000002.h5").write_bytes(b"C")
    (ck / "unrelated.txt").write_text("not ours")
    aside = rundir.set_aside(out, [out / "results.h5", ck / "ckpt-00000002.h5", ck / "missing.h5"])
    assert aside.parent == out and aside.name.startswith(rundir.ASIDE_PREFIX)
    assert (aside / "results.h5").read_bytes() == b"R"
    assert (aside / "checkpoints" / "ckpt-00000002.h5").read_bytes() == b"C"
    assert not (out / "results.h5").exists() and (ck / "unrelated.txt").exists()
    assert rundir.set_aside(out, [out / "results.h5"]) is None


class FakeComm:
    """allgather over a fixed set of other ranks' (stop flag, due) pairs."""

    rank = 0

    def __init__(self, others):
        self.others = others

    def allgather(self, mine):
        return [mine] + self.others


def test_boundary_takes_rank_0s_clock_and_any_ranks_stop():
    c = RunControl(FakeComm([(None, True)]), GuardSection(), 0.0, checkpoint_minutes=10)
    assert c.boundary() == (None, False)        # rank 1 thinks it is due; only rank 0's clock counts
    c.last_checkpoint -= 601
    assert c.boundary() == (None, True)
    c.checkpointed()
    assert c.boundary() == (None, False)
    c = RunControl(FakeComm([("SIGTERM", False)]), GuardSection(), 0.0, checkpoint_minutes=0)
    c.last_checkpoint = time.monotonic() - 1e6
    assert c.boundary() == ("SIGTERM", False)   # 0 minutes: the clock never triggers
