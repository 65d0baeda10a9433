"""Fairness of the global model over clients: statistics of each client's accuracy on its own
held-out test rows (``/client_eval``, ``run.eval_clients``).

- ``mean``: the plain mean over clients (each client counts once, whatever its size);
- ``worst10``: the mean of the worst 10 % of clients (the ceil(N / 10) lowest accuracies), as
  q-FFL (Li et al. 2020, Table 1: "worst 10%") and Ditto report it;
- ``std``: the standard deviation over clients (population, ddof = 0; q-FFL's variance is its square);
- ``jain``: Jain's fairness index (sum a_i)^2 / (N sum a_i^2), 1 when every client has the same
  accuracy, 1/N when one client has it all (Jain, Chiu and Hawe 1984).

Clients without held-out rows (NaN) are left out.
"""

from __future__ import annotations

import math

import numpy as np

STATS = ("mean", "worst10", "std", "jain")


def fairness(values) -> dict[str, float]:
    """The four statistics of per-client values (N,); NaN when no client has a value.

    >>> fairness([0.5, 1.0])["jain"]   # (1.5)^2 / (2 * 1.25)
    0.9
    """
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return dict.fromkeys(STATS, float("nan"))
    worst = np.sort(v)[: math.ceil(v.size / 10)]
    squares = float(np.sum(v * v))
    return {"mean": float(np.mean(v)), "worst10": float(np.mean(worst)), "std": float(np.std(v)),
            "jain": float(np.sum(v) ** 2 / (v.size * squares)) if squares > 0 else float("nan")}


def by_round(client_eval: dict, field: str = "accuracy") -> tuple[np.ndarray, list[np.ndarray]]:
    """A run's ``/client_eval`` as (rounds (E,), per round the clients' values (N,) in client order)."""
    rounds = np.asarray(client_eval.get("round", ()), dtype=np.int64)
    values = np.asarray(client_eval.get(field, ()), dtype=np.float64)
    clients = np.asarray(client_eval.get("client", ()), dtype=np.int64)
    out = np.unique(rounds)
    per = []
    for r in out:
        sel = rounds == r
        per.append(values[sel][np.argsort(clients[sel], kind="stable")])
    return out, per


def final(client_eval: dict, field: str = "accuracy") -> tuple[int | None, dict[str, float]]:
    """(last evaluated round, its :func:`fairness`) of a run; (None, NaNs) without ``/client_eval`` rows."""
    rounds, per = by_round(client_eval, field)
    if rounds.size == 0:
        return None, fairness([])
    return int(rounds[-1]), fairness(per[-1])
