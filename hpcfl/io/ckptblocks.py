"""Checkpoint arrays in bounded blocks: written as they arrive, hashed and read back a block at a time.

A checkpoint's per-client tables can be far larger than one process's spare memory (20 GB of
SCAFFOLD rows is a modest cluster job), so nothing here ever holds a whole table:

* :class:`Streamed` stands for an array that is written block by block, in C order, from an
  iterator (the engine's: rank 0's own rows and the rows the other ranks send it); the
  checkpoint store writes each block into its pre-created dataset and hashes it before
  asking for the next, so the writer needs one block of memory;
* :func:`hash_dataset` hashes a stored dataset a block at a time (verification after a save
  and before a resume);
* :class:`FileArrays` and :class:`DictArrays` give the arrays of a checkpoint a block at a time
  for a resume (a file opened by :func:`hpcfl.io.checkpoint.open_loaded`, or a dict in tests).

Blocks are whole rows (the first axis) of at most :data:`BLOCK_BYTES`, or one row when a row is
larger (one model's worth); the hash is the same as hashing the whole array at once, so files
written before streaming and after are the same format.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

BLOCK_BYTES = 64 << 20      # one block of rows in memory on the writer and the reader
MESSAGE_BYTES = 1 << 30     # the most one MPI message carries (MPI counts are int: under 2 GiB)


def row_blocks(nrows: int, row_bytes: int, block_bytes: int | None = None) -> list[tuple[int, int]]:
    """``[(r0, r1)]`` covering ``range(nrows)`` in order, each at most ``block_bytes`` (or one row)."""
    per = max(1, (block_bytes or BLOCK_BYTES) // max(1, row_bytes))
    return [(r0, min(nrows, r0 + per)) for r0 in range(0, nrows, per)]


def header(name: str, dtype: np.dtype, shape) -> bytes:
    """The line hashed before an array's bytes (see :mod:`hpcfl.io.ckptfile`)."""
    return (json.dumps([name, np.dtype(dtype).str, [int(n) for n in shape]]) + "\n").encode()


def hash_bytes(h, arr) -> None:
    """Update ``h`` with ``arr``'s raw C-order bytes: the buffer itself, not tobytes() (no second copy
    of a large block)."""
    h.update(np.ascontiguousarray(arr).reshape(-1).view(np.uint8))


def row_bytes(shape, dtype) -> int:
    return int(np.prod(shape[1:], dtype=np.int64)) * np.dtype(dtype).itemsize


@dataclass
class Streamed:
    """An array of ``shape`` and ``dtype`` whose blocks come from ``blocks()``.

    ``blocks`` yields ``(r0, r1, rows)``: rows ``r0 .. r1 - 1`` (C order, ascending, covering the
    first axis exactly once) as an array the caller must use before asking for the next (it
    may be a reused buffer). :meth:`drain` consumes what was not taken: a stream fed by
    other ranks must always be read to its end, also when writing failed.
    """

    shape: tuple
    dtype: np.dtype
    blocks: Callable[[], Iterator[tuple[int, int, np.ndarray]]]
    _it: Iterator | None = field(default=None, repr=False)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    def __iter__(self):
        if self._it is None:
            self._it = iter(self.blocks())
        return self._it

    def drain(self) -> None:
        for _ in self:
            pass


def hash_dataset(h, name: str, ds) -> None:
    """Update ``h`` with a stored dataset's header and bytes, one block at a time."""
    h.update(header(name, ds.dtype, ds.shape))
    if ds.ndim == 0:
        hash_bytes(h, ds[()])
        return
    for r0, r1 in row_blocks(ds.shape[0], row_bytes(ds.shape, ds.dtype)):
        hash_bytes(h, ds[r0:r1])


class FileArrays:
    """A verified checkpoint file's arrays, read a block at a time (an open ``h5py.File``)."""

    def __init__(self, f):
        self.f = f

    def spec(self, name: str):
        """``(shape, dtype)`` of array ``name``, or None when the file has none."""
        ds = self.f["arrays"].get(name)
        return None if ds is None else (tuple(ds.shape), ds.dtype)

    def array(self, name: str) -> np.ndarray:
        return np.asarray(self.f["arrays"][name][()])

    def block(self, name: str, r0: int, r1: int) -> np.ndarray:
        return np.ascontiguousarray(self.f["arrays"][name][r0:r1])

    def close(self) -> None:
        self.f.close()


class DictArrays(FileArrays):
    """The same over a dict of arrays (what :func:`hpcfl.engine.resume.capture` returns)."""

    def __init__(self, arrays: dict):
        self.arrays = arrays

    def spec(self, name: str):
        a = self.arrays.get(name)
        return None if a is None else (tuple(np.shape(a)), np.asarray(a).dtype)

    def array(self, name: str) -> np.ndarray:
        return np.asarray(self.arrays[name])

    def block(self, name: str, r0: int, r1: int) -> np.ndarray:
        return np.ascontiguousarray(self.arrays[name][r0:r1])

    def close(self) -> None:
        pass
