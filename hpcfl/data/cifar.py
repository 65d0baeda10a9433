"""CIFAR-10 / CIFAR-100, read from the "python version" pickle batches.

The batches are read with a restricted unpickler (:mod:`hpcfl.data.safe_pickle`) that can build
only dicts, lists, strings, bytes, numbers and plain numeric numpy arrays (the batches store
``b'data'`` as a uint8 ndarray). No other class can be loaded, so a crafted file cannot run code.
Every failure is a :class:`DataError` naming the file and what was expected.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from ..errors import DataError
from . import safe_pickle
from .container import Dataset
from .disk import _find_dir, _need_root, _open
from .image_files import ImageNormOptions, _image_dataset


def read_pickle(path: str, expected: str) -> dict:
    """Load a dict from a CIFAR-style pickle with :mod:`hpcfl.data.safe_pickle`; keys become str.

    Only dicts, lists, tuples, str, bytes, numbers, None and bool/integer/float numpy
    arrays can come out; anything else (another class, a function call, an object or
    structured dtype) is a :class:`DataError` naming the file and what was refused.
    """
    with _open(path, expected) as f:
        try:
            obj = safe_pickle.load(f)
        except safe_pickle.Refused as e:
            raise DataError(f"{path}: refusing to load {e}; expected {expected} (the loader accepts only "
                            "dicts, lists, strings, numbers and bool/integer/float numpy arrays)") from None
        except Exception as e:  # every failure of a corrupt or crafted stream is a data error
            raise DataError(f"{path} is truncated or not {expected} ({type(e).__name__}: {e})") from None
    if not isinstance(obj, dict):
        raise DataError(f"{path} holds a {type(obj).__name__}, not a dict; expected {expected}")
    return {(k.decode("latin1") if isinstance(k, bytes) else k): v for k, v in obj.items()}


# ----------------------------------------------------------------------------- CIFAR

_CIFAR_BYTES = 3 * 32 * 32


def read_cifar_batch(path: str, label_key: str, expected: str) -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 (n, 3, 32, 32), labels int64) of one CIFAR python batch."""
    d = read_pickle(path, expected)
    for key in ("data", label_key):
        if key not in d:
            have = ", ".join(sorted(map(str, d))) or "none"
            raise DataError(f"{path} has no b'{key}' entry (keys: {have}); expected {expected}")
    labels = d[label_key]
    try:
        y = np.asarray(labels, dtype=np.int64).reshape(-1)
    except (TypeError, ValueError):
        raise DataError(f"{path}: b'{label_key}' is not a list of integers") from None
    data = d["data"]
    if isinstance(data, (bytes, bytearray)):
        data = np.frombuffer(data, dtype=np.uint8)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8:
        raise DataError(f"{path}: b'data' is not a uint8 array; expected {expected}")
    n = len(y)
    if data.size != n * _CIFAR_BYTES:
        raise DataError(
            f"{path}: expected {n} images of {_CIFAR_BYTES} bytes ({n * _CIFAR_BYTES} bytes), "
            f"found {data.size} bytes"
        )
    return data.reshape(n, 3, 32, 32), y


@dataclass(frozen=True)
class Cifar10Options(ImageNormOptions):
    CHANNELS: ClassVar[int] = 3
    augment: bool = field(default=True, metadata={
        "help": "random crop (4-pixel padding) and horizontal flip of every training batch (FedNova, FedDisco)"})


@dataclass(frozen=True)
class Cifar100Options(Cifar10Options):
    labels: str = field(default="fine", metadata={
        "choices": ("fine", "coarse"),
        "help": "label set: fine (100 classes) or coarse (20 superclasses)"})


def load_cifar10(opts: Cifar10Options, root: str | None, seed: int) -> Dataset:
    root = _need_root(root, "cifar10", "cifar-10-batches-py")
    d = _find_dir(root, "data_batch_1", ("cifar-10-batches-py", ""), "cifar10")
    exp = "a CIFAR-10 python batch (dict with b'data' uint8 n x 3072 and b'labels')"
    parts = [read_cifar_batch(os.path.join(d, f"data_batch_{i}"), "labels", exp) for i in range(1, 6)]
    xte, yte = read_cifar_batch(os.path.join(d, "test_batch"), "labels", exp)
    num_classes = 10
    meta_path = os.path.join(d, "batches.meta")
    if os.path.exists(meta_path):
        meta = read_pickle(meta_path, "the CIFAR-10 batches.meta dict (b'label_names')")
        num_classes = len(meta.get("label_names", [None] * 10))
    return _image_dataset(
        "cifar10", opts, np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
        xte, yte, num_classes, opts.augment, d,
    )


def load_cifar100(opts: Cifar100Options, root: str | None, seed: int) -> Dataset:
    root = _need_root(root, "cifar100", "cifar-100-python")
    d = _find_dir(root, "train", ("cifar-100-python", ""), "cifar100")
    key = f"{opts.labels}_labels"
    exp = f"a CIFAR-100 python file (dict with b'data' uint8 n x 3072 and b'{key}')"
    xtr, ytr = read_cifar_batch(os.path.join(d, "train"), key, exp)
    xte, yte = read_cifar_batch(os.path.join(d, "test"), key, exp)
    num_classes = 100 if opts.labels == "fine" else 20
    meta_path = os.path.join(d, "meta")
    if os.path.exists(meta_path):
        meta = read_pickle(meta_path, "the CIFAR-100 meta dict")
        num_classes = len(meta.get(f"{opts.labels}_label_names", [None] * num_classes))
    return _image_dataset("cifar100", opts, xtr, ytr, xte, yte, num_classes, opts.augment, d)
