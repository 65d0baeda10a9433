"""The job's dataset on every rank, loaded once per node.

Every rank needs the whole training set (any rank may train any client). Each rank used to load
it for itself: R ranks of a node did R times the work and held R copies. Now the ranks of a node
(a shared-memory split of ``comm``) load it once, in one of two ways (:func:`how`):

* ``"cache"``, a dataset the dataset cache serves (a generated one, ``data.cache`` not "off"):
  the node's first rank loads it, generating and caching it on a miss (:mod:`hpcfl.data.cache`),
  while the others wait; then they map the cached entry, whose pages the node's ranks share.
* ``"window"``, every other dataset: read from the user's files under ``data.root`` (CIFAR, the
  IDX sets, npz, LEAF, TFF, Speech Commands), a dataset plug-in, ``digits``, ``quadratic``, a
  generated one with ``data.cache = "off"``. The node's first rank loads it; its large arrays
  (the inputs and labels, train and test, and the natural clients' indices) move into MPI-3
  shared windows (:meth:`hpcfl.parallel.shared.NodeTables.share_first`), read-only views on every
  rank of the node, and the small fields come by a broadcast over the node. A plug-in's function
  and the check of what it returns (:mod:`hpcfl.data.plugin`) run on the first rank only: once
  per node, so it should depend on its options and seed alone, and not use MPI itself.

The windows belong to the :class:`~hpcfl.parallel.shared.NodeTables` the caller passes, which
holds the run's per-client tables later (:func:`hpcfl.engine.setup.share_tables`) and frees
them all at the end of the run (:func:`hpcfl.engine.setup.release_tables`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import HpcflError
from ..parallel.comm import mpi_module


def how(name: str, cache: str) -> str:
    """How the ranks of a node share dataset ``name`` with ``data.cache = cache``: ``"cache"``
    (mapped from the dataset cache's entry) or ``"window"`` (loaded by the node's first rank into
    shared windows)."""
    from .. import data

    return "cache" if data.uses_cache(name, cache) else "window"


def load_per_node(cfg, comm, tables=None):
    """Collective over ``comm``: the job's :class:`hpcfl.data.Dataset` on this rank.

    Parameters
    ----------
    cfg : the job's config
    comm : MPI communicator
    tables : :class:`hpcfl.parallel.shared.NodeTables` over ``comm``, optional
        Where a dataset the cache does not serve is held once per node; without it (or with one
        rank on the node) every rank loads such a dataset for itself.

    An error on the node's first rank does not hang the others. Through the cache they load for
    themselves after it, and meet the same error or succeed; otherwise the first rank sends its
    error (one of :mod:`hpcfl.errors`: a missing or damaged file) and every rank of the node raises
    it, without reading the files again (any other exception: they load for themselves). The
    caller gathers every rank's error as usual.
    """
    from .. import data

    def load():
        return data.load_dataset(cfg.data.dataset, cfg.dataset_options, cfg.data.root, cfg.run.seed, cfg.data.cache)

    if comm.size == 1:
        return load()
    if how(cfg.data.dataset, cfg.data.cache) == "cache":
        return _through_cache(load, comm)
    if tables is None or not tables.on:
        return load()
    return _into_windows(load, tables)


def _through_cache(load, comm):
    node = comm.Split_type(mpi_module().COMM_TYPE_SHARED, key=comm.rank)
    try:
        if node.size == 1:
            return load()
        if node.rank == 0:
            try:
                return load()   # generates and caches on a miss
            finally:
                node.Barrier()
        node.Barrier()          # the entry is there now (or the first rank could not write it)
        return load()
    finally:
        node.Free()


def _into_windows(load, tables):
    """The node's first rank loads; its big arrays go to ``tables``' windows, the rest by broadcast."""
    node = tables.node
    if node.rank == 0:
        try:
            ds = load()
        except BaseException as exc:
            node.bcast(("failed", exc if isinstance(exc, HpcflError) else None), root=0)
            raise
        layout, arrays = pack(ds)
        del ds   # the views replace the loaded arrays on this rank too
        node.bcast(("loaded", layout), root=0)
    else:
        status, layout = node.bcast(None, root=0)
        if status == "failed":
            if layout is None:   # not one of hpcfl's errors (a bug, memory): see for ourselves
                return load()
            raise layout
        arrays = None
    return unpack(layout, tables.share_first(arrays))


def pack(ds) -> tuple[dict, list]:
    """(layout, arrays): ``ds``'s fields as a picklable layout that names its numpy arrays by their
    place in ``arrays``. Natural clients (a :class:`~hpcfl.data.partition.Groups`, or a tuple of
    index arrays of one dtype) become their concatenated indices and offsets."""
    from ..data.partition import Groups

    arrays: list = []

    def put(a) -> int:
        arrays.append(a)
        return len(arrays) - 1

    layout = {}
    for field in dataclasses.fields(ds):
        value = getattr(ds, field.name)
        if isinstance(value, np.ndarray):
            layout[field.name] = ("array", put(value))
        elif isinstance(value, Groups):
            layout[field.name] = ("groups", put(value.flat), put(value.sizes), put(np.cumsum(value.sizes)))
        elif isinstance(value, (tuple, list)) and value and all(isinstance(a, np.ndarray) for a in value) \
                and len({a.dtype for a in value}) == 1:
            offsets = np.cumsum([0] + [len(a) for a in value], dtype=np.int64)
            layout[field.name] = ("pieces", put(np.concatenate(value)), put(offsets))
        else:
            layout[field.name] = ("value", value)
    return layout, arrays


def unpack(layout: dict, arrays: list):
    """The :class:`hpcfl.data.Dataset` that :func:`pack` took apart, its arrays from ``arrays``
    (views of the shared windows): the same fields, types and bytes."""
    from ..data import Dataset
    from ..data.partition import Groups

    fields = {}
    for name, (kind, *at) in layout.items():
        if kind == "value":
            fields[name] = at[0]
        elif kind == "array":
            fields[name] = arrays[at[0]]
        elif kind == "groups":
            fields[name] = Groups(*(arrays[i] for i in at))
        else:   # pieces: views of the concatenated indices, as the loader's own arrays were
            flat, offsets = arrays[at[0]], arrays[at[1]].tolist()
            fields[name] = tuple(flat[a:b] for a, b in zip(offsets[:-1], offsets[1:]))
    return Dataset(**fields)
