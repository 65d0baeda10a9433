"""Issue 37.2: a live run's checkpoint folder is held open. Swapped for a link to (or replaced by) another
run's folder, the next save stops with DirectoryMoved naming where the run's folder went, and writes to
or deletes from neither; rotation never deletes a checkpoint the store did not write or find at hold()."""

import hashlib
import os
import shutil

import numpy as np
import pytest

from hpcfl.errors import HpcflError
from hpcfl.io.checkpoint import CheckpointStore
from hpcfl.io.heldir import DirectoryMoved

MANIFEST = {"world_size": 1, "config_sha256": "c" * 64, "versions": {}}


def save(store, rnd):
    return store.save(rnd, {"x": np.full(5, float(rnd))}, manifest=dict(MANIFEST))


def snapshot(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture
def other(tmp_path):
    """Run A's folder: checkpoints of rounds 3, 4, 5, stopped."""
    a = CheckpointStore(tmp_path / "A" / "checkpoints", keep=3)
    for r in (3, 4, 5):
        save(a, r)
    return tmp_path / "A" / "checkpoints"


@pytest.mark.parametrize("swap", ["link", "folder"])
def test_a_swapped_folder_stops_the_next_save_and_touches_neither(tmp_path, other, swap):
    before = snapshot(other)
    mine = tmp_path / "B" / "checkpoints"
    b = CheckpointStore(mine, keep=2)
    b.hold()
    for r in (1, 2, 3):
        save(b, r)
    moved = tmp_path / "B-moved"
    mine.rename(moved)
    if swap == "link":
        mine.symlink_to(other)   # ln -s A/checkpoints B/checkpoints
    else:
        mine.mkdir()             # an empty folder in its place
    with pytest.raises(DirectoryMoved) as e:
        save(b, 4)
    msg = str(e.value)
    assert f"{mine} was replaced while this run was live" in msg and f"now at {moved}" in msg, msg
    assert ("a symbolic link to" if swap == "link" else "another folder") in msg
    assert snapshot(other) == before                                   # A untouched
    assert sorted(p.name for p in moved.iterdir()) == ["ckpt-00000002.h5", "ckpt-00000003.h5"]
    assert CheckpointStore(moved).load_latest().round == 3             # resumable from the moved folder
    if swap == "folder":
        assert list(mine.iterdir()) == []


def test_the_held_folder_is_written_through_its_descriptor_even_if_renamed_between_checks(tmp_path, other):
    """A swap that lands between the check and the write still cannot redirect it: the file goes to the
    held folder (the check is made before the save, the write through /proc/self/fd/N)."""
    before = snapshot(other)
    mine = tmp_path / "B" / "checkpoints"
    b = CheckpointStore(mine, keep=2)
    b.hold()
    save(b, 1)
    moved = tmp_path / "B-moved"
    real = b._held.verify
    b._held.verify = lambda: (real(), mine.rename(moved), mine.symlink_to(other))[0]   # swap right after the check
    save(b, 2)
    assert snapshot(other) == before
    assert sorted(p.name for p in moved.iterdir()) == ["ckpt-00000001.h5", "ckpt-00000002.h5"]


def test_rotation_deletes_only_checkpoints_the_run_wrote_or_found_at_start(tmp_path, other):
    mine = tmp_path / "B" / "checkpoints"
    old = CheckpointStore(mine, keep=5)
    save(old, 1)                                  # an earlier process of this run
    b = CheckpointStore(mine, keep=2)
    b.hold()
    shutil.copy(other / "ckpt-00000004.h5", mine / "ckpt-00000004.h5")   # planted after the run took the folder
    for r in (2, 3, 5, 6):
        save(b, r)
    assert sorted(p.name for p in mine.iterdir() if p.name.startswith("ckpt")) == [
        "ckpt-00000004.h5", "ckpt-00000005.h5", "ckpt-00000006.h5"]   # 1 (found at hold), 2, 3 rotated away


def test_a_link_at_start_is_refused_naming_the_fix(tmp_path, other):
    link = tmp_path / "B" / "checkpoints"
    link.parent.mkdir()
    link.symlink_to(other)
    with pytest.raises(HpcflError, match="is a symbolic link .* never follows a link there. Set checkpoint.dir"):
        CheckpointStore(link).hold()


def test_the_descriptor_is_closed_when_the_store_goes(tmp_path):
    b = CheckpointStore(tmp_path / "c")
    b.hold()
    fd = b._held.fd
    assert os.readlink(f"/proc/self/fd/{fd}") == str(tmp_path / "c")
    del b
    assert not os.path.exists(f"/proc/self/fd/{fd}") or os.readlink(f"/proc/self/fd/{fd}") != str(tmp_path / "c")


def test_a_folder_moved_away_with_nothing_in_its_place_stops_the_next_save(tmp_path):
    """Nothing at the path is not the held folder either: the save stops (it would otherwise write on
    into the moved folder through its descriptor, where the user no longer looks)."""
    mine = tmp_path / "B" / "checkpoints"
    b = CheckpointStore(mine, keep=2)
    b.hold()
    save(b, 1)
    moved = tmp_path / "B-moved"
    mine.rename(moved)
    with pytest.raises(DirectoryMoved, match=f"{mine} was replaced while this run was live \\(there is nothing "
                                             f"there now\\).* now at {moved}"):
        save(b, 2)
    assert sorted(p.name for p in moved.iterdir()) == ["ckpt-00000001.h5"] and not mine.exists()
