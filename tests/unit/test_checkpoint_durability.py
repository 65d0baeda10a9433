"""What a checkpoint save owes a crash and a resume (hpcfl.io.checkpoint, issue 48): the new name is
put on disk by an fsync of the folder after the rename, the file read back must hold the payload that
was hashed while writing, and the fallback past a checkpoint that does not fit only ever goes to
older ones (``load_latest(below=)``, :func:`hpcfl.engine.resume.settle`)."""

import os
import stat
from pathlib import Path

import numpy as np
import pytest

from hpcfl.errors import HpcflError
from hpcfl.io.checkpoint import CheckpointStore, payload_sha256

MANIFEST = {"world_size": 1, "config_sha256": "d" * 64, "versions": {}}


def save(store, rnd, value=None):
    return store.save(rnd, {"x": np.full(4, float(rnd if value is None else value))}, manifest=dict(MANIFEST))


def record_renames_and_fsyncs(monkeypatch) -> list:
    """Log every ``os.replace`` (the new name) and ``os.fsync`` (folder or file, and its inode), in order."""
    events = []
    real_replace, real_fsync = os.replace, os.fsync

    def replace(src, dst, *a, **k):
        events.append(("replace", Path(dst).name))
        return real_replace(src, dst, *a, **k)

    def fsync(fd):
        st = os.fstat(fd)
        events.append(("fsync", "folder" if stat.S_ISDIR(st.st_mode) else "file", st.st_ino))
        return real_fsync(fd)

    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "fsync", fsync)
    return events


# ------------------------------------------------------------------ the folder's fsync after the rename
@pytest.mark.parametrize("held", [False, True])
def test_the_folder_is_fsynced_after_the_rename_so_the_new_name_survives_a_crash(tmp_path, monkeypatch, held):
    """The file's bytes are fsynced before the rename; the rename itself is only durable once the
    folder holding it is fsynced after it (through the held descriptor for a live run's folder)."""
    store = CheckpointStore(tmp_path / "ck")
    if held:
        store.hold()
    save(store, 1)
    events = record_renames_and_fsyncs(monkeypatch)
    path = save(store, 2)
    file_ino, folder_ino = path.stat().st_ino, (tmp_path / "ck").stat().st_ino
    assert events == [("fsync", "file", file_ino),      # flushed HDF5 data, through its descriptor
                      ("fsync", "file", file_ino),      # what closing the file wrote
                      ("replace", "ckpt-00000002.h5"),
                      ("fsync", "folder", folder_ino)]  # the new name, last


# ------------------------------------------------------------------ the read-back compares the digest
def test_a_file_that_verifies_on_its_own_but_holds_other_arrays_is_deleted(tmp_path, monkeypatch):
    """The file at the final name checks out against its own stored checksum, but that is not the
    checksum of the arrays the caller gave (another writer's file, a misdirected write): the save
    fails and the file goes, rather than a restart trusting the wrong state."""
    store = CheckpointStore(tmp_path)
    save(store, 1)
    real = CheckpointStore._write

    def write_other_arrays(self, tmp, arrays, attrs):
        real(self, tmp, {"x": np.full(4, -1.0)}, attrs)   # a whole, self-consistent file of other arrays
        return payload_sha256(arrays)                     # the digest of what was given

    monkeypatch.setattr(CheckpointStore, "_write", write_other_arrays)
    with pytest.raises(HpcflError, match="failed verification right after writing .*payload_sha256 is not the one "
                                         "computed while writing"):
        save(store, 2)
    assert store.list() == [(1, store.path_for(1))]
    assert store.load_latest().arrays["x"].tolist() == [1.0] * 4


# ------------------------------------------------------------------ load_latest(below=) and the fallback
def test_below_gives_only_older_checkpoints_never_the_round_itself(tmp_path):
    store = CheckpointStore(tmp_path, keep=5)
    for r in (1, 2, 3, 4):
        save(store, r)
    assert store.load_latest(below=4).round == 3
    assert store.load_latest(below=3).round == 2
    assert store.load_latest(below=2).round == 1
    assert store.load_latest(below=1) is None
    assert store.load_latest(below=99).round == 4


def test_settle_passes_over_each_checkpoint_that_does_not_fit_once_then_stops(tmp_path, monkeypatch):
    """None of rounds 1-3 fits the job: settle asks for each older one once (below=3, 2, 1) and gives
    up naming the newest. Were ``below`` to return the round itself it would ask for the same file
    forever; the spy stops it after 10 calls so that such a regression fails at once."""
    from hpcfl.engine import resume

    store = CheckpointStore(tmp_path, keep=5)
    for r in (1, 2, 3):
        save(store, r)
    monkeypatch.setattr(resume, "problems", lambda s, spec: "its 'model' is the wrong shape")
    monkeypatch.setattr(resume, "check_job", lambda loaded, cfg: None)
    asked = []
    real = store.load_latest

    def load_latest(**kw):
        asked.append(kw["below"])
        assert len(asked) <= 10, f"settle keeps asking for the same checkpoint: below={asked}"
        return real(**kw)

    store.load_latest = load_latest
    with pytest.raises(HpcflError, match=r"ckpt-00000003\.h5 does not fit this job \(its 'model' is the wrong "
                                         r"shape\) and no older checkpoint"):
        resume.settle(None, store, real(keep_arrays=False), None)
    assert asked == [3, 2, 1]
