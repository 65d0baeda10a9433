"""The round protocol across ranks: every hook's results and the captured state equal 1 rank's."""

import sys
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from protocol_probe import Probe  # noqa: E402
from runner import job  # noqa: E402

from hpcfl import config  # noqa: E402
from hpcfl.engine import resume, simulation  # noqa: E402


def probe_run(table, comm):
    s = simulation.prepare(config.from_dict(table), comm)
    probe = Probe(int((s.owner == comm.rank).sum()))
    s.algo.add(probe)
    rows = []
    x = simulation.run(s, on_round=lambda m, c: rows.append(({k: v for k, v in m.items()
                                                              if not k.startswith("time_")}, c)))
    return s, probe, x, rows


@pytest.mark.mpi(min_size=2)
def test_probe_records_and_state_match_one_rank():
    comm = MPI.COMM_WORLD
    table = job(**{"algorithm.name": "scaffold", "algorithm.clients_per_round": 5, "run.rounds": 3})
    ref = None
    if comm.rank == 0:
        s1, p1, x1, rows1 = probe_run(table, MPI.COMM_SELF)
        ref = (resume.capture(s1, x1), rows1, p1)
    comm.Barrier()
    s, probe, x, rows = probe_run(table, comm)
    arrays = resume.capture(s, x)
    assert probe.decision == 102                      # every rank received rank 0's decision
    assert probe.server_total.tolist() == [15.0]      # broadcast server state on every rank
    if comm.rank != 0:
        return
    ref_arrays, ref_rows, ref_probe = ref
    assert set(arrays) == set(ref_arrays)
    for k in arrays:
        assert arrays[k].tobytes() == ref_arrays[k].tobytes(), k
    for (m, c), (rm, rc) in zip(rows, ref_rows):
        assert m.keys() == rm.keys()
        for k in m:   # bitwise, NaN included
            assert np.float64(m[k]).tobytes() == np.float64(rm[k]).tobytes(), k
        for k in rc:
            assert c[k].tobytes() == rc[k].tobytes(), k
    assert probe.seen["setup_counts"].tolist() == ref_probe.seen["setup_counts"].tolist()
