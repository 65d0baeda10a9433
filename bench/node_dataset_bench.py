"""Per-rank private memory of a dataset read from the user's files, on 1, 2 and 4 ranks: once per node.

    python bench/node_dataset_bench.py [--mb 200] [--ranks 1 2 4] [--share both|on|off]

Writes an .npz of about ``--mb`` MB (float32 inputs of 1,000 features, 10 classes, a tenth of it
as the test split) in a temporary folder, then runs the set-up a run does on it
(``simulation.prepare``, ``share_tables``), logistic regression, 100 iid clients, on the CPU.
``--share off`` is the code before: every rank reads the file itself (``data.load_dataset``, as
``load_per_node`` did for a dataset the cache does not serve); ``on`` is ``load_per_node``: the
node's first rank reads it into the node's shared windows. Every rank then reads every page of the
inputs, as training and evaluation do over a run. Each rank reports its private memory
(``Private_Clean + Private_Dirty``, ``/proc/self/smaps_rollup``) and its proportional share
(``Pss``), after the imports and after set-up, and the largest peak resident memory (``VmHWM``: the
first rank holds the file's arrays and the windows at once while it fills them). Not a test: the
figures depend on the machine.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from node_tables_bench import launch, measure   # the same measurement and launch as the client tables'

FEATURES = 1000


def write(path: Path, mb: int) -> None:
    import numpy as np

    n = int(mb * 2**20 / (FEATURES * 4) / 1.1)
    rng = np.random.default_rng(0)
    np.savez(path, x=rng.normal(size=(n, FEATURES)).astype(np.float32), y=rng.integers(0, 10, n),
             x_test=rng.normal(size=(n // 10, FEATURES)).astype(np.float32), y_test=rng.integers(0, 10, n // 10))


def worker(a) -> None:
    import numpy as np

    from hpcfl import data
    from hpcfl.engine import setup as setup_module

    if a.share == "off":   # the code before: every rank reads the user's file itself
        setup_module.load_per_node = lambda cfg, comm, tables=None: data.load_dataset(
            cfg.data.dataset, cfg.dataset_options, cfg.data.root, cfg.run.seed, cfg.data.cache)
    table = {
        "run": {"name": "files", "seed": 0, "rounds": 1, "eval_every": 0},
        "data": {"dataset": "npz", "partition": "iid", "num_clients": 100, "npz": {"file": a.file}},
        "model": {"name": "logreg"},
        "algorithm": {"name": "fedavg", "clients_per_round": 10, "lr": 0.05, "local_steps": 1},
        "runtime": {"threads": 1, "progress": "none", "vectorize": "off"},
    }

    def touch(s):
        ds = s.dataset
        check = float(np.asarray(ds.x_train).sum(dtype=np.float64) + np.asarray(ds.x_test).sum(dtype=np.float64))
        held = sum(getattr(ds, k).nbytes for k in ("x_train", "y_train", "x_test", "y_test"))
        return {"check": check, "dataset_mb": held / 2**20}

    measure(table, touch, share=a.share)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--share", choices=("both", "on", "off"), default="both")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--file", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    results = []
    with tempfile.TemporaryDirectory(prefix="hpcfl-files-bench-") as folder:
        file = Path(folder) / "data.npz"
        write(file, a.mb)
        for share in (("off", "on") if a.share == "both" else (a.share,)):
            for ranks in a.ranks:
                results += launch(__file__, ranks, ["--share", share, "--file", str(file)])
    checks = {r["check"] for r in results}
    print(f"an .npz of {results[0]['dataset_mb']:.0f} MB (x, y, x_test, y_test), logistic regression, 100 clients; "
          f"MB per rank (set-up = after set-up minus after imports); every rank read the same bytes: {len(checks) == 1}")
    print(f"{'share':6s} {'ranks':>5s} {'private set-up':>15s} {'node private':>13s} {'PSS set-up':>11s} "
          f"{'shared/node':>12s} {'peak RSS':>9s}")
    for share in ("off", "on"):
        for ranks in a.ranks:
            rows = [r for r in results if r["share"] == share and r["ranks"] == ranks]
            if not rows:
                continue
            setup = [r["after_private_mb"] - r["base_private_mb"] for r in rows]
            pss = max(r["after_pss_mb"] - r["base_pss_mb"] for r in rows)
            peak = max(r["after_peak_mb"] for r in rows)
            print(f"{share:6s} {ranks:5d} {max(setup):15.0f} {sum(setup):13.0f} {pss:11.0f} "
                  f"{rows[0]['shared_mb']:12.0f} {peak:9.0f}")


if __name__ == "__main__":
    main()
