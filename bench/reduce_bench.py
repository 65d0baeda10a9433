"""Cost of the exact reduction versus a plain float64 Reduce(SUM).

    mpiexec -n 2 python -m mpi4py bench/reduce_bench.py [--length 10000000] [--local 1 5] [--repeat 5]

Each rank adds ``local`` contributions (random rows of ``length`` float64 with mixed
magnitudes) and reduces to rank 0. Times are medians over ``repeat`` runs after one
warm-up, measured between barriers; "add" is the per-rank cost of accepting the rows,
"reduce" is the collective including quantisation. Also checks that the exact result
is bitwise identical to the same sum computed on one rank.
"""

import argparse
import time

import numpy as np
from mpi4py import MPI

from hpcfl.comm import ExactSum, FloatSum


def timed(comm, fn):
    comm.Barrier()
    t = time.perf_counter()
    out = fn()
    comm.Barrier()
    return time.perf_counter() - t, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--length", type=int, default=10_000_000)
    ap.add_argument("--local", type=int, nargs="+", default=[1, 5])
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    if comm.rank == 0:
        print(f"ranks {comm.size}, buffer {a.length:,} float64 ({a.length * 8 / 2**20:.0f} MiB)")
        print(f"{'mode':<6} {'local':>5} {'add s':>8} {'reduce s':>9} {'total s':>8}")
    for local in a.local:
        rng = np.random.default_rng(comm.rank)
        rows = [rng.standard_normal(a.length) * 10.0 ** rng.integers(-6, 6, a.length) for _ in range(local)]
        total = local * comm.size
        results = {}
        for mode, cls in (("float", FloatSum), ("exact", ExactSum)):
            adds, reds = [], []
            acc = cls(a.length)  # one accumulator reused across rounds, as the engine does
            for rep in range(a.repeat + 1):
                acc.reset()
                t_add, _ = timed(comm, lambda: [acc.add(r) for r in rows])
                t_red, out = timed(comm, lambda: acc.reduce(comm, total, root=0))
                if rep:
                    adds.append(t_add)
                    reds.append(t_red)
            results[mode] = out
            if comm.rank == 0:
                ad, rd = np.median(adds), np.median(reds)
                print(f"{mode:<6} {local:>5} {ad:>8.3f} {rd:>9.3f} {ad + rd:>8.3f}")
        all_rows = comm.gather(rows, root=0)
        if comm.rank == 0:
            one = ExactSum(a.length)
            for rr in all_rows:
                for r in rr:
                    one.add(r)
            ref = one.reduce(MPI.COMM_SELF, total)
            print(f"       exact result bitwise equal to the 1-rank sum: {ref.tobytes() == results['exact'].tobytes()}")
            print(f"       max |float - exact| / max|exact|: "
                  f"{np.max(np.abs(results['float'] - ref)) / np.max(np.abs(ref)):.2e}")


if __name__ == "__main__":
    main()
