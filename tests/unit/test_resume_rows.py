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
from hpcfl.engine import resume, staterows
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
        self.queue, self.bcasts, self.taken = {}, [], {}

    def comm(self, rank):
        wire = self

        class Comm:
            def Ssend(self, buf, dest, tag):
                assert tag == resume.TAG
                wire.queue.setdefault((rank, dest), []).append(bytes(np.asarray(buf)))

            def Recv(self, buf, source, tag):
                assert tag == resume.TAG
                sent = wire.queue.get((source, rank), [])
                assert sent, f"rank {rank} receives from {source}, which sent nothing more"
                msg = sent.pop(0)
                assert len(msg) == buf.nbytes, f"a message of {len(msg)} bytes into a buffer of {buf.nbytes}"
                np.asarray(buf).reshape(-1).view(np.uint8)[:] = np.frombuffer(msg, dtype=np.uint8)

            def bcast(self, obj, root):   # a rank's k-th bcast gets rank 0's k-th, as in MPI
                assert root == 0
                if rank == 0:
                    wire.bcasts.append(obj)
                    return obj
                wire.taken[rank] = wire.taken.get(rank, 0) + 1
                return wire.bcasts[wire.taken[rank] - 1]

        c = Comm()
        c.rank = rank
        return c

    def empty(self) -> bool:
        return not any(self.queue.values())


def full_table(n, k):
    """Table ``k``'s rows in client order: row c is [c, c + 0.25, c + 0.5] + 100 k; table 0 ("a")
    in float64, table 1 ("b") in float32 (a table's dtype is its own, not the model's)."""
    rows = np.arange(n, dtype=np.float64)[:, None] + np.array([0.0, 0.25, 0.5]) + 100 * k
    return rows.astype(np.float32) if k == 1 else rows


def read_only(rows):
    view = rows.view()
    view.flags.writeable = False
    return view


def ranks_of(owner, wire, fill=True, movable=(True, False), size=None):
    """One emulated rank's state per rank (``size``, or one per owner): table "a" a RowTable (put),
    "b" get/set only, whose get() is a read-only view; a server array "g" on rank 0. ``fill``:
    rows of the full tables (else zeros, as a fresh start)."""
    owner = np.asarray(owner, dtype=np.int64)
    slot = np.zeros(len(owner), dtype=np.int64)
    out = []
    for r in range(size or max(owner) + 1):
        mine = np.flatnonzero(owner == r)
        slot[mine] = np.arange(len(mine))
        items, tables = [], {}
        for k, (name, put) in enumerate(zip("ab", movable)):
            rows = full_table(len(owner), k)[mine] if fill else np.zeros((len(mine), WIDTH), full_table(1, k).dtype)
            if put:
                rt = RowTable(len(mine), WIDTH, "cpu", torch.float64)
                rt.tensor().copy_(torch.from_numpy(rows))
                t = rt.client_table(name)
            else:
                box = {"rows": rows.copy()}
                t = ClientTable(name, WIDTH, get=lambda b=box: read_only(b["rows"]),
                                set=lambda v, b=box: b.update(rows=v))
            tables[name] = t
            items.append(t)
        g = {"v": np.array([7.0, 8.0]) if (fill and r == 0) else None}
        items.append(ServerArray("g", get=lambda g=g: g["v"], set=lambda v, g=g: g.update(v=v)))
        out.append(SimpleNamespace(owner=owner, slot=slot, comm=wire.comm(r), items=items, tables=tables, g=g))
    return out


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(ckptblocks, "BLOCK_BYTES", 2 * WIDTH * 8)   # 2 rows a block
    monkeypatch.setattr(resume, "MESSAGE_BYTES", 20)                # a block in 3 messages, the last shorter
    for where in (resume, staterows):   # the items the rows' helpers (staterows) and resume's own code see
        monkeypatch.setattr(where, "state_items", lambda s: s.items)


def write_all(ranks, store, x, before=None):
    """Ranks 1.. send first (their sends queue), then rank 0 writes; rank 0's result."""
    for s in ranks[1:]:
        assert resume.write(s, x, store, 4, {"config": "{}"}, MANIFEST) is None
    return resume.write(ranks[0], x, store, 4, {"config": "{}"}, MANIFEST, before=before)


# rank 1 owns a run of 5 clients (blocks of 2, 2 and 1 rows) and one more
WRITE_OWNER = [0, 0, 1, 1, 1, 1, 1, 0, 2, 2, 0, 1]
N = len(WRITE_OWNER)


def test_write_puts_every_ranks_rows_into_one_checkpoint_in_client_order(tmp_path, small_blocks):
    wire, store, calls = Wire(), CheckpointStore(tmp_path / "ck"), []
    ranks = ranks_of(WRITE_OWNER, wire)
    x = np.linspace(-1, 1, 5, dtype=np.float32)
    assert write_all(ranks, store, x, before=lambda: calls.append(list((tmp_path / "ck").glob("ckpt-*")))) is None
    assert calls == [[]] and wire.empty()                    # before() ran once, before the file existed
    got = store.load_latest()
    assert got.round == 4 and got.arrays["model"].tobytes() == x.tobytes() and got.meta == {"config": "{}"}
    assert got.arrays["server.g"].tolist() == [7.0, 8.0]
    for k, name in enumerate("ab"):
        assert got.arrays[f"clients.{name}"].tobytes() == full_table(N, k).tobytes()


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
@pytest.mark.parametrize("owner", [[1, 2, 1, 2, 0, 0, 0, 1, 2, 0, 1, 1], [1, 1, 1, 0, 0, 1, 0, 1, 1, 0, 1, 1]])
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
            assert s.tables[name].get().tobytes() == full_table(N, k)[mine].tobytes(), (r, name)
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


def test_capture_collects_every_ranks_rows_on_rank_0(small_blocks):
    """``capture``: the other ranks send, rank 0 returns whole tables (tests, small runs)."""
    wire = Wire()
    ranks = ranks_of(WRITE_OWNER, wire)
    x = np.arange(3, dtype=np.float32)
    assert [resume.capture(s, x) for s in ranks[1:]] == [None, None]
    got = resume.capture(ranks[0], x)
    assert wire.empty() and sorted(got) == ["clients.a", "clients.b", "model", "server.g"]
    assert got["clients.a"].tobytes() == full_table(N, 0).tobytes()
    assert got["clients.b"].tobytes() == full_table(N, 1).tobytes()


def test_a_rank_without_clients_takes_part_and_gets_the_model(small_blocks):
    """Four clients on three ranks: rank 2 owns none, reads no row and still gets the model."""
    arrays = {"model": np.array([2.0]), "clients.a": full_table(4, 0), "clients.b": full_table(4, 1)}
    wire = Wire()
    ranks = ranks_of([0, 1, 0, 1], wire, fill=False, size=3)
    got = [resume.restore(s, arrays if s.comm.rank == 0 else None) for s in ranks]
    assert wire.empty() and [g.tolist() for g in got] == [[2.0]] * 3
    assert ranks[2].tables["a"].get().shape == (0, WIDTH) and ranks[1].tables["b"].get().tolist() == \
        full_table(4, 1)[[1, 3]].tolist()


class Recording:
    """A checkpoint's arrays that record each block asked for."""

    def __init__(self, arrays):
        self.arrays, self.blocks = arrays, []

    def spec(self, name):
        return (self.arrays[name].shape, self.arrays[name].dtype) if name in self.arrays else None

    def array(self, name):
        return self.arrays[name]

    def block(self, name, r0, r1):
        self.blocks.append((name, r0, r1))
        return self.arrays[name][r0:r1]


def test_a_resume_reads_the_file_one_block_at_a_time(small_blocks):
    """Rank 0 asks the file for at most one block (2 rows here) at a time, in client order per
    run of an owner: never a whole table."""
    owner = [0, 0, 0, 1, 1, 1, 1, 1]
    source = Recording({"model": np.zeros(1), "clients.a": full_table(8, 0), "clients.b": full_table(8, 1)})
    wire = Wire()
    ranks = ranks_of(owner, wire, fill=False)
    resume._read(ranks[0], source)
    resume._read(ranks[1], None)
    assert wire.empty()
    assert [b[1:] for b in source.blocks if b[0] == "clients.a"] == [(0, 2), (2, 3), (3, 5), (5, 7), (7, 8)]


def test_rank_0_holds_one_block_of_another_ranks_rows(monkeypatch):
    """The buffer rank 0 receives another rank's rows into is one block (here one row), reused."""
    monkeypatch.setattr(ckptblocks, "BLOCK_BYTES", WIDTH * 8)
    for where in (resume, staterows):   # the items the rows' helpers (staterows) and resume's own code see
        monkeypatch.setattr(where, "state_items", lambda s: s.items)
    wire = Wire()
    ranks = ranks_of([1, 1, 1, 0, 1], wire)
    resume._send_tables(ranks[1])
    bases = set()
    for r0, r1, rows in resume._table_stream(ranks[0], ranks[0].tables["a"].get()):
        assert rows.tobytes() == full_table(5, 0)[r0:r1].tobytes()
        if r0 != 3:
            bases.add(id(rows.base))
            assert rows.base.nbytes == WIDTH * 8
    assert len(bases) == 1


def test_pieces_are_byte_views_of_at_most_message_bytes(monkeypatch):
    monkeypatch.setattr(resume, "MESSAGE_BYTES", 20)
    buf = np.arange(12, dtype=np.float64).reshape(4, 3)
    pieces = resume._pieces(buf)
    assert [p.nbytes for p in pieces] == [20, 20, 20, 20, 16]
    assert b"".join(p.tobytes() for p in pieces) == buf.tobytes()
    pieces[1][:] = 0                                   # views: a receive into a piece fills buf
    assert buf.reshape(-1)[2:5].tolist() == [0.0, 0.0, 0.0]
    assert [p.nbytes for p in resume._pieces(np.zeros((0, 3)))] == [0]


def test_the_state_is_the_policies_then_the_exact_sums_grid(monkeypatch):
    """An accumulator with state (the exact sum's grid) adds it; one without (a float sum) adds nothing."""
    mine = ServerArray("p", get=lambda: None, set=lambda v: None)
    grid = ServerArray("grid", get=lambda: None, set=lambda v: None)
    s = SimpleNamespace(algo=SimpleNamespace(state=lambda: [mine]))
    monkeypatch.setattr(staterows, "accumulator", lambda s: SimpleNamespace(state=lambda: [grid]))
    assert resume.state_items(s) == [mine, grid]
    monkeypatch.setattr(staterows, "accumulator", lambda s: object())
    assert resume.state_items(s) == [mine]
