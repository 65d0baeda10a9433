"""A dataset and a partition of your own (``data.dataset = "mydata:load"``, ``data.partition =
"myparts:split"``): calling them, and checking what they return.

Dataset contract::

    load(seed: int, **options) -> mapping with
        x       (n, *input_shape)  numbers (float; cast to float32)   training inputs
        y       (n,)               integers >= 0                      training labels
        x_test  (m, *input_shape)  as x                               test inputs
        y_test  (m,)               as y                               test labels
        client       (n,) integers, optional: the data's own client of each training row
        client_test  (m,) integers, optional: the same for the test rows
        num_classes  int, optional: default max label + 1 (train and test)

numpy arrays or torch tensors. ``client`` ids may be any integers: the sorted distinct ids are
clients 0..K-1 (client 0 is the smallest id), so ``data.partition = "natural"`` with
``data.num_clients = K`` gives client k the rows of the k-th smallest id, as an npz's ``client``
array does (:func:`hpcfl.data.clients.ids_clients`). ``client_test`` gives each client its own test
rows, which per-client evaluation then uses; a test row whose id is no training client's stays in
the global test set only (as a LEAF test user who is no training user).

Partition contract::

    split(labels: np.ndarray (n,) int64, num_clients: int, seed: int, **options)
        -> num_clients integer index arrays into the training set

Each array must hold valid indices, none twice within a client (a row may go to several clients);
they are returned sorted, as int64, as every built-in partition's are.

What a plug-in returns is refused with a message naming it (``data.dataset = 'mydata:load'``): a
DataError for the arrays of a dataset, a ConfigError for a partition's output.

A run calls the dataset's function, and :func:`load` checks what it returns, once per node, on the
node's first rank (:mod:`hpcfl.engine.dataload`); the node's other ranks read those checked arrays
from shared memory, or raise the same refusal.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..errors import ConfigError, DataError, nearest
from ..plugins import Plugin, raised_at
from .clients import ids_clients
from .container import Dataset, check_arrays

REQUIRED = ("x", "y", "x_test", "y_test")
OPTIONAL = ("client", "client_test", "num_classes")


def _call(plugin: Plugin, options, *fixed):
    try:
        return plugin.call(options, *fixed)
    except Exception as exc:   # the user's code: its line, not a traceback
        raise ConfigError(f"{plugin.label}: calling it raised {raised_at(exc)}; fix the function") from None


def _array(plugin: Plugin, key: str, value) -> np.ndarray:
    """numpy's view of a numpy array, a torch tensor (detached, on the CPU) or a nested list."""
    if type(value).__module__.split(".")[0] == "torch" and hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    try:
        return np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{plugin.label}: {key} cannot be read as an array ({exc}); return numpy arrays or torch "
                        f"tensors") from None


def _labels(plugin: Plugin, key: str, y: np.ndarray) -> None:
    if y.ndim != 1 or y.dtype.kind not in "iu":
        raise DataError(f"{plugin.label}: {key} is {y.dtype} of shape {y.shape}; expected one integer label per "
                        f"row, shape (n,) (cast whole-number labels with .astype(np.int64))")


def load(plugin: Plugin, options, seed: int) -> Dataset:
    """Call the dataset plug-in and check what it returns (see the module docstring)."""
    got = _call(plugin, options, int(seed))
    if not isinstance(got, Mapping):
        raise DataError(f"{plugin.label} returned a {type(got).__name__}; expected a mapping (dict) with keys "
                        f"{', '.join(REQUIRED)} (and optionally {', '.join(OPTIONAL)})")
    for key in got:
        if key not in REQUIRED + OPTIONAL:
            guess = nearest(key, REQUIRED + OPTIONAL)
            raise DataError(f"{plugin.label} returned key {key!r}, which is not one of {', '.join(REQUIRED + OPTIONAL)}"
                            + (f"; did you mean {guess!r}?" if guess else "; remove it"))
    missing = [k for k in REQUIRED if k not in got]
    if missing:
        raise DataError(f"{plugin.label} returned no {', '.join(missing)}; the mapping needs {', '.join(REQUIRED)}")
    x, y, xt, yt = (_array(plugin, k, got[k]) for k in REQUIRED)
    _labels(plugin, "y", y)
    _labels(plugin, "y_test", yt)
    check_arrays(plugin.label, x, y, "x/y")
    check_arrays(plugin.label, xt, yt, "x_test/y_test")
    if len(y) == 0:
        raise DataError(f"{plugin.label} returned no training rows (x has shape {x.shape}); return at least one")
    if xt.shape[1:] != x.shape[1:]:
        raise DataError(f"{plugin.label}: x_test's rows have shape {xt.shape[1:]} but x's have {x.shape[1:]}; "
                        f"both must hold samples of one shape")
    top = int(max(y.max(), yt.max() if yt.size else 0))
    num_classes = _num_classes(plugin, got.get("num_classes"), top)
    natural = own_test = None
    if got.get("client") is not None:
        test = got.get("client_test")
        natural, own_test = _clients(plugin, _array(plugin, "client", got["client"]), len(y),
                                     None if test is None else _array(plugin, "client_test", test), len(yt))
    elif got.get("client_test") is not None:
        raise DataError(f"{plugin.label} returned client_test without client; give both or neither")
    return Dataset(plugin.name, np.ascontiguousarray(x, dtype=np.float32), np.ascontiguousarray(y, dtype=np.int64),
                   np.ascontiguousarray(xt, dtype=np.float32), np.ascontiguousarray(yt, dtype=np.int64),
                   num_classes, tuple(int(s) for s in x.shape[1:]), natural_clients=natural,
                   natural_test=own_test)


def _num_classes(plugin: Plugin, given, top: int) -> int:
    if given is None:
        return top + 1
    value = given.item() if hasattr(given, "item") and getattr(given, "shape", None) in ((), None) else given
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= top:
        raise DataError(f"{plugin.label} returned num_classes = {given!r}; expected an integer above the largest "
                        f"label, {top} (or leave it out: max label + 1)")
    return int(value)


def _clients(plugin: Plugin, client: np.ndarray, n: int, client_test, m: int):
    """(clients' training rows, their own test rows or None), clients in the order of their sorted
    distinct ids, after checking each id array's shape and dtype."""
    for key, ids, rows in (("client", client, n), ("client_test", client_test, m)):
        if ids is None:
            continue
        if ids.ndim != 1 or ids.dtype.kind not in "iu" or len(ids) != rows:
            raise DataError(f"{plugin.label}: {key} is {ids.dtype} of shape {ids.shape}; expected one integer client "
                            f"id per {'training' if key == 'client' else 'test'} row, shape ({rows},)")
    return ids_clients(client.astype(np.int64), None if client_test is None else client_test.astype(np.int64))


def split(plugin: Plugin, labels: np.ndarray, num_clients: int, options, seed: int) -> list[np.ndarray]:
    """Call the partition plug-in and check its output: ``num_clients`` sorted int64 index arrays."""
    n = len(labels)
    parts = _call(plugin, options, labels.copy(), int(num_clients), int(seed))   # a copy: the data stays as it is
    try:
        count = len(parts)
    except TypeError:
        raise ConfigError(f"{plugin.label} returned a {type(parts).__name__}; expected a list of num_clients = "
                          f"{num_clients} index arrays") from None
    if count != num_clients:
        raise ConfigError(f"{plugin.label} returned {count} index arrays for data.num_clients = {num_clients}; "
                          f"return exactly one per client")
    out = []
    for i, part in enumerate(parts):
        a = np.asarray(part.detach().cpu().numpy() if hasattr(part, "detach") else part)
        if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
            raise ConfigError(f"{plugin.label}: client {i}'s indices are {a.dtype} of shape {a.shape}; expected a "
                              f"1-D integer array of indices into the {n} training rows")
        a = np.sort(a.astype(np.int64, copy=False))
        if a.size and (a[0] < 0 or a[-1] >= n):
            bad = int(a[0] if a[0] < 0 else a[-1])
            raise ConfigError(f"{plugin.label}: client {i} has index {bad}, out of range for the {n} training rows "
                              f"(0..{n - 1})")
        if a.size > 1 and np.any(a[1:] == a[:-1]):
            twice = int(a[1:][a[1:] == a[:-1]][0])
            raise ConfigError(f"{plugin.label}: client {i} has index {twice} more than once; give each client each "
                              f"row at most once")
        out.append(a)
    return out
