"""The round protocol through the real engine: every hook, by hand, on one rank."""

import numpy as np
from mpi4py import MPI
from protocol_probe import Probe
from runner import job

from hpcfl import config
from hpcfl.engine import resume, simulation


def probe_run(table, comm=MPI.COMM_SELF, rounds=None):
    cfg = config.from_dict(table)
    s = simulation.prepare(cfg, comm)
    probe = Probe(int((s.owner == comm.rank).sum()))
    s.algo.add(probe)
    rows = []
    x = simulation.run(s, on_round=lambda m, c: rows.append((m, c)))
    return s, probe, x, rows


def test_every_hook_sees_what_it_should():
    table = job(**{"algorithm.clients_per_round": 4, "run.rounds": 3})
    s, probe, _, rows = probe_run(table)
    # setup: the exact sum of owned clients' label counts is the whole training set's
    assert probe.seen["setup_counts"].tolist() == s.class_counts.sum(0).tolist()
    cohorts = [c["client"] for _, c in rows]
    for rnd, (m, c) in enumerate(rows):
        cohort = cohorts[rnd]
        assert m["probe_sizes"] == float(s.sizes[cohort].sum())          # statistics phase: exact sum
        assert c["probe_id"].tolist() == cohort.tolist()                # gather places rows by position
        assert m["probe_count"] == 4.0                                   # segment: one per trained client
        assert m["probe_decision"] == rnd + 100                          # controller -> every rank
    assert probe.server_total.tolist() == [12.0]                         # server state: 3 rounds x 4
    trained = np.zeros(len(s.sizes))
    for c in cohorts:
        trained[c] += 1
    assert probe.rows[:, 0].tolist() == trained.tolist()                 # per-client rows, by slot
    assert s.algo.transfer() == (3, 5)
    assert "probe" in s.algo.layout.slices


def test_segment_sum_of_weights_matches_the_aggregation_weights():
    table = job(**{"algorithm.clients_per_round": 5})
    s, probe, _, rows = probe_run(table)
    cohort = rows[-1][1]["client"]
    assert probe.seen["segment"][1] == float(s.sizes[cohort].sum())     # size weights, summed exactly


def test_state_protocol_capture_and_restore_round_trip():
    table = job(**{"algorithm.name": "scaffold", "algorithm.server_momentum": 0.5})
    s, probe, x, _ = probe_run(table)
    arrays = resume.capture(s, x)
    assert set(arrays) == {"model", "server.server_momentum", "server.scaffold_c", "clients.scaffold_c_i",
                           "server.probe_total", "clients.probe_rows", "server.exact_grid"}
    assert arrays["clients.scaffold_c_i"].shape == (len(s.sizes), s.model.num_params)
    s2, probe2, _, _ = probe_run(job(**{"algorithm.name": "scaffold", "algorithm.server_momentum": 0.5,
                                        "run.rounds": 1}))
    x2 = resume.restore(s2, arrays)
    again = resume.capture(s2, x2)
    for k, v in arrays.items():
        assert again[k].tobytes() == v.tobytes(), k
