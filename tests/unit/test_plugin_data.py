"""A dataset and a partition of your own: run through hpcfl.run with hand-checkable client sizes in
results.h5, the dataset's natural clients, and every check of what they return refused naming the
plug-in (hpcfl/data/plugin.py)."""

import numpy as np
import pytest
from plugin_code import DATA, job_text, write_module

import hpcfl
from hpcfl import config, data, plugins
from hpcfl.errors import ConfigError, DataError
from hpcfl.results import load


@pytest.fixture(scope="module")
def mine(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mydata")
    return folder, write_module(folder, DATA, "mydata")


def job(folder, dataset, partition, clients=3, extra=""):
    (folder / "job.toml").write_text(job_text("mlp", dataset, partition, clients=clients,
                                              extra="[model.mlp]\nhidden = [4]\n" + extra))
    return str(folder / "job.toml")


def test_a_run_on_your_dataset_and_partition_records_their_options_sizes_and_code(mine, tmp_path):
    folder, name = mine
    res = hpcfl.run(job(folder, f"{name}:load", f"{name}:split", extra="[data.split]\noffset = 1\n"),
                    out=tmp_path / "out")
    # 40 rows over 3 clients by strides: 14, 13, 13 rows; the training labels are row % 3
    counts = res.class_counts
    assert counts.sum(axis=1).tolist() == [14, 13, 13]
    # client 0 holds rows 1, 4, ..., 40 % 40 = 0 (offset 1): labels (row % 3) all 1, but row 0's label 0
    assert counts.tolist()[0] == [1, 13, 0]
    assert res.config["data"]["split"] == {"offset": 1}
    assert res.config["data"]["load"] == {"n": 40, "m": 12, "features": 3, "classes": 3}
    assert res.attrs["plugins"]["data.dataset"]["file"] == str(folder / f"{name}.py")
    assert set(res.attrs["plugins"]) == {"data.dataset", "data.partition"}
    assert res.input_shape == (3,) and res.num_classes == 3


def load_mine(folder, name, **opts):
    cls = data.dataset_options(f"{name}:load", [folder])
    return data.load_dataset(f"{name}:load", cls(**opts), None, 7)


def test_the_dataset_arrays_are_float32_and_int64_with_natural_clients_in_id_order(mine):
    ds = load_mine(*mine)
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int64 and ds.x_train.shape == (40, 3)
    assert ds.y_test.tolist() == [i % 3 for i in range(12)] and ds.num_classes == 3
    # ids 10, 20, 30, 40 are clients 0..3: client k holds the rows with row % 4 == k
    assert [c.tolist() for c in ds.natural_clients] == [list(range(k, 40, 4)) for k in range(4)]
    cfg_parts = data.make_partition("natural", ds.y_train, 4, data.partition_options("natural")(), 7, ds)
    assert [len(p) for p in cfg_parts] == [10] * 4


def test_the_same_seed_gives_the_same_data_and_another_seed_other_data(mine):
    folder, name = mine
    cls = data.dataset_options(f"{name}:load", [folder])
    a, b = (data.load_dataset(f"{name}:load", cls(), None, s) for s in (7, 7))
    c = data.load_dataset(f"{name}:load", cls(), None, 8)
    assert a.x_train.tobytes() == b.x_train.tobytes() != c.x_train.tobytes()


def test_the_partition_gets_the_labels_clients_and_seed_and_its_indices_come_back_sorted(tmp_path):
    name = write_module(tmp_path, "import numpy as np\n"
                                  "SEEN = []\n"
                                  "def split(labels, num_clients, seed):\n"
                                  "    SEEN.append((labels.dtype, labels.tolist(), num_clients, seed))\n"
                                  "    labels[:] = 9\n"   # writing to its copy changes nothing of the data
                                  "    return [np.array([3, 0], dtype=np.int32), [2, 1]]\n", "part")
    y = np.array([0, 1, 1, 0])
    opts = data.partition_options(f"{name}:split", [tmp_path])()
    parts = data.make_partition(f"{name}:split", y, 2, opts, 11)
    assert [p.tolist() for p in parts] == [[0, 3], [1, 2]] and all(p.dtype == np.int64 for p in parts)
    assert plugins.of(opts).obj.__globals__["SEEN"] == [(np.int64, [0, 1, 1, 0], 2, 11)]
    assert y.tolist() == [0, 1, 1, 0]


# ---- what they return, refused naming the plug-in ---------------------------------------------------

BAD_DATA = '''
import numpy as np

def base():
    return {"x": np.zeros((6, 2)), "y": np.arange(6) % 2, "x_test": np.zeros((2, 2)), "y_test": np.array([0, 1])}

def nan_x(seed):
    d = base(); d["x"][4, 1] = np.nan; return d

def short_y(seed):
    d = base(); d["y"] = d["y"][:5]; return d

def float_y(seed):
    d = base(); d["y"] = d["y"].astype(float); return d

def negative(seed):
    d = base(); d["y_test"] = np.array([0, -1]); return d

def test_shape(seed):
    d = base(); d["x_test"] = np.zeros((2, 3)); return d

def typo(seed):
    d = base(); d["x_tset"] = d.pop("x_test"); return d

def missing(seed):
    d = base(); del d["y_test"]; return d

def a_list(seed):
    return [1, 2]

def classes(seed):
    d = base(); d["num_classes"] = 1; return d

def clients_short(seed):
    d = base(); d["client"] = np.array([0, 1]); return d

def own_test_rows(seed):
    d = base(); d["client"] = np.array([7, 3, 7, 3, 9, 9]); d["client_test"] = np.array([9, 5, 3])
    d["x_test"], d["y_test"] = np.zeros((3, 2)), np.array([0, 1, 0])
    return d

def torch_ok(seed):
    import torch
    d = base(); d["x"] = torch.ones(6, 2, dtype=torch.float64); d["y"] = torch.arange(6) % 2; return d

def raises(seed):
    return {}["x"]
'''


@pytest.fixture(scope="module")
def bad(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bad")
    return folder, write_module(folder, BAD_DATA, "baddata")


@pytest.mark.parametrize("attr,error,words", [
    ("nan_x", DataError, "x[4, 1] = nan is not finite; inputs must be finite"),
    ("short_y", DataError, "x/y has 6 inputs but 5 labels"),
    ("float_y", DataError, "y is float64 of shape (6,); expected one integer label per row"),
    ("negative", DataError, "x_test/y_test has a negative label (-1)"),
    ("test_shape", DataError, "x_test's rows have shape (3,) but x's have (2,)"),
    ("typo", DataError, "returned key 'x_tset', which is not one of x, y, x_test, y_test, client, client_test, "
                        "num_classes; did you mean 'x_test'?"),
    ("missing", DataError, "returned no y_test; the mapping needs x, y, x_test, y_test"),
    ("a_list", DataError, "returned a list; expected a mapping (dict) with keys x, y, x_test, y_test"),
    ("classes", DataError, "returned num_classes = 1; expected an integer above the largest label, 1"),
    ("clients_short", DataError, "client is int64 of shape (2,); expected one integer client id per training row, "
                                 "shape (6,)"),
    ("raises", ConfigError, "calling it raised KeyError: 'x' (at "),
])
def test_each_dataset_check_is_refused_naming_the_plugin(bad, attr, error, words):
    folder, name = bad
    with pytest.raises(error) as err:
        data.load_dataset(f"{name}:{attr}", data.dataset_options(f"{name}:{attr}", [folder])(), None, 0)
    assert f"data.dataset = '{name}:{attr}'" in str(err.value) and words in str(err.value)


def test_client_test_gives_each_client_its_own_test_rows(bad):
    """Ids 3, 7, 9 are clients 0, 1, 2; test row 0 is client 2's, row 2 client 0's, and row 1 (id 5,
    no training client) stays in the global test set only, as an npz's or a LEAF test user's."""
    folder, name = bad
    ds = data.load_dataset(f"{name}:own_test_rows", data.dataset_options(f"{name}:own_test_rows", [folder])(),
                           None, 0)
    assert [c.tolist() for c in ds.natural_clients] == [[1, 3], [0, 2], [4, 5]]
    assert [t.tolist() for t in ds.natural_test] == [[2], [], [0]]


def test_a_torch_dataset_is_taken_as_numpy(bad):
    folder, name = bad
    ds = data.load_dataset(f"{name}:torch_ok", data.dataset_options(f"{name}:torch_ok", [folder])(), None, 0)
    assert ds.x_train.dtype == np.float32 and ds.x_train.sum() == 12 and ds.y_train.tolist() == [0, 1] * 3


BAD_SPLITS = '''
import numpy as np

def two(labels, num_clients, seed):
    return [np.arange(2), np.arange(2, 4)]

def out_of_range(labels, num_clients, seed):
    return [np.arange(0, 3), np.arange(3, 7), np.array([1])]

def negative(labels, num_clients, seed):
    return [np.array([0, -1]), np.arange(2, 4), np.array([5])]

def twice(labels, num_clients, seed):
    return [np.array([0, 2, 2]), np.arange(3, 5), np.array([5])]

def floats(labels, num_clients, seed):
    return [np.array([0.0, 1.0]), np.arange(2, 4), np.array([5])]

def not_a_list(labels, num_clients, seed):
    return 3
'''


@pytest.mark.parametrize("attr,words", [
    ("two", "returned 2 index arrays for data.num_clients = 3; return exactly one per client"),
    ("out_of_range", "client 1 has index 6, out of range for the 6 training rows (0..5)"),
    ("negative", "client 0 has index -1, out of range for the 6 training rows (0..5)"),
    ("twice", "client 0 has index 2 more than once"),
    ("floats", "client 0's indices are float64 of shape (2,); expected a 1-D integer array"),
    ("not_a_list", "returned a int; expected a list of num_clients = 3 index arrays"),
])
def test_each_partition_check_is_refused_naming_the_plugin(tmp_path, attr, words):
    name = write_module(tmp_path, BAD_SPLITS, "badsplit")
    opts = data.partition_options(f"{name}:{attr}", [tmp_path])()
    with pytest.raises(ConfigError) as err:
        data.make_partition(f"{name}:{attr}", np.arange(6) % 2, 3, opts, 0)
    assert f"data.partition = '{name}:{attr}'" in str(err.value) and words in str(err.value)


def test_a_run_refuses_a_partition_that_leaves_a_client_empty(mine, tmp_path):
    folder, name = mine
    empty = write_module(folder, "import numpy as np\ndef split(labels, num_clients, seed):\n"
                                 "    return [np.arange(len(labels))] + [[]] * (num_clients - 1)\n", "empty")
    with pytest.raises(ConfigError, match="2 clients got no training samples"):
        hpcfl.run(job(folder, f"{name}:load", f"{empty}:split"), out=tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_hpcfl_partition_previews_a_plugin_split(mine, tmp_path, capsys):
    from hpcfl.cli import main

    folder, name = mine
    jobfile = job(folder, f"{name}:load", f"{name}:split", clients=4)
    assert main(["partition", jobfile, "--png", str(tmp_path / "p.png")]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "p.png").stat().st_size > 0 and "heatmap:" in out
    cfg = config.load(jobfile)
    assert cfg.to_dict()["data"]["split"] == {"offset": 0}
