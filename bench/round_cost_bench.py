"""Cost of a near-empty round, before and after: what rank 0's results write adds to each round.

Run from the repository root::

    python bench/round_cost_bench.py [--tree OLD_CHECKOUT] [--tree .] [--ranks 2] [--rounds 100 1100]
    python bench/round_cost_bench.py --writer-only [--rounds 0 2000]

Logistic regression on the digits, 10 clients all in every round, one local step, no evaluation:
the training is about a millisecond, so a round's time is mostly what surrounds it. Each source
tree (``--tree``, default: this one) runs the job twice through ``mpiexec -n RANKS python -m hpcfl
run`` with R1 and R2 rounds; ms/round = (wall(R2) - wall(R1)) / (R2 - R1), which cancels start-up
and the final write. "beyond training" subtracts the mean ``time_train`` of the R2 run's
results.h5. The trees alternate (a, b, a, b, ...) ``--repeat`` times and each figure is the median,
since a shared machine's speed drifts. Prints one line per tree. Not a test: the figures depend
on the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = """
[run]
name = "near_empty"
seed = 0
rounds = {rounds}
eval_every = 0
[data]
dataset = "digits"
partition = "iid"
num_clients = 10
cache = "off"
[model]
name = "logreg"
[algorithm]
name = "fedavg"
clients_per_round = 10
lr = 0.05
batch_size = 16
local_steps = 1
[runtime]
threads = 1
progress = "none"
[checkpoint]
every = 0
"""


def run(tree: Path, ranks: int, rounds: int, folder: Path) -> tuple[float, float]:
    """(wall seconds, mean time_train in ms) of one run of the job from ``tree``."""
    job = folder / f"job{rounds}.toml"
    job.write_text(JOB.format(rounds=rounds))
    out = folder / f"out-{tree.name}-{rounds}-{time.monotonic_ns()}"
    cmd = [sys.executable, "-m", "mpi4py", "-m", "hpcfl", "run", str(job), "--out", str(out)]
    if ranks > 1:
        cmd = ["mpiexec", "-n", str(ranks), *cmd]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    t = time.perf_counter()
    p = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t
    if p.returncode != 0:
        raise SystemExit(f"{tree}: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
    import h5py

    with h5py.File(out / "results.h5", "r") as f:
        train_ms = float(f["metrics/time_train"][()].mean()) * 1e3
    return wall, train_ms


def writer_cost(rounds: int, clients: int = 10) -> None:
    """Rank 0's results write alone, in this process: ms per round that ``on_round`` spends in
    ``ResultsWriter.append_round`` (including the batched writes and a final sync), every round
    written as it ends (``results.flush_seconds = 0``, what every round did before) against the
    default batching. This is the time the other ranks wait at the round's end, without the
    scheduling noise of a loaded machine."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import numpy as np

    from hpcfl.engine.job import batching
    from hpcfl.io.results import CLIENT_FIELDS, METRICS, ResultsWriter

    attrs = {"config": {"run": {"rounds": rounds}}, "run_id": "0" * 32}
    ids = np.arange(clients)
    for seconds in (0.0, 2.0):
        with tempfile.TemporaryDirectory() as d:
            w = ResultsWriter(Path(d) / "results.h5", attrs, np.ones((clients, 10), dtype=np.int64),
                              **batching(seconds))
            spent = 0.0
            for r in range(1, rounds + 1):
                m = {k: float(r) for k in METRICS}
                m["round"] = r
                c = {k: np.full(clients, r) for k in CLIENT_FIELDS}
                c["client"] = ids
                t = time.perf_counter()
                w.append_round(m, c)
                spent += time.perf_counter() - t
            t = time.perf_counter()
            w.sync()
            spent += time.perf_counter() - t
            w.close()
        print(f"  results write on rank 0, flush_seconds = {seconds:g}: {spent / rounds * 1e3:6.3f} ms/round "
              f"({rounds} rounds of {clients} clients)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", action="append", type=Path, help="a source tree to time (repeatable)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, nargs=2, default=(100, 1100), metavar=("R1", "R2"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--writer-only", action="store_true", help="time rank 0's results write alone (this tree)")
    args = ap.parse_args()
    if args.writer_only:
        print(f"load average {os.getloadavg()[0]:.1f}")
        writer_cost(args.rounds[1])
        return
    trees = [t.resolve() for t in (args.tree or [Path(__file__).resolve().parents[1]])]
    r1, r2 = args.rounds
    per = {t: [] for t in trees}
    with tempfile.TemporaryDirectory() as d:
        for _ in range(args.repeat):
            for tree in trees:
                w1, _ = run(tree, args.ranks, r1, Path(d))
                w2, train = run(tree, args.ranks, r2, Path(d))
                per[tree].append(((w2 - w1) / (r2 - r1) * 1e3, train))
    print(f"near-empty round: logreg, digits, 10 clients, {args.ranks} rank(s), rounds {r1} vs {r2}, "
          f"median of {args.repeat}; load average {os.getloadavg()[0]:.1f}")
    for tree, rows in per.items():
        ms = statistics.median(r[0] for r in rows)
        train = statistics.median(r[1] for r in rows)
        print(f"  {tree!s:<24} {ms:6.2f} ms/round, training {train:5.2f} ms, beyond training {ms - train:6.2f} ms "
              f"(runs: {', '.join(f'{r[0]:.2f}' for r in rows)})")


if __name__ == "__main__":
    main()
