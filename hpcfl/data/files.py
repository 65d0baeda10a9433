"""Datasets read from disk in their distributed formats: ON_DISK, their registry, and ``npz``.

* CIFAR-10 / CIFAR-100 (:mod:`hpcfl.data.cifar`): the "python version" pickle batches, read
  with a restricted unpickler, so a crafted file cannot run code.
* MNIST, Fashion-MNIST, EMNIST (:mod:`hpcfl.data.idx`): IDX files, gzipped or not, parsed from
  their header.
* ``npz`` (here): a generic numpy archive (``x``, ``y``, optional ``x_test``, ``y_test``, and the
  natural clients' ids ``client``, ``client_test``).
* ``leaf`` (:mod:`hpcfl.data.leaf`) and ``tff`` (:mod:`hpcfl.data.tff`): LEAF's JSON and TensorFlow
  Federated's HDF5 client data, naturally partitioned.

What they share is in :mod:`hpcfl.data.disk` (finding and opening files under data.root) and
:mod:`hpcfl.data.image_files` (the image normalisation). Every failure (missing, truncated,
wrong format, not a regular file) is a :class:`DataError` naming the file and what was expected.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError, DataError
from .cifar import Cifar10Options, Cifar100Options, load_cifar10, load_cifar100
from .clients import ids_clients, paths_check
from .container import Dataset, DatasetSpec, check_arrays
from .disk import _find_dir, _open, root_check
from .idx import (
    _FASHION_DIRS,
    _MNIST_DIRS,
    EmnistOptions,
    MnistOptions,
    _emnist_find,
    _idx_find,
    _idx_loader,
    load_emnist,
)
from .leaf import LeafOptions, load_leaf
from .tff import TffOptions, load_tff

# ------------------------------------------------------------------------------- npz


def _npz_path(opts, root: str | None) -> str:
    """``data.npz.file``, absolute or relative to data.root."""
    return opts.file if os.path.isabs(opts.file) or root is None else os.path.join(root, opts.file)


def _npz_files(opts, root: str | None) -> list[str]:
    path = _npz_path(opts, root)
    if root is not None and not os.path.isdir(root):
        return [f"data.root = {root!r} is not a directory (data.npz.file = {opts.file!r} is read from it)"]
    if not os.path.exists(path):
        return [f"data.npz.file: {path} does not exist; set data.npz.file (absolute, or relative to data.root)"]
    return []


@dataclass(frozen=True)
class NpzOptions:
    file: str = field(default="data.npz", metadata={
        "help": "the .npz archive with x, y (optionally x_test, y_test; client, client_test: natural clients); "
                "absolute or relative to data.root"})
    test_fraction: float = field(default=0.2, metadata={
        "gt": 0, "lt": 1, "help": "fraction of the samples held out (seeded) as the test set when there is no x_test"})
    num_classes: int | None = field(default=None, metadata={
        "ge": 2, "help": "number of classes; unset: the largest label + 1"})
    augment: bool = field(default=False, metadata={
        "help": "random crop (4-pixel padding) and horizontal flip of every training batch (C, H, W images)"})


def load_npz(opts: NpzOptions, root: str | None, seed: int) -> Dataset:
    """``x``, ``y`` and optionally ``x_test``, ``y_test``, ``client``, ``client_test`` from an .npz (no pickles).

    ``file`` is absolute or relative to data.root. Inputs are cast to float32 as they are
    (normalise them beforehand). Without a test split, ``test_fraction`` of the samples,
    chosen with ``default_rng(seed)``, become the test set (with their ``client`` ids, which
    then are the clients' own test rows). ``client`` (n,) and ``client_test`` (n_test,) are
    integer ids of natural clients (:func:`hpcfl.data.clients.ids_clients`).
    """
    path = _npz_path(opts, root)
    exp = "an .npz archive with arrays x and y (optionally x_test and y_test, client and client_test)"
    with _open(path, exp) as f:
        try:
            with np.load(f, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except Exception as e:  # zipfile, zlib, format and pickle errors all mean the same here
            raise DataError(f"{path} is truncated or not {exp} ({type(e).__name__}: {e})") from None
    missing = [k for k in ("x", "y") if k not in arrays]
    if ("x_test" in arrays) != ("y_test" in arrays):
        missing.append("y_test" if "x_test" in arrays else "x_test")
    if "client_test" in arrays and "client" not in arrays:
        missing.append("client (client_test names the test rows' clients, client the training rows')")
    if "client_test" in arrays and "x_test" not in arrays:
        missing.append("x_test (client_test labels its rows; without x_test the held-out rows keep their client)")
    if missing:
        raise DataError(f"{path} lacks {', '.join(missing)} (has {', '.join(sorted(arrays)) or 'nothing'}); "
                        f"expected {exp}")

    def labels(key):
        y = arrays[key]
        if y.ndim != 1 or not (np.issubdtype(y.dtype, np.integer) or np.all(np.mod(y, 1) == 0)):
            raise DataError(f"{path}: {key} must be a 1-D array of integer class labels")
        return y.astype(np.int64)

    def ids(key, n):
        c = arrays.get(key)
        if c is None:
            return None
        if c.ndim != 1 or c.dtype.kind not in "iu" or len(c) != n:
            raise DataError(f"{path}: {key} has dtype {c.dtype} and shape {c.shape}; expected one integer client id "
                            f"per row, shape ({n},)")
        return c.astype(np.int64)

    x, y = arrays["x"], labels("y")
    check_arrays(path, x, y, "x/y")
    client = ids("client", len(y))
    if "x_test" in arrays:
        xte, yte = arrays["x_test"], labels("y_test")
        check_arrays(path, xte, yte, "x_test/y_test")
        if xte.shape[1:] != x.shape[1:]:
            raise DataError(f"{path}: x_test rows have shape {xte.shape[1:]}, x rows {x.shape[1:]}")
        client_test = ids("client_test", len(yte))
    else:
        perm = np.random.default_rng(seed).permutation(len(y))
        n_te = int(round(opts.test_fraction * len(y)))
        if not 0 < n_te < len(y):
            raise ConfigError(f"data.npz.test_fraction = {opts.test_fraction} leaves no train or no test "
                              f"samples out of {len(y)}")
        te, tr = np.sort(perm[:n_te]), np.sort(perm[n_te:])
        x, y, xte, yte = x[tr], y[tr], x[te], y[te]
        client, client_test = (None, None) if client is None else (client[tr], client[te])
    top = int(max(y.max(initial=0), yte.max(initial=0))) + 1
    num_classes = opts.num_classes or top
    if top > num_classes:
        raise DataError(f"{path}: labels go up to {top - 1} but data.npz.num_classes = {num_classes}")
    clients, own_test = ids_clients(client, client_test)
    return Dataset(
        name="npz", x_train=np.ascontiguousarray(x, dtype=np.float32), y_train=y,
        x_test=np.ascontiguousarray(xte, dtype=np.float32), y_test=yte, num_classes=num_classes,
        input_shape=tuple(x.shape[1:]), augment=opts.augment, natural_clients=clients, natural_test=own_test,
    )


ON_DISK = {
    "cifar10": DatasetSpec(Cifar10Options, load_cifar10, "CIFAR-10 python batches (cifar-10-batches-py)",
                           files=root_check("cifar10", "cifar-10-batches-py", lambda o, r: _find_dir(
                               r, "data_batch_1", ("cifar-10-batches-py", ""), "cifar10"))),
    "cifar100": DatasetSpec(Cifar100Options, load_cifar100, "CIFAR-100 python files (cifar-100-python)",
                            files=root_check("cifar100", "cifar-100-python", lambda o, r: _find_dir(
                                r, "train", ("cifar-100-python", ""), "cifar100"))),
    "mnist": DatasetSpec(MnistOptions, _idx_loader("mnist", _MNIST_DIRS), "MNIST IDX files",
                         files=root_check("mnist", "IDX files", _idx_find("mnist", _MNIST_DIRS))),
    "fashion_mnist": DatasetSpec(
        MnistOptions, _idx_loader("fashion_mnist", _FASHION_DIRS), "Fashion-MNIST IDX files",
        files=root_check("fashion_mnist", "IDX files", _idx_find("fashion_mnist", _FASHION_DIRS)),
    ),
    "emnist": DatasetSpec(EmnistOptions, load_emnist, "EMNIST IDX files of one split (emnist-<split>-...)",
                          files=root_check("emnist", "IDX files", _emnist_find)),
    "npz": DatasetSpec(NpzOptions, load_npz, "generic .npz with x, y (and optionally x_test, y_test; client, "
                       "client_test: natural clients)", files=_npz_files),
    "leaf": DatasetSpec(LeafOptions, load_leaf, "LEAF's JSON (FEMNIST, Shakespeare): natural clients, each user's "
                        "own test rows", files=paths_check("leaf", ("train", "test", "vocab_file"))),
    "tff": DatasetSpec(TffOptions, load_tff, "TensorFlow Federated's HDF5 client data (EMNIST-62, Shakespeare): "
                       "natural clients, own test rows", files=paths_check("tff", ("train", "test"))),
}
