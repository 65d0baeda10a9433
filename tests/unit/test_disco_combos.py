"""FedDisco through the engine: combinations with other policies, by closed form."""

import numpy as np
from mpi4py import MPI
from runner import job, run_memory

from hpcfl import config
from hpcfl.engine import simulation


def test_fednova_with_disco_uses_tau_eff_sum_p_tau():
    table = job(**{"algorithm.name": "fednova", "algorithm.weights": "disco", "algorithm.local_steps": 0,
                   "algorithm.steps": "random_epochs", "algorithm.random_epochs.low": 1,
                   "algorithm.random_epochs.high": 3})
    _, metrics, clients = run_memory(table, MPI.COMM_SELF)
    for m, c in zip(metrics, clients):
        # plain SGD: ||a_i||_1 = tau_i, and the recorded weights are the normalised Disco p
        assert abs(m["tau_eff"] - float(np.sum(c["weight"] * c["steps"]))) < 1e-12
        assert abs(c["weight"].sum() - 1) < 1e-12


def test_scaffold_control_variate_does_not_depend_on_disco_weights():
    # with one round, the server c depends only on the unweighted Delta c_i of the cohort
    def server_c(a, b):
        cfg = config.from_dict(job(**{"algorithm.name": "scaffold", "algorithm.weights": "disco",
                                      "algorithm.disco.a": a, "algorithm.disco.b": b, "run.rounds": 1}))
        s = simulation.prepare(cfg, MPI.COMM_SELF)
        simulation.run(s)
        return s.algo.extras[0].c.cpu().numpy().copy()

    assert server_c(0.5, 0.1).tobytes() == server_c(2.0, 0.0).tobytes()


def test_disco_weights_per_round_over_the_sampled_set():
    _, _, clients = run_memory(job(**{"algorithm.weights": "disco", "algorithm.disco.metric": "l1"}),
                               MPI.COMM_SELF)
    cfg = config.from_dict(job())
    s = simulation.prepare(cfg, MPI.COMM_SELF)
    from hpcfl.algorithms.disco import disco_weights, discrepancy

    d = discrepancy(s.class_counts, np.full(10, 0.1), "l1")
    for c in clients:                         # recomputed from the recorded cohort, by hand
        p, _ = disco_weights(s.sizes[c["client"]], d[c["client"]])
        assert np.allclose(c["weight"], p, rtol=0, atol=1e-15)
        assert np.allclose(c["disco_d"], d[c["client"]] / d[c["client"]].sum(), rtol=0, atol=1e-15)


def test_disco_rejects_sampling_with_replacement_with_a_clear_message():
    import pytest
    from hpcfl.errors import ConfigError

    with pytest.raises(ConfigError, match="sampling = 'with_replacement'.*disco"):
        config.from_dict(job(**{"algorithm.weights": "disco", "algorithm.sampling": "with_replacement"}))
