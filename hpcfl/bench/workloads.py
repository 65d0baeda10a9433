"""Named benchmark workloads of ``hpcfl bench`` (defined in docs/workloads.md).

Each is an ordinary job table: ``hpcfl bench`` runs it through the engine and runs the
same SGD work (data, clients, cohorts, local steps, batch size, lr) in a bare torch loop.
"""

from __future__ import annotations

import copy

# run.eval_clients off: the bare loop evaluates the test set only, so both sides do the same work
W = {
    "run": {"name": "bench_w", "seed": 0, "rounds": 20, "eval_every": 5, "eval_clients": False},
    "data": {"dataset": "synthetic_images", "partition": "dirichlet", "num_clients": 100,
             "dirichlet": {"alpha": 0.5, "min_samples": 10}},
    "model": {"name": "lenet5"},
    "algorithm": {"name": "fedavg", "clients_per_round": 10, "lr": 0.01, "batch_size": 32, "local_epochs": 1},
    "runtime": {"progress": "none"},
}

# Aggregation-heavy: a 9.75M-parameter model, 16 clients every round, 2 local steps each, so the
# reduction of 16 x 9.75M values is a visible share of the round.
VGG11 = {
    "run": {"name": "bench_vgg11", "seed": 0, "rounds": 4, "eval_every": 0, "eval_clients": False},
    "data": {"dataset": "synthetic_images", "partition": "iid", "num_clients": 16,
             "synthetic_images": {"num_train": 4096, "num_test": 256}},
    "model": {"name": "vgg11", "vgg11": {"dropout": 0.0}},
    "algorithm": {"name": "fedavg", "clients_per_round": 0, "lr": 0.01, "batch_size": 32, "local_steps": 2},
    "runtime": {"progress": "none"},
}

# Scale: 100,000 clients of 10 samples each, 1,000 per round, a small MLP on 20-d Gaussian-mixture data.
SCALE = {
    "run": {"name": "bench_scale", "seed": 0, "rounds": 5, "eval_every": 0, "eval_clients": False},
    "data": {"dataset": "gaussian_mixture", "partition": "iid", "num_clients": 100_000,
             "gaussian_mixture": {"num_train": 1_000_000, "num_test": 10_000}},
    "model": {"name": "mlp", "mlp": {"hidden": [64]}},
    "algorithm": {"name": "fedavg", "clients_per_round": 1000, "lr": 0.05, "batch_size": 10, "local_steps": 5},
    "runtime": {"progress": "none"},
}

WORKLOADS = {
    "W": ("CIFAR-shaped synthetic images, Dirichlet(0.5), 100 clients, LeNet-5, FedAvg 10/round, 1 epoch, "
          "batch 32, 20 rounds", W),
    "vgg11": ("aggregation-heavy: VGG-11 (9.75M parameters), 16 clients all in every round, 2 steps of batch 32",
              VGG11),
    "scale": ("100,000 clients x 10 samples, 1,000 per round, MLP(20-64-10), 5 steps of batch 10", SCALE),
}


def workload(name: str, rounds: int | None = None) -> dict:
    """A copy of the named workload's job table (``rounds`` overrides run.rounds)."""
    if name not in WORKLOADS:
        from ..errors import ConfigError

        raise ConfigError(f"unknown benchmark workload {name!r}; choose one of {', '.join(WORKLOADS)}")
    job = copy.deepcopy(WORKLOADS[name][1])
    if rounds is not None:
        job["run"]["rounds"] = int(rounds)
    return job
