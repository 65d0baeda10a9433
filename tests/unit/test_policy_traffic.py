"""What crosses ranks for FedDisco and FedGSNR, counted by instrumenting the collectives."""

from mpi4py import MPI
from runner import job, run_memory

from hpcfl.parallel import comm
from hpcfl.engine import simulation


def calls_of(table, monkeypatch):
    made = []

    class Counting(comm.Collectives):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.calls = made

    monkeypatch.setattr(simulation, "Collectives", Counting)
    run_memory(table, MPI.COMM_SELF)
    return made


def test_feddisco_exchanges_once_at_setup_and_never_per_round(monkeypatch):
    assert calls_of(job(**{"algorithm.name": "feddisco"}), monkeypatch) == ["disco_discrepancy"]
    global_target = job(**{"algorithm.name": "feddisco", "algorithm.disco.target": "global"})
    assert calls_of(global_target, monkeypatch) == ["disco_label_histogram", "disco_discrepancy"]


def test_fedgsnr_makes_one_reduction_and_one_gather_per_round(monkeypatch):
    made = calls_of(job(**{"algorithm.name": "fedgsnr", "algorithm.local_steps": 4, "run.rounds": 3}), monkeypatch)
    assert made == ["gsnr_moments", "gsnr_scalars"] * 3


def test_plain_fedavg_asks_for_no_policy_collective(monkeypatch):
    assert calls_of(job(), monkeypatch) == []
