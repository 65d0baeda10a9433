"""On-disk loaders: CIFAR pickle batches, IDX (plain and gzip), EMNIST, npz; error paths."""

import gzip
import os
import pickle
import struct

import numpy as np
import pytest

from hpcfl import options
from hpcfl.data import dataset_options, load_dataset
from hpcfl.data.files import read_idx, read_pickle
from hpcfl.errors import ConfigError, DataError

# ------------------------------------------------------------ writers in the real formats


def _py2_str(b: bytes) -> bytes:
    """A Python 2 ``str`` as cPickle protocol 2 writes it (loads as bytes in Python 3)."""
    if len(b) < 256:
        return b"U" + bytes([len(b)]) + b
    return b"T" + struct.pack("<I", len(b)) + b


def _py2_int(v: int) -> bytes:
    return b"J" + struct.pack("<i", v)


def py2_cifar_pickle(d: dict) -> bytes:
    """Bytes like the distributed CIFAR batches: Python 2 cPickle protocol 2 of a dict with
    str keys, int lists, str lists and a uint8 ndarray (numpy.core.multiarray._reconstruct)."""
    out = [b"\x80\x02}("]
    for key, val in d.items():
        out.append(_py2_str(key.encode()))
        if isinstance(val, np.ndarray):
            out.append(b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\n"
                       + _py2_int(0) + b"\x85" + _py2_str(b"b") + b"\x87R(" + _py2_int(1)
                       + _py2_int(val.shape[0]) + _py2_int(val.shape[1]) + b"\x86"
                       + b"cnumpy\ndtype\n" + _py2_str(b"u1") + _py2_int(0) + _py2_int(1) + b"\x87R("
                       + _py2_int(3) + _py2_str(b"|") + b"NNN" + _py2_int(-1) + _py2_int(-1) + _py2_int(0)
                       + b"tb\x89" + _py2_str(val.tobytes()) + b"tb")
        elif isinstance(val, list):
            out.append(b"](")
            out += [_py2_int(v) if isinstance(v, int) else _py2_str(v) for v in val]
            out.append(b"e")
        else:
            out.append(_py2_str(val))
    out.append(b"u.")
    return b"".join(out)


def write_cifar10(root, n_per_batch=6, n_test=5, py2=True):
    d = os.path.join(root, "cifar-10-batches-py")
    os.makedirs(d)
    rng = np.random.default_rng(0)
    for name, n in [(f"data_batch_{i}", n_per_batch) for i in range(1, 6)] + [("test_batch", n_test)]:
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, n).tolist()
        entry = {"batch_label": b"training batch", "labels": labels, "data": data}
        blob = py2_cifar_pickle(entry) if py2 else pickle.dumps({k.encode(): v for k, v in entry.items()})
        with open(os.path.join(d, name), "wb") as f:
            f.write(blob)
    with open(os.path.join(d, "batches.meta"), "wb") as f:
        f.write(py2_cifar_pickle({"label_names": [b"airplane"] * 10, "num_vis": b"3072"}))
    return d


def idx_bytes(arr: np.ndarray, code=0x08) -> bytes:
    return bytes([0, 0, code, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.tobytes()


def write_idx(path, arr, gz):
    blob = idx_bytes(arr)
    with open(path + (".gz" if gz else ""), "wb") as f:
        f.write(gzip.compress(blob) if gz else blob)


def write_mnist(root, prefix="", gz=False, n=7, m=3, label_max=10):
    rng = np.random.default_rng(1)
    for split, k in (("train", n), ("t10k" if not prefix else "test", m)):
        stem = f"{prefix}{split}" if prefix else split
        write_idx(os.path.join(root, f"{stem}-images-idx3-ubyte"), rng.integers(0, 256, (k, 28, 28), dtype=np.uint8), gz)
        write_idx(os.path.join(root, f"{stem}-labels-idx1-ubyte"), rng.integers(0, label_max, k, dtype=np.uint8), gz)


def build(name, table=None):
    return options.build(dataset_options(name), table, f"data.{name}")


# ------------------------------------------------------------------------------ CIFAR


@pytest.mark.parametrize("py2", [True, False])
def test_cifar10_roundtrip(tmp_path, py2):
    d = write_cifar10(str(tmp_path), py2=py2)
    ds = load_dataset("cifar10", build("cifar10"), str(tmp_path), 0)
    raw = read_pickle(os.path.join(d, "data_batch_1"), "x")
    assert ds.x_train.shape == (30, 3, 32, 32) and ds.x_train.dtype == np.float32
    assert ds.x_test.shape == (5, 3, 32, 32) and ds.y_test.dtype == np.int64
    assert ds.num_classes == 10 and ds.input_shape == (3, 32, 32) and ds.augment
    assert ds.y_train[:6].tolist() == list(raw["labels"])
    px = raw["data"][0].reshape(3, 32, 32)  # rows are 1024 R, then G, then B
    want = (px / 255.0 - np.array([0.4914, 0.4822, 0.4465])[:, None, None]) / np.array([0.2023, 0.1994, 0.2010])[:, None, None]
    np.testing.assert_allclose(ds.x_train[0], want, rtol=1e-5, atol=1e-5)
    none = load_dataset("cifar10", build("cifar10", {"normalize": "none", "augment": False}), str(tmp_path), 0)
    np.testing.assert_allclose(none.x_train[0], px / 255.0, atol=1e-6)
    assert not none.augment


def test_cifar10_root_may_be_the_batch_dir_itself(tmp_path):
    d = write_cifar10(str(tmp_path))
    assert load_dataset("cifar10", None, d, 0).x_train.shape[0] == 30


def test_cifar100_fine_and_coarse(tmp_path):
    d = tmp_path / "cifar-100-python"
    d.mkdir()
    rng = np.random.default_rng(2)
    for name, n in (("train", 8), ("test", 4)):
        entry = {"filenames": [b"a.png"] * n, "fine_labels": rng.integers(0, 100, n).tolist(),
                 "coarse_labels": rng.integers(0, 20, n).tolist(), "data": rng.integers(0, 256, (n, 3072), dtype=np.uint8)}
        (d / name).write_bytes(py2_cifar_pickle(entry))
        if name == "train":
            fine, coarse = entry["fine_labels"], entry["coarse_labels"]
    fine_ds = load_dataset("cifar100", None, str(tmp_path), 0)
    assert fine_ds.num_classes == 100 and fine_ds.y_train.tolist() == fine
    coarse_ds = load_dataset("cifar100", build("cifar100", {"labels": "coarse"}), str(tmp_path), 0)
    assert coarse_ds.num_classes == 20 and coarse_ds.y_train.tolist() == coarse


def test_cifar_truncated_and_inconsistent(tmp_path):
    d = write_cifar10(str(tmp_path))
    path = os.path.join(d, "data_batch_3")
    blob = open(path, "rb").read()
    open(path, "wb").write(blob[: len(blob) // 2])
    with pytest.raises(DataError, match="data_batch_3 is truncated or not a CIFAR-10 python batch"):
        load_dataset("cifar10", None, str(tmp_path), 0)
    # 6 labels but 5 images
    data = np.zeros((5, 3072), np.uint8)
    open(path, "wb").write(py2_cifar_pickle({"labels": [0] * 6, "data": data}))
    with pytest.raises(DataError, match=r"data_batch_3: expected 6 images of 3072 bytes \(18432 bytes\), found 15360"):
        load_dataset("cifar10", None, str(tmp_path), 0)
    os.remove(path)
    with pytest.raises(DataError, match="missing file .*data_batch_3"):
        load_dataset("cifar10", None, str(tmp_path), 0)


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_restricted_unpickler_refuses_classes(tmp_path):
    d = write_cifar10(str(tmp_path))
    path = os.path.join(d, "test_batch")
    open(path, "wb").write(pickle.dumps({b"data": Evil(), b"labels": []}))
    with pytest.raises(DataError, match=r"test_batch is truncated or not .*refusing to load (posix|os)\.system"):
        load_dataset("cifar10", None, str(tmp_path), 0)
    open(path, "wb").write(pickle.dumps({b"data": np.array([object()], dtype=object), b"labels": []}))
    with pytest.raises(DataError, match="test_batch"):
        load_dataset("cifar10", None, str(tmp_path), 0)


def test_missing_root():
    with pytest.raises(ConfigError, match="data.root is not set"):
        load_dataset("cifar10", None, None, 0)
    with pytest.raises(DataError, match="not a directory"):
        load_dataset("mnist", None, "/nonexistent/dir", 0)


# -------------------------------------------------------------------------------- IDX


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_idx_roundtrip(tmp_path, gz):
    write_mnist(str(tmp_path), gz=gz)
    raw = read_idx(str(tmp_path / ("train-images-idx3-ubyte" + (".gz" if gz else ""))))
    ds = load_dataset("mnist", None, str(tmp_path), 0)
    assert ds.x_train.shape == (7, 1, 28, 28) and ds.x_test.shape == (3, 1, 28, 28)
    np.testing.assert_allclose(ds.x_train[:, 0], (raw / 255.0 - 0.1307) / 0.3081, atol=1e-5)
    half = load_dataset("fashion_mnist", build("fashion_mnist", {"normalize": "half"}), str(tmp_path), 0)
    np.testing.assert_allclose(half.x_train[:, 0], (raw / 255.0 - 0.5) / 0.5, atol=1e-5)


def test_idx_header_dtypes(tmp_path):
    arr = np.arange(12, dtype=">i4").reshape(3, 4)
    p = tmp_path / "x.idx"
    p.write_bytes(idx_bytes(arr, 0x0C))
    out = read_idx(str(p))
    assert out.dtype == np.int32 and out.tolist() == arr.tolist()


def test_idx_truncated_and_wrong_magic(tmp_path):
    write_mnist(str(tmp_path), n=10000, m=2)
    p = tmp_path / "train-images-idx3-ubyte"
    p.write_bytes(p.read_bytes()[:1250])
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte: expected 10000 images of 784 bytes "
                                        r"\(7840000 bytes after the header\), found 1234 bytes"):
        load_dataset("mnist", None, str(tmp_path), 0)
    p.write_bytes(b"\x12\x34\x56\x78" + b"\x00" * 100)
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte: not an IDX file \(magic bytes 12345678"):
        load_dataset("mnist", None, str(tmp_path), 0)
    write_mnist(str(tmp_path), gz=True, n=5, m=2)
    os.remove(p)
    g = tmp_path / "train-images-idx3-ubyte.gz"
    g.write_bytes(g.read_bytes()[:-20])
    with pytest.raises(DataError, match=r"train-images-idx3-ubyte\.gz: truncated or corrupt gzip"):
        load_dataset("mnist", None, str(tmp_path), 0)


def test_idx_label_out_of_range(tmp_path):
    write_mnist(str(tmp_path), label_max=12)
    with pytest.raises(DataError, match="labels outside 0..9"):
        load_dataset("mnist", None, str(tmp_path), 0)


def test_emnist_split_names_transpose_and_letters(tmp_path):
    gzdir = tmp_path / "gzip"
    gzdir.mkdir()
    write_mnist(str(gzdir), prefix="emnist-letters-", gz=True, label_max=27)
    raw_x = read_idx(str(gzdir / "emnist-letters-train-images-idx3-ubyte.gz"))
    raw_y = read_idx(str(gzdir / "emnist-letters-train-labels-idx1-ubyte.gz"))
    raw_y = np.maximum(raw_y, 1)  # letters are 1..26
    with gzip.open(gzdir / "emnist-letters-train-labels-idx1-ubyte.gz", "wb") as f:
        f.write(idx_bytes(raw_y.astype(np.uint8)))
    ds = load_dataset("emnist", build("emnist", {"split": "letters", "normalize": "none"}), str(tmp_path), 0)
    assert ds.num_classes == 26 and ds.y_train.tolist() == (raw_y.astype(int) - 1).tolist()
    np.testing.assert_allclose(ds.x_train[0, 0], raw_x[0].T / 255.0, atol=1e-6)
    with pytest.raises(DataError, match="emnist-balanced-train-images-idx3-ubyte"):
        load_dataset("emnist", None, str(tmp_path), 0)


# -------------------------------------------------------------------------------- npz


def test_npz_with_and_without_test_split(tmp_path):
    x = np.random.default_rng(0).normal(size=(50, 4)).astype(np.float64)
    y = np.arange(50) % 3
    np.savez(tmp_path / "a.npz", x=x, y=y)
    ds = load_dataset("npz", build("npz", {"file": "a.npz", "test_fraction": 0.2}), str(tmp_path), 5)
    assert ds.x_train.shape == (40, 4) and ds.x_test.shape == (10, 4) and ds.num_classes == 3
    assert ds.x_train.dtype == np.float32 and ds.y_train.dtype == np.int64
    both = np.concatenate([ds.x_train, ds.x_test])
    assert sorted(map(tuple, both.round(5))) == sorted(map(tuple, x.astype(np.float32).round(5)))
    again = load_dataset("npz", build("npz", {"file": "a.npz"}), str(tmp_path), 5)
    assert np.array_equal(again.y_test, ds.y_test)
    np.savez(tmp_path / "b.npz", x=x, y=y, x_test=x[:7], y_test=y[:7])
    ds = load_dataset("npz", build("npz", {"file": str(tmp_path / "b.npz")}), None, 0)
    assert ds.x_train.shape == (50, 4) and ds.x_test.shape == (7, 4)


def test_npz_errors(tmp_path):
    np.savez(tmp_path / "a.npz", x=np.zeros((3, 2)))
    with pytest.raises(DataError, match=r"a\.npz lacks y"):
        load_dataset("npz", build("npz", {"file": "a.npz"}), str(tmp_path), 0)
    blob = open(tmp_path / "a.npz", "rb").read()
    (tmp_path / "c.npz").write_bytes(blob[:30])
    with pytest.raises(DataError, match=r"c\.npz is truncated or not an \.npz"):
        load_dataset("npz", build("npz", {"file": "c.npz"}), str(tmp_path), 0)
    with pytest.raises(DataError, match=r"missing file .*nope\.npz"):
        load_dataset("npz", build("npz", {"file": "nope.npz"}), str(tmp_path), 0)
