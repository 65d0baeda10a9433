"""Shared test helpers: small jobs and an in-memory run (no files)."""

import json

import numpy as np

from hpcfl import config, simulation

SMALL = {
    "run": {"name": "t", "seed": 3, "rounds": 3, "eval_every": 1},
    "data": {"dataset": "digits", "partition": "dirichlet", "num_clients": 7, "dirichlet": {"alpha": 0.5}},
    "model": {"name": "mlp", "mlp": {"hidden": [16]}},
    "algorithm": {"name": "fedavg", "clients_per_round": 5, "lr": 0.1, "batch_size": 16, "local_steps": 4},
    "runtime": {"threads": 1, "progress": "none"},
}


def job(**overrides):
    """SMALL with dotted-key overrides, e.g. job(**{"algorithm.name": "fedprox"})."""
    d = json.loads(json.dumps(SMALL))
    return config.apply_overrides(d, [f"{k}={json.dumps(v)}" for k, v in overrides.items()])


def run_memory(table, comm):
    """Run a job on ``comm``; returns (final model, metrics rows, client rows) on rank 0."""
    cfg = config.from_dict(table)
    setup = simulation.prepare(cfg, comm)
    metrics, clients = [], []

    def on_round(m, c):
        metrics.append({k: v for k, v in m.items() if not k.startswith("time_")})
        clients.append(c)

    x = simulation.run(setup, on_round=on_round)
    return np.asarray(x), metrics, clients
