"""The disk cache of generated datasets (hpcfl.data.cache, data.cache)."""

import numpy as np
import pytest

from hpcfl import data
from hpcfl.data import cache
from hpcfl.data.datasets import SyntheticImagesOptions, SyntheticOptions

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
    assert cache.cache_root("auto") == tmp_path / "c"
    monkeypatch.delenv("HPCFL_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache.cache_root("auto") == tmp_path / "x" / "hpcfl"
    assert cache.cache_root("off") is None


def test_natural_clients_survive_the_round_trip(tmp_path):
    opts = SyntheticOptions(num_clients=5)
    a = data.load_dataset("synthetic", opts, None, 2, str(tmp_path))
    b = data.load_dataset("synthetic", opts, None, 2, str(tmp_path))
    same(a, b)
    assert len(b.natural_clients) == 5
    assert all(np.array_equal(x, y) for x, y in zip(a.natural_clients, b.natural_clients))


def test_a_damaged_file_is_generated_again_and_replaced(tmp_path, capsys):
    good = data.load_dataset("synthetic_images", SMALL, None, 0, str(tmp_path))
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
