"""Clients side by side on CPU threads (hpcfl.client.lanes): the one-by-one loop's bits and order.

The reference is the sequential Trainer on one torch thread: a lane computes each client on
one thread, so every result must be bitwise that, handed back in cohort order, whatever the
number of lanes and the start order.
"""

import numpy as np
import pytest
import torch
from mpi4py import MPI
from runner import SMALL, job, run_memory

from hpcfl import config, rng
from hpcfl.algorithms.local import LocalSolver, SolverSpec
from hpcfl.client import lanes as lanes_mod
from hpcfl.client.lanes import Lanes, lane_count
from hpcfl.client.trainer import Trainer
from hpcfl.errors import ConfigError
from hpcfl.models.cnn import LeNet5
from hpcfl.params import FlatModel

CPU = torch.device("cpu")
SPEC = SolverSpec(lr=0.05, momentum=0.5, weight_decay=1e-3)


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def setup(n=400):
    torch.manual_seed(0)
    model = FlatModel(LeNet5((1, 16, 16), 4), CPU, torch.float32)
    x = torch.randn(n, 1, 16, 16)
    y = torch.randint(0, 4, (n,))
    return Trainer(model, x, y, 8), model.flat.detach().clone()


def tasks(n_clients=9, seed=1, slots=None):
    """(position, slot, indices, steps, generator): unequal sizes and steps."""
    g = np.random.default_rng(seed)
    sizes, steps = g.integers(5, 40, n_clients), g.integers(1, 9, n_clients)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    slots = list(range(n_clients)) if slots is None else slots
    return [(j, slots[j], torch.arange(s, s + k), int(t), rng.torch_generator(CPU, 0, rng.CLIENT_TRAIN, 0, j))
            for j, (s, k, t) in enumerate(zip(starts, sizes, steps))]


def corrections(num_params):
    table = {s: torch.full((num_params,), 1e-3 * (s - 4)) for s in range(12)}
    return table, (lambda slot: table[slot].clone())


def sequential(trainer, x0, todo, correction):
    torch.set_num_threads(1)   # what a lane runs at
    try:
        return [(j, trainer.train(x0, idx, k, LocalSolver(SPEC), gen, correction(slot), SPEC.lr))
                for j, slot, idx, k, gen in todo]
    finally:
        torch.set_num_threads(2)


def same(a, b):
    assert [j for j, _ in a] == [j for j, _ in b]
    for (_, r), (_, s) in zip(a, b):
        assert r.delta.numpy().tobytes() == s.delta.numpy().tobytes()
        assert (r.loss, r.steps, r.anorm, r.samples) == (s.loss, s.steps, s.anorm, s.samples)


@pytest.mark.parametrize("count", [2, 3])
@pytest.mark.parametrize("hold", [lanes_mod.HOLD_BYTES, 0])   # longest first / cohort order
def test_lanes_give_the_one_by_one_bits_in_cohort_order(count, hold, monkeypatch, two_threads):
    monkeypatch.setattr(lanes_mod, "HOLD_BYTES", hold)
    trainer, x0 = setup()
    _, correction = corrections(trainer.model.num_params)
    ref = sequential(trainer, x0, tasks(), correction)
    got = list(Lanes(trainer, SPEC, count).train(x0, tasks(), correction, SPEC.lr))
    same(got, ref)
    assert torch.get_num_threads() == 2   # the rank's threads are back for evaluation
    assert len({r.delta.abs().sum().item() for _, r in got}) == len(got)   # nine different clients


def test_cohort_order_keeps_at_most_twice_the_lanes_in_flight(monkeypatch, two_threads):
    monkeypatch.setattr(lanes_mod, "HOLD_BYTES", 0)
    trainer, x0 = setup()
    lanes = Lanes(trainer, SPEC, 2)
    started = []   # a client's correction is read when it is handed to the pool
    handed = 0
    for _ in lanes.train(x0, tasks(12), lambda slot: started.append(slot), SPEC.lr):
        assert len(started) - handed <= 4
        handed += 1
    assert handed == 12 and started == list(range(12))


def test_longest_clients_start_first_when_the_results_fit(two_threads, monkeypatch):
    trainer, x0 = setup()
    lanes = Lanes(trainer, SPEC, 2)
    order = []
    run = lanes._run
    monkeypatch.setattr(lanes, "_run", lambda x0_, idx, steps, *a: order.append(steps) or run(x0_, idx, steps, *a))
    todo = tasks()
    list(lanes.train(x0, todo, lambda s: None, SPEC.lr))
    assert order == sorted((t[3] for t in todo), reverse=True)


def test_a_repeated_slot_reads_its_correction_after_the_earlier_result_is_handed_back(two_threads):
    """A client drawn twice: its second draw must see what handling the first did to its state,
    as in the one-by-one loop, so it starts only after the first came back."""
    trainer, x0 = setup()
    slots, P = [0, 1, 2, 1, 3, 1], trainer.model.num_params

    def run(stream):
        table, correction = corrections(P)
        out = []
        for j, res in stream(correction):
            table[slots[j]] += res.delta[:P] * 0.5   # packing changes the client's state
            out.append((j, res))
        return out

    def one_by_one(correction):
        for j, slot, idx, k, gen in tasks(6, slots=slots):
            torch.set_num_threads(1)
            res = trainer.train(x0, idx, k, LocalSolver(SPEC), gen, correction(slot), SPEC.lr)
            torch.set_num_threads(2)
            yield j, res

    ref = run(one_by_one)
    same(run(lambda c: Lanes(trainer, SPEC, 3).train(x0, tasks(6, slots=slots), c, SPEC.lr)), ref)


def test_an_error_in_a_client_stops_the_round_and_gives_the_threads_back(two_threads, monkeypatch):
    trainer, x0 = setup()
    todo = tasks(8)
    todo[2] = (2, 2, torch.tensor([10 ** 6]), 3, todo[2][4])   # a sample index past the data
    lanes = Lanes(trainer, SPEC, 2)
    with pytest.raises(IndexError):
        for _ in lanes.train(x0, todo, lambda s: None, SPEC.lr):
            pass
    assert torch.get_num_threads() == 2
    assert lanes._free.qsize() == 2   # both lanes returned for the next round


def test_lane_count_rules():
    cfg = config.from_dict(job(**{"runtime.threads": 2}))
    trainer, _ = setup()
    m = trainer.model   # LeNet-5: convolutions
    assert lane_count(cfg, m, False, 2, False) == (2, "2 threads")
    small = FlatModel(torch.nn.Sequential(torch.nn.Linear(300, 300), torch.nn.ReLU(), torch.nn.Linear(300, 10)),
                      CPU, torch.float32)   # 93,310 parameters, dense
    n, why = lane_count(cfg, small, False, 2, False)
    assert n == 1 and "mostly Python" in why
    dense = FlatModel(torch.nn.Sequential(torch.nn.Linear(320, 300), torch.nn.ReLU(), torch.nn.Linear(300, 10)),
                      CPU, torch.float32)   # 99,310 parameters: just under MIN_PARAMS
    assert lane_count(cfg, dense, False, 2, False)[0] == 1
    wide = FlatModel(torch.nn.Linear(1000, 100), CPU, torch.float32)   # 100,100 parameters
    assert lane_count(cfg, wide, False, 2, False) == (2, "2 threads")
    rnn = FlatModel(torch.nn.LSTM(4, 8), CPU, torch.float32)
    assert lane_count(cfg, rnn, False, 2, False)[0] == 2
    assert lane_count(cfg, m, False, 1, False)[0] == 1
    n, why = lane_count(cfg, m, True, 2, False)
    assert n == 1 and "runtime.lanes" in why   # your own model: lanes only when asked
    assert lane_count(cfg, m, False, 2, True)[0] == 1
    asked = config.from_dict(job(**{"runtime.lanes": 3}))
    assert lane_count(asked, m, True, 1, False) == (3, "runtime.lanes")
    drop = FlatModel(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.1)), CPU, torch.float32)
    assert lane_count(cfg, drop, False, 2, False)[0] == 1
    with pytest.raises(ConfigError, match="dropout.*runtime.lanes = 1"):
        lane_count(asked, drop, False, 2, False)
    with pytest.raises(ConfigError, match="batched groups"):
        lane_count(asked, m, False, 2, True)
    big = FlatModel(torch.nn.Linear(1000, 1000), CPU, torch.float32)   # 1,001,000 parameters
    n, why = lane_count(cfg, big, False, 2, False)
    assert n == 1 and "1M parameters" in why
    assert lane_count(asked, big, False, 2, False) == (3, "runtime.lanes")


@pytest.mark.parametrize("algo", [{}, {"algorithm.name": "scaffold", "algorithm.clients_per_round": 6}])
def test_a_run_with_lanes_is_bitwise_the_run_on_one_thread(algo):
    """The whole engine: threads = 2 (two lanes) against threads = 1 (one client at a time)."""
    one = run_memory(job(**{"runtime.threads": 1, **algo}), MPI.COMM_SELF)
    two = run_memory(job(**{"runtime.threads": 2, "runtime.lanes": 2, **algo}), MPI.COMM_SELF)   # a small MLP: asked
    assert SMALL["model"]["name"] == "mlp"
    assert one[0].tobytes() == two[0].tobytes()
    assert repr([sorted(m.items()) for m in one[1]]) == repr([sorted(m.items()) for m in two[1]])   # NaNs too
    auto = run_memory(job(**{"runtime.threads": 2, "runtime.lanes": 1, "runtime.step": "autograd", **algo}),
                      MPI.COMM_SELF)
    # autograd with both threads in each operation: the same run within float rounding
    assert np.allclose(auto[0], one[0], rtol=1e-4, atol=1e-6) and np.abs(one[0]).max() > 0.1
