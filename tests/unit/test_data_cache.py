"""The disk cache of generated datasets (hpcfl.data.cache, data.cache)."""

import json
import os

import numpy as np
import pytest

from hpcfl import data
from hpcfl.data import cache
from hpcfl.data.datasets import SyntheticOptions
from hpcfl.data.embedded_images import SyntheticImagesOptions
from hpcfl.native import cachedir

SMALL = SyntheticImagesOptions(num_train=64, num_test=16, image_shape=(3, 8, 8))


def same(a, b):
    for f in ("x_train", "y_train", "x_test", "y_test"):
        assert getattr(a, f).dtype == getattr(b, f).dtype
        assert getattr(a, f).tobytes() == getattr(b, f).tobytes(), f
    assert (a.name, a.num_classes, tuple(a.input_shape), a.augment) == (b.name, b.num_classes,
                                                                         tuple(b.input_shape), b.augment)


def test_second_load_reads_the_file_and_equals_the_generated_data(tmp_path, monkeypatch, capsys):
    first = data.load_dataset("synthetic_images", SMALL, None, 0, str(tmp_path))
    assert "hpcfl: cached the generated dataset in" in capsys.readouterr().out
    same(first, data.load_dataset("synthetic_images", SMALL, None, 0, "off"))   # == a fresh generation
    files = list((tmp_path / "datasets").iterdir())
    assert [f.name for f in files] == [f"synthetic_images-{cache.key('synthetic_images', SMALL, 0)}"]
    spec = data.DATASETS["synthetic_images"]
    monkeypatch.setitem(data.DATASETS, "synthetic_images",
                        type(spec)(spec.options, lambda *a: pytest.fail("generated again"), spec.doc, spec.labels,
                                   spec.cache))
    same(data.load_dataset("synthetic_images", SMALL, None, 0, str(tmp_path)), first)


def test_key_changes_with_options_seed_and_version(monkeypatch):
    k = cache.key("synthetic_images", SMALL, 0)
    assert k != cache.key("synthetic_images", SMALL, 1)
    assert k != cache.key("synthetic_images", SyntheticImagesOptions(num_train=65, num_test=16,
                                                                     image_shape=(3, 8, 8)), 0)
    assert k != cache.key("synthetic", SMALL, 0)
    monkeypatch.setattr(cache, "VERSION", cache.VERSION + 1)
    assert k != cache.key("synthetic_images", SMALL, 0)


def test_off_writes_nothing_and_files_are_only_for_generated_datasets(tmp_path):
    data.load_dataset("synthetic_images", SMALL, None, 0, "off")
    data.load_dataset("digits", None, None, 0, str(tmp_path))    # read from sklearn's files: not cached
    assert not (tmp_path / "datasets").exists()


def test_auto_uses_the_environment_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HPCFL_CACHE_DIR", str(tmp_path / "c"))
    assert cachedir.cache_root("auto") == tmp_path / "c"
    monkeypatch.delenv("HPCFL_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cachedir.cache_root("auto") == tmp_path / "x" / "hpcfl"
    assert cachedir.cache_root("off") is None


def test_natural_clients_survive_the_round_trip(tmp_path):
    opts = SyntheticOptions(num_clients=5)
    a = data.load_dataset("synthetic", opts, None, 2, str(tmp_path))
    b = data.load_dataset("synthetic", opts, None, 2, str(tmp_path))
    same(a, b)
    assert len(b.natural_clients) == 5
    assert all(np.array_equal(x, y) for x, y in zip(a.natural_clients, b.natural_clients))
    assert a.natural_test is None and b.natural_test is None


def test_natural_test_rows_survive_the_round_trip(tmp_path):
    from hpcfl.data.partition import Groups

    ds = data.load_dataset("synthetic_images", SMALL, None, 0, "off")
    own = Groups(np.array([3, 0, 7], dtype=np.int64), np.array([2, 0, 1], dtype=np.int64))
    ds = data.Dataset(**{**ds.__dict__, "natural_clients": (np.arange(4), np.arange(4, 9)), "natural_test": own})
    path = cache.path_for(tmp_path, "synthetic_images", SMALL, 0)
    assert cache._write(path, ds)
    back = cache._read(path)
    assert [list(t) for t in back.natural_test] == [[3, 0], [], [7]]
    assert [list(c) for c in back.natural_clients] == [[0, 1, 2, 3], [4, 5, 6, 7, 8]]


def test_a_miss_hands_back_the_entry_it_wrote_mapped(tmp_path):
    """The generated arrays are dropped for the written entry, mapped: the pages are then the file's,
    shared with the node's other ranks, not this process's own."""
    first = data.load_dataset("synthetic_images", SMALL, None, 0, str(tmp_path))
    assert all(isinstance(getattr(first, f), np.memmap) for f in ("x_train", "y_train", "x_test", "y_test"))
    same(first, data.load_dataset("synthetic_images", SMALL, None, 0, "off"))


def test_a_damaged_file_is_generated_again_and_replaced(tmp_path, capsys):
    data.load_dataset("synthetic_images", SMALL, None, 0, str(tmp_path))
    good = data.load_dataset("synthetic_images", SMALL, None, 0, "off")   # in memory: the entry gets damaged
    path = cache.path_for(tmp_path, "synthetic_images", SMALL, 0)
    npy = path / "x_train.npy"
    npy.write_bytes(npy.read_bytes()[:100])          # damaged by some other tool
    again = data.load_dataset("synthetic_images", SMALL, None, 0, str(tmp_path))
    assert "is unreadable" in capsys.readouterr().out
    same(again, good)
    same(cache._read(path), good)                     # the entry was rewritten whole
    assert [p.name for p in path.parent.iterdir()] == [path.name]   # no temporary folder left


def test_an_unwritable_folder_costs_only_the_speed_up(tmp_path, capsys):
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("a file where the cache folder would go (fails even for root)")
    ds = data.load_dataset("synthetic_images", SMALL, None, 0, str(blocker))
    assert "could not write the dataset cache" in capsys.readouterr().out
    same(ds, data.load_dataset("synthetic_images", SMALL, None, 0, "off"))
    assert blocker.read_text().startswith("a file")


def test_a_second_writer_keeps_the_first_entry(tmp_path):
    """Two ranks that generated the same dataset at once: the second rename finds the entry and
    discards its own copy, leaving one whole entry and no temporary folder."""
    ds = data.load_dataset("synthetic_images", SMALL, None, 0, "off")
    path = cache.path_for(tmp_path, "synthetic_images", SMALL, 0)
    assert cache._write(path, ds) is True
    assert cache._write(path, ds) is False
    assert [p.name for p in path.parent.iterdir()] == [path.name]
    same(cache._read(path), ds)


def test_an_edited_value_is_detected_and_the_entry_generated_again(tmp_path, capsys):
    """An edited cached .npy was used silently: results differed from an uncached run's."""
    fresh = data.load_dataset("synthetic_images", SMALL, None, 0, "off")
    data.load_dataset("synthetic_images", SMALL, None, 0, str(tmp_path))
    path = cache.path_for(tmp_path, "synthetic_images", SMALL, 0)
    x = np.load(path / "x_train.npy", mmap_mode="r+")
    x[3, 0, 0, 0] += 1.0                                   # one value, the file's size unchanged
    x.flush()
    del x
    capsys.readouterr()
    again = data.load_dataset("synthetic_images", SMALL, None, 0, str(tmp_path))
    out = capsys.readouterr().out
    assert "x_train.npy changed since it was cached" in out and "generating the data again" in out
    same(again, fresh)
    same(cache._read(path), fresh)                         # and the entry was replaced whole


def test_an_entry_mixed_from_two_entries_is_generated_again(tmp_path, capsys):
    """Entries whose files came from different recipes failed every run with errors blaming the config."""
    other = SyntheticImagesOptions(num_train=64, num_test=16, image_shape=(3, 8, 8), num_classes=4)
    data.load_dataset("synthetic_images", SMALL, None, 0, str(tmp_path))
    data.load_dataset("synthetic_images", other, None, 0, str(tmp_path))
    a, b = (cache.path_for(tmp_path, "synthetic_images", o, 0) for o in (SMALL, other))
    (a / "y_train.npy").write_bytes((b / "y_train.npy").read_bytes())
    capsys.readouterr()
    same(data.load_dataset("synthetic_images", SMALL, None, 0, str(tmp_path)),
         data.load_dataset("synthetic_images", SMALL, None, 0, "off"))
    assert "y_train.npy changed since it was cached" in capsys.readouterr().out


def test_an_unchanged_entry_is_not_hashed_and_a_copied_one_once(tmp_path, monkeypatch):
    """The check costs nothing while a file's stamp (inode, mtime, ctime) is the one recorded; a copied
    entry (new inodes) is hashed once and its new stamps remembered in verified.json."""
    data.load_dataset("synthetic_images", SMALL, None, 0, str(tmp_path / "a"))
    hashed = []
    real = cache._sha256
    monkeypatch.setattr(cache, "_sha256", lambda p: (hashed.append(p.name), real(p))[1])
    data.load_dataset("synthetic_images", SMALL, None, 0, str(tmp_path / "a"))
    assert hashed == []
    import shutil
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    data.load_dataset("synthetic_images", SMALL, None, 0, str(tmp_path / "b"))
    assert sorted(hashed) == sorted(f"{n}.npy" for n in cache.ARRAYS)
    hashed.clear()
    data.load_dataset("synthetic_images", SMALL, None, 0, str(tmp_path / "b"))
    assert hashed == []


def test_an_entry_without_hashes_is_generated_again(tmp_path, capsys):
    """Entries written before the content check carry no hashes: they cannot be trusted."""
    data.load_dataset("synthetic_images", SMALL, None, 0, str(tmp_path))
    path = cache.path_for(tmp_path, "synthetic_images", SMALL, 0)
    meta = json.loads((path / "meta.json").read_text())
    del meta["files"]
    (path / "meta.json").write_text(json.dumps(meta))
    capsys.readouterr()
    data.load_dataset("synthetic_images", SMALL, None, 0, str(tmp_path))
    assert "records no content hashes" in capsys.readouterr().out
    assert "files" in json.loads((path / "meta.json").read_text())


def test_a_stop_requested_during_generation_skips_the_cache_write(tmp_path, monkeypatch):
    """Ctrl-C during start-up waited for generation, a 704 MB cache write and round 1: the write can wait."""
    from hpcfl import signals

    monkeypatch.setattr(signals, "_requested", ["SIGINT"])
    ds = data.load_dataset("synthetic_images", SMALL, None, 0, str(tmp_path))
    same(ds, data.load_dataset("synthetic_images", SMALL, None, 0, "off"))
    assert not (tmp_path / "datasets").exists() or not any((tmp_path / "datasets").iterdir())


NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")


@pytest.mark.parametrize("how", [
    pytest.param("other user owns the root", marks=as_root), pytest.param("other user owns the entry", marks=as_root),
    pytest.param("other user owns a file", marks=as_root), "datasets/ group-writable", "entry writable by others",
    "a file group-writable", "control: trusted"])
def test_a_planted_entry_where_others_can_write_is_never_used(tmp_path, capsys, how):
    """Every training label shifted by one and meta.json recomputed to match was trained on (issue
    37.1): the hashes only catch damage. Now the entry is not read and the data is generated."""
    root = tmp_path / "cache"
    data.load_dataset("synthetic_images", SMALL, None, 0, str(root))
    fresh = data.load_dataset("synthetic_images", SMALL, None, 0, "off")   # in memory: the entry is rewritten below
    entry = cache.path_for(root, "synthetic_images", SMALL, 0)
    y = np.load(entry / "y_train.npy")
    np.save(entry / "y_train.npy", (y + 1) % 10)            # the plant, with its hash and stamp recorded
    meta = json.loads((entry / "meta.json").read_text())
    meta["files"]["y_train.npy"] = {"sha256": cache._sha256(entry / "y_train.npy"), **cache._stamp(entry / "y_train.npy")}
    (entry / "meta.json").write_text(json.dumps(meta))
    bad = {"other user owns the root": root, "other user owns the entry": entry,
           "datasets/ group-writable": entry.parent, "entry writable by others": entry,
           "other user owns a file": entry / "y_train.npy", "a file group-writable": entry / "y_train.npy"}.get(how)
    if "other user" in how:
        os.chown(bad, NOBODY, NOBODY)
    elif "writable" in how:
        os.chmod(bad, 0o777 if "others" in how else 0o770 if bad.is_dir() else 0o660)
    capsys.readouterr()
    got = data.load_dataset("synthetic_images", SMALL, None, 0, str(root))
    if how.startswith("control"):   # the plant is a valid one: where only its owner can write, it is used
        assert np.array_equal(got.y_train, (y + 1) % 10)
        return
    same(got, fresh)                                          # generated, not the planted labels
    out = capsys.readouterr().out
    assert "the dataset cache is not used" in out and f"{bad} is" in out
    assert np.array_equal(np.load(entry / "y_train.npy"), (y + 1) % 10)   # and the plant left as it was


def test_dataset_cache_folders_are_created_private(tmp_path):
    old = os.umask(0o002)
    try:
        data.load_dataset("synthetic_images", SMALL, None, 0, str(tmp_path / "new" / "cache"))
    finally:
        os.umask(old)
    entry = cache.path_for(tmp_path / "new" / "cache", "synthetic_images", SMALL, 0)
    for p in (tmp_path / "new", tmp_path / "new" / "cache", entry.parent, entry):
        assert p.stat().st_mode & 0o777 == 0o700, p
    assert all(f.stat().st_mode & 0o022 == 0 for f in entry.iterdir())
    same(data.load_dataset("synthetic_images", SMALL, None, 0, str(tmp_path / "new" / "cache")),
         data.load_dataset("synthetic_images", SMALL, None, 0, "off"))


def test_an_untrusted_cache_is_said_once_per_process(tmp_path, capsys):
    """A sweep loads the dataset for every point in one process: the cache folder's problem is told
    once, not once per load."""
    root = tmp_path / "cache"
    root.mkdir()
    os.chmod(root, 0o770)                                    # group-writable: not trusted
    first = data.load_dataset("synthetic_images", SMALL, None, 0, str(root))
    again = data.load_dataset("synthetic_images", SMALL, None, 0, str(root))
    same(first, again)
    out = capsys.readouterr().out
    assert out.count("the dataset cache is not used") == 1 and f"{root} is writable by group" in out, out
    assert list(root.iterdir()) == []                         # nothing written there either
