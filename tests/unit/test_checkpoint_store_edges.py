"""The checkpoint store's edges (hpcfl/io/checkpoint.py, CheckpointStore): the write-error message
word for word, the free-space check at its boundary, the directory fsync after the rename (kept on a
file system that refuses it), what a failed save leaves, what a fresh store's rotation keeps, and
each reason a damaged checkpoint is skipped for, as ``last_skipped`` gives it."""

import errno
import json
import os
import shutil
import stat
from collections import namedtuple

import h5py
import numpy as np
import pytest

from hpcfl.errors import HpcflError
from hpcfl.io import checkpoint, safefs
from hpcfl.io.checkpoint import CheckpointStore, payload_sha256

MANIFEST = {"world_size": 2, "config_sha256": "ab" * 32, "versions": {"hpcfl": "1.2"}}
ARRAYS = {"a": np.arange(4.0), "b": np.arange(3, dtype=np.int32)}   # 32 + 12 bytes
Usage = namedtuple("Usage", "total used free")


def save(store, round=3, arrays=ARRAYS):
    return store.save(round, arrays, meta={"t": 1.5}, manifest=MANIFEST)


def test_a_new_store_keeps_three_and_has_skipped_nothing(tmp_path):
    store = CheckpointStore(tmp_path)
    assert store.keep == 3 and store.last_skipped == []


# ---- the write-error message --------------------------------------------------------------------------

TAIL = ("Free space (or quota) there, lower the number of checkpoints kept, or set the checkpoint directory to a "
        "filesystem with room. Previous checkpoints were left untouched.")


@pytest.mark.parametrize("err, what", [
    (OSError(errno.ENOSPC, "x"), "No space left on device (ENOSPC)"),
    (OSError(4099, "x"), f"{os.strerror(4099)} (errno 4099)"),        # an errno Python has no name for
    (RuntimeError("HDF5: can't write data"), "HDF5: can't write data"),   # HDF5: no errno, the text
    (RuntimeError(), "RuntimeError"),                                     # nothing at all: the type
])
def test_a_write_error_names_round_folder_cause_size_free_space_and_the_fix(tmp_path, monkeypatch, err, what):
    store = CheckpointStore(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(0, 0, 1_234_567_890))
    assert store._write_error(7, err, 2_500_000) == (
        f"cannot write the checkpoint of round 7 to {tmp_path}: {what}. It needs about 2.5 MB (2,500,000 bytes) "
        f"plus a little HDF5 metadata; 1,234.6 MB are free there now. {TAIL}")


def test_a_write_error_without_the_free_space_when_it_cannot_be_read(tmp_path, monkeypatch):
    store = CheckpointStore(tmp_path)

    def refuse(p):
        raise PermissionError(errno.EACCES, "no")
    monkeypatch.setattr(shutil, "disk_usage", refuse)
    assert store._write_error(1, OSError(errno.EIO, "x"), 10) == (
        f"cannot write the checkpoint of round 1 to {tmp_path}: Input/output error (EIO). It needs about 0.0 MB "
        f"(10 bytes) plus a little HDF5 metadata. {TAIL}")


# ---- save ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("spare, fits", [(64 << 10, True), ((64 << 10) - 1, False)])
def test_a_save_needs_its_bytes_plus_64_kib_free(tmp_path, monkeypatch, spare, fits):
    """The arrays' 44 bytes plus 64 KiB for HDF5's own: one byte less is refused before anything is
    written, with the ENOSPC message of this round."""
    monkeypatch.setattr(safefs, "free_bytes", lambda d: 44 + spare)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(0, 0, 0))
    store = CheckpointStore(tmp_path)
    if fits:
        assert save(store).name == "ckpt-00000003.h5"
        return
    with pytest.raises(HpcflError) as info:
        save(store)
    assert str(info.value).startswith(f"cannot write the checkpoint of round 3 to {tmp_path}: No space left on "
                                      "device (ENOSPC). It needs about 0.0 MB (44 bytes)")
    assert list(tmp_path.iterdir()) == []


def test_the_folder_is_fsynced_after_the_rename_even_where_directories_refuse_it(tmp_path, monkeypatch):
    """Some network file systems refuse fsync on a directory (EINVAL): the rename is then as durable
    as they make it, and the save goes on. The directory's fsync comes after the file is in place."""
    events, real_fsync, real_replace = [], os.fsync, os.replace

    def fsync(fd):
        is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
        events.append("fsync dir" if is_dir else "fsync file")
        if is_dir:
            raise OSError(errno.EINVAL, "Invalid argument")
        real_fsync(fd)

    def replace(a, b):
        events.append("rename")
        real_replace(a, b)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    path = save(CheckpointStore(tmp_path))
    assert path.exists() and events[-2:] == ["rename", "fsync dir"] and "fsync file" in events[:-2]


def test_a_write_that_fails_before_its_file_exists_reports_the_write_error(tmp_path, monkeypatch):
    """The clean-up of the temporary file tolerates its absence: the cause is what is reported."""
    def fail(self, tmp, arrays, attrs):
        raise OSError(errno.EIO, "Input/output error")
    monkeypatch.setattr(CheckpointStore, "_write", fail)
    with pytest.raises(HpcflError, match=r"^cannot write the checkpoint of round 3 to .*: Input/output error \(EIO\)"):
        save(CheckpointStore(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_that_does_not_verify_is_deleted_and_said_so(tmp_path, monkeypatch):
    """The file read back does not hold the digest computed while writing (a silent I/O error)."""
    real_write = CheckpointStore._write

    def write(self, tmp, arrays, attrs):
        real_write(self, tmp, arrays, attrs)
        return "0" * 64
    monkeypatch.setattr(CheckpointStore, "_write", write)
    store = CheckpointStore(tmp_path)
    with pytest.raises(HpcflError) as info:
        save(store)
    assert str(info.value) == (
        f"checkpoint {store.path_for(3)} failed verification right after writing (the stored payload_sha256 is "
        f"not the one computed while writing); it was deleted and older checkpoints kept. Check {tmp_path} for "
        f"I/O errors.")
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_gone_before_its_check_is_reported_not_a_crash(tmp_path, monkeypatch):
    """The file vanished between the rename and the read-back (another process, a failing disk):
    the verification failure is reported, not the clean-up's FileNotFoundError."""
    real_read = CheckpointStore._read

    def read(self, path, keep_arrays, **more):
        path.unlink()
        return real_read(self, path, keep_arrays, **more)
    monkeypatch.setattr(CheckpointStore, "_read", read)
    with pytest.raises(HpcflError, match=r"failed verification right after writing \(unreadable: "):
        save(CheckpointStore(tmp_path))


def test_the_manifest_reads_back_as_written(tmp_path):
    """versions as a table, the creation time in UTC, integers as Python ints."""
    store = CheckpointStore(tmp_path)
    save(store)
    got = store.load_latest()
    assert got.manifest["versions"] == {"hpcfl": "1.2"} and got.meta == {"t": 1.5}
    assert got.manifest["created"].endswith("+00:00")
    assert type(got.manifest["world_size"]) is int and type(got.manifest["round"]) is int


def test_a_fresh_stores_rotation_counts_the_older_valid_checkpoints(tmp_path):
    """A store opened on a folder of 4 checkpoints (a restart) verifies them and keeps the newest 3,
    the new one among them; those it deletes it forgets."""
    first = CheckpointStore(tmp_path)
    for r in (1, 2, 3, 4):
        save(first, r)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000002.h5", "ckpt-00000003.h5",
                                                          "ckpt-00000004.h5"]
    assert sorted(p.name for p in first._verified) == ["ckpt-00000002.h5", "ckpt-00000003.h5", "ckpt-00000004.h5"]
    fresh = CheckpointStore(tmp_path)
    save(fresh, 5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-00000003.h5", "ckpt-00000004.h5",
                                                          "ckpt-00000005.h5"]
    assert sorted(p.name for p in fresh._verified) == ["ckpt-00000003.h5", "ckpt-00000004.h5", "ckpt-00000005.h5"]


def test_rotation_tolerates_a_checkpoint_already_gone(tmp_path, monkeypatch):
    """An old checkpoint listed but removed meanwhile (by hand, another process) is not an error."""
    store = CheckpointStore(tmp_path)
    for r in (1, 2, 3):
        save(store, r)
    real_list = CheckpointStore.list
    monkeypatch.setattr(CheckpointStore, "list", lambda self: real_list(self) + [(0, tmp_path / "ckpt-00000000.h5")])
    save(store, 4)
    assert min(p.name for p in tmp_path.iterdir()) == "ckpt-00000002.h5"


# ---- why a checkpoint is skipped -----------------------------------------------------------------------

@pytest.fixture
def good(tmp_path):
    return save(CheckpointStore(tmp_path / "ck"))


def skipped_because(path):
    store = CheckpointStore(path.parent)
    assert store.load_latest() is None
    (where, why), = store.last_skipped
    assert where == path
    return why


def edit(path, change):
    with h5py.File(path, "r+") as f:
        change(f)
    return path


def test_skipped_for_another_format_version(good):
    edit(good, lambda f: f.attrs.__setitem__("format_version", 99))
    assert skipped_because(good) == (f"format_version 99, this hpcfl reads {checkpoint.FORMAT_VERSION} and "
                                     f"{checkpoint.SHARDED_VERSION}")


def test_skipped_when_the_name_and_the_manifest_disagree_on_the_round(good):
    edit(good, lambda f: f.attrs.__setitem__("round", 4))
    assert skipped_because(good) == "the file name says round 3, the manifest round 4"


def test_skipped_without_its_arrays_group(good):
    edit(good, lambda f: f.__delitem__("arrays"))
    assert skipped_because(good) == "no /arrays group"


@pytest.mark.parametrize("make, why", [
    (lambda g: g.create_group("c"), "/arrays/c is not a numeric dataset"),
    (lambda g: g.create_dataset("c", data=np.array(["x"], dtype=h5py.string_dtype())),
     "/arrays/c is not a numeric dataset"),
    (lambda g: g.__setitem__("c", h5py.SoftLink("/arrays/a")), "/arrays/c is a link to another object or file"),
])
def test_skipped_for_a_member_that_is_no_plain_numeric_dataset(good, make, why):
    edit(good, lambda f: make(f["arrays"]))
    assert skipped_because(good) == why


def test_skipped_for_external_storage_with_h5checks_words_without_the_path(good, tmp_path):
    (tmp_path / "outside.bin").write_bytes(bytes(32))
    edit(good, lambda f: f["arrays"].create_dataset("c", shape=(4,), dtype="f8",
                                                    external=[(str(tmp_path / "outside.bin"), 0, 32)]))
    why = skipped_because(good)
    assert str(good) not in why and why.startswith("/arrays/c") and "external" in why, why


def test_skipped_for_a_checksum_mismatch_with_both_digests_cut_to_12(good):
    def change(f):
        f["arrays/a"][0] = 9.0
    edit(good, change)
    with h5py.File(good, "r") as f:
        stored = f.attrs["payload_sha256"]
    computed = payload_sha256({"a": np.array([9.0, 1.0, 2.0, 3.0]), "b": ARRAYS["b"]})
    assert skipped_because(good) == f"checksum mismatch: payload_sha256 {stored[:12]}... stored, " \
                                    f"{computed[:12]}... computed"


def test_skipped_for_a_manifest_that_is_not_json(good):
    edit(good, lambda f: f.attrs.__setitem__("meta", "{bad"))
    try:
        json.loads("{bad")
    except ValueError as e:
        words = str(e)
    assert skipped_because(good) == f"manifest JSON unreadable: {words}"


@pytest.mark.parametrize("cut, kind", [(4000, "truncated"), (None, "unreadable")])
def test_a_file_hdf5_cannot_open_is_skipped_as_truncated_or_unreadable(good, cut, kind):
    data = good.read_bytes()
    good.write_bytes(data[:cut] if cut else b"\x89HDF\r\n\x1a\n" + bytes(len(data) - 8))
    why = skipped_because(good)
    assert why.startswith(f"{kind}: OSError: "), why


# ---- more from the re-run ------------------------------------------------------------------------------

def test_complex_arrays_are_checkpoints_too(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(1, {"z": np.array([1 + 2j, -3j])}, manifest=MANIFEST)
    assert store.load_latest().arrays["z"].tolist() == [1 + 2j, -3j]


def test_sizes_in_the_message_round_to_a_tenth_of_a_megabyte(tmp_path, monkeypatch):
    """1,050,000 bytes are 1.05 MB: "1.1" (one megabyte is 10**6 bytes here, as disks count)."""
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(0, 0, 1_050_000))
    text = CheckpointStore(tmp_path)._write_error(1, OSError(errno.ENOSPC, "x"), 1_050_000)
    assert "It needs about 1.1 MB (1,050,000 bytes)" in text and "; 1.1 MB are free there now." in text


def test_rotation_verifies_the_older_checkpoints_a_block_at_a_time(tmp_path, monkeypatch):
    """Counting the valid ones never loads a checkpoint's arrays whole (a table may exceed memory)."""
    first = CheckpointStore(tmp_path)
    for r in (1, 2):
        save(first, r)
    asked, real_read = [], CheckpointStore._read

    def read(self, path, keep_arrays, **more):
        asked.append((path.name, keep_arrays))
        return real_read(self, path, keep_arrays, **more)
    monkeypatch.setattr(CheckpointStore, "_read", read)
    save(CheckpointStore(tmp_path), 3)
    assert sorted(asked) == [("ckpt-00000001.h5", False), ("ckpt-00000002.h5", False), ("ckpt-00000003.h5", False)]


def test_a_held_store_lists_its_own_folder_even_after_a_swap(tmp_path):
    """The folder moved away and another put at its path: the held store lists the folder it holds."""
    store = CheckpointStore(tmp_path / "ck")
    save(store, 1)
    store.hold()
    (tmp_path / "ck").rename(tmp_path / "moved")
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "ckpt-00000009.h5").write_bytes(b"x")
    assert [(r, p.name) for r, p in store.list()] == [(1, "ckpt-00000001.h5")]


def test_clean_temp_tolerates_a_temporary_file_removed_meanwhile(tmp_path, monkeypatch):
    """Another process (or a second clean-up) removed it between the listing and the unlink."""
    store = CheckpointStore(tmp_path)
    gone = tmp_path / ".ckpt-00000001.h5.tmp-99"
    monkeypatch.setattr(type(tmp_path), "glob", lambda self, pattern: iter([gone]))
    assert store.clean_temp() == [gone]
