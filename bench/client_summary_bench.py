"""/clients_summary at scale: the per-client median of a client field (FedGSNR's GSNR), old loop
against :func:`hpcfl.io.client_summary.per_client`.

Run from the repository root::

    python bench/client_summary_bench.py [--rows 30000 100000 1000000] [--clients 1000000] [--old-max 100000]

Rows are (client, value) pairs as a run writes them: 100 clients per round drawn from
``--clients``, values normal with 5% NaN. The old loop (``values[ids == c]`` for each unique
client, quadratic) is timed up to ``--old-max`` rows only (at 1M rows it takes minutes). Prints
seconds per row count and whether the two agree bitwise. Not a test.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hpcfl.io.client_summary import per_client
from hpcfl.io.schema import SUMMARIES


def old_loop(ids, values, n):
    out = np.full(n, np.nan)
    for c in np.unique(ids):
        v = values[ids == c]
        if np.isfinite(v).any():
            out[c] = SUMMARIES["median"](v)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[30_000, 100_000, 1_000_000])
    ap.add_argument("--clients", type=int, default=1_000_000)
    ap.add_argument("--old-max", type=int, default=100_000)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"per-client median over rows, {args.clients:,} clients; load average {os.getloadavg()[0]:.1f}")
    for rows in args.rows:
        ids = rng.integers(0, args.clients, size=rows)
        values = rng.normal(size=rows)
        values[rng.random(rows) < 0.05] = np.nan
        t = time.perf_counter()
        new = per_client(ids, values, args.clients, "median")
        t_new = time.perf_counter() - t
        line = f"  {rows:>9,} rows: new {t_new:7.3f} s"
        if rows <= args.old_max:
            t = time.perf_counter()
            old = old_loop(ids, values, args.clients)
            line += f", old loop {time.perf_counter() - t:7.2f} s, bitwise equal: {old.tobytes() == new.tobytes()}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
