"""A dataset read from the user's files, loaded once per node (hpcfl.engine.dataload, "window"), at 2
and 3 ranks: the node's first rank reads the .npz; every rank gets the one-rank load's bytes, the big
arrays as read-only views of the node's shared windows (one copy: a write through the window is seen
by every rank), and the run's tensors on them without a copy. Runs on it are bitwise the one-rank
runs; a damaged file, or a refusal on the first rank alone, is the same error on every rank, no
hang; the windows are freed at the end of each run through hpcfl.run, and of a run that failed."""

import dataclasses
import json
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from runner import job, run_memory

import hpcfl
from hpcfl import config, data
from hpcfl.engine import job as job_module
from hpcfl.engine import simulation
from hpcfl.engine.dataload import load_per_node
from hpcfl.engine.setup import release_tables
from hpcfl.errors import DataError, HpcflError
from hpcfl.parallel import shared
from hpcfl.parallel.shared import NodeTables

N, M, F = 1800, 200, 160   # x: 1800 x 160 float32 = 1.1 MiB, over MIN_BYTES; y: 14 KB, under it


@pytest.fixture
def folder():
    comm = MPI.COMM_WORLD
    path = Path(comm.bcast(tempfile.mkdtemp(prefix="hpcfl-files-") if comm.rank == 0 else None, root=0))
    if comm.rank == 0:   # the user's file, as np.savez writes it: 12 natural clients, their own test rows
        rng = np.random.default_rng(4)
        np.savez(path / "d.npz", x=rng.normal(size=(N, F)).astype(np.float32), y=rng.integers(0, 5, N),
                 x_test=rng.normal(size=(M, F)).astype(np.float32), y_test=rng.integers(0, 5, M),
                 client=rng.integers(0, 12, N) * 7, client_test=rng.integers(0, 12, M) * 7)
        (path / "bad.npz").write_bytes((path / "d.npz").read_bytes()[:5000])   # truncated
    comm.Barrier()
    yield path
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


def table(path: Path, name: str = "d.npz", **over) -> dict:
    """The tests' small job on the .npz: 12 natural clients, logistic regression."""
    t = job(**{"model.name": "logreg", "run.eval_clients": True})
    t["data"] = {"dataset": "npz", "npz": {"file": str(path / name)}, "partition": "natural", "num_clients": 12}
    return config.apply_overrides(t, [f"{k}={json.dumps(v)}" for k, v in over.items()])


def counted(monkeypatch, refuse=False):
    """data.DATASETS["npz"] counting its loads (and refusing where ``refuse``)."""
    spec, calls = data.DATASETS["npz"], []

    def load(*args):
        calls.append(1)
        if refuse:
            raise DataError("d.npz: refused on the first rank only")
        return spec.load(*args)

    monkeypatch.setitem(data.DATASETS, "npz", dataclasses.replace(spec, load=load))
    return calls


@pytest.mark.mpi(min_size=2)
def test_a_file_dataset_is_read_once_per_node_into_read_only_shared_windows(folder, monkeypatch):
    comm = MPI.COMM_WORLD
    cfg = config.from_dict(table(folder))
    calls = counted(monkeypatch)
    tables = NodeTables(comm)
    ds = load_per_node(cfg, comm, tables)
    assert len(calls) == (tables.node.rank == 0)   # read by the node's first rank only
    one = data.DATASETS["npz"].load(cfg.dataset_options, None, cfg.run.seed)    # what one rank reads alone
    for name in ("x_train", "y_train", "x_test", "y_test"):
        a, b = getattr(ds, name), getattr(one, name)
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), name
    for name in ("natural_clients", "natural_test"):
        a, b = getattr(ds, name), getattr(one, name)
        assert type(a) is type(b) and a.flat.tobytes() == b.flat.tobytes() and a.sizes.tobytes() == b.sizes.tobytes()
        assert [g.tobytes() for g in a] == [g.tobytes() for g in b]
    assert (ds.num_classes, ds.input_shape, ds.augment) == (one.num_classes, one.input_shape, one.augment)
    # the inputs in the node's windows, read-only on every rank; the 14 KB of labels private
    assert tables.holds(ds.x_train) and not ds.x_train.flags.writeable
    assert not tables.holds(ds.y_train) and ds.y_train.flags.writeable
    assert tables.shared_bytes == ds.x_train.nbytes + ds.x_test.nbytes * (ds.x_test.nbytes >= shared.MIN_BYTES)
    with pytest.raises(ValueError):
        ds.x_train[0, 0] = 1.0
    # one copy: the first rank writes through the window, every rank sees it
    before = float(ds.x_train[5, 3])
    tables.node.Barrier()   # every rank has compared its bytes
    if tables.node.rank == 0:
        buf, _ = tables.windows[0].Shared_query(0)
        np.ndarray(ds.x_train.shape, dtype=np.float32, buffer=buf)[5, 3] = 1234.5
    tables.node.Barrier()
    assert float(ds.x_train[5, 3]) == 1234.5 != before
    tables.free()
    assert tables.windows == [] and tables.node is None


@pytest.mark.mpi(min_size=2)
def test_set_up_trains_on_the_window_without_a_copy_and_frees_it(folder, monkeypatch):
    monkeypatch.setattr(shared, "MIN_BYTES", 0)   # every array in a window: the natural clients' indices too
    comm = MPI.COMM_WORLD
    with warnings.catch_warnings():
        warnings.simplefilter("error")   # torch's warning on a read-only array is not shown
        s = simulation.prepare(config.from_dict(table(folder, **{"runtime.device": "cpu"})), comm)   # GPU: copied
    assert s.tables is not None and s.tables.holds(s.dataset.x_train) and s.tables.holds(s.dataset.natural_clients.flat)
    for tensor, array in ((s.trainer.x, s.dataset.x_train), (s.trainer.y, s.dataset.y_train),
                          (s.x_test, s.dataset.x_test), (s.y_test, s.dataset.y_test)):
        assert tensor.data_ptr() == array.ctypes.data and s.tables.holds(array)   # the window itself, no copy
    tables = s.tables
    release_tables(s)
    assert tables.windows == [] and s.dataset is None


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("over", [{}, {"data.partition": "iid", "data.num_clients": 9, "runtime.dtype": "float64"}],
                         ids=["natural_eval_clients", "iid_float64"])
def test_runs_on_a_shared_file_dataset_are_the_one_rank_runs(folder, monkeypatch, over):
    monkeypatch.setattr(shared, "MIN_BYTES", 0)
    comm = MPI.COMM_WORLD
    t = table(folder, **over)
    ref = run_memory(t, MPI.COMM_SELF) if comm.rank == 0 else None
    comm.Barrier()
    x, metrics, clients = run_memory(t, comm)
    if comm.rank == 0:
        assert x.tobytes() == ref[0].tobytes()
        assert repr(metrics) == repr(ref[1])
        for c, r in zip(clients, ref[2]):
            for k in r:
                assert np.asarray(c[k]).tobytes() == np.asarray(r[k]).tobytes(), k


def same_error_everywhere(comm, exc) -> str:
    texts = comm.allgather((type(exc).__name__, str(exc)))
    assert len(set(texts)) == 1, texts
    return texts[0][1]


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_a_damaged_file_is_one_error_on_every_rank(folder):
    comm = MPI.COMM_WORLD
    tables = NodeTables(comm)
    with pytest.raises(DataError) as got:
        load_per_node(config.from_dict(table(folder, "bad.npz")), comm, tables)
    assert "bad.npz is truncated or not an .npz archive" in same_error_everywhere(comm, got.value)
    assert tables.windows == []
    tables.free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(120)
def test_the_first_ranks_refusal_reaches_the_others_who_do_not_read_again(folder, monkeypatch):
    comm = MPI.COMM_WORLD
    tables = NodeTables(comm)
    calls = counted(monkeypatch, refuse=tables.node.rank == 0)
    with pytest.raises(DataError, match="refused on the first rank only") as got:
        load_per_node(config.from_dict(table(folder)), comm, tables)
    same_error_everywhere(comm, got.value)
    assert len(calls) == (tables.node.rank == 0)
    tables.free()


@pytest.mark.mpi(min_size=2)
@pytest.mark.timeout(200)
def test_hpcfl_run_frees_the_windows_of_each_run_finished_or_failed(folder, monkeypatch):
    """Three runs in one process: a damaged file (refused in set-up), a batch too large for the
    data read (refused after the load: the windows existed), a finished run: every NodeTables the
    runs made has no window left, and the finished run is the one-rank run."""
    monkeypatch.setattr(shared, "MIN_BYTES", 0)
    made = []

    class Spy(NodeTables):
        def __init__(self, comm):
            super().__init__(comm)
            made.append(self)

    monkeypatch.setattr(job_module, "NodeTables", Spy)
    comm = MPI.COMM_WORLD
    out = folder / "runs"
    with pytest.raises(HpcflError) as got:
        hpcfl.run(table(folder, "bad.npz"), out=out / "bad", comm=comm)
    assert "bad.npz is truncated" in same_error_everywhere(comm, got.value)
    with pytest.raises(HpcflError) as got:
        hpcfl.run(table(folder, **{"algorithm.batch_size": N + 1}), out=out / "big", comm=comm)
    assert "exceeds the whole training set" in same_error_everywhere(comm, got.value)
    assert made[1].shared_bytes > 0   # the second run had mapped its dataset before it was refused
    res = hpcfl.run(table(folder, **{"run.rounds": 2}), out=out / "ok", comm=comm)
    assert len(made) == 3 and all(t.windows == [] and t.node is None for t in made)
    ref = hpcfl.run(table(folder, **{"run.rounds": 2}), out=out / f"one{comm.rank}", comm=MPI.COMM_SELF)
    assert res.final_params.tobytes() == ref.final_params.tobytes()
