"""Writers of small files in the exact layouts of the naturally partitioned formats (no download):
LEAF's JSON (train/ and test/ folders of files with users, num_samples, user_data, hierarchies) and
TensorFlow Federated's HDF5 client data (examples/<client>/<feature>, TFF's dtypes)."""

import json
import os

import numpy as np


def leaf_doc(users: dict) -> dict:
    """One LEAF file's object from {user: (x rows, y rows)}, users in the given order."""
    ids = list(users)
    return {"users": ids, "num_samples": [len(users[u][1]) for u in ids],
            "user_data": {u: {"x": users[u][0], "y": users[u][1]} for u in ids},
            "hierarchies": []}


def write_leaf(folder, files: dict) -> str:
    """``files``: {file name: {user: (x rows, y rows)}}, each written as LEAF writes a split's file."""
    os.makedirs(folder, exist_ok=True)
    for name, users in files.items():
        with open(os.path.join(folder, name), "w") as f:
            json.dump(leaf_doc(users), f)
    return str(folder)


def image_rows(tag: int, n: int, width: int = 4) -> list:
    """n rows of ``width`` floats, row r = [tag, r, 0.5, 0.25, ...]: each row says whose it is."""
    return [[float(tag), float(r)] + [0.5 / (k + 1) for k in range(width - 2)] for r in range(n)]


# The tiny LEAF image set of the tests: 3 training users over 2 files, out of id order, and test rows
# for two of them plus one user with test rows only. The rows stay as read: training rows 0-3 are u2's,
# 4-5 u10's, 6-8 u1's; test rows 0-1 u2's, 2 u9's, 3 u1's. Sorted ids: "u1" < "u10" < "u2", so client 0
# is u1 (rows 6-8, own test row 3), client 1 u10 (rows 4-5, no test row), client 2 u2 (rows 0-3, own
# test rows 0-1); test row 2 is no client's.
LEAF_TRAIN = {
    "all_data_0_niid_0_keep_0_train_9.json": {"u2": (image_rows(2, 4), [1, 2, 2, 3]),
                                              "u10": (image_rows(10, 2), [0, 0])},
    "all_data_1_niid_0_keep_0_train_9.json": {"u1": (image_rows(1, 3), [4, 1, 0])},
}
LEAF_TEST = {
    "all_data_0_niid_0_keep_0_test_9.json": {"u2": (image_rows(2, 2), [2, 3]), "u9": (image_rows(9, 1), [1])},
    "all_data_1_niid_0_keep_0_test_9.json": {"u1": (image_rows(1, 1), [4])},
}


def write_leaf_images(root) -> str:
    """LEAF_TRAIN and LEAF_TEST under root/train and root/test; returns root."""
    write_leaf(os.path.join(root, "train"), LEAF_TRAIN)
    write_leaf(os.path.join(root, "test"), LEAF_TEST)
    return str(root)


def shakespeare_rows(text: str, seq_len: int) -> tuple[list, list]:
    """LEAF Shakespeare's rows of one user: every window of seq_len characters and the next one."""
    return [text[i:i + seq_len] for i in range(len(text) - seq_len)], list(text[seq_len:])


def write_tff(path, clients: dict, dtypes: dict | None = None) -> str:
    """An .h5 laid out as TFF's: ``clients`` {client id: {feature: array or list of byte strings}}.
    A list of bytes becomes a variable-length byte-string dataset (TFF's snippets)."""
    import h5py

    with h5py.File(path, "w") as f:
        ex = f.create_group("examples")
        for cid, feats in clients.items():
            g = ex.create_group(cid)
            for name, val in feats.items():
                if isinstance(val, list):
                    g.create_dataset(name, data=np.array(val, dtype=object), dtype=h5py.string_dtype("utf-8"))
                else:
                    g.create_dataset(name, data=val, dtype=(dtypes or {}).get(name, val.dtype))
    return str(path)


def emnist_client(tag: int, n: int, labels) -> dict:
    """TFF EMNIST's features of one client: pixels float32 (n, 28, 28) with pixel [0, 0] = tag and
    [0, 1] = row, label int32 (n,)."""
    pixels = np.ones((n, 28, 28), dtype=np.float32)
    pixels[:, 0, 0] = tag
    pixels[:, 0, 1] = np.arange(n)
    return {"pixels": pixels, "label": np.asarray(labels, dtype=np.int32)}


# The tiny TFF EMNIST files of the tests: ids sort as "f0003_12" < "f0010_01" < "f0100_40"; client
# f0010_01 has no test rows, "f9999_00" test rows only.
TFF_TRAIN = {"f0100_40": emnist_client(100, 4, [61, 1, 2, 61]), "f0003_12": emnist_client(3, 2, [0, 9]),
             "f0010_01": emnist_client(10, 3, [5, 5, 7])}
TFF_TEST = {"f0003_12": emnist_client(3, 1, [9]), "f0100_40": emnist_client(100, 2, [1, 61]),
            "f9999_00": emnist_client(9999, 1, [3])}


def write_tff_emnist(root) -> str:
    os.makedirs(root, exist_ok=True)
    write_tff(os.path.join(root, "fed_emnist_train.h5"), TFF_TRAIN)
    write_tff(os.path.join(root, "fed_emnist_test.h5"), TFF_TEST)
    return str(root)


def random_leaf(root, users: int = 7, width: int = 16, classes: int = 4, seed: int = 0, chars: bool = False) -> str:
    """A LEAF split pair of ``users`` users with random rows (3 to 10 training rows, 0 to 3 test rows each),
    over two train and two test files; ``chars``: Shakespeare-like rows of ``width`` characters instead."""
    rng = np.random.default_rng(seed)
    text = "abcdefgh ijkl,mnop.\n"

    def rows(n):
        if chars:
            xs = ["".join(rng.choice(list(text), width)) for _ in range(n)]
            return xs, [str(c) for c in rng.choice(list(text), n)]
        return rng.normal(size=(n, width)).round(4).tolist(), rng.integers(0, classes, n).tolist()

    train, test = ({}, {}), ({}, {})
    for u in range(users):
        uid = f"f{rng.integers(0, 10**4):04d}_{u:02d}"
        train[u % 2][uid] = rows(int(rng.integers(3, 11)))
        n_test = int(rng.integers(0, 4))
        if n_test:
            test[u % 2][uid] = rows(n_test)
    write_leaf(os.path.join(root, "train"), {"a_train.json": train[0], "b_train.json": train[1]})
    write_leaf(os.path.join(root, "test"), {"a_test.json": test[0], "b_test.json": test[1]})
    return str(root)
