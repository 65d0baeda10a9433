"""Held-out figures of three algorithms against their baselines, on seeds the tests do not use.

    python bench/fidelity_figures.py                    # all three, seeds 10 11 12: about 10 min on 2 idle cores
    python bench/fidelity_figures.py gift --seeds 3 4 5
    python bench/fidelity_figures.py lga disco

Each figure is the setting of a test, re-run on other seeds (the tests use seeds 0-2 or 0-4), so that
a default tuned to the tests' seeds would show here:

- ``gift`` (tests/e2e/test_gift_behaviour.py): digits, 20 clients of 2 classes, MLP 64-32-10, SGD lr
  0.05, batch 32, tau0 = 50, 100 rounds, clock 0.05 s per iteration and 5 Mbit/s up. Target: fixed
  tau's final accuracy (mean of its last 10 evaluations); time to target: simulated seconds at the end
  of the first 5 evaluations whose mean reaches it. Printed: GIFT's first division of tau, both
  times and their ratio (below 1: GIFT reaches fixed tau's accuracy sooner).
- ``lga`` (tests/e2e/test_fedlga_e2e.py, D3 and D2): FedLGA (default reading C_pseudo, and the mixed
  reading A_table1) minus FedAvg under the same stragglers (rho 0.5, tau_max 4), in points of test
  accuracy: on the synthetic D3 setting the mean over rounds 6-10 (where the effect shows), and on the
  digits D2 setting (20 clients of 2 classes, MLP 64-32-10, lr 0.05, 100 rounds) the final accuracy.
- ``disco`` (tests/e2e/test_feddisco_e2e.py): FedDisco (KL to uniform, a 0.5, b 0.1) minus FedAvg (size
  weights) on NIID-2 digits, mean test accuracy of the last 5 of 30 rounds, in points: full
  participation (5 biased clients and 1 unbiased, all every round) and partial (25 biased and 5
  unbiased, 10 a round).

Runs go to ``--workers`` processes (default 2: the machine's cores), each an in-memory run on
MPI.COMM_SELF with one torch thread.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time

import numpy as np
from workers import run_in_workers   # bench/ is sys.path[0] when a script here runs

KEEP = ("round", "test_accuracy", "sim_time", "tau_used", "tau_next")
RUNTIME = {"threads": 1, "progress": "none"}


# ---------------------------------------------------------------------------------------- jobs
def gift_job(seed: int, mode: str) -> dict:
    return {
        "run": {"name": "gift_fig", "seed": seed, "rounds": 100, "eval_every": 1},
        "data": {"dataset": "digits", "num_clients": 20, "partition": "label_k", "label_k": {"classes_per_client": 2}},
        "model": {"name": "mlp", "mlp": {"hidden": [32]}},
        "algorithm": {"name": "gift", "lr": 0.05, "batch_size": 32, "local_steps": 50, "clients_per_round": 0,
                      "gift": {"mode": mode}},
        "system": {"enabled": True, "compute_s": 0.05, "uplink_mbps": 5.0, "downlink_mbps": float("inf")},
        "runtime": {**RUNTIME, "vectorize": "on"},
    }


LGA = {"FedAvg": {"name": "fedavg"}, "FedLGA C": {"name": "fedlga"},
       "FedLGA A": {"name": "fedlga", "lga": {"variant": "A_table1"}}}


def lga_d3_job(seed: int, method: str) -> dict:
    return {
        "run": {"name": "lga_d3", "seed": seed, "rounds": 10, "eval_every": 1},
        "data": {"dataset": "lga_synthetic", "partition": "shards", "shards": {"shards_per_client": 2},
                 "num_clients": 20},
        "model": {"name": "mlp", "mlp": {"hidden": [64], "init": "he_lecun"}},
        "algorithm": {"clients_per_round": 10, "weights": "uniform", "lr": 0.01, "batch_size": 10, "local_epochs": 5,
                      "steps": "straggler", "straggler": {"rho": 0.5, "tau_max": 4}, **LGA[method]},
        "runtime": RUNTIME,
    }


def lga_d2_job(seed: int, method: str) -> dict:
    return {
        "run": {"name": "lga_d2", "seed": seed, "rounds": 100, "eval_every": 10},
        "data": {"dataset": "digits", "partition": "label_k", "num_clients": 20,
                 "label_k": {"classes_per_client": 2, "assignment": "random"}},
        "model": {"name": "mlp", "mlp": {"hidden": [32]}},
        "algorithm": {"weights": "uniform", "clients_per_round": 10, "lr": 0.05, "batch_size": 10, "local_epochs": 5,
                      "steps": "straggler", "straggler": {"rho": 0.5, "tau_max": 4}, **LGA[method]},
        "runtime": RUNTIME,
    }


DISCO = {"full": {"num_clients": 6, "biased_unbiased": {"num_unbiased": 1, "shard": 20}, "per_round": 0},
         "partial": {"num_clients": 30, "biased_unbiased": {"num_unbiased": 5}, "per_round": 10}}


def disco_job(seed: int, setting: str, weights: str) -> dict:
    s = DISCO[setting]
    return {
        "run": {"name": "disco_fig", "seed": seed, "rounds": 30, "eval_every": 1},
        "data": {"dataset": "digits", "digits": {"test_per_class": 50, "normalize": False},
                 "partition": "biased_unbiased", "num_clients": s["num_clients"],
                 "biased_unbiased": s["biased_unbiased"]},
        "model": {"name": "mlp", "mlp": {"hidden": [32], "init": "he_normal"}},
        "algorithm": {"name": "fedavg", "lr": 0.1, "batch_size": 16, "local_epochs": 2, "weights": weights,
                      "clients_per_round": s["per_round"]},
        "runtime": RUNTIME,
    }


# ---------------------------------------------------------------------------------------- runs
def worker() -> None:
    """``--worker``: job tables in as JSON on stdin, one JSON line of per-round records per run out."""
    from mpi4py import MPI

    from hpcfl import config
    from hpcfl.engine import simulation

    for t in json.loads(sys.stdin.read()):
        rows = []
        setup = simulation.prepare(config.from_dict(t), MPI.COMM_SELF)
        simulation.run(setup, on_round=lambda m, _c: rows.append([float(m.get(k, np.nan)) for k in KEEP]))
        print(json.dumps(rows), flush=True)


def run_all(tables: list[dict], workers: int) -> list[dict]:
    """Run ``tables`` in ``workers`` subprocesses of this script; per table {record: (R,) array}."""
    out = []
    for rows in run_in_workers(__file__, tables, [list(range(w, len(tables), workers)) for w in range(workers)]):
        cols = np.array(rows, dtype=np.float64).reshape(-1, len(KEEP))
        out.append({k: cols[:, j] for j, k in enumerate(KEEP)})
    return out


def mean_std(values) -> str:
    v = np.asarray(values, dtype=np.float64)
    return f"{v.mean():+.2f} (sd {v.std(ddof=1):.2f})" if v.size > 1 else f"{v.mean():+.2f}"


# ---------------------------------------------------------------------------------------- figures
def time_to(r: dict, target: float, window: int = 5) -> float:
    hit = np.flatnonzero(np.convolve(r["test_accuracy"], np.ones(window) / window, "valid") >= target)
    return float(r["sim_time"][hit[0] + window - 1]) if hit.size else float("inf")


def gift(seeds: list[int], workers: int) -> None:
    res = run_all([gift_job(s, m) for s in seeds for m in ("stagnation", "fixed")], workers)
    print("\nGIFT (defaults) vs fixed tau = 50: simulated seconds to fixed tau's final accuracy")
    print(f"{'seed':>4} {'target':>7} {'1st division':>12} {'T fixed s':>9} {'T GIFT s':>8} {'ratio':>6} "
          f"{'total fixed s':>13} {'total GIFT s':>12}")
    ratios = []
    for i, s in enumerate(seeds):
        g, f = res[2 * i], res[2 * i + 1]
        target = float(np.mean(f["test_accuracy"][-10:]))
        fell = np.flatnonzero(g["tau_next"] < g["tau_used"])
        tf, tg = time_to(f, target), time_to(g, target)
        ratios.append(tg / tf)
        print(f"{s:>4} {target:>7.4f} {int(g['round'][fell[0]]) if fell.size else '-':>12} {tf:>9.1f} {tg:>8.1f} "
              f"{tg / tf:>6.2f} {f['sim_time'][-1]:>13.1f} {g['sim_time'][-1]:>12.1f}")
    print(f"mean ratio {np.mean(ratios):.2f} over seeds {seeds} (below 1: GIFT is sooner)")


def lga(seeds: list[int], workers: int) -> None:
    methods = list(LGA)
    tables = [lga_d3_job(s, m) for s in seeds for m in methods] + [lga_d2_job(s, m) for s in seeds for m in methods]
    res = run_all(tables, workers)
    n = len(seeds) * len(methods)
    d3 = {(s, m): res[i * len(methods) + j] for i, s in enumerate(seeds) for j, m in enumerate(methods)}
    d2 = {(s, m): res[n + i * len(methods) + j] for i, s in enumerate(seeds) for j, m in enumerate(methods)}
    for title, runs, score in (
            ("D3 synthetic, mean accuracy of rounds 6-10", d3, lambda r: np.mean(r["test_accuracy"][5:10])),
            ("D2 digits, final accuracy (round 100)", d2, lambda r: r["test_accuracy"][-1])):
        print(f"\nFedLGA minus FedAvg, same stragglers; {title} (points)")
        print(f"{'seed':>4} {'FedAvg':>7} " + " ".join(f"{m:>9}" for m in methods[1:]) + "   differences")
        diffs = {m: [] for m in methods[1:]}
        for s in seeds:
            base = score(runs[s, "FedAvg"])
            for m in methods[1:]:
                diffs[m].append(100 * (score(runs[s, m]) - base))
            print(f"{s:>4} {base:>7.4f} " + " ".join(f"{score(runs[s, m]):>9.4f}" for m in methods[1:]) + "   " +
                  "  ".join(f"{m}: {diffs[m][-1]:+.2f}" for m in methods[1:]))
        print("mean " + "  ".join(f"{m}: {mean_std(diffs[m])}" for m in methods[1:]))


def disco(seeds: list[int], workers: int) -> None:
    tables = [disco_job(s, setting, w) for setting in DISCO for s in seeds for w in ("size", "disco")]
    res = run_all(tables, workers)
    for k, setting in enumerate(DISCO):
        print(f"\nFedDisco minus FedAvg, NIID-2 digits, {setting} participation: "
              "mean accuracy of rounds 26-30 (points)")
        gains = []
        for i, s in enumerate(seeds):
            avg, dsc = res[k * 2 * len(seeds) + 2 * i], res[k * 2 * len(seeds) + 2 * i + 1]
            a, d = np.mean(avg["test_accuracy"][-5:]), np.mean(dsc["test_accuracy"][-5:])
            gains.append(100 * (d - a))
            print(f"  seed {s}: FedAvg {a:.4f}, FedDisco {d:.4f}, {gains[-1]:+.2f}")
        print(f"  mean {mean_std(gains)}, won {sum(g > 0 for g in gains)} of {len(gains)}")


FIGURES = {"gift": gift, "lga": lga, "disco": disco}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("figures", nargs="*", metavar="FIGURE", help=f"any of {', '.join(FIGURES)} (default: all)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[10, 11, 12], help="held-out seeds (tests use 0-4)")
    ap.add_argument("--workers", type=int, default=2, help="runs at a time (one process each)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker()
        return
    unknown = [f for f in a.figures if f not in FIGURES]
    if unknown:
        ap.error(f"unknown figure {', '.join(unknown)}: choose from {', '.join(FIGURES)}")
    print("command: " + " ".join(shlex.quote(x) for x in ["python", "bench/fidelity_figures.py", *sys.argv[1:]]))
    t0 = time.perf_counter()
    for name in a.figures or list(FIGURES):
        FIGURES[name](a.seeds, a.workers)
    print(f"\n{time.perf_counter() - t0:.0f} s wall")


if __name__ == "__main__":
    main()
