"""Checkpoints streamed rank by rank (hpcfl.engine.resume.write / read) across ranks: the file a run
on R ranks writes, in blocks of a few rows, holds exactly the 1-rank run's state, and reading it
back on R ranks (any placement) gives every rank its own rows bitwise."""

import errno
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from runner import job

from hpcfl import config
from hpcfl.engine import resume, simulation
from hpcfl.errors import HpcflError
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


def _untaken_rows(comm, deadline_s: float = 30.0) -> int:
    """Rank 0: how many row messages the other ranks still had to send after :func:`resume.write`
    returned (received and counted here, so that no rank stays blocked in its Ssend); 0 elsewhere.

    Every rank enters a non-blocking barrier once its own write returned; a rank still sending
    enters it only once rank 0 took its last message. A rank stuck anywhere else aborts the job
    after ``deadline_s`` rather than hanging it."""
    req, taken, start, st = comm.Ibarrier(), 0, time.monotonic(), MPI.Status()
    while not req.Test():
        if comm.rank == 0 and comm.Iprobe(source=MPI.ANY_SOURCE, tag=resume.TAG, status=st):
            comm.Recv(np.empty(st.Get_count(MPI.BYTE), dtype=np.uint8), source=st.Get_source(), tag=resume.TAG)
            taken += 1
        if time.monotonic() - start > deadline_s:
            print(f"rank {comm.rank}: the ranks never met after a failed checkpoint", file=sys.stderr, flush=True)
            comm.Abort(3)
        time.sleep(0.001)
    return taken


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
@pytest.mark.parametrize("where", ["before the save", "mid-stream"])
def test_a_failed_save_still_takes_every_rows_message(where, monkeypatch):
    """Rank 0's save fails (the results file's sync before it, or the disk after a few blocks): the
    other ranks' rows are still received to the last message, so that no rank hangs in Ssend, the
    error comes back on rank 0 and no checkpoint is left."""
    comm = MPI.COMM_WORLD
    cfg = config.from_dict(job(**{"algorithm.name": "scaffold", "run.rounds": 1, "data.num_clients": 11}))
    monkeypatch.setattr(ckptblocks, "BLOCK_BYTES", 3 * 1210 * 4)   # 3 rows a message: several per rank
    s = simulation.prepare(cfg, comm)
    folder = comm.bcast(tempfile.mkdtemp(prefix="hpcfl-ckpt-mpi-") if comm.rank == 0 else None, root=0)
    store = CheckpointStore(folder) if comm.rank == 0 else None
    before = None
    if where == "before the save":
        def before():
            raise HpcflError("cannot write the rounds before the checkpoint: disk full")
    elif comm.rank == 0:
        hashed = []

        def failing(h, rows):   # the third block (the first of rank 1's rows) meets a failing disk
            hashed.append(len(rows))
            if len(hashed) == 3:
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            ckptblocks.hash_bytes(h, rows)

        monkeypatch.setattr("hpcfl.io.ckptfile.hash_bytes", failing)   # write_file hashes there
    try:
        err = resume.write(s, s.model.numpy(), store, 1, {}, MANIFEST, before=before)
        untaken = _untaken_rows(comm)
        if comm.rank == 0:
            assert untaken == 0, f"{untaken} row messages were left to the other ranks' Ssend"
            assert isinstance(err, HpcflError) and ("disk full" in str(err) if where == "before the save"
                                                    else "Input/output error" in str(err)), err
            assert store.list() == [] and os.listdir(folder) == []
        else:
            assert err is None
    finally:
        comm.Barrier()
        if comm.rank == 0:
            shutil.rmtree(folder, ignore_errors=True)
