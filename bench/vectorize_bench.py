"""Seconds per round of the tiny-model paper jobs: one-by-one loop vs vectorised client blocks.

    python bench/vectorize_bench.py [--repeat 3] [--quadratic-rounds 100]

Runs, on one core, each job three ways in one sitting:

- ``loop``:   ``runtime.vectorize = "off"``, one client at a time (torch, eager);
- ``torch``:  batched groups with the batched torch step (the path without numba);
- ``auto``:   what ``vectorize = "auto"`` takes: for logistic regression and the quadratic on CPU
  with numba, a group's whole round in one compiled call (:mod:`hpcfl.client.fused`).

Jobs: ``jobs/papers/fednova_synthetic.toml`` as shipped (Synthetic(1,1) logistic regression, 9 of
30 clients per round, E ~ U{1..5}, evaluation every round, 30 rounds) and
``jobs/papers/fednova_quadratic.toml`` cut to ``--quadratic-rounds`` rounds (the per-round cost does
not change with the round count). Each figure is ms per round over the whole run after one
warm-up run, the best and the worst of ``repeat``; the ratio is loop / mode on the medians.
"""

import argparse
import statistics
import time
from pathlib import Path

from mpi4py import MPI

from hpcfl import config
from hpcfl.engine import simulation

PAPERS = Path(__file__).resolve().parents[1] / "jobs" / "papers"


def seconds(table: dict, torch_step: bool) -> float:
    setup = simulation.prepare(config.from_dict(table), MPI.COMM_SELF)
    if torch_step and setup.block is not None:
        setup.block.fused = None   # the batched torch step instead of the compiled kernel
    t = time.perf_counter()
    simulation.run(setup)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quadratic-rounds", type=int, default=100)
    args = ap.parse_args()
    jobs = {"fednova_synthetic": [], "fednova_quadratic": [f"run.rounds={args.quadratic_rounds}"]}
    modes = {"loop": ("off", False), "torch": ("auto", True), "auto": ("auto", False)}
    print(f"{'job':20s} {'mode':6s} {'ms/round (best-worst)':>22s} {'vs loop':>8s}")
    for name, extra in jobs.items():
        base = config.apply_overrides(config.read_job(PAPERS / f"{name}.toml"), [
            "runtime.threads=1", "runtime.progress='none'", *extra])
        rounds = config.from_dict(base).run.rounds
        med = {}
        for mode, (vec, torch_step) in modes.items():
            table = config.apply_overrides(base, [f"runtime.vectorize='{vec}'"])
            seconds(table, torch_step)   # warm-up: caches, allocator, numba's cache load
            ms = [seconds(table, torch_step) / rounds * 1e3 for _ in range(args.repeat)]
            med[mode] = statistics.median(ms)
            print(f"{name:20s} {mode:6s} {min(ms):10.1f} - {max(ms):8.1f} {med['loop'] / med[mode]:7.1f}x",
                  flush=True)


if __name__ == "__main__":
    main()
