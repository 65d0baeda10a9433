"""MNIST, Fashion-MNIST, EMNIST: IDX files, gzipped or not, parsed from their header.

The files are looked for in data.root itself and in the usual folders under it (torchvision's
``MNIST/raw`` among them); EMNIST reads the files of one split (``emnist-<split>-...``).
Every failure is a :class:`DataError` naming the file and what was expected.
"""

from __future__ import annotations

import gzip
import os
import struct
import zlib
from dataclasses import dataclass, field

import numpy as np

from ..errors import DataError
from .container import Dataset
from .disk import _need_root, _open, _under
from .image_files import ImageNormOptions, _image_dataset
from .sources import get_hint

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
