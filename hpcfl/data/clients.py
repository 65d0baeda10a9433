"""What the readers of naturally partitioned data share: the client order, the clients' index arrays
and where their files are.

* Client order: every user with at least one training row becomes a client, in ascending order of
  its id (as a string, by code point, so "f10" comes before "f9"; integers for npz). A user with no
  training row (LEAF's user split, a TFF client whose snippets are all shorter than a window) trains
  nothing: its test rows, if any, stay in the global test set and belong to no client.
* :func:`natural_groups`: the clients' training rows and their own test rows as
  :class:`hpcfl.data.partition.Groups`, from the per-user row counts, in linear time.
* :func:`resolve`, :func:`listing`, :func:`paths_check`: a ``train``/``test`` option is a file or a
  folder, absolute or relative to ``data.root`` (as ``data.npz.file``).
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import DataError
from .partition import Groups


def _ranges(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + n) for s, n in zip(starts, sizes)])`` without a loop, int64."""
    sizes = np.asarray(sizes, dtype=np.int64)
    total = int(sizes.sum())
    ends = np.cumsum(sizes)
    # each row's position in the output minus its block's start there, plus the block's start
    return np.repeat(np.asarray(starts, dtype=np.int64) - (ends - sizes), sizes) + np.arange(total, dtype=np.int64)


def natural_groups(train_ids: list, train_sizes, test_ids: list | None = None,
                   test_sizes=None) -> tuple[Groups, Groups | None, list]:
    """The clients and their own test rows from per-user row counts.

    Parameters
    ----------
    train_ids : list, length U
        User ids in ascending order; the training set holds their rows in this order.
    train_sizes : array of int, shape (U,)
        Training rows per user (0: the user is no client).
    test_ids : list, length V, or None
        User ids of the test set in ascending order; it holds their rows in this order.
    test_sizes : array of int, shape (V,), or None

    Returns
    -------
    clients : Groups
        Client i's training rows (sorted), for the K users with rows.
    own_test : Groups or None
        Client i's test rows (sorted; none for a client absent from the test set); None when no
        client has any (per-client evaluation then draws its rows, :mod:`hpcfl.data.client_test`).
    ids : list, length K
        The clients' user ids, in client order.
    """
    sizes = np.asarray(train_sizes, dtype=np.int64)
    keep = np.flatnonzero(sizes > 0)
    ids = [train_ids[i] for i in keep]
    kept = sizes[keep]
    clients = Groups(np.arange(int(kept.sum()), dtype=np.int64), kept)
    if test_ids is None:
        return clients, None, ids
    tsizes = np.asarray(test_sizes, dtype=np.int64)
    tstarts = np.cumsum(tsizes) - tsizes
    where = {u: j for j, u in enumerate(test_ids)}
    j = np.fromiter((where.get(u, -1) for u in ids), dtype=np.int64, count=len(ids))
    own = np.where(j >= 0, tsizes[j], 0)
    if not own.any():
        return clients, None, ids
    starts = np.where(j >= 0, tstarts[j], 0)
    return clients, Groups(_ranges(starts, own), own), ids


# ------------------------------------------------------------------------- paths


def resolve(path: str, root: str | None) -> str:
    """``path`` as given when absolute or without ``data.root``, else under ``data.root``."""
    return path if os.path.isabs(path) or root is None else os.path.join(root, path)


def listing(path: str, suffixes: tuple[str, ...], key: str, what: str) -> list[str]:
    """The files an option names: ``path`` itself, or the ``suffixes`` files of folder ``path``,
    sorted by name (a DataError naming ``key`` when there is none)."""
    if os.path.isdir(path):
        names = sorted(n for n in os.listdir(path) if n.endswith(suffixes) and not n.startswith("."))
        if not names:
            raise DataError(f"{key}: the folder {path} holds no {' or '.join(suffixes)} file; expected {what}")
        return [os.path.join(path, n) for n in names]
    if not os.path.exists(path):
        raise DataError(f"{key}: {path} does not exist; expected {what} (absolute, or relative to data.root)")
    return [path]


def paths_check(name: str, keys: tuple[str, ...]):
    """The ``DatasetSpec.files`` check of a dataset whose options ``keys`` name a file or a folder
    (stat calls only: problems are reported with the job's others, before anything is read)."""
    def check(opts, root: str | None) -> list[str]:
        if root is not None and not os.path.isdir(root):
            return [f"data.root = {root!r} is not a directory (data.{name}.{keys[0]} is read from it)"]
        problems = []
        for k in keys:
            value = getattr(opts, k)
            if not value:   # an optional file left unset (its options' validate() says when it is needed)
                continue
            path = resolve(value, root)
            if not os.path.exists(path):
                problems.append(f"data.{name}.{k}: {path} does not exist; set data.{name}.{k} (a file or a "
                                f"folder, absolute or relative to data.root)")
        return problems
    return check
