"""``tff``: TensorFlow Federated's HDF5 client data in its exact layout (examples/<client>/<feature>,
EMNIST's float32 pixels and int32 labels, Shakespeare's variable-length byte-string snippets):
clients in sorted id order, sizes and own test rows (hand-checked), the character windows, and every
malformed file refused naming the file, the client and the feature."""

import os

import h5py
import numpy as np
import pytest
from natural_writers import (
    TFF_TEST,
    TFF_TRAIN,
    emnist_client,
    write_tff,
    write_tff_emnist,
)

from hpcfl import data
from hpcfl.config import options
from hpcfl.data.chars import LEAF_CHARS
from hpcfl.errors import DataError


def load(root, **opts):
    o = options.build(data.dataset_options("tff"), opts, "data.tff")
    return data.load_dataset("tff", o, str(root), 0)


def test_emnist_clients_in_sorted_id_order_with_their_own_test_rows(tmp_path):
    ds = load(write_tff_emnist(tmp_path))
    # f0003_12 (2 rows), f0010_01 (3), f0100_40 (4); pixel [0, 0] is the writer's tag, [0, 1] the row
    assert [list(c) for c in ds.natural_clients] == [[0, 1], [2, 3, 4], [5, 6, 7, 8]]
    assert ds.x_train[:, 0, 0, :2].tolist() == [[3, 0], [3, 1], [10, 0], [10, 1], [10, 2], [100, 0], [100, 1],
                                                [100, 2], [100, 3]]
    assert ds.y_train.tolist() == [0, 9, 5, 5, 7, 61, 1, 2, 61] and ds.y_train.dtype == np.int64
    # test: f0003_12 (1), f0100_40 (2), f9999_00 (1, no client's); f0010_01 has none
    assert ds.x_test[:, 0, 0, 0].tolist() == [3, 100, 100, 9999] and ds.y_test.tolist() == [9, 1, 61, 3]
    assert [list(t) for t in ds.natural_test] == [[0], [], [1, 2]]
    assert ds.input_shape == (1, 28, 28) and ds.x_train.dtype == np.float32 and ds.num_classes == 62
    assert float(ds.x_train[0, 0, 5, 5]) == 1.0
    parts = data.make_partition("natural", ds.y_train, 3, None, 0, ds)
    assert [list(p) for p in parts] == [[0, 1], [2, 3, 4], [5, 6, 7, 8]]


def test_image_shape_labels_of_shape_n_1_and_other_dtypes(tmp_path):
    clients = {"b": {"pixels": np.arange(12, dtype=np.uint8).reshape(3, 2, 2), "label": np.array([[1], [0], [2]])},
               "a": {"pixels": np.full((1, 2, 2), 0.5), "label": np.array([[4]], dtype=np.int16)}}
    write_tff(tmp_path / "tr.h5", clients)
    write_tff(tmp_path / "te.h5", {"a": clients["a"]})
    ds = load(tmp_path, train="tr.h5", test="te.h5", image_shape=[4])
    assert ds.input_shape == (4,) and ds.x_train.tolist() == [[0.5] * 4, [0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert ds.y_train.tolist() == [4, 1, 0, 2] and ds.num_classes == 5
    with pytest.raises(DataError, match=r"data.tff.image_shape = \[3\] does not hold the rows of .*tr.h5, of shape "
                                        r"\(2, 2\)"):
        load(tmp_path, train="tr.h5", test="te.h5", image_shape=[3])


def snippets(clients: dict) -> dict:
    return {cid: {"snippets": [s.encode() for s in texts]} for cid, texts in clients.items()}


def test_shakespeare_snippets_become_next_character_windows(tmp_path):
    write_tff(tmp_path / "shakespeare_train.h5", snippets({
        "THE_TEMPEST_MIRANDA": ["abcdefg", "ab", "xyz!"], "ALLS_WELL_KING": ["Hello"]}))
    write_tff(tmp_path / "shakespeare_test.h5", snippets({"ALLS_WELL_KING": ["Yes sir"]}))
    ds = load(tmp_path, features="chars", train="shakespeare_train.h5", test="shakespeare_test.h5", seq_len=3)
    ids = LEAF_CHARS.index
    # stride 3: "Hello" -> Hel|l; "abcdefg" -> abc|d, def|g; "ab" none; "xyz!" -> xyz|!
    assert ds.x_train.tolist() == [[ids(c) for c in w] for w in ("Hel", "abc", "def", "xyz")]
    assert ds.y_train.tolist() == [ids("l"), ids("d"), ids("g"), ids("!")]
    assert [list(c) for c in ds.natural_clients] == [[0], [1, 2, 3]]
    assert ds.x_test.tolist() == [[ids(c) for c in w] for w in ("Yes", " si")]     # "Yes sir": Yes| , si|r
    assert ds.y_test.tolist() == [ids(" "), ids("r")] and [list(t) for t in ds.natural_test] == [[0, 1], []]
    assert ds.input_shape == (3,) and ds.num_classes == 81   # unknown = "map": one more id
    one = load(tmp_path, features="chars", train="shakespeare_train.h5", test="shakespeare_test.h5", seq_len=3,
               stride=1)
    assert len(one.natural_clients[1]) == 4 + 0 + 1 and len(one.y_test) == 4   # 7-3, none, 4-3; 7-3


def test_characters_outside_the_vocabulary_map_to_one_id_or_are_named(tmp_path):
    write_tff(tmp_path / "tr.h5", snippets({"A": ["ok", "a#b%cd"]}))
    write_tff(tmp_path / "te.h5", snippets({"A": ["ab@cd"]}))
    ds = load(tmp_path, features="chars", train="tr.h5", test="te.h5", seq_len=2)
    assert ds.x_train.tolist() == [[0 + LEAF_CHARS.index("a"), 80], [LEAF_CHARS.index("b"), 80]]
    assert ds.y_train.tolist() == [LEAF_CHARS.index("b"), LEAF_CHARS.index("c")]
    with pytest.raises(DataError, match=r"tr.h5: client 'A', feature 'snippets', row 1, character 1 is '#', which "
                                        r"is not in data.tff.vocab"):
        load(tmp_path, features="chars", train="tr.h5", test="te.h5", seq_len=2, unknown="error")


def _malformed(tmp_path, case):
    """A training file with one defect; returns what the message must say."""
    good = emnist_client(1, 3, [0, 1, 2])
    path = tmp_path / "bad_train.h5"
    if case == "no_examples":
        with h5py.File(path, "w") as f:
            f.create_group("clients")
        return r"bad_train.h5 has no group 'examples' \(has clients\)"
    if case == "missing_feature":
        write_tff(path, {"w1": {"pixels": good["pixels"]}})
        return r"bad_train.h5: client 'w1' has no feature 'label' \(has pixels\)"
    if case == "lengths_differ":
        write_tff(path, {"w0": good, "w1": {"pixels": good["pixels"], "label": good["label"][:2]}})
        return r"bad_train.h5: client 'w1' has 3 rows of 'pixels' but 2 of 'label'"
    if case == "float_labels":
        write_tff(path, {"w1": {"pixels": good["pixels"], "label": good["label"].astype(np.float32)}})
        return r"bad_train.h5: client 'w1', feature 'label' has dtype float32; expected integer class labels"
    if case == "string_pixels":
        write_tff(path, {"w1": {"pixels": [b"a", b"b", b"c"], "label": good["label"]}})
        return r"bad_train.h5: client 'w1', feature 'pixels' has dtype object; expected numbers"
    if case == "non_finite":
        pixels = good["pixels"].copy()
        pixels[2, 3, 4] = np.inf
        write_tff(path, {"w0": good, "w1": {"pixels": pixels, "label": good["label"]}})
        return r"bad_train.h5: client 'w1', feature 'pixels', row 2 holds a value that is not finite"
    if case == "negative_label":
        write_tff(path, {"w1": {"pixels": good["pixels"], "label": np.array([0, -1, 2], dtype=np.int32)}})
        return r"bad_train.h5: client 'w1', feature 'label', row 1 = -1 is a negative label"
    if case == "row_shape":
        write_tff(path, {"w0": good, "w1": {"pixels": np.zeros((3, 28, 27), np.float32), "label": good["label"]}})
        return r"bad_train.h5: client 'w1', feature 'pixels' has rows of shape \(28, 27\); the first client's"
    if case == "not_hdf5":
        path.write_bytes(b"not an HDF5 file at all" * 20)
        return r"bad_train.h5 cannot be opened as HDF5"
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["no_examples", "missing_feature", "lengths_differ", "float_labels", "string_pixels",
                                  "non_finite", "negative_label", "row_shape", "not_hdf5"])
def test_a_malformed_file_is_refused_naming_file_client_and_feature(tmp_path, case):
    message = _malformed(tmp_path, case)
    write_tff(tmp_path / "te.h5", {"w1": emnist_client(1, 1, [0])})
    with pytest.raises(DataError, match=message):
        load(tmp_path, train="bad_train.h5", test="te.h5")


def test_snippets_that_are_not_utf8_or_not_strings_are_refused(tmp_path):
    with h5py.File(tmp_path / "tr.h5", "w") as f:
        g = f.create_group("examples").create_group("A")
        g.create_dataset("snippets", data=np.array([b"fine", b"\xff\xfe bad"], dtype=object),
                         dtype=h5py.string_dtype("ascii"))
    write_tff(tmp_path / "te.h5", snippets({"A": ["abcdef"]}))
    with pytest.raises(DataError, match=r"tr.h5: client 'A', feature 'snippets', row 1 is not UTF-8 text"):
        load(tmp_path, features="chars", train="tr.h5", test="te.h5", seq_len=2)
    write_tff(tmp_path / "tr.h5", {"A": {"snippets": np.zeros(3, np.int32)}})
    with pytest.raises(DataError, match=r"feature 'snippets' has dtype int32; expected byte strings"):
        load(tmp_path, features="chars", train="tr.h5", test="te.h5", seq_len=2)
    write_tff(tmp_path / "tr.h5", snippets({"A": ["ab", "c"]}))
    with pytest.raises(DataError, match=r"data.tff.train: .*tr.h5 gives no rows \(no snippet is longer than "
                                        r"data.tff.seq_len = 2\)"):
        load(tmp_path, features="chars", train="tr.h5", test="te.h5", seq_len=2)


def test_missing_files_are_reported_before_anything_is_read(tmp_path):
    spec = data.DATASETS["tff"]
    problems = spec.files(data.dataset_options("tff")(), str(tmp_path))
    assert [p.split(":")[0] for p in problems] == ["data.tff.train", "data.tff.test"]
    assert os.path.join(str(tmp_path), "fed_emnist_train.h5") in problems[0]
    write_tff_emnist(tmp_path)
    assert spec.files(data.dataset_options("tff")(), str(tmp_path)) == []
    assert set(TFF_TRAIN) & set(TFF_TEST) == {"f0003_12", "f0100_40"}
