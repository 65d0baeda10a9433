"""How the ranks of a node share the job's dataset (hpcfl.engine.dataload): the rule that picks the
cache's mapped entry or the node's windows, and the layout a dataset crosses the node in."""

import numpy as np
import pytest
from mpi4py import MPI

from hpcfl import config, data
from hpcfl.data.partition import Groups
from hpcfl.engine.dataload import how, load_per_node, pack, unpack
from hpcfl.parallel.shared import NodeTables

FILES = ("cifar10", "cifar100", "mnist", "fashion_mnist", "emnist", "npz", "leaf", "tff", "speech_commands")
CACHED = ("synthetic", "gaussian_mixture", "synthetic_images", "lga_synthetic")


@pytest.mark.parametrize("cache", ["FOLDER", "off"])
def test_the_rule_windows_for_everything_the_cache_does_not_serve(tmp_path, cache):
    cache = str(tmp_path) if cache == "FOLDER" else cache
    for name in FILES + ("digits", "quadratic", "mymodule:load"):   # files, not cached, a plug-in
        assert how(name, cache) == "window", name
    for name in CACHED:   # generated, pure in (options, seed): the cache's entry, unless it is off
        assert how(name, cache) == ("cache" if cache != "off" else "window"), name
    # every dataset of the registry is one of the two
    assert set(data.DATASETS) == set(FILES + CACHED + ("digits", "quadratic"))


def test_the_rule_names_an_unknown_dataset():
    with pytest.raises(Exception, match="data.dataset = 'mnsit' is not known; did you mean 'mnist'"):
        how("mnsit", "off")


def test_pack_and_unpack_keep_every_field_its_type_and_bytes():
    rng = np.random.default_rng(0)
    pieces = (np.array([4, 1], dtype=np.int64), np.array([], dtype=np.int64), np.array([0, 3, 2], dtype=np.int64))
    ds = data.Dataset("own", rng.normal(size=(5, 2, 3)).astype(np.float32), np.arange(5, dtype=np.int64) % 2,
                      np.ones((2, 2, 3), np.float32), np.array([1, 0]), 2, (2, 3), True,
                      natural_clients=pieces,
                      natural_test=Groups(np.array([1, 0], dtype=np.int64), np.array([1, 0, 1], dtype=np.int64)))
    layout, arrays = pack(ds)
    # the tuple of pieces crosses as its concatenation and offsets, the Groups as flat, sizes, ends
    assert layout["natural_clients"][0] == "pieces" and layout["natural_test"][0] == "groups"
    assert layout["name"] == ("value", "own") and layout["input_shape"] == ("value", (2, 3))
    assert all(isinstance(a, np.ndarray) for a in arrays) and len(arrays) == 4 + 2 + 3
    back = unpack(layout, [a.copy() for a in arrays])
    for name in ("x_train", "y_train", "x_test", "y_test"):
        a, b = getattr(back, name), getattr(ds, name)
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    assert type(back.natural_clients) is tuple and [p.tolist() for p in back.natural_clients] == [[4, 1], [], [0, 3, 2]]
    assert isinstance(back.natural_test, Groups) and [g.tolist() for g in back.natural_test] == [[1], [], [0]]
    assert (back.name, back.num_classes, back.input_shape, back.augment) == ("own", 2, (2, 3), True)


def test_one_rank_loads_as_before_and_keeps_no_window(tmp_path):
    np.savez(tmp_path / "d.npz", x=np.arange(40, dtype=np.float32).reshape(20, 2), y=np.arange(20) % 3)
    cfg = config.from_dict({"run": {"name": "d", "seed": 1, "rounds": 1},
                            "data": {"dataset": "npz", "num_clients": 2, "npz": {"file": str(tmp_path / "d.npz")}},
                            "model": {"name": "logreg"}, "algorithm": {"name": "fedavg"}})
    tables = NodeTables(MPI.COMM_SELF)
    ds = load_per_node(cfg, MPI.COMM_SELF, tables)
    direct = data.load_dataset("npz", cfg.dataset_options, None, 1)
    assert ds.x_train.tobytes() == direct.x_train.tobytes() and ds.x_train.flags.writeable
    assert not tables.on and tables.windows == []
