"""Checkpoints written by every rank (hpcfl.engine.shards through resume.write(shards=True)): one shard
per rank holding exactly its own clients' rows, the 1-rank run's state bitwise when put together, read
back on every rank under another placement; a rank that cannot write its shard, or rank 0 failing
before any shard, fails the save on every rank and leaves only the older checkpoint."""

import sys
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from runner import job

from hpcfl import config
from hpcfl.engine import resume, simulation
from hpcfl.errors import HpcflError
from hpcfl.io import ckptshards
from hpcfl.io.checkpoint import CheckpointStore
from hpcfl.state import ClientTable

MANIFEST = {"world_size": 0, "config_sha256": "", "versions": {}}


def own_rows(s) -> dict:
    return {t.name: np.array(t.get(), copy=True) for t in resume.state_items(s) if isinstance(t, ClientTable)}


def cfg_of(placement):
    return config.from_dict(job(**{"algorithm.name": "scaffold", "algorithm.server_momentum": 0.5, "run.rounds": 3,
                                   "data.num_clients": 11, "runtime.placement": placement}))



@pytest.mark.mpi(min_size=2)
def test_every_rank_writes_its_rows_and_another_placement_reads_them_back(folder):
    comm = MPI.COMM_WORLD
    cfg = cfg_of("block")
    ref = None
    if comm.rank == 0:
        one = simulation.prepare(cfg, MPI.COMM_SELF)
        ref = resume.capture(one, simulation.run(one))
    ref = comm.bcast(ref, root=0)
    s = simulation.prepare(cfg, comm)
    x = simulation.run(s)
    store = CheckpointStore(folder) if comm.rank == 0 else None
    assert resume.write(s, x, store, 3, {}, MANIFEST, shards=True) is None
    names = sorted(p.name for p in folder.iterdir())
    assert len([n for n in names if ckptshards.SHARD_RE.match(n)]) == comm.size and "ckpt-00000003.h5" in names
    loaded = store.load_latest(keep_arrays=False) if comm.rank == 0 else None
    if comm.rank == 0:
        assert len(loaded.shards) == comm.size and resume.problems(s, loaded.shapes.get) is None
        rows = ckptshards.ShardRows(loaded.shards)
        for name, whole in ref.items():   # the shards put together: the 1-rank run's tables, bitwise
            if name.startswith("clients."):
                got = np.concatenate([rows.block(k, name, f, f + c1 - c0) for c0, c1, k, f in rows.pieces(0, 11)])
                assert got.tobytes() == whole.tobytes(), name
        rows.close()
        assert store.load_latest().arrays["model"].tobytes() == ref["model"].tobytes()
    # Another placement: each rank owns other clients now, and reads them from whichever shards hold them.
    s2 = simulation.prepare(cfg_of("round_robin"), comm)
    assert resume.read(s2, loaded).tobytes() == x.tobytes()
    mine = np.flatnonzero(s2.owner == comm.rank)
    for name, rows in own_rows(s2).items():
        assert rows.tobytes() == ref[f"clients.{name}"][mine].tobytes(), name


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("where", ["rank 1's shard", "rank 0 before"])
def test_a_failed_shard_or_sync_fails_the_save_everywhere_and_leaves_the_older_checkpoint(folder, monkeypatch, where):
    comm = MPI.COMM_WORLD
    s = simulation.prepare(cfg_of("block"), comm)
    x = simulation.run(s)
    store = CheckpointStore(folder) if comm.rank == 0 else None
    assert resume.write(s, x, store, 2, {}, MANIFEST, shards=True) is None
    comm.Barrier()
    before = sorted(p.name for p in folder.iterdir())
    comm.Barrier()   # every rank has looked before any starts the next save
    sync = None
    if where == "rank 1's shard" and comm.rank == 1:
        def full(*a, **k):
            raise HpcflError("rank 1 could not write its checkpoint shard: No space left on device")
        monkeypatch.setattr(ckptshards, "write", full)
    if where == "rank 0 before" and comm.rank == 0:
        def sync():
            raise HpcflError("results.h5 could not be synced")
    failure = resume.write(s, x, store, 3, {}, MANIFEST, before=sync, shards=True)
    if comm.rank == 0:
        assert isinstance(failure, HpcflError)
        assert ("rank 1 could not write" if where == "rank 1's shard" else "could not be synced") in str(failure)
    else:
        assert failure is None
    comm.Barrier()
    assert sorted(p.name for p in folder.iterdir()) == before   # no shard of the failed save, round 2 intact
    if comm.rank == 0:
        assert store.load_latest(keep_arrays=False).round == 2
