"""Sharded checkpoints' files (hpcfl/io/ckptshards.py and the store's side of them): shards written and
checked, a manifest that names them, every way a shard set can be wrong, reading rows by client id
across shards, and which shard files count as an interrupted save's debris."""

import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from hpcfl.errors import HpcflError
from hpcfl.io import ckptshards, safefs
from hpcfl.io.checkpoint import CheckpointStore

MANIFEST = {"world_size": 3, "config_sha256": "cd" * 32, "versions": {}}
N, WIDTH = 10, 3
TABLE = np.arange(N * WIDTH, dtype=np.float32).reshape(N, WIDTH) * 0.5 - 4   # client c's row: TABLE[c]
OWNER = np.array([0, 0, 1, 2, 2, 2, 1, 1, 0, 2])                              # runs of one owner, not blocks


def runs_of(rank, owner=OWNER):
    ids = np.flatnonzero(owner == rank)
    cuts = np.flatnonzero(np.diff(ids) != 1) + 1
    return np.array([(g[0], g[-1] + 1) for g in np.split(ids, cuts) if g.size], dtype=np.int64).reshape(-1, 2)


def shard_arrays(rank, owner=OWNER):
    runs = runs_of(rank, owner)
    rows = np.concatenate([TABLE[lo:hi] for lo, hi in runs]) if len(runs) else np.zeros((0, WIDTH), np.float32)
    return {"rows": runs, "clients.c": rows, "clients.n": np.arange(len(rows), dtype=np.int64)[:, None] + 100 * rank}


def save_sharded(store, rnd, token="00c0ffee", arrays_of=shard_arrays, ranks=3):
    entries = [ckptshards.write(store.directory, rnd, token, r, arrays_of(r), MANIFEST) for r in range(ranks)]
    store.save(rnd, {"model": np.linspace(0, 1, 5)}, meta={}, manifest={**MANIFEST, "shards": entries,
                                                                       "shard_token": token, "shard_clients": N})
    return entries


def test_runs_here_are_the_hand_computed_ones():
    assert runs_of(0).tolist() == [[0, 2], [8, 9]]
    assert runs_of(1).tolist() == [[2, 3], [6, 8]]
    assert runs_of(2).tolist() == [[3, 6], [9, 10]]


def test_a_sharded_checkpoint_loads_with_whole_table_shapes_and_every_row_reads_back_by_client(tmp_path):
    store = CheckpointStore(tmp_path)
    entries = save_sharded(store, 4)
    assert [e["name"] for e in entries] == [f"ckpt-00000004.00c0ffee.shard-0000{r}.h5" for r in range(3)]
    got = store.load_latest(keep_arrays=False)
    assert got.round == 4 and got.manifest["format_version"] == 2 and len(got.shards) == 3
    assert got.shapes["clients.c"] == ((N, WIDTH), np.dtype(np.float32))
    assert got.shapes["clients.n"] == ((N, 1), np.dtype(np.int64))
    rows = ckptshards.ShardRows(got.shards)
    try:
        for lo, hi in [(0, 10), (1, 7), (5, 6), (7, 10)]:
            out = np.concatenate([rows.block(sh, "clients.c", f, f + c1 - c0)
                                  for c0, c1, sh, f in rows.pieces(lo, hi)])
            assert out.tobytes() == TABLE[lo:hi].tobytes(), (lo, hi)
    finally:
        rows.close()
    whole = store.load_latest().arrays   # kept in memory: the tables put together, as from one file
    assert sorted(whole) == ["clients.c", "clients.n", "model"]
    assert whole["clients.c"].tobytes() == TABLE.tobytes()
    assert whole["clients.n"][:, 0].tolist() == [0, 1, 100, 200, 201, 202, 101, 102, 2, 203]


def test_pieces_name_the_shard_and_its_row_for_each_run_of_clients(tmp_path):
    # shard 0 holds 0,1,8 (rows 0,1,2); shard 1 holds 2,6,7 (rows 0,1,2); shard 2 holds 3,4,5,9 (rows 0..3)
    rows = ckptshards.ShardRows([ckptshards.Shard(Path(n), "", 0, runs_of(r)) for r, n in enumerate("abc")])
    assert list(rows.pieces(1, 9)) == [(1, 2, 0, 1), (2, 3, 1, 0), (3, 6, 2, 0), (6, 8, 1, 1), (8, 9, 0, 2)]
    assert list(rows.pieces(4, 5)) == [(4, 5, 2, 1)]


def broken_set(what):
    """Shard arrays by rank, with one thing wrong."""
    def arrays_of(rank):
        a = shard_arrays(rank)
        if what == "overlap" and rank == 1:      # rank 1 claims client 1 too: held twice
            a["rows"] = np.array([[1, 3], [6, 8]])
            a["clients.c"] = np.concatenate([TABLE[1:3], TABLE[6:8]])
            a["clients.n"] = np.zeros((4, 1), np.int64)
        if what == "gap" and rank == 2:          # client 9 held by nobody
            a["rows"], a["clients.c"], a["clients.n"] = a["rows"][:1], a["clients.c"][:3], a["clients.n"][:3]
        if what == "width" and rank == 2:
            a["clients.c"] = np.zeros((4, WIDTH + 1), np.float32)
        if what == "count" and rank == 0:        # rows for 3 clients, 2 of them written
            a["clients.c"] = a["clients.c"][:2]
        return a
    return arrays_of


@pytest.mark.parametrize("what,reason", [("overlap", "exactly once"), ("gap", "exactly once"),
                                         ("width", "do not match"), ("count", "do not match")])
def test_a_shard_set_that_does_not_hold_every_row_once_is_skipped_for_the_older(tmp_path, what, reason):
    store = CheckpointStore(tmp_path)
    save_sharded(store, 2)
    save_sharded(store, 4, token="0000beef", arrays_of=broken_set(what))
    got = store.load_latest(keep_arrays=False)
    assert got.round == 2
    assert reason in dict(got.skipped)[store.path_for(4)]


def test_the_manifest_is_not_written_when_rank_0_does_not_see_a_shard(tmp_path):
    """A rank on another node wrote into node-local disk: rank 0 refuses to write a manifest naming it."""
    store = CheckpointStore(tmp_path)
    save_sharded(store, 2)
    entries = [ckptshards.write(tmp_path, 4, "0000beef", r, shard_arrays(r), MANIFEST) for r in range(3)]
    (tmp_path / entries[2]["name"]).unlink()
    with pytest.raises(HpcflError, match="every node reaches.*checkpoint.shards = false"):
        store.save(4, {"model": np.zeros(5)}, meta={}, manifest={**MANIFEST, "shards": entries,
                                                                 "shard_token": "0000beef", "shard_clients": N})
    assert not store.path_for(4).exists()
    assert store.load_latest(keep_arrays=False).round == 2


def test_a_shard_that_cannot_be_written_leaves_nothing_and_says_which_rank(tmp_path, monkeypatch):
    monkeypatch.setattr(safefs, "free_bytes", lambda d: 100)
    with pytest.raises(HpcflError, match=r"rank 1 could not write its checkpoint shard .*No space left"):
        ckptshards.write(tmp_path, 4, "0000beef", 1, shard_arrays(1), MANIFEST)
    assert list(tmp_path.iterdir()) == []


def test_rotation_deletes_the_shards_with_their_manifest(tmp_path):
    store = CheckpointStore(tmp_path, keep=2)
    for i, rnd in enumerate((2, 4, 6)):
        save_sharded(store, rnd, token=f"{i:08x}")
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(["ckpt-00000004.h5", "ckpt-00000006.h5"] +
                           [f"ckpt-0000000{r}.{i:08x}.shard-0000{k}.h5" for r, i in ((4, 1), (6, 2)) for k in range(3)])


def test_debris_is_every_shard_no_manifest_names_except_a_damaged_manifests():
    names = ["ckpt-00000004.h5", "ckpt-00000004.aaaaaaaa.shard-00000.h5", "ckpt-00000004.bbbbbbbb.shard-00000.h5",
             "ckpt-00000006.cccccccc.shard-00001.h5", "ckpt-00000008.dddddddd.shard-00000.h5", "notes.txt"]
    manifests = {4: ["ckpt-00000004.aaaaaaaa.shard-00000.h5"], 6: (), 8: None}   # 8's manifest unreadable
    assert ckptshards.debris(names, manifests) == ["ckpt-00000004.bbbbbbbb.shard-00000.h5",
                                                         "ckpt-00000006.cccccccc.shard-00001.h5"]


def test_clean_temp_removes_a_save_killed_before_its_manifest(tmp_path):
    store = CheckpointStore(tmp_path)
    save_sharded(store, 2)
    for r in range(2):   # round 4's save: two ranks' shards written, then killed
        ckptshards.write(tmp_path, 4, "0000beef", r, shard_arrays(r), MANIFEST)
    (tmp_path / ".ckpt-00000004.0000beef.shard-00002.h5.tmp-99").write_bytes(b"x")
    removed = sorted(p.name for p in store.clean_temp())
    assert removed == [".ckpt-00000004.0000beef.shard-00002.h5.tmp-99", "ckpt-00000004.0000beef.shard-00000.h5",
                       "ckpt-00000004.0000beef.shard-00001.h5"]
    assert store.load_latest(keep_arrays=False).round == 2 and len(list(tmp_path.iterdir())) == 4


def test_a_manifest_edited_to_name_another_shard_or_size_is_skipped(tmp_path):
    store = CheckpointStore(tmp_path)
    save_sharded(store, 2)
    entries = save_sharded(store, 4, token="0000beef")
    with h5py.File(store.path_for(4), "r+") as f:
        edited = [dict(e) for e in entries]
        edited[1]["bytes"] += 1
        f.attrs["shards"] = json.dumps(edited)
    got = store.load_latest(keep_arrays=False)
    assert got.round == 2 and "the manifest says" in dict(got.skipped)[store.path_for(4)]


def test_a_shard_that_does_not_read_back_as_written_is_deleted_and_the_save_fails(tmp_path, monkeypatch):
    """A silent write error (here: one value changed on its way to disk, hashed as it was meant to be)."""
    real = ckptshards.write_file

    def write_other(tmp, arrays, attrs):
        digest = real(tmp, arrays, attrs)
        with h5py.File(tmp, "r+") as f:
            f["arrays/clients.c"][1, 2] += 1
        return digest
    monkeypatch.setattr(ckptshards, "write_file", write_other)
    with pytest.raises(HpcflError, match=r"rank 2 could not write .*clients.c rows 0..3 read back differ"):
        ckptshards.write(tmp_path, 4, "0000beef", 2, shard_arrays(2), MANIFEST)
    assert list(tmp_path.iterdir()) == []
