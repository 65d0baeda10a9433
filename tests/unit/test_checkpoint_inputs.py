"""What a checkpoint accepts and how its bytes are laid out and read back (hpcfl/io/ckptfile.py,
hpcfl/io/ckptblocks.py), and the rounds a resume checks (hpcfl/io/resume_check.py): round 0 and the
names refused, lists taken as arrays, the manifest's JSON canonical, the payload digest's byte
format pinned (a checkpoint written now must verify in the next version), blocks sized by the
row's own dtype, the arrays read back by name, and the job's rounds read from a checkpoint."""

import hashlib
import json
import os
from pathlib import Path
from types import SimpleNamespace

import h5py
import numpy as np
import pytest
from test_results_file import ATTRS, row

from hpcfl.errors import HpcflError
from hpcfl.io import ckptblocks, ckptfile, resume_check
from hpcfl.io.checkpoint import CheckpointStore, open_loaded, payload_sha256
from hpcfl.io.ckptblocks import DictArrays, row_blocks, row_bytes
from hpcfl.io.results import ResultsWriter

MANIFEST = {"world_size": 1, "config_sha256": "ab" * 32, "versions": {}}


# ---- what save takes ------------------------------------------------------------------------------------

def test_round_0_is_a_checkpoint_and_minus_1_is_refused(tmp_path):
    store = CheckpointStore(tmp_path)
    assert store.save(0, {"a": np.zeros(2)}, manifest=MANIFEST).name == "ckpt-00000000.h5"
    with pytest.raises(ValueError, match=r"^round must be an integer >= 0 \(the number of completed rounds\), "
                                         r"found -1$"):
        store.save(-1, {"a": np.zeros(2)}, manifest=MANIFEST)


@pytest.mark.parametrize("name", ["", ".", "..", "a/b"])
def test_names_that_are_no_hdf5_member_are_refused(tmp_path, name):
    with pytest.raises(ValueError, match=rf"^array name {name!r} is not allowed: use a non-empty string without '/'$"):
        CheckpointStore(tmp_path).save(1, {name: np.zeros(2)}, manifest=MANIFEST)


def test_a_list_is_stored_as_the_array_it_makes(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(1, {"a": [1.5, 2.5]}, manifest=MANIFEST)
    got = store.load_latest().arrays["a"]
    assert got.dtype == np.float64 and got.tolist() == [1.5, 2.5]


def test_objects_are_refused_never_pickled(tmp_path):
    with pytest.raises(TypeError, match=r"^array 'a' has dtype object: checkpoints hold bool/int/uint/float/complex "
                                        r"arrays only and never pickle objects$"):
        CheckpointStore(tmp_path).save(1, {"a": np.array([{}], dtype=object)}, manifest=MANIFEST)
    with pytest.raises(TypeError, match=r"^object is not JSON serialisable; store arrays in `arrays`, not "
                                        r"meta/manifest$"):
        CheckpointStore(tmp_path).save(1, {"a": np.zeros(1)}, meta={"x": object()}, manifest=MANIFEST)


def test_the_manifests_json_is_canonical(tmp_path):
    """Keys sorted: the same meta gives the same bytes whatever order it was built in."""
    path = CheckpointStore(tmp_path).save(1, {"a": np.zeros(1)}, meta={"b": 2, "a": 1},
                                          manifest={**MANIFEST, "extra": {"z": 0, "y": 1}})
    with h5py.File(path, "r") as f:
        assert f.attrs["meta"] == '{"a": 1, "b": 2}' and f.attrs["extra"] == '{"y": 1, "z": 0}'


def test_locking_back_on_with_nothing_set_is_fine(monkeypatch):
    monkeypatch.delenv("HDF5_USE_FILE_LOCKING", raising=False)
    ckptfile.configure_locking(True)
    assert "HDF5_USE_FILE_LOCKING" not in os.environ
    ckptfile.configure_locking(False)
    assert os.environ["HDF5_USE_FILE_LOCKING"] == "FALSE"
    ckptfile.configure_locking(True)
    assert "HDF5_USE_FILE_LOCKING" not in os.environ


# ---- the bytes and the blocks ---------------------------------------------------------------------------

def test_the_payload_digest_is_a_header_line_then_the_raw_bytes_per_array_in_name_order():
    a, b = np.arange(3, dtype="<f8"), np.array([[1, 2]], dtype="<i4")
    expected = hashlib.sha256(b'["a", "<f8", [3]]\n' + a.tobytes() + b'["b", "<i4", [1, 2]]\n' + b.tobytes())
    assert payload_sha256({"b": b, "a": a}) == expected.hexdigest()


def test_a_rows_bytes_are_its_own_dtypes_and_blocks_hold_whole_rows():
    assert row_bytes((5, 3), np.float32) == 12 and row_bytes((5,), np.int16) == 2 and row_bytes((5, 0), "f8") == 0
    assert row_blocks(5, 1, 4) == [(0, 4), (4, 5)]        # 1-byte rows: 4 to a 4-byte block


def test_a_checkpoints_arrays_read_back_by_name_whole_or_by_rows(tmp_path):
    table = np.arange(12.0).reshape(4, 3)
    store = CheckpointStore(tmp_path)
    store.save(2, {"t": table, "m": np.arange(2, dtype=np.int32)}, manifest=MANIFEST)
    loaded = store.load_latest(keep_arrays=False)
    for src in (open_loaded(loaded), DictArrays({"t": table, "m": np.arange(2, dtype=np.int32)})):
        try:
            assert src.array("m").tolist() == [0, 1] and src.array("t").tolist() == table.tolist()
            assert src.block("t", 1, 3).tolist() == table[1:3].tolist()
            assert src.spec("nope") is None and tuple(src.spec("t")[0]) == (4, 3)
        finally:
            src.close()


def test_a_checkpoint_changed_after_its_check_is_not_read(tmp_path):
    store = CheckpointStore(tmp_path)
    path = store.save(2, {"t": np.zeros(4)}, manifest=MANIFEST)
    loaded = store.load_latest(keep_arrays=False)
    os.utime(path, ns=(0, 0))
    with pytest.raises(HpcflError) as info:
        open_loaded(loaded)
    assert str(info.value) == (f"cannot read checkpoint {path}: it changed since it was verified; run the same "
                               "command again to resume from the newest valid checkpoint")


def test_the_block_budget_is_the_modules_unless_given(monkeypatch):
    monkeypatch.setattr(ckptblocks, "BLOCK_BYTES", 24)
    assert row_blocks(5, 8) == [(0, 3), (3, 5)] and row_blocks(5, 8, 16) == [(0, 2), (2, 4), (4, 5)]


# ---- the rounds a resume checks ------------------------------------------------------------------------

@pytest.mark.parametrize("config, rounds", [
    (json.dumps({"run": {"rounds": 6}}), 6),
    (None, None), ("{not json", None), (json.dumps({"data": {}}), None), (json.dumps({"run": {}}), None),
    (json.dumps({"run": {"rounds": True}}), None), (json.dumps({"run": {"rounds": "6"}}), None),
    (json.dumps({"run": {"rounds": 6.0}}), None),
])
def test_the_jobs_rounds_as_a_checkpoint_records_them(config, rounds):
    meta = {} if config is None else {"config": config}
    assert resume_check.job_rounds_of(SimpleNamespace(meta=meta)) == rounds


def results_with(tmp_path, rounds) -> Path:
    path = tmp_path / "results.h5"
    w = ResultsWriter(path, ATTRS, np.ones((2, 3), dtype=np.int64))
    for r in rounds:
        w.append_round(*row(r))
    w.close()
    return path


def test_the_rounds_are_read_from_the_results_file_when_not_given(tmp_path):
    path = results_with(tmp_path, (1, 2))
    ckpt = tmp_path / "checkpoints" / "ckpt-00000003.h5"
    resume_check.check(path, ckpt.with_name("ckpt-00000002.h5"), 2, 6, 6)     # whole: nothing said
    with pytest.raises(HpcflError) as info:
        resume_check.check(path, ckpt, 3, 6, 6)
    assert str(info.value) == (
        f"{path} holds rounds 1-2 but checkpoint {ckpt} was written after round 3: results.h5 is behind its "
        f"checkpoint (rounds 3 are missing; an older copy put back, or a file system that lost its end), and "
        f"resuming would finish with those rounds missing. Put back the results.h5 written with that checkpoint, "
        f"or remove the checkpoints after round 2 from {ckpt.parent} so that the run resumes from one the file "
        f"covers, or pass --force to set the old run aside and start over")


def test_a_stored_table_is_hashed_in_blocks_of_its_own_rows_bytes(tmp_path, monkeypatch):
    """Verifying a float32 (6, 2) table with 16-byte blocks reads 2 rows (8 bytes each) at a time."""
    monkeypatch.setattr(ckptblocks, "BLOCK_BYTES", 16)
    store = CheckpointStore(tmp_path)
    store.save(1, {"t": np.arange(12, dtype=np.float32).reshape(6, 2)}, manifest=MANIFEST)
    asked, real = [], ckptblocks.hash_bytes
    monkeypatch.setattr(ckptblocks, "hash_bytes", lambda h, rows: (asked.append(np.shape(rows)), real(h, rows)))
    assert store.load_latest(keep_arrays=False) is not None
    assert asked == [(2, 2), (2, 2), (2, 2)]
