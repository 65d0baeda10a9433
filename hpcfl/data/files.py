"""Datasets read from disk in their distributed formats.

* CIFAR-10 / CIFAR-100: the "python version" pickle batches, read with a restricted
  unpickler that can build only dicts, lists, strings, bytes, numbers and plain numeric
  numpy arrays (the batches store ``b'data'`` as a uint8 ndarray). No other class can be
  loaded, so a crafted file cannot run code.
* MNIST, Fashion-MNIST, EMNIST: IDX files, gzipped or not, parsed from their header.
* ``npz``: a generic numpy archive (``x``, ``y``, optional ``x_test``, ``y_test``).

Every failure (missing, truncated, wrong format, not a regular file) is a :class:`DataError`
naming the file and what was expected.
"""

from __future__ import annotations

import gzip
import os
import struct
import zlib
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from ..errors import ConfigError, DataError, HpcflError
from ..inputs import open_regular
from . import safe_pickle
from .augment import normalize_images
from .container import Dataset, DatasetSpec, check_arrays
from .sources import get_hint


def _open(path: str, expected: str):
    """``path`` for reading, if it is a regular file (a FIFO would block start-up: :mod:`hpcfl.inputs`)."""
    try:
        return open_regular(path)
    except FileNotFoundError:
        raise DataError(f"missing file {path}; expected {expected}") from None
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror}; expected {expected}") from None


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


def _under(root: str, subdirs: tuple[str, ...]) -> list[str]:
    """The folders ``subdirs`` of ``root``, in order ("" is ``root`` itself)."""
    return [os.path.join(root, s) if s else root for s in subdirs]


def _find_dir(root: str, marker: str, candidates: tuple[str, ...], what: str) -> str:
    tried = _under(root, candidates)
    for d in tried:
        if os.path.exists(os.path.join(d, marker)):
            return d
    raise DataError(f"{what}: no {marker} found in any of {', '.join(tried)}; "
                    f"set data.root to the directory that holds the extracted files{get_hint(what)}")


def _need_root(root: str | None, name: str, what: str) -> str:
    if root is None:
        raise ConfigError(f"data.root is not set; dataset {name!r} reads {what} from it{get_hint(name)}")
    if not os.path.isdir(root):
        raise DataError(f"data.root = {root!r} is not a directory (dataset {name!r} reads {what} from it)"
                        f"{get_hint(name)}")
    return root


def root_check(name: str, what: str, find=None):
    """The ``DatasetSpec.files`` check of a dataset that reads ``what`` from ``data.root``;
    ``find(opts, root)``, when given, looks for its first file there (stat calls only)."""
    def check(opts, root: str | None) -> list[str]:
        try:
            _need_root(root, name, what)
            if find is not None:
                find(opts, root)
        except HpcflError as exc:
            return [str(exc).removeprefix("config error: ")]
        return []
    return check


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


_STATS = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
    "mnist": ((0.1307,), (0.3081,)),
    "fashion_mnist": ((0.2860,), (0.3530,)),
    "emnist": ((0.1751,), (0.3332,)),
}


@dataclass(frozen=True)
class ImageNormOptions:
    """``normalize``: ``standard`` (the dataset's usual mean/std), ``half`` (0.5, 0.5),
    ``none`` (pixels in [0, 1]); ``mean``/``std`` override per channel."""

    CHANNELS: ClassVar[int] = 1
    normalize: str = field(default="standard", metadata={
        "choices": ("standard", "half", "none"),
        "help": "standard: the dataset's usual per-channel mean/std; half: mean = std = 0.5; none: pixels in [0, 1]"})
    mean: tuple[float, ...] | None = field(default=None, metadata={
        "help": "per-channel mean, overrides normalize (set std too); unset: from normalize"})
    std: tuple[float, ...] | None = field(default=None, metadata={
        "gt": 0, "help": "per-channel std, overrides normalize (set mean too); unset: from normalize"})

    def validate(self) -> list[str]:
        out = []
        if (self.mean is None) != (self.std is None):
            out.append("set both mean and std, or neither")
        for key in ("mean", "std"):
            v = getattr(self, key)
            if v is not None and len(v) != self.CHANNELS:
                out.append(f"{key} needs {self.CHANNELS} value(s), one per channel; got {len(v)}")
        return out

    def stats(self, name: str):
        if self.mean is not None:
            return self.mean, self.std
        c = self.CHANNELS
        return {"standard": _STATS[name], "half": ((0.5,) * c, (0.5,) * c), "none": ((0.0,) * c, (1.0,) * c)}[
            self.normalize
        ]


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


def _image_dataset(name, opts, xtr, ytr, xte, yte, num_classes, augment, where) -> Dataset:
    for y, what in ((ytr, "training labels"), (yte, "test labels")):
        if y.size and (y.min() < 0 or y.max() >= num_classes):
            raise DataError(f"{name} in {where}: {what} outside 0..{num_classes - 1} "
                            f"(found {int(y.min())}..{int(y.max())})")
    mean, std = opts.stats(name)
    return Dataset(
        name=name,
        x_train=normalize_images(xtr, mean, std),
        y_train=ytr.astype(np.int64),
        x_test=normalize_images(xte, mean, std),
        y_test=yte.astype(np.int64),
        num_classes=num_classes,
        input_shape=tuple(xtr.shape[1:]),
        augment=augment,
    )


# ------------------------------------------------------------------------------- IDX

_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str, ndim: int | None = None) -> np.ndarray:
    """Parse an IDX file (gzipped when it starts with the gzip magic) into an array."""
    with _open(path, "an IDX file") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (EOFError, OSError, zlib.error) as e:
            raise DataError(f"{path}: truncated or corrupt gzip stream ({e})") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_TYPES:
        raise DataError(f"{path}: not an IDX file (magic bytes {raw[:4].hex() or 'missing'}, "
                        "expected 0000 then a type code 08/09/0b/0c/0d/0e and the number of dimensions)")
    dtype, nd = np.dtype(_IDX_TYPES[raw[2]]), raw[3]
    if nd == 0:
        raise DataError(f"{path}: IDX file declares 0 dimensions")
    if ndim is not None and nd != ndim:
        raise DataError(f"{path}: IDX file has {nd} dimensions, expected {ndim}")
    if len(raw) < 4 + 4 * nd:
        raise DataError(f"{path}: truncated IDX header (expected {4 + 4 * nd} bytes, found {len(raw)})")
    dims = struct.unpack(f">{nd}I", raw[4 : 4 + 4 * nd])
    item = int(np.prod(dims[1:], dtype=np.int64)) * dtype.itemsize
    want = dims[0] * item
    have = len(raw) - 4 - 4 * nd
    if have != want:
        kind = "images" if nd >= 3 else "labels" if nd == 1 else "items"
        raise DataError(f"{path}: expected {dims[0]} {kind} of {item} bytes ({want} bytes after the header), "
                        f"found {have} bytes")
    return np.frombuffer(raw, dtype=dtype, offset=4 + 4 * nd).reshape(dims).astype(dtype.newbyteorder("="))


def _find_file(dirs: list[str], stem: str, name: str = "") -> str:
    for d in dirs:
        for file in (stem, stem + ".gz"):
            p = os.path.join(d, file)
            if os.path.exists(p):
                return p
    raise DataError(f"missing file {stem}[.gz]; looked in {', '.join(dirs)}; "
                    f"set data.root to the directory that holds the IDX files{get_hint(name)}")


def _load_idx_pair(dirs, img_stem, lbl_stem, name=""):
    img_path, lbl_path = _find_file(dirs, img_stem, name), _find_file(dirs, lbl_stem, name)
    x, y = read_idx(img_path, 3), read_idx(lbl_path, 1)
    if x.shape[0] != y.shape[0]:
        raise DataError(f"{img_path} has {x.shape[0]} images but {lbl_path} has {y.shape[0]} labels")
    return x, y.astype(np.int64), img_path


@dataclass(frozen=True)
class MnistOptions(ImageNormOptions):
    pass


_EMNIST_CLASSES = {"byclass": 62, "bymerge": 47, "balanced": 47, "letters": 26, "digits": 10, "mnist": 10}


@dataclass(frozen=True)
class EmnistOptions(ImageNormOptions):
    split: str = field(default="balanced", metadata={
        "choices": tuple(_EMNIST_CLASSES),
        "help": "which EMNIST files (emnist-<split>-*): byclass 62, bymerge and balanced 47, letters 26, digits and "
                "mnist 10 classes"})
    transpose: bool = field(default=True, metadata={
        "help": "transpose the images to MNIST's orientation (EMNIST stores them transposed)"})


_MNIST_DIRS = ("", "MNIST/raw", "mnist")   # where under data.root the IDX files may be ("": data.root itself)
_FASHION_DIRS = ("", "FashionMNIST/raw", "fashion_mnist", "fashion-mnist")
_EMNIST_DIRS = ("", "gzip", "EMNIST/raw")


def _idx_find(name: str, subdirs: tuple[str, ...]):
    def find(opts, root):
        _find_file(_under(root, subdirs), "train-images-idx3-ubyte", name)
    return find


def _emnist_find(opts, root):
    _find_file(_under(root, _EMNIST_DIRS), f"emnist-{opts.split}-train-images-idx3-ubyte", "emnist")


def _idx_loader(name: str, subdirs: tuple[str, ...]):
    def load(opts: MnistOptions, root: str | None, seed: int) -> Dataset:
        root = _need_root(root, name, "IDX files")
        dirs = _under(root, subdirs)
        xtr, ytr, where = _load_idx_pair(dirs, "train-images-idx3-ubyte", "train-labels-idx1-ubyte", name)
        xte, yte, _ = _load_idx_pair(dirs, "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", name)
        return _image_dataset(name, opts, xtr[:, None], ytr, xte[:, None], yte, 10, False, where)

    return load


def load_emnist(opts: EmnistOptions, root: str | None, seed: int) -> Dataset:
    """EMNIST split files ``emnist-<split>-{train,test}-{images-idx3,labels-idx1}-ubyte[.gz]``.

    EMNIST stores images transposed relative to MNIST; ``transpose`` (default) fixes that.
    ``letters`` labels 1..26 are shifted to 0..25.
    """
    root = _need_root(root, "emnist", "IDX files")
    dirs = _under(root, _EMNIST_DIRS)
    s = f"emnist-{opts.split}"
    xtr, ytr, where = _load_idx_pair(dirs, f"{s}-train-images-idx3-ubyte", f"{s}-train-labels-idx1-ubyte", "emnist")
    xte, yte, _ = _load_idx_pair(dirs, f"{s}-test-images-idx3-ubyte", f"{s}-test-labels-idx1-ubyte", "emnist")
    if opts.split == "letters":
        ytr, yte = ytr - 1, yte - 1
    if opts.transpose:
        xtr, xte = xtr.transpose(0, 2, 1), xte.transpose(0, 2, 1)
    return _image_dataset("emnist", opts, xtr[:, None], ytr, xte[:, None], yte,
                          _EMNIST_CLASSES[opts.split], False, where)


# ------------------------------------------------------------------------------- npz


@dataclass(frozen=True)
class NpzOptions:
    file: str = field(default="data.npz", metadata={
        "help": "the .npz archive with x, y (optionally x_test, y_test); absolute or relative to data.root"})
    test_fraction: float = field(default=0.2, metadata={
        "gt": 0, "lt": 1, "help": "fraction of the samples held out (seeded) as the test set when there is no x_test"})
    num_classes: int | None = field(default=None, metadata={
        "ge": 2, "help": "number of classes; unset: the largest label + 1"})
    augment: bool = field(default=False, metadata={
        "help": "random crop (4-pixel padding) and horizontal flip of every training batch (C, H, W images)"})


def load_npz(opts: NpzOptions, root: str | None, seed: int) -> Dataset:
    """``x``, ``y`` and optionally ``x_test``, ``y_test`` from an .npz (no pickles).

    ``file`` is absolute or relative to data.root. Inputs are cast to float32 as they are
    (normalise them beforehand). Without a test split, ``test_fraction`` of the samples,
    chosen with ``default_rng(seed)``, become the test set.
    """
    path = _npz_path(opts, root)
    exp = "an .npz archive with arrays x and y (optionally x_test and y_test)"
    with _open(path, exp) as f:
        try:
            with np.load(f, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except Exception as e:  # zipfile, zlib, format and pickle errors all mean the same here
            raise DataError(f"{path} is truncated or not {exp} ({type(e).__name__}: {e})") from None
    missing = [k for k in ("x", "y") if k not in arrays]
    if ("x_test" in arrays) != ("y_test" in arrays):
        missing.append("y_test" if "x_test" in arrays else "x_test")
    if missing:
        raise DataError(f"{path} lacks {', '.join(missing)} (has {', '.join(sorted(arrays)) or 'nothing'}); "
                        f"expected {exp}")

    def labels(key):
        y = arrays[key]
        if y.ndim != 1 or not (np.issubdtype(y.dtype, np.integer) or np.all(np.mod(y, 1) == 0)):
            raise DataError(f"{path}: {key} must be a 1-D array of integer class labels")
        return y.astype(np.int64)

    x, y = arrays["x"], labels("y")
    check_arrays(path, x, y, "x/y")
    if "x_test" in arrays:
        xte, yte = arrays["x_test"], labels("y_test")
        check_arrays(path, xte, yte, "x_test/y_test")
        if xte.shape[1:] != x.shape[1:]:
            raise DataError(f"{path}: x_test rows have shape {xte.shape[1:]}, x rows {x.shape[1:]}")
    else:
        perm = np.random.default_rng(seed).permutation(len(y))
        n_te = int(round(opts.test_fraction * len(y)))
        if not 0 < n_te < len(y):
            raise ConfigError(f"data.npz.test_fraction = {opts.test_fraction} leaves no train or no test "
                              f"samples out of {len(y)}")
        te, tr = np.sort(perm[:n_te]), np.sort(perm[n_te:])
        x, y, xte, yte = x[tr], y[tr], x[te], y[te]
    top = int(max(y.max(initial=0), yte.max(initial=0))) + 1
    num_classes = opts.num_classes or top
    if top > num_classes:
        raise DataError(f"{path}: labels go up to {top - 1} but data.npz.num_classes = {num_classes}")
    return Dataset(
        name="npz", x_train=np.ascontiguousarray(x, dtype=np.float32), y_train=y,
        x_test=np.ascontiguousarray(xte, dtype=np.float32), y_test=yte, num_classes=num_classes,
        input_shape=tuple(x.shape[1:]), augment=opts.augment,
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
    "npz": DatasetSpec(NpzOptions, load_npz, "generic .npz with x, y (and optionally x_test, y_test)",
                       files=_npz_files),
}
