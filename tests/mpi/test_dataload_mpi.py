"""The dataset generated once per node on a cache miss (hpcfl.engine.dataload): the node's first
rank generates and caches it, the others map the entry; every rank gets the same arrays, bitwise."""

import dataclasses

import numpy as np
import pytest
from mpi4py import MPI

from hpcfl import config, data
from hpcfl.engine.dataload import load_per_node


@pytest.mark.mpi(min_size=2)
def test_a_cache_miss_generates_the_dataset_once_per_node(tmp_path, monkeypatch):
    comm = MPI.COMM_WORLD
    folder = comm.bcast(str(tmp_path) if comm.rank == 0 else None, root=0)   # one empty cache for all ranks
    spec = data.DATASETS["gaussian_mixture"]
    calls = []

    def counted(*args):
        calls.append(1)
        return spec.load(*args)

    monkeypatch.setitem(data.DATASETS, "gaussian_mixture", dataclasses.replace(spec, load=counted))
    cfg = config.from_dict({"run": {"name": "d", "seed": 5, "rounds": 1},
                            "data": {"dataset": "gaussian_mixture", "num_clients": 4, "cache": folder,
                                     "gaussian_mixture": {"num_train": 500, "num_test": 50}},
                            "model": {"name": "logreg"}, "algorithm": {"name": "fedavg"}})
    ds = load_per_node(cfg, comm)
    nodes = len(set(comm.allgather(MPI.Get_processor_name())))
    assert comm.allreduce(len(calls)) == nodes          # 1 on one node; every rank generated before
    direct = spec.load(cfg.dataset_options, None, 5)
    for name in ("x_train", "y_train", "x_test", "y_test"):
        assert np.asarray(getattr(ds, name)).tobytes() == getattr(direct, name).tobytes(), name
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    if local.rank > 0:                                  # mapped from the node's cache entry
        assert isinstance(ds.x_train, np.memmap)
    local.Free()
