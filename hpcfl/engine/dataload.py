"""The job's dataset on every rank, generated once per node.

Every rank needs the whole training set (any rank may train any client). On a cache miss each
rank used to generate it again, all at once: R ranks of a node did R times the work and wrote R
copies, of which one was kept. Now the ranks of a node (a shared-memory split of ``comm``) take
turns: the node's first rank loads it, generating and caching it on a miss
(:mod:`hpcfl.data.cache`), and the others wait for it, then map the cached entry, whose pages the
node's ranks share. Datasets the cache does not hold (files read from ``data.root``, ``data.cache =
"off"``) are loaded by every rank at once, as before.
"""

from __future__ import annotations

from ..parallel.comm import mpi_module


def load_per_node(cfg, comm):
    """Collective over ``comm``: the job's :class:`hpcfl.data.Dataset` on this rank.

    An error on the node's first rank (bad options, a cache folder it cannot write) does not
    hang the others: they load for themselves after it, and meet the same error or succeed, and
    the caller gathers every rank's error as usual.
    """
    from .. import data

    def load():
        return data.load_dataset(cfg.data.dataset, cfg.dataset_options, cfg.data.root, cfg.run.seed, cfg.data.cache)

    if comm.size == 1 or not data.uses_cache(cfg.data.dataset, cfg.data.cache):
        return load()
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
