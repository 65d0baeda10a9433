"""Checkpoint arrays a block at a time (hpcfl.io.ckptblocks): a streamed table writes the same file
and checksum as the whole array, the store holds one block of it while saving and verifying, a
resume reads only the file it verified, and the per-client rows' storage never moves for guests."""

import hashlib
import tracemalloc

import h5py
import numpy as np
import pytest
import torch

from hpcfl.errors import HpcflError
from hpcfl.io import ckptblocks
from hpcfl.io.checkpoint import CheckpointStore, open_loaded, payload_sha256
from hpcfl.io.ckptblocks import Streamed, row_blocks

MANIFEST = {"world_size": 2, "config_sha256": "ab" * 32, "versions": {}}


def streamed(full: np.ndarray, seen: list | None = None) -> Streamed:
    """``full`` given block by block, each a fresh copy (as received from another rank)."""
    def blocks():
        for r0, r1 in row_blocks(len(full), full[0].nbytes):
            if seen is not None:
                seen.append((r0, r1))
            yield r0, r1, full[r0:r1].copy()

    return Streamed(full.shape, full.dtype, blocks)


def test_row_blocks_cover_the_rows_in_order_within_the_budget():
    assert row_blocks(10, 8, 24) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert row_blocks(3, 100, 24) == [(0, 1), (1, 2), (2, 3)]   # a row larger than a block: one row each
    assert row_blocks(0, 8, 24) == []


def test_streamed_table_writes_the_same_arrays_and_checksum_as_the_whole_array(tmp_path, monkeypatch):
    monkeypatch.setattr(ckptblocks, "BLOCK_BYTES", 3 * 40 * 4)       # 3 rows of 40 float32 a block
    rng = np.random.default_rng(0)
    table = rng.standard_normal((11, 40)).astype(np.float32)
    whole = {"model": rng.standard_normal(40), "clients.c": table, "server.g": np.arange(5, dtype=np.int16)}
    seen = []
    path = CheckpointStore(tmp_path / "a").save(1, {**whole, "clients.c": streamed(table, seen)}, manifest=MANIFEST)
    assert seen == [(0, 3), (3, 6), (6, 9), (9, 11)]
    with h5py.File(path, "r") as f:
        assert f.attrs["payload_sha256"] == payload_sha256(whole)    # the format of whole arrays
        assert f["arrays/clients.c"][()].tobytes() == table.tobytes()
    got = CheckpointStore(tmp_path / "a").load_latest()
    assert got.arrays["clients.c"].tobytes() == table.tobytes()


def test_save_and_verify_hold_one_block_of_a_large_table(tmp_path, monkeypatch):
    """16 MB of rows, 64 kB blocks: numpy's allocations while saving (and reading back to verify)
    peak far below the table (the code before streaming hashed and verified whole arrays)."""
    monkeypatch.setattr(ckptblocks, "BLOCK_BYTES", 64 << 10)
    rows, width = 4096, 1024

    def blocks():
        for r0, r1 in row_blocks(rows, width * 4):
            yield r0, r1, np.full((r1 - r0, width), r0, dtype=np.float32)   # made as it is sent

    store = CheckpointStore(tmp_path)
    tracemalloc.start()
    try:
        store.save(1, {"model": np.zeros(8), "clients.c": Streamed((rows, width), np.dtype(np.float32), blocks)},
                   manifest=MANIFEST)
        got = store.load_latest(keep_arrays=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got.round == 1 and got.arrays == {}
    assert got.shapes["clients.c"] == ((rows, width), np.dtype(np.float32))
    assert peak < 1 << 20, f"{peak / 2**20:.1f} MB for 16 MB of rows"


def test_verifying_a_block_at_a_time_finds_a_flipped_byte_in_the_last_block(tmp_path, monkeypatch):
    monkeypatch.setattr(ckptblocks, "BLOCK_BYTES", 1 << 10)
    store = CheckpointStore(tmp_path, keep=2)
    table = np.arange(64 * 100, dtype=np.float64).reshape(64, 100)
    store.save(1, {"clients.c": table}, manifest=MANIFEST)
    newest = store.save(2, {"clients.c": table + 1}, manifest=MANIFEST)
    with h5py.File(newest, "r") as f:
        offset = f["arrays/clients.c"].id.get_offset()
    with open(newest, "r+b") as fh:
        fh.seek(offset + table.nbytes - 3)
        b = fh.read(1)
        fh.seek(offset + table.nbytes - 3)
        fh.write(bytes([b[0] ^ 1]))
    got = store.load_latest(keep_arrays=False)
    assert got.round == 1 and "checksum mismatch" in store.last_skipped[0][1]


def test_a_resume_reads_only_the_file_it_verified(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(1, {"model": np.arange(6.0)}, manifest=MANIFEST)
    got = store.load_latest(keep_arrays=False)
    src = open_loaded(got)
    assert src.spec("model") == ((6,), np.dtype(np.float64)) and src.block("model", 2, 4).tolist() == [2.0, 3.0]
    src.close()
    store.save(1, {"model": np.arange(6.0) + 1}, manifest=MANIFEST)   # replaced since it was verified
    with pytest.raises(HpcflError, match="changed since it was verified"):
        open_loaded(got)


def test_a_failed_save_lets_the_caller_drain_the_rest_of_the_stream(tmp_path):
    """The rows of other ranks arrive whatever rank 0's disk does: what was not written is drained."""
    seen = []
    table = np.ones((4, 3), dtype=np.float32)
    st = streamed(table, seen)
    with pytest.raises(TypeError):   # an object array is refused before anything is written
        CheckpointStore(tmp_path).save(1, {"clients.c": st, "bad": np.array([object()])}, manifest=MANIFEST)
    st.drain()
    assert seen == [(0, 4)]


# ------------------------------------------------------------------- per-client rows and guests
def test_making_room_for_guests_never_moves_or_copies_the_own_rows():
    from hpcfl.algorithms.protocol import RowTable

    t = RowTable(3, 2, torch.device("cpu"), torch.float64)
    ct = t.client_table("c")
    ct.set(np.arange(6.0).reshape(3, 2))
    home = t.tensor().data_ptr()
    for n in (1, 4, 2, 7):
        t.reserve(n)
        assert t.tensor().data_ptr() == home                   # own rows stay where they are
    ct.put(np.array([4, 0, 9]), np.array([[10.0, 11.0], [12.0, 13.0], [14.0, 15.0]]))   # guest, own, guest
    assert ct.rows(np.array([0, 4, 9, 2])).tolist() == [[12.0, 13.0], [10.0, 11.0], [14.0, 15.0], [4.0, 5.0]]
    t[5] = torch.tensor([1.0, 2.0], dtype=torch.float64)
    t[5] -= 1.0                                                # policies update rows in place
    assert t[5].tolist() == [0.0, 1.0] and ct.get().tolist() == [[12.0, 13.0], [2.0, 3.0], [4.0, 5.0]]
    with pytest.raises(IndexError):
        t[3 + 7]
    ct.put(np.array([1, 2]), np.array([[7.0, 7.0], [8.0, 8.0]]))   # a run of own rows (a resume's block)
    assert hashlib.sha256(ct.get().tobytes()).digest() == hashlib.sha256(
        np.array([[12.0, 13.0], [7.0, 7.0], [8.0, 8.0]]).tobytes()).digest()


# ------------------------------------------------------------------- arrays checked against the job
def test_every_array_a_resume_loads_is_checked_against_the_job():
    from mpi4py import MPI
    from runner import job

    from hpcfl import config
    from hpcfl.engine import resume, simulation
    from hpcfl.io.ckptblocks import DictArrays

    s = simulation.prepare(config.from_dict(job(**{"algorithm.name": "scaffold", "run.rounds": 1})), MPI.COMM_SELF)
    arrays = resume.capture(s, s.model.numpy())
    assert resume.problems(s, DictArrays(arrays).spec) is None
    P, N = s.model.length, len(s.sizes)

    def why(**change):
        bad = dict(arrays, **change)
        return resume.problems(s, DictArrays({k: v for k, v in bad.items() if v is not None}).spec)

    assert why(model=arrays["model"][:-1]) == (f"its 'model' is float32 of shape ({P - 1},), this job's is "
                                               f"float32 of shape ({P},)")
    assert why(model=arrays["model"].reshape(1, -1)).startswith("its 'model' is float32 of shape (1, ")
    assert why(model=arrays["model"].astype(np.float64)).startswith("its 'model' is float64")
    assert why(model=None) == "it has no array 'model'"
    grid = arrays["server.exact_grid"]
    assert why(**{"server.exact_grid": np.append(grid, 0).astype(grid.dtype)}).startswith(
        f"its 'server.exact_grid' is int16 of shape ({grid.size + 1},)")
    assert why(**{"clients.scaffold_c_i": arrays["clients.scaffold_c_i"][:-1]}) == (
        f"its 'clients.scaffold_c_i' is float32 of shape ({N - 1}, {P}), this job's is float32 of shape ({N}, {P})")
    assert why(**{"server.scaffold_c": None}) == "it has no array 'server.scaffold_c'"


def test_draining_after_a_partial_read_takes_only_the_rest(tmp_path, monkeypatch):
    """A save that fails after the first block leaves the stream part read; drain() must go on from
    there (the other ranks send each block once), not start the stream over."""
    monkeypatch.setattr(ckptblocks, "BLOCK_BYTES", 3 * 4)             # one row of 3 float32 a block
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    seen = []
    st = streamed(table, seen)
    it = iter(st)
    assert next(it)[:2] == (0, 1)
    st.drain()
    assert seen == [(0, 1), (1, 2), (2, 3), (3, 4)]                 # each block once
    # the same through a save that fails while writing the second block
    seen.clear()
    st = streamed(table, seen)
    calls = []

    def failing(h, rows):
        calls.append(len(rows))
        if len(calls) == 2:
            raise OSError(5, "Input/output error")
        ckptblocks.hash_bytes(h, rows)

    monkeypatch.setattr("hpcfl.io.ckptfile.hash_bytes", failing)   # write_file hashes there
    with pytest.raises(HpcflError, match="Input/output error"):
        CheckpointStore(tmp_path).save(1, {"clients.c": st}, manifest=MANIFEST)
    st.drain()
    assert seen == [(0, 1), (1, 2), (2, 3), (3, 4)]


def test_a_streamed_arrays_size_counts_its_item_size_in_the_free_space_check(tmp_path, monkeypatch):
    """1000 x 100 float64 rows are 800,000 bytes (not 100,000 elements): with room for the elements
    but not the bytes, the save is refused before anything is written or read from the stream."""
    st = Streamed((1000, 100), np.dtype(np.float64), lambda: iter(()))
    assert st.nbytes == 800_000
    assert Streamed((7,), np.dtype(np.int16), lambda: iter(())).nbytes == 14
    seen = []
    table = np.ones((1000, 100))
    monkeypatch.setattr("hpcfl.io.safefs.free_bytes", lambda d: 100_000 + (64 << 10) + 4096)
    with pytest.raises(HpcflError, match=r"No space left on device .* It needs about 0\.8 MB \(800,000 bytes\)"):
        CheckpointStore(tmp_path).save(1, {"clients.c": streamed(table, seen)}, manifest=MANIFEST)
    assert seen == [] and list(tmp_path.iterdir()) == []


def test_segments_are_the_runs_of_one_owner_in_id_order():
    from hpcfl.engine.resume import _segments

    assert _segments(np.array([0, 0, 1, 1, 1, 0, 1])) == [(0, 2, 0), (2, 5, 1), (5, 6, 0), (6, 7, 1)]
    assert _segments(np.array([0, 1, 0, 1])) == [(0, 1, 0), (1, 2, 1), (2, 3, 0), (3, 4, 1)]
    assert _segments(np.array([1, 1, 1])) == [(0, 3, 1)]
    assert _segments(np.array([2])) == [(0, 1, 2)]
    assert _segments(np.array([], dtype=np.int64)) == []


class Wire:
    """Point-to-point messages between emulated ranks, checked as MPI would match them: every
    receive finds a send of exactly its size waiting (a missing one fails here, where MPI would block)."""

    def __init__(self):
        self.queue = {}     # (source, dest) -> [bytes]

    def comm(self, rank):
        wire = self

        class Comm:
            def Ssend(self, buf, dest, tag):
                wire.queue.setdefault((rank, dest), []).append(bytes(np.asarray(buf)))

            def Recv(self, buf, source, tag):
                sent = wire.queue.get((source, rank), [])
                assert sent, f"rank {rank} receives from {source}, which sent nothing more: MPI would hang here"
                msg = sent.pop(0)
                assert len(msg) == buf.nbytes, f"a message of {len(msg)} bytes into a buffer of {buf.nbytes}"
                np.asarray(buf).reshape(-1).view(np.uint8)[:] = np.frombuffer(msg, dtype=np.uint8)

        c = Comm()
        c.rank = rank
        return c


@pytest.mark.parametrize("owner", [[0, 0, 1, 1, 1, 0, 1, 2, 2, 0], [1, 2, 1, 2, 0, 0, 0, 1], [2, 2, 2, 2, 1]])
def test_streamed_tables_send_and_receive_the_same_messages(monkeypatch, owner):
    """The checkpoint's client tables, rank 0 writing and the others sending (hpcfl.engine.resume),
    emulated in one process with small blocks and messages: each rank sends exactly the segments,
    blocks and pieces rank 0 receives, in the same order, and the table comes out whole."""
    from types import SimpleNamespace

    from hpcfl.engine import resume

    owner = np.array(owner)
    n, width, ranks = len(owner), 3, 3
    full = np.arange(n * width, dtype=np.float64).reshape(n, width) + 0.5
    monkeypatch.setattr(ckptblocks, "BLOCK_BYTES", 2 * width * 8)   # 2 rows a block
    monkeypatch.setattr(resume, "MESSAGE_BYTES", 16)                # a block in 3 messages
    slot = np.zeros(n, dtype=np.int64)
    for r in range(ranks):
        mine = np.flatnonzero(owner == r)
        slot[mine] = np.arange(mine.size)
    wire = Wire()

    def state(rank):
        table = SimpleNamespace(name="t", get=lambda: full[owner == rank])
        return SimpleNamespace(owner=owner, slot=slot, comm=wire.comm(rank)), table

    for rank in (1, 2):
        s, table = state(rank)
        monkeypatch.setattr(resume, "_tables", lambda s, t=table: [t])
        resume._send_tables(s)
    sent = {k: len(v) for k, v in wire.queue.items()}
    s, table = state(0)
    got = np.full_like(full, np.nan)
    for r0, r1, rows in resume._table_stream(s, table.get()):
        got[r0:r1] = rows
    np.testing.assert_array_equal(got, full)
    assert all(not v for v in wire.queue.values()), "messages sent but never received"
    # hand count for the first placement: rank 1 owns runs of 3 and 1 rows (2 + 1 and 1 blocks),
    # rank 2 a run of 2 (1 block); a 2-row block is 48 bytes in 3 messages of 16, a 1-row one in 2
    if owner.tolist() == [0, 0, 1, 1, 1, 0, 1, 2, 2, 0]:
        assert sent == {(1, 0): 3 + 2 + 2, (2, 0): 3}
