"""Checkpoints streamed rank by rank (hpcfl.engine.resume.write / read) across ranks: the file a run
on R ranks writes, in blocks of a few rows, holds exactly the 1-rank run's state, and reading it
back on R ranks (any placement) gives every rank its own rows bitwise."""

import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from runner import job

from hpcfl import config
from hpcfl.engine import resume, simulation
from hpcfl.io import ckptblocks
from hpcfl.io.checkpoint import CheckpointStore
from hpcfl.state import ClientTable

MANIFEST = {"world_size": 0, "config_sha256": "", "versions": {}}


def own_rows(s) -> dict:
    return {t.name: np.array(t.get(), copy=True) for t in resume.state_items(s) if isinstance(t, ClientTable)}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("placement", ["block", "round_robin"])
def test_streamed_checkpoint_equals_one_rank_and_reads_back_on_every_rank(placement, monkeypatch):
    comm = MPI.COMM_WORLD
    table = job(**{"algorithm.name": "scaffold", "algorithm.server_momentum": 0.5, "run.rounds": 3,
                   "data.num_clients": 11, "runtime.placement": placement})
    cfg = config.from_dict(table)
    monkeypatch.setattr(ckptblocks, "BLOCK_BYTES", 3 * 1210 * 4)   # 3 rows of 1,210 float32 a message
    ref = None
    if comm.rank == 0:
        one = simulation.prepare(cfg, MPI.COMM_SELF)
        ref = resume.capture(one, simulation.run(one))
    comm.Barrier()
    s = simulation.prepare(cfg, comm)
    x = simulation.run(s)
    mine = own_rows(s)
    folder = comm.bcast(tempfile.mkdtemp(prefix="hpcfl-ckpt-mpi-") if comm.rank == 0 else None, root=0)
    store = CheckpointStore(folder) if comm.rank == 0 else None
    try:
        check(s, x, cfg, store, ref, mine)
    finally:
        comm.Barrier()
        if comm.rank == 0:
            shutil.rmtree(folder, ignore_errors=True)


def check(s, x, cfg, store, ref, mine):
    comm = s.comm
    assert resume.write(s, x, store, 3, {}, MANIFEST) is None
    loaded = store.load_latest(keep_arrays=False) if comm.rank == 0 else None
    if comm.rank == 0:
        got = store.load_latest().arrays
        assert set(got) == set(ref)
        for k in ref:
            assert got[k].tobytes() == ref[k].tobytes(), k
        assert resume.problems(s, loaded.shapes.get) is None
    s2 = simulation.prepare(cfg, comm)             # a fresh process's state: zero rows
    x2 = resume.read(s2, loaded)
    assert x2.tobytes() == x.tobytes()
    for name, rows in own_rows(s2).items():
        assert rows.tobytes() == mine[name].tobytes(), name
