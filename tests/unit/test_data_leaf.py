"""``leaf``: LEAF's JSON in its exact layout (split train/ and test/ folders of files with users,
num_samples, user_data, hierarchies): clients in sorted id order, their sizes and own test rows
(hand-checked), FEMNIST-like images and Shakespeare characters, and every malformed file refused
naming the file, the user and the field."""

import json
import os

import numpy as np
import pytest
from natural_writers import (
    LEAF_TEST,
    LEAF_TRAIN,
    image_rows,
    leaf_doc,
    shakespeare_rows,
    write_leaf,
    write_leaf_images,
)

from hpcfl import data
from hpcfl.config import options
from hpcfl.data.chars import LEAF_CHARS
from hpcfl.errors import ConfigError, DataError


def load(root, **opts):
    o = options.build(data.dataset_options("leaf"), opts, "data.leaf")
    return data.load_dataset("leaf", o, str(root) if root is not None else None, 0)


def test_users_become_clients_in_sorted_id_order_with_their_own_test_rows(tmp_path):
    ds = load(write_leaf_images(tmp_path), image_shape=[1, 2, 2])
    # rows as read: file 0 holds u2 (4 rows) then u10 (2), file 1 u1 (3)
    assert ds.x_train[:, 0, 0, :].tolist() == [[2, 0], [2, 1], [2, 2], [2, 3], [10, 0], [10, 1], [1, 0], [1, 1],
                                               [1, 2]]
    assert ds.y_train.tolist() == [1, 2, 2, 3, 0, 0, 4, 1, 0]
    # clients by id, "u1" < "u10" < "u2"
    assert [list(c) for c in ds.natural_clients] == [[6, 7, 8], [4, 5], [0, 1, 2, 3]]
    # test set: u2 (2 rows), u9 (1, no client's), u1 (1); u10 has none
    assert ds.x_test[:, 0, 0, 0].tolist() == [2, 2, 9, 1] and ds.y_test.tolist() == [2, 3, 1, 4]
    assert [list(t) for t in ds.natural_test] == [[3], [], [0, 1]]
    assert ds.input_shape == (1, 2, 2) and ds.num_classes == 5 and ds.x_train.dtype == np.float32
    assert ds.x_train[0, 0, 1].tolist() == [0.5, 0.25]
    parts = data.make_partition("natural", ds.y_train, 3, None, 0, ds)
    assert [list(p) for p in parts] == [[6, 7, 8], [4, 5], [0, 1, 2, 3]]
    with pytest.raises(ConfigError, match=r"data.num_clients = 4, but 'leaf' has 3 natural clients; set "
                                          r"data.num_clients = 3"):
        data.make_partition("natural", ds.y_train, 4, None, 0, ds)


def test_flat_rows_single_files_and_paths_relative_to_root_or_absolute(tmp_path):
    root = write_leaf_images(tmp_path)
    ds = load(root, train="train/all_data_1_niid_0_keep_0_train_9.json", num_classes=10)
    assert ds.input_shape == (4,) and ds.x_train.shape == (3, 4) and ds.num_classes == 10
    assert [list(c) for c in ds.natural_clients] == [[0, 1, 2]] and [list(t) for t in ds.natural_test] == [[3]]
    absolute = load(None, train=os.path.join(root, "train"), test=os.path.join(root, "test"))
    assert absolute.x_train.shape == (9, 4)


def test_no_user_of_the_training_files_with_test_rows_leaves_per_client_rows_drawn(tmp_path):
    write_leaf(tmp_path / "train", {"a.json": {"x": (image_rows(1, 2), [0, 1])}})
    write_leaf(tmp_path / "test", {"a.json": {"other": (image_rows(2, 2), [1, 1])}})   # LEAF's user split
    ds = load(tmp_path)
    assert len(ds.natural_clients) == 1 and ds.natural_test is None and len(ds.y_test) == 2


def test_a_user_without_training_rows_is_no_client(tmp_path):
    write_leaf(tmp_path / "train", {"a.json": {"b": ([], []), "a": (image_rows(1, 2), [0, 1])}})
    write_leaf(tmp_path / "test", {"a.json": {"b": (image_rows(2, 1), [1])}})
    ds = load(tmp_path)
    assert [list(c) for c in ds.natural_clients] == [[0, 1]] and ds.natural_test is None


def test_shakespeare_characters_become_ids_over_leafs_vocabulary(tmp_path):
    seq = 5
    bob = shakespeare_rows("To be, or not", seq)       # 8 rows
    amy = shakespeare_rows("What? 12 [x]}", seq)
    write_leaf(tmp_path / "train", {"t.json": {"bob": bob, "amy": amy}})
    write_leaf(tmp_path / "test", {"t.json": {"amy": shakespeare_rows("Alas!\n poor", seq)}})
    ds = load(tmp_path, features="chars")
    assert ds.input_shape == (seq,) and ds.num_classes == 80 and len(LEAF_CHARS) == 80
    # rows as read (bob's 8, then amy's 8); clients by id: amy, bob
    assert [list(c) for c in ds.natural_clients] == [list(range(8, 16)), list(range(8))]
    ids = [LEAF_CHARS.index(c) for c in "What?"]
    assert ds.x_train[8].tolist() == ids and ds.y_train[8] == LEAF_CHARS.index(" ")
    assert ds.x_train[0].tolist() == [LEAF_CHARS.index(c) for c in "To be"] and ds.y_train[0] == LEAF_CHARS.index(",")
    assert LEAF_CHARS.index("\n") == 0 and LEAF_CHARS.index("}") == 79
    assert ds.y_train[15] == 79 and ds.y_test.tolist()[:2] == [LEAF_CHARS.index("\n"), LEAF_CHARS.index(" ")]
    assert [list(t) for t in ds.natural_test] == [list(range(6)), []]


def test_a_character_outside_the_vocabulary_is_an_error_or_one_extra_id(tmp_path):
    write_leaf(tmp_path / "train", {"t.json": {"bob": (["ab#cd", "abcde"], ["f", "%"])}})
    write_leaf(tmp_path / "test", {"t.json": {"bob": (["abcde"], ["f"])}})
    with pytest.raises(DataError, match=r"t\.json: user_data\['bob'\]\['x'\]\[0\], character 2 is '#', which is "
                                        r"not in data\.leaf\.vocab"):
        load(tmp_path, features="chars")
    ds = load(tmp_path, features="chars", unknown="map")
    assert ds.num_classes == 81 and ds.x_train[0, 2] == 80 and ds.y_train.tolist() == [LEAF_CHARS.index("f"), 80]
    ds = load(tmp_path, features="chars", vocab="abcdef#%")
    assert ds.x_train[0].tolist() == [0, 1, 6, 2, 3] and ds.y_train.tolist() == [5, 7] and ds.num_classes == 8
    with pytest.raises(DataError, match=r"user_data\['bob'\]\['y'\]\[1\] is '%'"):
        load(tmp_path, features="chars", vocab="abcdef#")


def test_repeated_or_empty_vocabulary_is_a_config_error():
    with pytest.raises(ConfigError, match=r"data.leaf: vocab repeats 'a' \(positions 0 and 2\)"):
        options.build(data.dataset_options("leaf"), {"features": "chars", "vocab": "aba"}, "data.leaf")
    with pytest.raises(ConfigError, match=r"data.leaf: vocab is empty"):
        options.build(data.dataset_options("leaf"), {"features": "chars", "vocab": ""}, "data.leaf")


def _good():
    return {"u": (image_rows(1, 2), [0, 1])}


def _edit(doc, how):
    how(doc)
    return doc


MALFORMED = {
    "missing_key": (lambda d: d.pop("num_samples"), r"lacks the key num_samples"),
    "count_mismatch": (lambda d: d["num_samples"].__setitem__(0, 3),
                       r"user 'u': num_samples says 3 rows but user_data\['u'\]\['x'\] has 2"),
    "y_shorter": (lambda d: d["user_data"]["u"]["y"].pop(), (r"user 'u': num_samples says 2 rows but "
                                                              r"user_data\['u'\]\['y'\] has 1")),
    "listed_user_missing": (lambda d: (d["users"].append("v"), d["num_samples"].append(1)),
                            r"user 'v' is in users but not in user_data"),
    "unlisted_user": (lambda d: d["user_data"].__setitem__("w", {"x": [], "y": []}),
                      r"user 'w' is in user_data but not in users"),
    "users_counts_lengths": (lambda d: d["num_samples"].append(4), r"users lists 1 users but num_samples 2"),
    "no_y": (lambda d: d["user_data"]["u"].pop("y"), r"user_data\['u'\] needs keys x and y \(has x\)"),
    "short_row": (lambda d: d["user_data"]["u"]["x"][1].pop(), (r"user_data\['u'\]\['x'\]\[1\] has 3 values; "
                                                                 r"expected 4")),
    "string_value": (lambda d: d["user_data"]["u"]["x"][1].__setitem__(2, "0.5"),
                     r"user_data\['u'\]\['x'\]\[1\]\[2\] is '0.5' \(a str\); expected a number"),
    "null_value": (lambda d: d["user_data"]["u"]["x"][0].__setitem__(3, None),
                   r"user_data\['u'\]\['x'\]\[0\]\[3\] is None"),
    "nan_value": (lambda d: d["user_data"]["u"]["x"][1].__setitem__(0, float("nan")),
                  r"user_data\['u'\]\['x'\]\[1\]\[0\] = nan is not a finite float32 value"),
    "beyond_float32": (lambda d: d["user_data"]["u"]["x"][0].__setitem__(1, 1e39),
                       r"user_data\['u'\]\['x'\]\[0\]\[1\] = 1e\+39 is not a finite float32 value"),
    "negative_label": (lambda d: d["user_data"]["u"]["y"].__setitem__(1, -2),
                       r"user_data\['u'\]\['y'\]\[1\] = -2 is a negative label"),
    "fractional_label": (lambda d: d["user_data"]["u"]["y"].__setitem__(0, 1.5),
                         r"user_data\['u'\]\['y'\]\[0\] is 1.5 \(a float\); expected an integer class label"),
    "string_label": (lambda d: d["user_data"]["u"]["y"].__setitem__(0, "a"),
                     r"user_data\['u'\]\['y'\]\[0\] is 'a' \(a str\); expected an integer class label"),
    "numeric_user_id": (lambda d: d["users"].__setitem__(0, 7), r"users\[0\] = 7 is not a string"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_file_is_refused_naming_file_user_and_field(tmp_path, case):
    how, message = MALFORMED[case]
    os.makedirs(tmp_path / "train")
    with open(tmp_path / "train" / "bad_train.json", "w") as f:
        json.dump(_edit(leaf_doc(_good()), how), f)
    write_leaf(tmp_path / "test", {"t.json": _good()})
    with pytest.raises(DataError, match=r"train/bad_train\.json:? .*" + message):
        load(tmp_path)


def test_invalid_json_names_line_and_column_and_duplicates_are_refused(tmp_path):
    write_leaf_images(tmp_path)
    (tmp_path / "test" / "broken.json").write_text('{"users": ["a"],\n "num_samples": [1,]}')
    with pytest.raises(DataError, match=r"test/broken\.json is not valid JSON: .* at line 2, column 20"):
        load(tmp_path)
    os.remove(tmp_path / "test" / "broken.json")
    write_leaf(tmp_path / "train", {"zz_again.json": {"u10": (image_rows(10, 1), [0])}})
    with pytest.raises(DataError, match=r"zz_again\.json: user 'u10' is also in .*all_data_0_niid_0_keep_0_train_9"):
        load(tmp_path)
    os.remove(tmp_path / "train" / "zz_again.json")
    (tmp_path / "train" / "list.json").write_text("[1, 2]")
    with pytest.raises(DataError, match=r"list\.json: the top level is a JSON list"):
        load(tmp_path)


def test_rows_of_another_length_in_the_test_split_and_missing_paths(tmp_path):
    write_leaf(tmp_path / "train", LEAF_TRAIN)
    write_leaf(tmp_path / "test", {"t.json": {"u1": (image_rows(1, 1, width=6), [0])}})
    with pytest.raises(DataError, match=r"t\.json: user_data\['u1'\]\['x'\]\[0\] has 6 values; expected 4"):
        load(tmp_path)
    spec = data.DATASETS["leaf"]
    problems = spec.files(data.dataset_options("leaf")(), str(tmp_path / "nowhere"))
    assert problems == [(f"data.root = {str(tmp_path / 'nowhere')!r} is not a directory (data.leaf.train is read "
                         f"from it)")]
    (tmp_path / "empty").mkdir()
    problems = spec.files(data.dataset_options("leaf")(), str(tmp_path / "empty"))
    assert len(problems) == 2 and "data.leaf.train:" in problems[0] and "data.leaf.test:" in problems[1]
    with pytest.raises(DataError, match=r"data.leaf.test: the folder .*/empty holds no \.json file"):
        load(tmp_path, test="empty")


def test_labels_beyond_num_classes_are_refused(tmp_path):
    write_leaf(tmp_path / "train", LEAF_TRAIN)
    write_leaf(tmp_path / "test", LEAF_TEST)
    with pytest.raises(DataError, match=r"data.leaf.num_classes = 3 is too small for labels up to 4; set it to at "
                                        r"least 5"):
        load(tmp_path, num_classes=3)


def sent140(*texts_labels):
    """LEAF's Sent140 rows: x = [tweet id, date, query, user, text], y = 0 or 1."""
    return ([[str(1000 + i), "Mon Apr 06 22:19:45 PDT 2009", "NO_QUERY", "amy", t] for i, (t, _) in
             enumerate(texts_labels)], [y for _, y in texts_labels])


def test_sent140_texts_become_word_ids_with_padding_and_unknown_words(tmp_path):
    (tmp_path / "glove.txt").write_text("the 0.1 0.2\nmovie 0.3 -0.1\n\ngood 0.5 0.5\n! 0.0 0.0\n")
    write_leaf(tmp_path / "train", {"s.json": {"amy": sent140(("The movie was good!", 1),
                                                              ("the the the the the the the movie", 0))}})
    write_leaf(tmp_path / "test", {"s.json": {"amy": sent140(("good, movie", 1))}})
    ds = load(tmp_path, features="tokens", vocab_file="glove.txt", seq_len=6)
    # the=2, movie=3, good=4, !=5 (the blank line is skipped); 0 pads, 1 is any other word
    assert ds.x_train.tolist() == [[1, 3, 1, 4, 5, 0], [2, 2, 2, 2, 2, 2]] and ds.y_train.tolist() == [1, 0]
    assert ds.x_test.tolist() == [[4, 1, 3, 0, 0, 0]] and ds.input_shape == (6,) and ds.num_classes == 2
    low = load(tmp_path, features="tokens", vocab_file=str(tmp_path / "glove.txt"), seq_len=3, lowercase=True)
    assert low.x_train.tolist() == [[2, 3, 1], [2, 2, 2]]
    (tmp_path / "dup.txt").write_text("a\nb\na 1\n")
    with pytest.raises(DataError, match=r"dup\.txt, line 3: token 'a' is listed again \(first as id 2\)"):
        load(tmp_path, features="tokens", vocab_file="dup.txt")
    with pytest.raises(ConfigError, match=r"features = 'tokens' needs vocab_file"):
        load(tmp_path, features="tokens")
    write_leaf(tmp_path / "test", {"s.json": {"amy": ([[1, 2]], [0])}})
    with pytest.raises(DataError, match=r"s\.json: user_data\['amy'\]\['x'\]\[0\] is \[1, 2\] \(a list\); expected "
                                        r"a text"):
        load(tmp_path, features="tokens", vocab_file="glove.txt")


def test_an_embedding_smaller_than_the_ids_is_refused_at_start_up(tmp_path):
    from mpi4py import MPI
    from runner import job

    from hpcfl import config
    from hpcfl.engine import simulation

    (tmp_path / "glove.txt").write_text("the\nmovie\ngood\n!\n")
    texts = [("The movie was good!", 1), ("the movie", 0), ("good good", 1)]
    write_leaf(tmp_path / "train", {"s.json": {"amy": sent140(*texts), "bob": sent140(*texts[1:])}})
    write_leaf(tmp_path / "test", {"s.json": {"amy": sent140(texts[0])}})
    table = job(**{"data.dataset": "leaf", "data.root": str(tmp_path), "data.partition": "natural",
                   "data.num_clients": 2, "data.leaf.features": "tokens", "data.leaf.vocab_file": "glove.txt",
                   "data.leaf.seq_len": 4, "algorithm.batch_size": 2, "algorithm.clients_per_round": 2,
                   "run.rounds": 1})
    table["model"] = {"name": "char_lstm", "char_lstm": {"hidden": 4, "layers": 1}}
    with pytest.raises(ConfigError, match=r"model.name = 'char_lstm' embeds its inputs as ids 0..1 .*holds ids "
                                          r"0..4; set model.char_lstm.vocab_size to at least 5"):
        simulation.prepare(config.from_dict(table), MPI.COMM_SELF)
    table["model"]["char_lstm"]["vocab_size"] = 6
    setup = simulation.prepare(config.from_dict(table), MPI.COMM_SELF)
    x = simulation.run(setup)
    assert np.isfinite(np.asarray(x)).all() and setup.client_eval.sizes.tolist() == [1, 0]
