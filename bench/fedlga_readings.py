"""FedLGA's three sign readings under the two gradient proxies, on two straggler jobs over three seeds.

    python bench/fedlga_readings.py                      # 12 methods x 2 jobs x 3 seeds, 20 rounds: 2-3 min CPU
    python bench/fedlga_readings.py --rounds 10 --seeds 0 --jobs synthetic

Jobs (device heterogeneity ``steps = "straggler"``: in every round round(0.5 K) = 5 of the K = 10
clients are slow with tau_i ~ U{1..4}, E_i = E - tau_i + 1 of E = 5 epochs; the run seed draws
the same cohorts and slow clients for every method):

- ``synthetic``: bench/fedlga_d3.py's job (lga_synthetic, 20 clients of 2 label shards, MLP
  32-64-10, batch 10, lr 0.01);
- ``digits``: scikit-learn's 8x8 digit images (embedded), 20 clients of 2 label shards, MLP
  64-32-10, batch 10, lr 0.05.

Methods: FedAvg (truncated updates averaged as they are) and FedLGA rank1, lam 1, under each reading
(docs/algorithms/fedlga.md): B_alg1 (the paper as printed, D + G(Dbar - D), with its default guard
alpha_min = 0), C_pseudo (hpcfl's default, D + G(D - Dbar)), A_table1 (D + G(Dbar + D)); each with
G built from ``avg_update`` (g = D / (lr S), parallel to D: a per-client scale alpha_i),
``full_grad`` (the paper's G, Eq. 6: the gradient of the slow client's whole local objective at its
last iterate) or ``last_grad`` (a one-mini-batch estimate of it, plus weight decay, here 0); and
B_alg1 unguarded (alpha_min = -inf) with avg_update, to show what the guard stops, and with
full_grad: the paper's algorithm exactly.

Printed: mean test accuracy over the seeds at round 5 and at the last round (per seed in
brackets), the median and [5th, 95th] percentile of alpha_i (the scale of a slow update along
itself, /clients/lga_alpha), the share of alpha_i > 1 (the slow update extended), and divergences.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time

import numpy as np
from mpi4py import MPI

from hpcfl import config
from hpcfl.engine import simulation

EARLY = 5
METHODS = {"FedAvg": {"name": "fedavg"}}
for _v in ("B_alg1", "C_pseudo", "A_table1"):
    for _p in ("avg_update", "full_grad", "last_grad"):
        METHODS[f"{_v} {_p}"] = {"name": "fedlga", "lga": {"variant": _v, "grad_proxy": _p}}
# the printed reading without its guard (alpha_min = 0 by default for B_alg1)
METHODS["B_alg1 avg_update unguarded"] = {"name": "fedlga", "lga": {"variant": "B_alg1", "alpha_min": float("-inf")}}
# the paper exactly: its G over the whole local objective, its signs, no guard
METHODS["B_alg1 full_grad unguarded"] = {"name": "fedlga", "lga": {"variant": "B_alg1", "grad_proxy": "full_grad",
                                                                   "alpha_min": float("-inf")}}

JOBS = {
    "synthetic": ({"dataset": "lga_synthetic", "partition": "shards", "shards": {"shards_per_client": 2},
                   "num_clients": 20}, {"name": "mlp", "mlp": {"hidden": [64], "init": "he_lecun"}}, 0.01),
    "digits": ({"dataset": "digits", "partition": "shards", "shards": {"shards_per_client": 2},
                "num_clients": 20}, {"name": "mlp", "mlp": {"hidden": [32]}}, 0.05),
}


def job(name: str, method: dict, seed: int, rounds: int) -> dict:
    data, model, lr = JOBS[name]
    alg = {"clients_per_round": 10, "weights": "uniform", "lr": lr, "batch_size": 10, "local_epochs": 5,
           "steps": "straggler", "server_lr": 1.0,
           "straggler": {"rho": 0.5, "tau_max": 4, "tau_min": 1, "unit": "epoch", "assignment": "per_round"},
           **method}
    return {"run": {"name": "fedlga_readings", "seed": seed, "rounds": rounds, "eval_every": 1},
            "data": data, "model": model, "algorithm": alg, "runtime": {"threads": 1, "progress": "none"}}


def run(table: dict) -> tuple[np.ndarray, int | None, np.ndarray]:
    """(test accuracy per round, NaN after a divergence; the diverged round or None; every finite alpha_i)."""
    acc, alphas = np.full(table["run"]["rounds"], np.nan), []

    def on_round(m, clients):
        acc[int(m["round"]) - 1] = m["test_accuracy"]
        a = np.asarray(clients.get("lga_alpha", []), dtype=np.float64)
        alphas.append(a[np.isfinite(a)])

    try:
        simulation.run(simulation.prepare(config.from_dict(table), MPI.COMM_SELF), on_round=on_round)
        diverged = None
    except simulation.Diverged as exc:
        diverged = exc.round
    return acc, diverged, np.concatenate(alphas) if alphas else np.zeros(0)


def fmt(values: np.ndarray) -> str:
    mean = "nan" if not np.isfinite(values).all() else f"{values.mean():.3f}"
    return f"{mean} ({' '.join('nan' if not np.isfinite(x) else f'{x:.3f}' for x in values)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--jobs", nargs="+", default=list(JOBS), choices=list(JOBS))
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS), metavar="METHOD",
                    help="rows to run (quoted labels of the table); default: all")
    a = ap.parse_args()
    if a.rounds < EARLY:
        ap.error(f"--rounds must be at least {EARLY}")
    print(f"command: python bench/fedlga_readings.py {' '.join(shlex.quote(x) for x in sys.argv[1:])}".rstrip())
    t0 = time.perf_counter()
    for name in a.jobs:
        print(f"\njob {name}: {a.rounds} rounds, seeds {a.seeds}\n")
        print(f"| method | acc@{EARLY} mean (per seed) | acc@{a.rounds} mean (per seed) | alpha median [p5, p95] | "
              f"alpha > 1 | diverged |")
        print("|---|---|---|---|---|---|")
        for label, method in ((k, METHODS[k]) for k in a.methods):
            accs, divs, alphas = [], [], []
            for seed in a.seeds:
                acc, div, alpha = run(job(name, method, seed, a.rounds))
                accs.append(acc)
                divs.append(div)
                alphas.append(alpha)
            acc, alpha = np.array(accs), np.concatenate(alphas)
            al = (f"{np.median(alpha):.3g} [{np.percentile(alpha, 5):.3g}, {np.percentile(alpha, 95):.3g}]"
                  if alpha.size else "-")
            up = f"{np.mean(alpha > 1):.0%}" if alpha.size else "-"
            dv = ", ".join(f"seed {s}: round {d}" for s, d in zip(a.seeds, divs) if d is not None) or "no"
            print(f"| {label} | {fmt(acc[:, EARLY - 1])} | {fmt(acc[:, -1])} | {al} | {up} | {dv} |", flush=True)
    print(f"\ntotal wall time {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
