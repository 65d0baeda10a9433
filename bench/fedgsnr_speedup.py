"""FedGSNR vs FedAvg at small scale: rounds to a target accuracy (checks B5 and B6, docs/workloads.md).

GMM-10 (20 features, 10 classes, 6 modes per class, drawn from seed 0), MLP 20-64-10,
batch / statistics batch 64, E_const = 10 local steps, lr 0.05, 100 rounds, evaluated
every round. The run seed draws the partition, the initial model and the batches.

B5: 20 clients, full participation, NonBalance / Pareto / IID, seeds 100 and 101:
    first round with test accuracy >= 0.50, and the best accuracy; also FedProx (mu 0.01)
    with and without FedGSNR on Pareto.
B6: 50 clients, NonBalance, 10% and 100% participation, target 0.45.
Also prints the statistics phase's share of a round (time_decide / time_round, rounds 2+).

    python bench/fedgsnr_speedup.py            # about 5 minutes on 2 cores
    python bench/fedgsnr_speedup.py --quick    # seed 100 only, B5 only
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

from hpcfl import config
from hpcfl.engine import simulation


def table(partition: str, seed: int, gsnr: bool, clients: int = 20, per_round: int = 0, prox: bool = False):
    opts = {"iid": ("iid", {}), "nonbalance": ("nonbalance", {}), "pareto": ("pareto", {})}[partition]
    alg = {"name": "fedprox" if prox else "fedavg", "lr": 0.05, "batch_size": 64, "local_steps": 10,
           "clients_per_round": per_round, "steps": "gsnr" if gsnr else "fixed"}
    if prox:
        alg["mu"] = 0.01
    return {
        "run": {"name": "b5", "seed": seed, "rounds": 100, "eval_every": 1},
        "data": {"dataset": "gaussian_mixture", "gaussian_mixture": {"seed_offset": -seed},
                 "partition": opts[0], opts[0]: opts[1], "num_clients": clients},
        "model": {"name": "mlp", "mlp": {"hidden": [64], "init": "he_lecun"}},
        "algorithm": alg,
        "runtime": {"threads": 1, "progress": "none"},
    }


def run(t: dict) -> tuple[np.ndarray, float]:
    """(test accuracy per round, statistics share of a round)."""
    s = simulation.prepare(config.from_dict(t), MPI.COMM_SELF)
    rows = []
    simulation.run(s, on_round=lambda m, c: rows.append(m))
    acc = np.array([m["test_accuracy"] for m in rows])
    share = np.mean([m["time_decide"] / m["time_round"] for m in rows[1:]])
    return acc, share


def first(acc: np.ndarray, target: float) -> int | None:
    hit = np.flatnonzero(acc >= target)
    return int(hit[0]) + 1 if hit.size else None


def fmt(r) -> str:
    return "  -" if r is None else f"{r:3d}"


def compare(label: str, base: dict, variant: dict, target: float, shares: list) -> tuple:
    a, _ = run(base)
    g, share = run(variant)
    shares.append(share)
    ra, rg = first(a, target), first(g, target)
    print(f"| {label:<34} | {fmt(ra)} | {fmt(rg)} | {a.max():.3f} | {g.max():.3f} |", flush=True)
    return ra, rg


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    seeds = (100,) if args.quick else (100, 101)
    t0, shares, ratios = time.perf_counter(), [], {}
    print("B5: rounds to 0.50 test accuracy (- = not within 100 rounds), best accuracy")
    print("| setting                            | FedAvg | FedGSNR | best FedAvg | best FedGSNR |")
    print("|---|---|---|---|---|")
    for part in ("nonbalance", "pareto", "iid"):
        for seed in seeds:
            ra, rg = compare(f"{part}, seed {seed}", table(part, seed, False), table(part, seed, True), 0.50, shares)
            ratios.setdefault(part, []).append((ra, rg))
    for seed in seeds:
        compare(f"pareto, seed {seed}, FedProx mu 0.01", table("pareto", seed, False, prox=True),
                table("pareto", seed, True, prox=True), 0.50, shares)
    for part, pairs in ratios.items():
        done = [(a, g) for a, g in pairs if a and g]
        if done:
            print(f"{part}: FedGSNR needs {np.mean([g for _, g in done]) / np.mean([a for a, _ in done]):.2f}x "
                  f"FedAvg's rounds (mean over seeds where both reach 0.50)")
        only = [g for a, g in pairs if a is None and g]
        if only:   # FedAvg missed the target: 100 rounds is a lower bound on its count
            print(f"{part}: FedGSNR reaches 0.50 in {', '.join(map(str, only))} rounds where FedAvg does not "
                  f"within 100 (ratio below {np.mean(only) / 100:.2f})")
    if not args.quick:
        print("\nB6: 50 clients, NonBalance, rounds to 0.45 test accuracy")
        print("| participation                      | FedAvg | FedGSNR | best FedAvg | best FedGSNR |")
        print("|---|---|---|---|---|")
        for per_round, label in ((5, "10% (5 of 50)"), (0, "100%")):
            compare(label, table("nonbalance", 100, False, 50, per_round),
                    table("nonbalance", 100, True, 50, per_round), 0.45, shares)
    print(f"\nstatistics phase: {100 * np.mean(shares):.1f}% of a round on average over the FedGSNR runs "
          f"(max {100 * np.max(shares):.1f}%); {time.perf_counter() - t0:.0f} s in all")


if __name__ == "__main__":
    main()
