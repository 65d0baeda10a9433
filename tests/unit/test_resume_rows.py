"""A checkpoint's write and read across ranks (hpcfl/engine/resume.py: write, read, restore, _read,
_put), with ranks emulated in one process: every rank's client rows go into one file in client-id
order, and come back to whichever rank owns each client on resume (another rank count, another
placement), a block at a time, through ``put`` or ``set``; the model and the server's arrays reach
every rank; a failed save is returned, not raised, and still takes every rank's rows.

The MPI suite resumes whole runs bitwise on 1, 2 and 3 ranks; these pin each step in seconds.
"""

from types import SimpleNamespace

import h5py
import numpy as np
import pytest
import torch

from hpcfl.algorithms.protocol import RowTable
from hpcfl.engine import resume
from hpcfl.errors import WriteError
from hpcfl.io import ckptblocks
from hpcfl.io.checkpoint import CheckpointStore
from hpcfl.state import ClientTable, ServerArray

MANIFEST = {"world_size": 3, "config_sha256": "ab" * 32, "versions": {}}
WIDTH = 3


class Wire:
    """Messages between emulated ranks, run one after another: a send waits in a queue until its
    receive, which must find one of exactly its size (where MPI would block, this fails)."""

    def __init__(self):
        self.queue, self.bcasts = {}, []

    def comm(self, rank):
        wire = self

        class Comm:
            def Ssend(self, buf, dest, tag):
                assert tag == resume.TAG
                wire.queue.setdefault((rank, dest), []).append(bytes(np.asarray(buf)))

            def Recv(self, buf, source, tag):
                sent = wire.queue.get((source, rank), [])
                assert sent, f"rank {rank} receives from {source}, which sent nothing more"
                msg = sent.pop(0)
                assert len(msg) == buf.nbytes, f"a message of {len(msg)} bytes into a buffer of {buf.nbytes}"
                np.asarray(buf).reshape(-1).view(np.uint8)[:] = np.frombuffer(msg, dtype=np.uint8)

            def bcast(self, obj, root):
                assert root == 0
                if rank == 0:
                    wire.bcasts.append(obj)
                    return obj
                return wire.bcasts[-1]

        c = Comm()
        c.rank = rank
        return c

    def empty(self) -> bool:
        return not any(self.queue.values())


def full_table(n, k):
    """Table ``k``'s rows in client order: row c is [c, c + 0.25, c + 0.5] + 100 k."""
    return np.arange(n, dtype=np.float64)[:, None] + np.array([0.0, 0.25, 0.5]) + 100 * k


def ranks_of(owner, wire, fill=True, movable=(True, False)):
    """One emulated rank's state per rank: table "a" a RowTable (put), "b" get/set only; a server
    array "g" on rank 0. ``fill``: rows of the full tables (else zeros, as a fresh start)."""
    owner = np.asarray(owner, dtype=np.int64)
    slot = np.zeros(len(owner), dtype=np.int64)
    out = []
    for r in range(max(owner) + 1):
        mine = np.flatnonzero(owner == r)
        slot[mine] = np.arange(len(mine))
        items, tables = [], {}
        for k, (name, put) in enumerate(zip("ab", movable)):
            rows = full_table(len(owner), k)[mine] if fill else np.zeros((len(mine), WIDTH))
            if put:
                rt = RowTable(len(mine), WIDTH, "cpu", torch.float64)
                rt.tensor().copy_(torch.from_numpy(rows))
                t = rt.client_table(name)
            else:
                box = {"rows": rows.copy()}
                t = ClientTable(name, WIDTH, get=lambda b=box: b["rows"], set=lambda v, b=box: b.update(rows=v))
            tables[name] = t
            items.append(t)
        g = {"v": np.array([7.0, 8.0]) if (fill and r == 0) else None}
        items.append(ServerArray("g", get=lambda g=g: g["v"], set=lambda v, g=g: g.update(v=v)))
        out.append(SimpleNamespace(owner=owner, slot=slot, comm=wire.comm(r), items=items, tables=tables, g=g))
    return out


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(ckptblocks, "BLOCK_BYTES", 2 * WIDTH * 8)   # 2 rows a block
    monkeypatch.setattr(resume, "MESSAGE_BYTES", 16)                # a block in 3 messages
    monkeypatch.setattr(resume, "state_items", lambda s: s.items)


def write_all(ranks, store, x, before=None):
    """Ranks 1.. send first (their sends queue), then rank 0 writes; rank 0's result."""
    for s in ranks[1:]:
        assert resume.write(s, x, store, 4, {"config": "{}"}, MANIFEST) is None
    return resume.write(ranks[0], x, store, 4, {"config": "{}"}, MANIFEST, before=before)


WRITE_OWNER = [0, 0, 1, 1, 1, 0, 1, 2, 2, 0]


def test_write_puts_every_ranks_rows_into_one_checkpoint_in_client_order(tmp_path, small_blocks):
    wire, store, calls = Wire(), CheckpointStore(tmp_path / "ck"), []
    ranks = ranks_of(WRITE_OWNER, wire)
    x = np.linspace(-1, 1, 5, dtype=np.float32)
    assert write_all(ranks, store, x, before=lambda: calls.append(list((tmp_path / "ck").glob("ckpt-*")))) is None
    assert calls == [[]] and wire.empty()                    # before() ran once, before the file existed
    got = store.load_latest()
    assert got.round == 4 and got.arrays["model"].tobytes() == x.tobytes()
    assert got.arrays["server.g"].tolist() == [7.0, 8.0]
    for k, name in enumerate("ab"):
        assert got.arrays[f"clients.{name}"].tobytes() == full_table(10, k).tobytes()


def test_a_failed_save_is_returned_and_still_takes_every_ranks_rows(tmp_path, small_blocks):
    """Rank 0's save fails (here its ``before``): write returns the error, writes no checkpoint,
    and receives the rows the other ranks sent anyway (else they would wait in Ssend for ever)."""
    wire, store = Wire(), CheckpointStore(tmp_path / "ck")
    err = WriteError("disk full")

    def fail():
        raise err
    assert write_all(ranks_of(WRITE_OWNER, wire), store, np.zeros(5, dtype=np.float32), before=fail) is err
    assert wire.empty() and store.load_latest() is None


@pytest.mark.parametrize("keep_arrays", [True, False])
@pytest.mark.parametrize("owner", [[1, 2, 1, 2, 0, 0, 0, 1, 2, 0], [1, 1, 1, 0, 0, 1, 0, 1, 1, 0]])
def test_read_gives_each_client_its_rows_on_the_rank_that_owns_it_now(tmp_path, small_blocks, owner, keep_arrays):
    """Written by 3 ranks in one placement, read by 3 or 2 ranks in another: each rank's tables
    hold exactly its clients' rows, in its slot order; the model and the server array reach every
    rank, each its own copy. The file is read whole (keep_arrays) or a block at a time."""
    x = np.linspace(-1, 1, 5, dtype=np.float32)
    store = CheckpointStore(tmp_path / "ck")
    assert write_all(ranks_of(WRITE_OWNER, Wire()), store, x) is None
    wire = Wire()
    ranks = ranks_of(owner, wire, fill=False)
    loaded = store.load_latest(keep_arrays=keep_arrays)
    files_open = len(h5py.h5f.get_obj_ids(types=h5py.h5f.OBJ_FILE))
    got = [resume.read(s, loaded if s.comm.rank == 0 else None) for s in ranks]
    assert wire.empty() and len(h5py.h5f.get_obj_ids(types=h5py.h5f.OBJ_FILE)) == files_open   # closed again
    for r, s in enumerate(ranks):
        mine = np.flatnonzero(np.asarray(owner) == r)
        for k, name in enumerate("ab"):
            assert s.tables[name].get().tobytes() == full_table(10, k)[mine].tobytes(), (r, name)
        assert got[r].tobytes() == x.tobytes() and s.g["v"].tolist() == [7.0, 8.0]
    assert not np.shares_memory(got[0], got[1])
    if keep_arrays:
        assert not np.shares_memory(got[0], loaded.arrays["model"])


def test_restore_loads_a_dict_of_arrays_on_every_rank(small_blocks):
    """``restore``: the checkpoint's arrays given as a dict on rank 0 (tests, small runs)."""
    owner = [2, 0, 1, 2, 0]
    arrays = {"model": np.array([1.5, -2.5]), "server.g": np.array([3.0, 4.0]),
              "clients.a": full_table(5, 0), "clients.b": full_table(5, 1)}
    wire = Wire()
    ranks = ranks_of(owner, wire, fill=False)
    got = [resume.restore(s, arrays if s.comm.rank == 0 else None) for s in ranks]
    assert wire.empty() and all(g.tolist() == [1.5, -2.5] for g in got)
    assert ranks[2].tables["a"].get().tolist() == full_table(5, 0)[[0, 3]].tolist()
    assert ranks[0].tables["b"].get().tolist() == full_table(5, 1)[[1, 4]].tolist()
    assert all(s.g["v"].tolist() == [3.0, 4.0] for s in ranks)


def test_a_checkpoint_without_a_server_array_leaves_it_as_it_is(small_blocks):
    """A server array not started when the checkpoint was taken (get() None: not saved) is not set
    on resume: it stays None, as in a run that starts from round 1."""
    arrays = {"model": np.array([1.0]), "clients.a": full_table(2, 0), "clients.b": full_table(2, 1)}
    ranks = ranks_of([0, 0], Wire(), fill=False)
    resume.restore(ranks[0], arrays)
    assert ranks[0].g["v"] is None


def test_rank0_arrays_leave_out_server_arrays_not_started(small_blocks):
    ranks = ranks_of([0, 0], Wire(), fill=False)
    assert sorted(resume._rank0_arrays(ranks[0], np.zeros(1))) == ["clients.a", "clients.b", "model"]
