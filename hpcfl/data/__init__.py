"""Data layer: dataset and partition registries and the functions the engine calls.

A job file names one dataset and one partition; each has its own option table::

    [data]
    dataset = "cifar10"
    root = "/path"
    partition = "dirichlet"
    num_clients = 100
    [data.cifar10]
    augment = true
    [data.dirichlet]
    alpha = 0.1

The engine builds options with ``options.build(dataset_options(name), table, f"data.{name}")``
and then calls :func:`load_dataset` and :func:`make_partition`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from .. import plugins
from ..errors import ConfigError, DataError, nearest
from ..native.cachedir import cache_root
from . import cache as _cache
from . import partition as _p
from . import plugin as _plugin_data
from . import partition_labels as _pl
from .container import Dataset, DatasetSpec
from .datasets import EMBEDDED
from .files import ON_DISK
from .quadratic import QuadraticOptions, load_quadratic
from .speech import SPEECH


@dataclass(frozen=True)
class PartitionSpec:
    """Registry entry: option dataclass, ``fn(labels, num_clients, options, seed, dataset)``, doc line."""

    options: type
    fn: Callable[..., list]
    doc: str


DATASETS: dict[str, DatasetSpec] = {
    **ON_DISK,
    **EMBEDDED,
    **SPEECH,
    "quadratic": DatasetSpec(QuadraticOptions, load_quadratic,
                             "quadratic objectives, one per client: FedNova's 1/2||x - e_i||^2, or GIFT's curvatures and gradient noise"),
}

PARTITIONS: dict[str, PartitionSpec] = {
    "iid": PartitionSpec(_p.IidOptions, _p.iid, "uniformly random equal split"),
    "dirichlet": PartitionSpec(
        _p.DirichletOptions, _p.dirichlet, "class-wise Dirichlet (NIID-Bench noniid-labeldir, FedNova, FedDisco NIID-1)"
    ),
    "dirichlet_client": PartitionSpec(
        _p.DirichletClientOptions, _p.dirichlet_client, "per-client Dirichlet label mix, equal sizes (Hsu et al.)"
    ),
    "quantity_skew": PartitionSpec(
        _p.QuantitySkewOptions, _p.quantity_skew, "iid labels, Dirichlet client sizes (NIID-Bench)"
    ),
    "longtail": PartitionSpec(
        _p.LongtailOptions, _p.longtail, "FedDisco globally imbalanced (long-tailed) training set, then NIID-1"
    ),
    "label_k": PartitionSpec(
        _pl.LabelKOptions, _pl.label_k, "every client exactly k classes (FedGSNR Label 2, FedLGA)"
    ),
    "shards": PartitionSpec(_pl.ShardsOptions, _pl.shards, "McMahan sort-by-label shards"),
    "biased_unbiased": PartitionSpec(
        _pl.BiasedUnbiasedOptions, _pl.biased_unbiased, "FedDisco NIID-2: biased clients plus unbiased ones"
    ),
    "nonbalance": PartitionSpec(
        _pl.NonBalanceOptions, _pl.nonbalance, "FedGSNR NonBalance: abundant/medium/less clients"
    ),
    "pareto": PartitionSpec(_pl.ParetoOptions, _pl.pareto, "FedGSNR Pareto class counts (80/20)"),
    "natural": PartitionSpec(_p.NaturalOptions, _p.natural, "the dataset's own clients (synthetic, leaf, tff, npz with client)"),
}


PLUGIN_HINT = {"data.dataset": 'a dataset of your own: data.dataset = "yourmodule:load"',
               "data.partition": 'a partition of your own: data.partition = "yourmodule:split"'}


def _lookup(registry: dict, name, key: str):
    if name not in registry:
        valid = ", ".join(sorted(registry))
        guess = nearest(name, registry) if isinstance(name, str) else None
        raise ConfigError(f"{key} = {name!r} is not known; " + (f"did you mean {guess!r}? (or one of {valid})"
                                                                 if guess else f"choose one of {valid}") +
                          f"; {PLUGIN_HINT[key]}")
    return registry[name]


def dataset_options(name: str, search=()) -> type:
    """Option dataclass of dataset ``name`` (ConfigError naming ``data.dataset`` if unknown); a plug-in's
    (``"module:function"``, :mod:`hpcfl.plugins`) is generated, its module looked for in ``search`` too."""
    if plugins.is_plugin(name):
        return plugins.resolve("dataset", name, search).options
    return _lookup(DATASETS, name, "data.dataset").options


def partition_options(name: str, search=()) -> type:
    """Option dataclass of partition ``name`` (ConfigError naming ``data.partition`` if unknown), or a plug-in's."""
    if plugins.is_plugin(name):
        return plugins.resolve("partition", name, search).options
    return _lookup(PARTITIONS, name, "data.partition").options


def _plugin(kind: str, name: str, options):
    """The plug-in behind ``options`` (made by :func:`dataset_options`/:func:`partition_options` for ``name``)."""
    plugin = plugins.of(options)
    if plugin is None or plugin.name != name or plugin.kind != kind:
        raise TypeError(f"{name} needs the options {kind}_options({name!r}) made, got {type(options).__name__}")
    return plugin


def load_dataset(name: str, options, root: str | None, seed: int, cache: str = "off") -> Dataset:
    """Load dataset ``name``; ``options`` None means all defaults.

    ``cache`` is ``data.cache`` ("auto", "off" or a folder): generated datasets are read
    from there when an earlier run stored them (:mod:`hpcfl.data.cache`). A plug-in's
    (``options`` from :func:`dataset_options`) is called every time, never cached, and what it
    returns is checked (:mod:`hpcfl.data.plugin`).
    """
    if plugins.is_plugin(name):
        return _plugin_data.load(_plugin("dataset", name, options), options, seed)
    spec = _lookup(DATASETS, name, "data.dataset")
    opts = options if options is not None else spec.options()
    root_dir = cache_root(cache) if spec.cache else None
    return _cache.load_or_make(root_dir, name, opts, int(seed), lambda: spec.load(opts, root, int(seed)))


def uses_cache(name: str, cache: str) -> bool:
    """Whether :func:`load_dataset` of ``name`` with ``data.cache = cache`` goes through the dataset cache."""
    if plugins.is_plugin(name):   # its function may read anything: nothing to key a cache entry on
        return False
    return bool(_lookup(DATASETS, name, "data.dataset").cache) and cache_root(cache) is not None


def load_labels(name: str, options, root: str | None, seed: int) -> Dataset:
    """A Dataset with the true training labels (and natural clients) for previews.

    Where the dataset has a cheaper path (``synthetic_images``: no noise is drawn, so the
    50k CIFAR-shaped set takes milliseconds instead of seconds), the inputs are zero-stride
    placeholders and the test split may be empty; elsewhere this is :func:`load_dataset`.
    Partitions computed from it equal those from the full dataset. Not for training.
    A plug-in dataset is loaded in full.
    """
    if plugins.is_plugin(name):
        return load_dataset(name, options, root, seed)
    spec = _lookup(DATASETS, name, "data.dataset")
    load = spec.labels or spec.load
    return load(options if options is not None else spec.options(), root, int(seed))


def _check_labels(labels) -> np.ndarray:
    y = np.asarray(labels)
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"training labels must be a 1-D integer array, got {y.dtype} with shape {y.shape}")
    if y.size and y.min() < 0:
        raise DataError(f"training labels must be non-negative, found {int(y.min())}")
    return y.astype(np.int64, copy=False)


def make_partition(name: str, labels, num_clients: int, options, seed: int, dataset: Dataset | None = None):
    """Split the training set over ``num_clients`` clients.

    Returns a list of ``num_clients`` int64 index arrays into the training set, each
    sorted ascending. Pure in (labels, num_clients, options, seed[, dataset]). A plug-in's
    (``options`` from :func:`partition_options`) output is checked (:mod:`hpcfl.data.plugin`).
    """
    spec = None if plugins.is_plugin(name) else _lookup(PARTITIONS, name, "data.partition")
    y = _check_labels(labels)
    k = int(num_clients)
    if k < 1:
        raise ConfigError(f"data.num_clients = {num_clients} must be at least 1")
    if spec is None:   # a plug-in: a row may go to several clients, so k may exceed the rows
        return _plugin_data.split(_plugin("partition", name, options), y, k, options, int(seed))
    if k > len(y) and name != "natural":
        raise ConfigError(f"data.num_clients = {k} exceeds the {len(y)} training samples; "
                          f"use at most {len(y)} clients")
    opts = options if options is not None else spec.options()
    parts = spec.fn(y, k, opts, int(seed), dataset)
    if len(parts) != k:  # a bug, not a user error
        raise AssertionError(f"partition {name} returned {len(parts)} clients, expected {k}")
    if isinstance(parts, _p.Groups):   # int64 views of one array already (and that array, for start-up)
        return parts
    return [np.asarray(p, dtype=np.int64) for p in parts]


def class_counts(labels, parts, num_classes: int) -> np.ndarray:
    """(clients, classes) int64 matrix of label counts per client."""
    if isinstance(parts, _p.Groups):
        return class_counts_flat(labels, parts.flat, parts.sizes, num_classes)
    sizes = np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
    index = np.concatenate(parts, dtype=np.int64) if len(parts) else np.zeros(0, dtype=np.int64)
    return class_counts_flat(labels, index, sizes, num_classes)


def class_counts_flat(labels, index: np.ndarray, sizes: np.ndarray, num_classes: int) -> np.ndarray:
    """:func:`class_counts` from every client's indices concatenated in id order, ``index`` (sum of
    ``sizes``,), and ``sizes`` (clients,): no loop over clients (1M clients: a tenth of a second)."""
    y = np.asarray(labels, dtype=np.int64)
    k = len(sizes)
    if int(np.sum(sizes)) == 0:
        return np.zeros((k, num_classes), dtype=np.int64)
    lab = y[np.asarray(index, dtype=np.int64)]
    if lab.min() < 0 or lab.max() >= num_classes:
        raise DataError(f"labels must lie in 0..{num_classes - 1}, found {int(lab.min())}..{int(lab.max())}")
    owner = np.repeat(np.arange(k, dtype=np.int64), sizes)
    flat = np.bincount(owner * num_classes + lab, minlength=k * num_classes)
    return flat[: k * num_classes].reshape(k, num_classes).astype(np.int64)


__all__ = [
    "DATASETS", "PARTITIONS", "Dataset", "DatasetSpec", "PartitionSpec", "class_counts", "class_counts_flat",
    "dataset_options", "load_dataset", "load_labels", "make_partition", "partition_options", "uses_cache",
]
