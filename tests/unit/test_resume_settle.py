"""Which checkpoint a resume starts from (hpcfl/engine/resume.py: problems, settle, check_job):
every message and warning word for word, the older checkpoints asked for without their arrays,
each older one checked against the job, and a server array that was not started yet checked for
its type only.
"""

import hashlib
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from hpcfl import config
from hpcfl.engine import resume
from hpcfl.errors import HpcflError
from hpcfl.state import ClientTable, ServerArray

# ---- problems: the arrays against the job ----------------------------------------------------------


def job_state(started=None):
    """A job of a 4-float model, a (3 clients, 2) float64 table and a server array "g" that is
    ``started`` (an array) or not yet (None)."""
    table = ClientTable("c", 2, get=lambda: np.zeros((3, 2)), set=lambda v: None)
    g = ServerArray("g", get=lambda: started, set=lambda v: None)
    return SimpleNamespace(model=SimpleNamespace(numpy=lambda: np.zeros(4, np.float32)), owner=np.zeros(3, np.int64),
                           items=[table, g])


@pytest.fixture(autouse=True)
def items(monkeypatch):
    monkeypatch.setattr(resume, "state_items", lambda s: s.items)


FITS = {"model": ((4,), np.float32), "clients.c": ((3, 2), np.float64)}


@pytest.mark.parametrize("dtype, why", [
    (None, None),                  # not in the checkpoint: it was not started there either
    (np.float64, None), (np.int32, None), (np.bool_, None),
    (np.dtype("S4"), "its 'server.g' is not a real array"),
    (np.dtype("O"), "its 'server.g' is not a real array"),
    (np.complex128, "its 'server.g' is not a real array"),
])
def test_a_server_array_not_started_is_checked_for_a_real_type_only(dtype, why):
    spec = dict(FITS, **({} if dtype is None else {"server.g": ((7,), dtype)}))
    assert resume.problems(job_state(), spec.get) == why


def test_every_problem_is_named_and_joined():
    spec = {"model": ((5,), np.float32), "server.g": ((2,), np.dtype("S2"))}
    assert resume.problems(job_state(), spec.get) == (
        "its 'model' is float32 of shape (5,), this job's is float32 of shape (4,); "
        "it has no array 'clients.c'; its 'server.g' is not a real array")


# ---- settle: the newest checkpoint that fits --------------------------------------------------------

def ckpt(round, shapes, meta=None, sha=None, folder=Path("/runs/a")):
    return SimpleNamespace(round=round, shapes=shapes, path=folder / f"ckpt-{round:08d}.h5", meta=meta or {},
                           manifest={"config_sha256": sha})


class Store:
    """Hands out ``older`` checkpoints one by one, recording how it was asked; skips what ``skipped`` says."""

    def __init__(self, older, skipped=()):
        self.older, self.asked, self.last_skipped, self.skipped = list(older), [], [], list(skipped)

    def load_latest(self, keep_arrays=True, below=None):
        self.asked.append((keep_arrays, below))
        self.last_skipped = self.skipped.pop(0) if self.skipped else []
        return self.older.pop(0) if self.older else None


@pytest.fixture
def fine(monkeypatch):
    """check_job passes every checkpoint; the calls are recorded."""
    calls = []
    monkeypatch.setattr(resume, "check_job", lambda loaded, cfg: calls.append((loaded.round, cfg)))
    return calls


BAD = {"model": ((5,), np.float32), "clients.c": ((3, 2), np.float64)}
WHY = "its 'model' is float32 of shape (5,), this job's is float32 of shape (4,)"


def test_the_newest_that_fits_is_taken_without_a_word(fine):
    store, newest = Store([]), ckpt(5, FITS)
    assert resume.settle(job_state(), store, newest, "cfg") == (newest, [])
    assert store.asked == [] and fine == []


def test_one_that_does_not_fit_is_passed_over_for_an_older_one_asked_for_without_arrays(fine):
    older = ckpt(3, FITS)
    store = Store([older], skipped=[[(Path("/runs/a/ckpt-00000004.h5"), "checksum differs")]])
    got, warnings = resume.settle(job_state(), store, ckpt(5, BAD), "cfg")
    assert got is older and store.asked == [(False, 5)] and fine == [(3, "cfg")]
    assert warnings == [f"warning: checkpoint /runs/a/ckpt-00000005.h5 does not fit this job and is passed over: {WHY}",
                        "warning: checkpoint ckpt-00000004.h5 skipped: checksum differs",
                        "warning: resuming from the older ckpt-00000003.h5 instead"]


def test_when_none_fits_the_newest_is_named_with_the_fix(fine):
    store = Store([ckpt(3, BAD)])
    with pytest.raises(HpcflError) as info:
        resume.settle(job_state(), store, ckpt(5, BAD), "cfg")
    assert str(info.value) == (
        f"checkpoint /runs/a/ckpt-00000005.h5 does not fit this job ({WHY}) and no older checkpoint in /runs/a "
        "does: it was not written by this version of hpcfl for this job. Move the checkpoint(s) away to start "
        "this run over from round 1, or pass --force to set the old run aside and start over")
    assert store.asked == [(False, 5), (False, 3)]


# ---- check_job: the checkpoint's job against this one ------------------------------------------------

@pytest.fixture
def cfg(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text("[run]\nseed = 1\nrounds = 4\n[data]\ndataset = \"digits\"\n[model]\nname = \"mlp\"\n")
    return lambda *sets: config.load(job, list(sets))


def written_by(text, folder=Path("/runs/a")):
    return ckpt(2, FITS, meta={"config": text}, sha=hashlib.sha256(text.encode()).hexdigest(), folder=folder)


FIX = ("it is not this run's: remove it from /runs/a, choose another --out, or pass --force to set the old run "
       "aside and start over")


def test_an_older_checkpoint_of_another_job_stops_the_resume(cfg):
    """settle checks each older checkpoint against the job before taking it."""
    other = written_by(cfg("run.seed=2", "algorithm.lr=0.5").to_json())
    with pytest.raises(HpcflError) as info:
        resume.settle(job_state(), Store([other]), ckpt(5, BAD), cfg())
    assert str(info.value) == ("checkpoint /runs/a/ckpt-00000002.h5 was written by a different job (it differs in "
                               f"algorithm.lr, run.seed); {FIX}")
    mine = written_by(cfg("run.rounds=9").to_json())            # a safe change: taken
    assert resume.settle(job_state(), Store([mine]), ckpt(5, BAD), cfg())[0] is mine


def test_a_checkpoints_job_that_is_not_json_is_refused_with_the_fix(cfg):
    with pytest.raises(HpcflError) as info:
        resume.check_job(written_by("{not json"), cfg())
    assert str(info.value) == f"checkpoint /runs/a/ckpt-00000002.h5 holds a job that is not valid JSON; {FIX}"


def test_a_checkpoint_whose_job_and_hash_differ_is_refused_with_the_fix(cfg):
    bad = written_by(cfg().to_json())
    bad.manifest["config_sha256"] = "0" * 64
    with pytest.raises(HpcflError) as info:
        resume.check_job(bad, cfg())
    assert str(info.value) == ("checkpoint /runs/a/ckpt-00000002.h5 does not record the job it belongs to "
                               f"consistently (its config and config_sha256 differ); {FIX}")
