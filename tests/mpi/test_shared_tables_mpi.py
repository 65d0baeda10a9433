"""Read-only per-client tables once per node (hpcfl.parallel.shared), at 2 and 3 ranks.

The windows must really be shared (a write by the node's first rank is seen by the others),
read-only for numpy, out of each rank's private memory, and change no result: runs with every
table shared (the size threshold set to 0) are bitwise the one-rank runs.
"""

import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from runner import job, run_memory

import hpcfl
from hpcfl.parallel import shared
from hpcfl.parallel.shared import NodeTables


def private_kib() -> int:
    """This process's private resident memory (Private_Clean + Private_Dirty), KiB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:])
    return sum(int(fields[k].split()[0]) for k in ("Private_Clean", "Private_Dirty"))


@pytest.mark.mpi(min_size=2)
def test_a_shared_table_is_one_copy_read_only_and_out_of_private_memory():
    comm = MPI.COMM_WORLD
    tables = NodeTables(comm)
    assert tables.on and tables.node.size == comm.size   # one node here
    n = 8 << 20   # 64 MiB of int64
    table = np.arange(n, dtype=np.int64) * 3
    table[:] += 1   # touched: resident and private
    before = private_kib()
    view = tables.share(table)
    del table
    # every rank reads it all (as ranks read the partition and class counts): each page is then mapped
    # by every rank of the node, and counts as shared, not as the first rank's private memory
    assert int(view.sum()) == 3 * n * (n - 1) // 2 + n
    tables.node.Barrier()
    after = private_kib()
    assert np.array_equal(view[:5], [1, 4, 7, 10, 13]) and int(view[-1]) == 3 * (n - 1) + 1
    with pytest.raises(ValueError):
        view[0] = 0   # read-only for numpy
    assert before - after > 0.9 * (n * 8 >> 10), (before, after)   # the private copy went, on every rank
    # one copy: the first rank writes through the window, the others see it
    buf, _ = tables.windows[0].Shared_query(0)
    if tables.node.rank == 0:
        np.ndarray((n,), dtype=np.int64, buffer=buf)[7] = -5
    tables.node.Barrier()
    assert int(view[7]) == -5
    assert tables.shared_bytes == n * 8
    small = tables.share(np.ones(3))   # under MIN_BYTES: private, writable
    assert small.flags.writeable and len(tables.windows) == 1
    tables.free()
    assert tables.windows == [] and tables.node is None


CASES = {
    "fedavg_eval_clients": {"run.eval_clients": True},
    "scaffold_block": {"algorithm.name": "scaffold", "runtime.placement": "block"},
    "feddisco": {"algorithm.name": "feddisco"},
    "fedgsnr": {"algorithm.name": "fedgsnr", "algorithm.local_steps": 4},
}


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("case", sorted(CASES))
def test_runs_with_every_table_shared_are_the_one_rank_runs(case, monkeypatch):
    monkeypatch.setattr(shared, "MIN_BYTES", 0)   # share even this job's small tables
    comm = MPI.COMM_WORLD
    table = job(**CASES[case])
    ref = run_memory(table, MPI.COMM_SELF) if comm.rank == 0 else None
    comm.Barrier()
    x, metrics, clients = run_memory(table, comm)
    if comm.rank == 0:
        assert x.tobytes() == ref[0].tobytes(), f"{case}: final model differs"
        assert repr(metrics) == repr(ref[1]), f"{case}: metrics differ"
        for c, r in zip(clients, ref[2]):
            for k in r:
                assert np.asarray(c[k]).tobytes() == np.asarray(r[k]).tobytes(), f"{case}: clients/{k} differs"


@pytest.mark.mpi(min_size=2)
def test_a_job_shares_its_tables_and_gives_them_back(monkeypatch):
    """Through hpcfl.run (the job's own start-up and end): the tables are windows during the run
    (read-only on every rank), freed at its end, and the results are the one-rank run's."""
    from hpcfl.engine import job as job_module

    monkeypatch.setattr(shared, "MIN_BYTES", 0)
    comm = MPI.COMM_WORLD
    seen = []
    share = job_module.share_tables

    def spy(s, c):
        share(s, c)
        seen.append((s.tables is not None, s.class_counts.flags.writeable, s.sizes.flags.writeable,
                     s.client_eval.sample.flags.writeable))

    monkeypatch.setattr(job_module, "share_tables", spy)
    table = job(**{"run.rounds": 3, "run.eval_clients": True})
    folder = Path(comm.bcast(tempfile.mkdtemp(prefix="hpcfl-shared-") if comm.rank == 0 else None, root=0))
    try:
        res = hpcfl.run(table, out=folder / "world", comm=comm)
        ref = hpcfl.run(table, out=folder / f"one{comm.rank}", comm=MPI.COMM_SELF)
        assert seen[0] == (True, False, False, False)
        assert res.final_params.tobytes() == ref.final_params.tobytes()
        assert res.client_eval["accuracy"].tobytes() == ref.client_eval["accuracy"].tobytes()
    finally:
        comm.Barrier()
        if comm.rank == 0:
            shutil.rmtree(folder, ignore_errors=True)
