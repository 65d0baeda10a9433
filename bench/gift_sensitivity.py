"""Sensitivity of GIFT's tau schedule to hpcfl's stagnation rule, against Algorithm 1 as printed.

    python bench/gift_sensitivity.py                       # 6 settings x 2 jobs x 3 seeds, 100 rounds
    python bench/gift_sensitivity.py --rounds 60 --seeds 0 --jobs logreg

Settings: fixed tau (FedAvg, ``gift.mode = "fixed"``, the reference), the stagnation mode (hpcfl's
own rule: halve tau once C made no new minimum eps_rel below the running one for patience = 10
rounds, after a 10-round warm-up) with eps_rel 0.05, 0.1 (the default) and 0.2, and the literal
mode (Algorithm 1 lines 12-15: halve when C_r >= C_{r-1}) without and with frequency relaxation
(tau += 5 after o = 10 rounds of strictly falling C).

Jobs: scikit-learn's 8x8 digits, 20 clients of 2 classes each (``label_k``), every client every
round, unweighted mean, tau0 = 50, batch 32, the simulated clock charging 0.05 s per local
iteration and the float32 upload at 5 Mbit/s:

- ``logreg``: multinomial logistic regression, lr 0.2, weight decay 0.01 (bench/gift_small.py's job);
- ``mlp``: MLP 64-32-10, lr 0.05 (tests/e2e/test_gift_behaviour.py's job).

Printed per job and setting, means over the seeds (per seed in brackets): the round after which tau
was first halved ("-": never), the simulated seconds until the test accuracy first reaches the
fixed-tau run's final accuracy (mean of its last 10 evaluations; "-": never), and the final accuracy
(mean of the last 10 evaluations).
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

TAU0, LAST = 50, 10
SETTINGS = {
    "fixed tau": {"mode": "fixed"},
    "stagnation eps_rel 0.05": {"eps_rel": 0.05},
    "stagnation eps_rel 0.1 (default)": {"eps_rel": 0.1},
    "stagnation eps_rel 0.2": {"eps_rel": 0.2},
    "literal (Alg. 1)": {"mode": "literal"},
    "literal + relaxation": {"mode": "literal", "relax": True},
}
JOBS = {
    "logreg": ({"name": "logreg"}, {"lr": 0.2, "weight_decay": 0.01}),
    "mlp": ({"name": "mlp", "mlp": {"hidden": [32]}}, {"lr": 0.05}),
}


def job(name: str, gift: dict, seed: int, rounds: int) -> dict:
    model, alg = JOBS[name]
    return {
        "run": {"name": "gift_sensitivity", "seed": seed, "rounds": rounds, "eval_every": 1},
        "data": {"dataset": "digits", "num_clients": 20, "partition": "label_k", "label_k": {"classes_per_client": 2}},
        "model": model,
        "algorithm": {"name": "gift", "batch_size": 32, "local_steps": TAU0, "clients_per_round": 0, **alg,
                      "gift": gift},
        "system": {"enabled": True, "compute_s": 0.05, "uplink_mbps": 5.0, "downlink_mbps": float("inf")},
        "runtime": {"threads": 1, "progress": "none", "vectorize": "on"},
    }


def run(table: dict) -> dict[str, np.ndarray]:
    """Per-round test accuracy, cumulative simulated time and tau_next."""
    rows = []
    simulation.run(simulation.prepare(config.from_dict(table), MPI.COMM_SELF),
                   on_round=lambda m, c: rows.append((m["test_accuracy"], m["sim_time"], m["tau_next"])))
    acc, t, tau = (np.array(x, dtype=np.float64) for x in zip(*rows))
    return {"acc": acc, "time": t, "tau": tau}


def first_halving(r: dict) -> float:
    below = np.flatnonzero(r["tau"] < TAU0)
    return float(below[0] + 1) if below.size else np.nan


def time_to(r: dict, target: float) -> float:
    hit = np.flatnonzero(r["acc"] >= target)
    return float(r["time"][hit[0]]) if hit.size else np.nan


def fmt(values, digits=0) -> str:
    v = np.asarray(values, dtype=np.float64)
    one = (lambda x: "-" if not np.isfinite(x) else f"{x:.{digits}f}")
    mean = one(v.mean()) if np.isfinite(v).all() else "-"
    return f"{mean} ({' '.join(one(x) for x in v)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--jobs", nargs="+", default=list(JOBS), choices=list(JOBS))
    a = ap.parse_args()
    print(f"command: python bench/gift_sensitivity.py {' '.join(shlex.quote(x) for x in sys.argv[1:])}".rstrip())
    t0 = time.perf_counter()
    for name in a.jobs:
        res = {label: [run(job(name, gift, s, a.rounds)) for s in a.seeds] for label, gift in SETTINGS.items()}
        targets = [r["acc"][-LAST:].mean() for r in res["fixed tau"]]
        print(f"\njob {name}: {a.rounds} rounds, seeds {a.seeds}; fixed tau's final accuracy {fmt(targets, 3)}\n")
        print("| setting | first halving (round) | sim. time to fixed tau's accuracy (s) | final accuracy |")
        print("|---|---|---|---|")
        for label, runs in res.items():
            print(f"| {label} | {fmt([first_halving(r) for r in runs])} | "
                  f"{fmt([time_to(r, tg) for r, tg in zip(runs, targets)])} | "
                  f"{fmt([r['acc'][-LAST:].mean() for r in runs], 3)} |", flush=True)
    print(f"\ntotal wall time {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
