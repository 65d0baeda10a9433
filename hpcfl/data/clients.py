"""What the readers of naturally partitioned data share: the client order, the clients' index arrays
and where their files are.

* Client order: every user with at least one training row becomes a client, in ascending order of
  its id (as a string, by code point, so "f10" comes before "f9"; integers for npz). A user with no
  training row (LEAF's user split, a TFF client whose snippets are all shorter than a window) trains
  nothing: its test rows, if any, stay in the global test set and belong to no client.
* :func:`natural_groups`: the clients' training rows and their own test rows as
  :class:`hpcfl.data.partition.Groups`, from where each user's rows are (a reader may keep the rows
  in the order it read them: LEAF's in file order), in linear time plus one sort of the ids.
* :func:`ids_clients`: the same from one client id per row (npz's and dataset plug-ins' ``client``
  and ``client_test`` arrays).
* :func:`resolve`, :func:`listing`, :func:`paths_check`: a ``train``/``test`` option is a file or a
  folder, absolute or relative to ``data.root`` (as ``data.npz.file``).
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import DataError
from .partition import Groups, groups_from_owner


def _ranges(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """``concatenate([arange(s, s + n) for s, n in zip(starts, sizes)])`` without a loop, int64."""
    sizes = np.asarray(sizes, dtype=np.int64)
    total = int(sizes.sum())
    ends = np.cumsum(sizes)
    # each row's position in the output minus its block's start there, plus the block's start
    return np.repeat(np.asarray(starts, dtype=np.int64) - (ends - sizes), sizes) + np.arange(total, dtype=np.int64)


def natural_groups(train_ids: list, train_starts, train_sizes, test_ids: list | None = None, test_starts=None,
                   test_sizes=None) -> tuple[Groups, Groups | None, list]:
    """The clients and their own test rows from where each user's rows are.

    Parameters
    ----------
    train_ids : list, length U
        User ids, in any order (each once).
    train_starts, train_sizes : array of int, shape (U,)
        Each user's first row in the training set and its row count (0: the user is no client);
        a user's rows are consecutive.
    test_ids, test_starts, test_sizes : the same for the test set, or None

    Returns
    -------
    clients : Groups
        Client i's training rows (ascending), for the K users with rows, in ascending id order.
    own_test : Groups or None
        Client i's test rows (ascending; none for a client absent from the test set); None when no
        client has any (per-client evaluation then draws its rows, :mod:`hpcfl.data.client_test`).
    ids : list, length K
        The clients' user ids, in client order.
    """
    sizes = np.asarray(train_sizes, dtype=np.int64)
    starts = np.asarray(train_starts, dtype=np.int64)
    keep = np.array([i for i in sorted(range(len(train_ids)), key=train_ids.__getitem__) if sizes[i] > 0],
                    dtype=np.int64)
    ids = [train_ids[i] for i in keep]
    kept = sizes[keep]
    clients = Groups(_ranges(starts[keep], kept), kept)
    if test_ids is None:
        return clients, None, ids
    tsizes = np.asarray(test_sizes, dtype=np.int64)
    tstarts = np.asarray(test_starts, dtype=np.int64)
    where = {u: j for j, u in enumerate(test_ids)}
    j = np.fromiter((where.get(u, -1) for u in ids), dtype=np.int64, count=len(ids))
    own = np.where(j >= 0, tsizes[j], 0)
    if not own.any():
        return clients, None, ids
    return clients, Groups(_ranges(np.where(j >= 0, tstarts[j], 0), own), own), ids


def consecutive(sizes) -> np.ndarray:
    """Each user's first row when the users' rows follow one another in order: (U,) int64."""
    sizes = np.asarray(sizes, dtype=np.int64)
    return np.cumsum(sizes) - sizes


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


def ids_clients(client: np.ndarray | None, client_test: np.ndarray | None):
    """Natural clients from per-row ids (an npz's or a dataset plug-in's ``client`` arrays): (clients,
    own test rows), each Groups or None.

    The distinct ids of ``client`` (n,), ascending, are clients 0..K-1; a client's rows keep
    the arrays' order. ``client_test`` (n_test,) gives each client its own test rows; a test
    row whose id is no training client's stays in the global test set and belongs to no client.
    No client with a test row: None (per-client evaluation then draws its rows).
    """
    if client is None:
        return None, None
    uniq, owner = np.unique(client, return_inverse=True)
    clients = groups_from_owner(owner.reshape(-1), len(uniq))
    if client_test is None or not len(uniq):
        return clients, None
    at = np.minimum(np.searchsorted(uniq, client_test), len(uniq) - 1)
    own = groups_from_owner(np.where(uniq[at] == client_test, at, -1), len(uniq))
    return clients, (own if own.sizes.sum() else None)
