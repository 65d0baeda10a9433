"""The dataset container, its registry entry, and the check that loaded arrays pass.

* :class:`Dataset`: train and test arrays, ready for the engine.
* :class:`DatasetSpec`: a registry entry (options class, loader, doc line, and the optional
  labels-only loader, cache flag and file check).
* :class:`NoOptions`: the options class of a component that takes none.
* :func:`check_arrays`: numeric inputs, finite and within float32's range, one non-negative
  label per row; a :class:`DataError` naming the file, the array and the first bad index.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Sequence
from typing import Callable

import numpy as np

from ..errors import DataError


@dataclass(frozen=True)
class Dataset:
    """Train and test arrays, ready for the engine.

    ``x_*`` are float32 and already normalised; ``y_*`` are int64. When ``augment`` is
    true the engine applies :func:`hpcfl.data.augment.augment_batch` to every training
    batch. ``natural_clients`` holds per-client index arrays into the training set for
    datasets that come with their own clients (Synthetic, LEAF, TFF, npz with ``client``), in
    client order. ``natural_test``, where the format also gives every client its own test rows
    (LEAF's and TFF's test files, npz's ``client_test``), holds per-client index arrays into the
    test set in the same order (a client may have none); per-client evaluation then uses them with
    ``data.partition = "natural"`` (:mod:`hpcfl.engine.setup`). Either may be a
    :class:`hpcfl.data.partition.Groups` (one concatenated array) rather than a tuple.
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    input_shape: tuple[int, ...]
    augment: bool = False
    natural_clients: Sequence[np.ndarray] | None = None
    natural_test: Sequence[np.ndarray] | None = None


@dataclass(frozen=True)
class DatasetSpec:
    """Registry entry: option dataclass, loader ``load(options, root, seed)`` and a doc line.

    ``labels``, when set, is a cheaper loader with the same signature for previews: it
    returns the true training labels but placeholder inputs (see ``hpcfl.data.load_labels``).
    """

    options: type
    load: Callable[..., Dataset]
    doc: str
    labels: Callable[..., Dataset] | None = None
    cache: bool = False   # a pure function of (options, seed) worth caching on disk (hpcfl.data.cache)
    # ``files(options, root)``: problems with where the dataset's files should be (an unset or
    # missing data.root, a missing file), found without reading them, so that they are reported
    # with the job's other problems; None for a dataset that reads no files.
    files: Callable[..., list[str]] | None = None


@dataclass(frozen=True)
class NoOptions:
    """For components that take no options."""


_F32_MAX = float(np.finfo(np.float32).max)
_ROWS = 4096   # rows checked at a time: the finite-value check never holds a mask as large as x


def check_arrays(name: str, x: np.ndarray, y: np.ndarray, what: str) -> None:
    """Raise DataError unless x is an array of numeric samples (at least 1-D rows: shape (n, ...)),
    with one row per label, every value finite and within float32's range (the engine trains in
    float32 or float64 from a float32 copy), and labels are non-negative.

    ``what`` names the pair, e.g. ``"x/y"``; its first name is the inputs' array. A NaN or Inf
    input would reach the model and surface rounds later as "diverged" (NaN) or as every client's
    update refused by the guard (Inf), blaming the learning rate or the clients: the message here
    names the file, the array, the first bad index and the fix instead.
    """
    xname = what.split("/")[0]
    if x.ndim < 2:
        raise DataError(f"{name}: {xname} has shape {x.shape}; expected one row per sample, shape (samples, "
                        f"features...) with at least 2 dimensions (e.g. reshape a 1-D feature to (n, 1))")
    if x.dtype.kind not in "biuf":
        raise DataError(f"{name}: {xname} has dtype {x.dtype}; expected numbers (bool, integer or float)")
    if x.dtype.kind == "f":
        for start in range(0, x.shape[0], _ROWS):
            block = x[start:start + _ROWS]
            bad = ~np.isfinite(block) | (np.abs(block) > _F32_MAX)
            if bad.any():
                at = tuple(int(i) for i in np.argwhere(bad)[0])
                at = (at[0] + start,) + at[1:]
                value = float(x[at])
                why = "not finite" if not np.isfinite(value) else "beyond float32's range (it would become inf)"
                raise DataError(f"{name}: {xname}[{', '.join(map(str, at))}] = {value!r} is {why}; "
                                f"inputs must be finite: replace or drop those samples (e.g. np.nan_to_num, or "
                                f"keep np.isfinite(x).all(axis=...) rows) and write the file again")
    if x.shape[0] != y.shape[0]:
        raise DataError(f"{name}: {what} has {x.shape[0]} inputs but {y.shape[0]} labels")
    if y.size and y.min() < 0:
        raise DataError(f"{name}: {what} has a negative label ({int(y.min())})")
