"""Cost of per-client evaluation (run.eval_clients): the evaluation pass with and without it, alternated
in one process on the same model, and the one-off draw of the held-out rows.

    PYTHONPATH=. python bench/client_eval_cost.py jobs/quickstart.toml [--reps 5] [--set KEY=VALUE ...]
    PYTHONPATH=. python bench/client_eval_cost.py jobs/bench_w.toml --set runtime.threads=1

Prints the median seconds of one evaluation with and without the per-client sums, the extra as a
share of the evaluation, and the extra per run (evaluations times the extra, plus the draw): compare
it with the run's wall time. docs/performance.md, "Per-client evaluation", has the figures.
"""

import argparse
import os
import time

import numpy as np
from mpi4py import MPI

from hpcfl import config
from hpcfl.data.client_test import client_test_pairs
from hpcfl.engine import simulation
from hpcfl.engine.evaluation import ClientEval, evaluate


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("job")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--set", dest="sets", action="append", default=[])
    a = ap.parse_args()
    cfg = config.load(a.job, a.sets)
    s = simulation.prepare(cfg, MPI.COMM_WORLD)
    t = time.perf_counter()
    ce = ClientEval(*client_test_pairs(s.dataset.y_test, s.class_counts, cfg.run.seed, cfg.run.eval_clients_min))
    draw = time.perf_counter() - t
    s.model.load(s.model.numpy())
    off, on = [], []
    evaluate(s, s.x_test, s.y_test)   # warm-up
    for _ in range(a.reps):
        t = time.perf_counter()
        evaluate(s, s.x_test, s.y_test)
        off.append(time.perf_counter() - t)
        t = time.perf_counter()
        evaluate(s, s.x_test, s.y_test, clients=ce)
        on.append(time.perf_counter() - t)
    m_off, m_on = float(np.median(off)), float(np.median(on))
    load = os.getloadavg()[0]
    print(f"{a.job}: {cfg.data.num_clients} clients, {len(s.y_test)} test samples, {int(ce.sizes.sum())} held-out "
          f"rows in all; load {load:.1f}")
    print(f"  evaluation without: {m_off:.4f} s, with: {m_on:.4f} s (median of {a.reps}): +{m_on - m_off:.4f} s, "
          f"{100 * (m_on - m_off) / m_off:+.1f} % of the evaluation")
    print(f"  the rows' draw, once per run: {draw:.4f} s")
    evals = len([r for r in range(1, cfg.run.rounds + 1)
                 if r == cfg.run.rounds or (cfg.run.eval_every and r % cfg.run.eval_every == 0)])
    print(f"  per run of {cfg.run.rounds} rounds, {evals} evaluations: +{evals * (m_on - m_off) + draw:.3f} s")


if __name__ == "__main__":
    main()
