"""A round's records: metrics and per-client rows for the results file (rank 0)."""

from __future__ import annotations

import numpy as np

from ..algorithms.nova_diag import nova_diagnostics
from ..system.model import NO_STEPS

REJECTED = 5  # /clients/dropped code of an update refused by the guard (system codes are 0-4)


def round_records(algo, ctx, sums, gathered, diag):
    """Round metrics (without test and timing fields) and per-client rows, on rank 0.

    ``gathered``: each rank's records (cohort position, loss, ||a||_1, code, ||a||_2^2, a_{-1}).
    The ``nova_*`` metrics are FedNova's diagnostics of the local work of the clients that
    reported (:mod:`hpcfl.algorithms.nova_diag`), for every algorithm.
    """
    _, sc = algo.segments(sums)
    cohort, weights, plan, k = ctx.cohort, ctx.weights, ctx.plan, len(ctx.cohort)
    done = {rec[0]: rec[1:] for part in gathered for rec in part}   # by cohort position
    ok = {j for j, (_, _, code, _, _) in done.items() if code == 0}
    rep = sorted(ok)
    total_w = sc["weight"]
    dropped = np.array(plan.reason if plan is not None else np.zeros(k), dtype=np.int8)
    dropped[(np.asarray(ctx.steps) == 0) & (dropped == 0)] = NO_STEPS   # e.g. FedGSNR's n_opt = 0
    dropped[[j for j in range(k) if j in done and done[j][2]]] = REJECTED
    clients = {
        "round": np.full(k, ctx.rnd + 1), "client": cohort, "steps": ctx.steps,
        "weight": np.array([weights[j] / total_w if j in ok else 0.0 for j in range(k)]),
        "train_loss": np.array([done.get(j, (np.nan,))[0] for j in range(k)]),
        "anorm": np.array([done[j][1] if j in ok else 0.0 for j in range(k)]),
        "anorm2": np.array([done[j][3] if j in ok else 0.0 for j in range(k)]),
        "alast": np.array([done[j][4] if j in ok else 0.0 for j in range(k)]),
        "sim_time": plan.total_s if plan is not None else np.zeros(k),
        "dropped": dropped,
    }
    metrics = {
        "round": ctx.rnd + 1, "train_loss": sc["weight_loss"] / total_w if total_w else float("nan"),
        "clients_participating": len(ok), "lr": ctx.lr, "tau_eff": diag.get("tau_eff", float("nan")),
        "sim_time_round": plan.duration_s if plan is not None else 0.0,
    }
    a1, a2, last = ([done[j][i] for j in rep] for i in (1, 3, 4))   # ||a||_1, ||a||_2^2, a_{-1}
    nova = nova_diagnostics(np.asarray(weights, dtype=np.float64)[rep], np.asarray(ctx.steps)[rep], a1, a2, last)
    metrics.update(nova.metrics())
    extra_clients, extra_rounds = algo.records(ctx)
    clients.update(extra_clients)
    metrics.update(extra_rounds)
    return metrics, clients
