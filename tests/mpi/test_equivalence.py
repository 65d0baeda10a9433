"""Bitwise equivalence of runs on 1 rank and on the world's ranks (run at 2 and 3 ranks).

Rank 0 first runs the job alone on COMM_SELF (the reference); then all ranks run it
together. The final model, every metric (timings aside) and every per-client record
must be bitwise identical, for every algorithm and for other client placements.
"""

import math

import numpy as np
import pytest
from mpi4py import MPI
from runner import job, run_memory

CASES = {
    "fedavg": {},
    "fedavg_uniform_full": {"algorithm.weights": "uniform", "algorithm.clients_per_round": 0},
    "fedprox_momentum": {"algorithm.name": "fedprox", "algorithm.mu": 0.1, "algorithm.momentum": 0.9},
    "scaffold": {"algorithm.name": "scaffold", "algorithm.clients_per_round": 4, "run.rounds": 4},
    "server_momentum_epochs": {"algorithm.server_momentum": 0.5, "algorithm.server_lr": 0.8,
                               "algorithm.local_steps": 0, "algorithm.local_epochs": 1},
    "float64_eval_every_2": {"runtime.dtype": "float64", "run.eval_every": 2},
    "round_robin_placement": {"runtime.placement": "round_robin", "algorithm.name": "scaffold"},
    "fednova_random_epochs": {"algorithm.name": "fednova", "algorithm.local_steps": 0,
                              "algorithm.steps": "random_epochs", "algorithm.random_epochs.low": 1,
                              "algorithm.random_epochs.high": 3, "run.eval_train": True},
    "fednova_prox_server_momentum": {"algorithm.name": "fednova", "algorithm.local": "prox", "algorithm.mu": 0.05,
                                     "algorithm.server_momentum": 0.9, "algorithm.lr_schedule": "step"},
    "fednova_vr_momentum": {"algorithm.name": "fednova", "algorithm.local": "vr", "algorithm.momentum": 0.5,
                            "algorithm.clients_per_round": 0},
    # vectorised client blocks: a client's row never depends on its group, so rank counts do not matter
    "vectorize_mlp_scaffold_epochs": {"runtime.vectorize": "on", "algorithm.name": "scaffold",
                                      "algorithm.local_steps": 0, "algorithm.steps": "random_epochs",
                                      "algorithm.random_epochs.low": 1, "algorithm.random_epochs.high": 3},
    "vectorize_linear_vr_momentum": {"runtime.vectorize": "on", "model.mlp.hidden": [], "algorithm.name": "fednova",
                                     "algorithm.local": "vr", "algorithm.momentum": 0.5,
                                     "algorithm.clients_per_round": 0},
    "vectorize_fedprox_with_replacement": {"runtime.vectorize": "on", "algorithm.name": "fedprox",
                                           "algorithm.mu": 0.1, "algorithm.sampling": "with_replacement"},
    # clients side by side on CPU threads (runtime.threads = 2: two lanes per rank), LeNet-5 and an MLP
    # through the graph-free step: each client on one thread, so rank counts do not matter
    "lanes_mlp_scaffold": {"runtime.threads": 2, "runtime.lanes": 2, "algorithm.name": "scaffold",
                           "algorithm.clients_per_round": 6},
    "lanes_lenet_fedprox": {"runtime.threads": 2, "data.dataset": "synthetic_images", "data.cache": "off",
                            "data.synthetic_images.num_train": 384, "data.synthetic_images.num_test": 64,
                            "data.synthetic_images.image_shape": [1, 16, 16], "model.name": "lenet5",
                            "algorithm.name": "fedprox", "algorithm.mu": 0.1},
    # logreg under vectorize = 'auto': the compiled group kernel (hpcfl.client.fused: C, else numba)
    "logreg_fused_scaffold_momentum_epochs": {"model.name": "logreg", "algorithm.name": "scaffold",
                                              "algorithm.momentum": 0.5, "algorithm.local_steps": 0,
                                              "algorithm.steps": "random_epochs", "algorithm.random_epochs.low": 1,
                                              "algorithm.random_epochs.high": 3, "algorithm.lr": 0.05},
    "with_replacement_merged": {"algorithm.name": "fednova", "algorithm.sampling": "with_replacement_merged"},
    "unbiased": {"algorithm.sampling": "unbiased", "algorithm.local_lr_decay": 0.9},
    "feddisco": {"algorithm.name": "feddisco"},
    "feddisco_global_target_fednova": {"algorithm.name": "fednova", "algorithm.weights": "disco",
                                       "algorithm.disco.target": "global", "algorithm.local_steps": 0,
                                       "algorithm.steps": "random_epochs"},
    "feddisco_scaffold_cosine": {"algorithm.name": "scaffold", "algorithm.weights": "disco",
                                 "algorithm.disco.metric": "cosine", "algorithm.clients_per_round": 4},
    "fedgsnr": {"algorithm.name": "fedgsnr", "algorithm.local_steps": 4},
    "fedgsnr_scaffold_disco": {"algorithm.name": "scaffold", "algorithm.steps": "gsnr", "algorithm.weights": "disco",
                               "algorithm.local_steps": 4},
    "fedgsnr_prox_scale": {"algorithm.name": "fedprox", "algorithm.mu": 0.1, "algorithm.steps": "gsnr",
                           "algorithm.local_steps": 4, "algorithm.gsnr.step_mode": "scale", "algorithm.gsnr.m": 30.0},
    "system_deadline": {"algorithm.name": "fednova", "algorithm.local_steps": 20, "system.enabled": True,
                        "system.compute_dist": "lognormal", "system.compute_s": 0.05, "system.compute_sigma": 1.0,
                        "system.uplink_mbps": 1.0, "system.deadline_s": 0.6, "system.unavailability": 0.2},
    # FedLGA and FedDyn under the straggler steps policy (FedLGA spec C1, C3), 3-4 rounds. Slow clients in
    # every round: round(0.5 * 5) = 3 per round, or 4 of the 7 clients with assignment = 'fixed'; in the
    # epoch cases tau_min = tau_max = 2, so no slow client finishes (and B = 64 keeps epochs short). The
    # held clients of rank1 and of the clipped diag (two reductions) and the fused diag segments all cross
    # ranks; with_replacement leaves a rank with no cohort member in some round.
    "fedlga_rank1": {"algorithm.name": "fedlga", "algorithm.steps": "straggler", "run.rounds": 3,
                     "algorithm.local_steps": 0, "algorithm.local_epochs": 2, "algorithm.batch_size": 64,
                     "algorithm.straggler.tau_max": 2, "algorithm.straggler.tau_min": 2},
    "fedlga_B_alg1_diag_fused": {"algorithm.name": "fedlga", "algorithm.steps": "straggler", "run.rounds": 3,
                                 "algorithm.straggler.unit": "step", "algorithm.local_steps": 6,
                                 "algorithm.straggler.tau_max": 4, "algorithm.straggler.tau_min": 2,
                                 "algorithm.lga.variant": "B_alg1", "algorithm.lga.hessian": "diag"},
    "fedlga_B_alg1_rank1": {"algorithm.name": "fedlga", "algorithm.steps": "straggler", "run.rounds": 3,
                            "algorithm.straggler.unit": "step", "algorithm.local_steps": 6,
                            "algorithm.straggler.tau_max": 4, "algorithm.straggler.tau_min": 2,
                            "algorithm.lga.variant": "B_alg1", "algorithm.lr": 0.02},
    # the paper's G: the last-iterate gradient is computed by the rank that holds the slow client
    "fedlga_B_alg1_last_grad": {"algorithm.name": "fedlga", "algorithm.steps": "straggler", "run.rounds": 3,
                                "algorithm.straggler.unit": "step", "algorithm.local_steps": 6,
                                "algorithm.straggler.tau_max": 4, "algorithm.straggler.tau_min": 2,
                                "algorithm.lga.variant": "B_alg1", "algorithm.lga.grad_proxy": "last_grad"},
    # the paper's G over all of a slow client's samples (more than one chunk), with weight decay in the job
    # (which full_grad leaves out), on the clients' owner ranks
    "fedlga_B_alg1_full_grad": {"algorithm.name": "fedlga", "algorithm.steps": "straggler", "run.rounds": 3,
                                "algorithm.straggler.unit": "step", "algorithm.local_steps": 6,
                                "algorithm.straggler.tau_max": 4, "algorithm.straggler.tau_min": 2,
                                "algorithm.weight_decay": 0.001, "algorithm.lga.variant": "B_alg1",
                                "algorithm.lga.grad_proxy": "full_grad"},
    "fedlga_A_diag_fused_prox": {"algorithm.name": "fedlga", "algorithm.local": "prox", "algorithm.mu": 0.1,
                                 "algorithm.steps": "straggler", "run.rounds": 3, "algorithm.straggler.unit": "step",
                                 "algorithm.local_steps": 6, "algorithm.straggler.tau_max": 4,
                                 "algorithm.lga.hessian": "diag"},
    "fedlga_diag_corr_clip": {"algorithm.name": "fedlga", "algorithm.steps": "straggler", "run.rounds": 3,
                              "algorithm.straggler.unit": "step", "algorithm.local_steps": 6,
                              "algorithm.straggler.tau_max": 4, "algorithm.lga.hessian": "diag",
                              "algorithm.lga.corr_clip_ratio": 0.5},
    "fedlga_fixed_step": {"algorithm.name": "fedlga", "algorithm.steps": "straggler", "run.rounds": 4,
                          "algorithm.straggler.unit": "step", "algorithm.local_steps": 6,
                          "algorithm.straggler.tau_max": 4, "algorithm.straggler.assignment": "fixed"},
    "fedlga_with_replacement": {"algorithm.name": "fedlga", "algorithm.steps": "straggler", "run.rounds": 4,
                                "algorithm.straggler.unit": "step", "algorithm.local_steps": 6,
                                "algorithm.straggler.tau_max": 4, "algorithm.sampling": "with_replacement"},
    "fedlga_round_robin_placement": {"algorithm.name": "fedlga", "algorithm.steps": "straggler", "run.rounds": 3,
                                     "algorithm.local_steps": 0, "algorithm.local_epochs": 2,
                                     "algorithm.batch_size": 64, "algorithm.straggler.tau_max": 2,
                                     "algorithm.straggler.tau_min": 2, "runtime.placement": "round_robin"},
    "feddyn_straggler": {"algorithm.name": "feddyn", "algorithm.steps": "straggler", "run.rounds": 3,
                         "algorithm.local_steps": 0, "algorithm.local_epochs": 2, "algorithm.batch_size": 64,
                         "algorithm.straggler.tau_max": 2, "algorithm.straggler.tau_min": 2},
    "feddyn_disco_straggler": {"algorithm.name": "feddyn", "algorithm.weights": "disco",
                               "algorithm.steps": "straggler", "run.rounds": 3, "algorithm.straggler.unit": "step",
                               "algorithm.local_steps": 6, "algorithm.straggler.tau_max": 4},
}


def same(a, b):
    return all((x == y) or (isinstance(x, float) and math.isnan(x) and math.isnan(y)) for x, y in zip(a, b))


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("case", sorted(CASES))
def test_world_run_is_bitwise_identical_to_one_rank(case):
    comm = MPI.COMM_WORLD
    table = job(**CASES[case])
    if table["model"]["name"] != "mlp":   # SMALL's [model.mlp] table belongs to the mlp only
        table["model"].pop("mlp", None)   # --set model.name already drops it
    ref = run_memory(table, MPI.COMM_SELF) if comm.rank == 0 else None
    comm.Barrier()
    x, metrics, clients = run_memory(table, comm)
    if comm.rank != 0:
        return
    rx, rmetrics, rclients = ref
    assert x.tobytes() == rx.tobytes(), f"{case}: final model differs"
    assert len(metrics) == len(rmetrics)
    for m, r in zip(metrics, rmetrics):
        assert m.keys() == r.keys()
        assert same(list(m.values()), list(r.values())), f"{case}: metrics differ {m} vs {r}"
    for c, r in zip(clients, rclients):
        for k in r:
            assert np.asarray(c[k]).tobytes() == np.asarray(r[k]).tobytes(), f"{case}: clients/{k} differs"


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("case", ["fedavg", "scaffold", "fedgsnr", "fedlga_rank1", "fedlga_B_alg1_diag_fused",
                                  "feddyn_straggler", "fednova_vr_momentum"])
def test_device_sums_on_the_world_equal_host_sums_on_one_rank(case, monkeypatch):
    """The GPU path's round (rows, exact sum and model on the training device; HPCFL_DEVICE_SUMS=1 runs it
    on CPU tensors) over the world's ranks, against the host path on one rank: bitwise."""
    comm = MPI.COMM_WORLD
    table = job(**CASES[case])
    monkeypatch.delenv("HPCFL_DEVICE_SUMS", raising=False)
    ref = run_memory(table, MPI.COMM_SELF) if comm.rank == 0 else None
    comm.Barrier()
    monkeypatch.setenv("HPCFL_DEVICE_SUMS", "1")
    x, metrics, clients = run_memory(table, comm)
    if comm.rank == 0:
        assert x.tobytes() == ref[0].tobytes(), f"{case}: final model differs"
        for m, r in zip(metrics, ref[1]):
            assert same(list(m.values()), list(r.values())), f"{case}: metrics differ"


@pytest.mark.mpi(min_size=2)
def test_placements_agree_with_each_other():
    comm = MPI.COMM_WORLD
    a = run_memory(job(**{"runtime.placement": "block"}), comm)
    b = run_memory(job(**{"runtime.placement": "round_robin"}), comm)
    c = run_memory(job(**{"runtime.placement": "balanced"}), comm)
    if comm.rank == 0:
        assert a[0].tobytes() == b[0].tobytes() == c[0].tobytes()
        assert np.isfinite(a[1][-1]["test_accuracy"])


@pytest.mark.mpi(min_size=2)
def test_balanced_placement_deals_each_round_and_pins_stateful_algorithms(capsys):
    """Dealt training covers every cohort member once, with even shares; SCAFFOLD's rows stay home."""
    from hpcfl import config
    from hpcfl.engine import simulation

    comm = MPI.COMM_WORLD
    s = simulation.prepare(config.from_dict(job(**{"run.rounds": 4})), comm)
    simulation.settle_placement(s)
    assert s.dealt
    trained, train = [], s.trainer.train

    def recording(x0, indices, steps, *args, **kwargs):
        trained.append(int(indices.numel()))    # client sizes: tell the clients apart well enough here
        return train(x0, indices, steps, *args, **kwargs)

    s.trainer.train = recording
    per_round = []
    orig_deal = simulation.deal

    def spy(work, size):
        ranks = orig_deal(work, size)
        per_round.append(np.bincount(ranks, minlength=size))
        return ranks

    simulation.deal = spy
    try:
        simulation.run(s)
    finally:
        simulation.deal = orig_deal
    counts = comm.allgather(len(trained))
    assert sum(counts) == 4 * 5                                     # every member once, 4 rounds of 5
    for shares in per_round:                                        # 4 steps each: equal work per client
        assert shares.sum() == 5 and shares.max() - shares.min() <= 1
    capsys.readouterr()
    vr = {"algorithm.name": "fednova", "algorithm.local": "vr", "algorithm.clients_per_round": 0}
    pinned = simulation.prepare(config.from_dict(job(**vr)), comm)
    simulation.settle_placement(pinned)
    assert not pinned.dealt
    if comm.rank == 0:
        assert "because VarianceReduction (statistics) needs them there" in capsys.readouterr().out


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("name", ["scaffold", "feddyn"])
def test_per_client_state_follows_dealt_clients_bitwise(name, capsys):
    """SCAFFOLD's c_i and FedDyn's gradients travel to the rank that trains the client and back:
    rows do move, and the run (model, records and the final tables) equals the 1-rank run bit for bit."""
    from hpcfl import config
    from hpcfl.engine import resume, simulation

    comm = MPI.COMM_WORLD
    table = job(**{"algorithm.name": name, "run.rounds": 5, "algorithm.clients_per_round": 5})
    cfg = config.from_dict(table)
    ref = None
    if comm.rank == 0:
        one = simulation.prepare(cfg, MPI.COMM_SELF)
        ref = (simulation.run(one), resume.capture(one, one.model.numpy()))
    comm.Barrier()
    s = simulation.prepare(cfg, comm)
    x = simulation.run(s)
    assert s.dealt and s.migration is not None
    arrays = resume.capture(s, x)
    assert s.migration.moved > 0                     # some client trained away from home
    if comm.rank == 0:
        assert "travels with clients dealt to another rank" in capsys.readouterr().out
        assert x.tobytes() == ref[0].tobytes()
        tables = [k for k in ref[1] if k.startswith("clients.")]
        assert tables
        for k in tables:
            assert arrays[k].tobytes() == ref[1][k].tobytes(), k


@pytest.mark.mpi(min_size=2)
def test_every_rank_holds_the_same_final_model():
    comm = MPI.COMM_WORLD
    x, _, _ = run_memory(job(**{"algorithm.name": "scaffold"}), comm)
    models = comm.allgather(x.tobytes())
    assert all(m == models[0] for m in models)


@pytest.mark.mpi(min_size=2)
def test_float_reduce_runs_and_is_close():
    comm = MPI.COMM_WORLD
    table = job(**{"runtime.reduce": "float", "runtime.dtype": "float64"})
    ref = run_memory(job(**{"runtime.dtype": "float64"}), comm)
    x, metrics, _ = run_memory(table, comm)
    if comm.rank == 0:
        assert np.allclose(x, ref[0], rtol=1e-9, atol=1e-12)
