"""Loading naturally partitioned data at scale: LEAF JSON and TFF HDF5 files of N FEMNIST-shaped clients.

    python bench/natural_clients.py [--clients 1000 10000] [--format leaf tff] [--rows 20] [--setup]

For every N and format, writes the files (not timed: a generator, not a reader), then loads them in
a fresh process (``hpcfl.data.load_dataset``, as a run does) and prints the load's wall time and the
process's peak RSS, beside its RSS after the imports and the size of the arrays it ends with. With
``--setup``, the same process then builds a run's whole start-up (:func:`hpcfl.engine.simulation.prepare`:
the natural partition, logistic regression 784 -> 62, per-client evaluation on the clients' own rows)
and runs one round of 10 clients, and prints those times and the peak RSS after them.

The clients are FEMNIST-shaped: 28 x 28 float pixels, 62 classes, ``rows`` training rows each on
average (uniform in [rows / 2, 3 rows / 2]) and about a tenth as many test rows (at least 1). LEAF's
JSON is split as LEAF's scripts split it, ``--users-per-file`` users a file; its pixel values are
drawn from a pool of FEMNIST-like rows (mostly background 1.0, the rest k / 255 as float32 prints
them), so that writing 10k clients takes seconds while each row still is 784 numbers to parse. TFF's
file has one group per client, ``pixels`` float32 (n, 28, 28) and ``label`` int32 (n,).

What to expect (the check of linearity): load time and the RSS above the imports grow in proportion
to N. Both hold the data about once at their peak; LEAF's adds one file's Python objects (bounded by
``--users-per-file``, not by N).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SIDE, CLASSES = 28, 62


def rss_mb() -> float:
    """This process's peak resident set so far, MB (ru_maxrss: KiB on Linux, bytes on macOS)."""
    scale = 1 / 1024 if sys.platform != "darwin" else 1 / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def sizes(n_clients: int, rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    train = rng.integers(max(1, rows // 2), rows + rows // 2 + 1, n_clients)
    return train, np.maximum(1, np.rint(train / 10).astype(np.int64))


def client_ids(n: int) -> list[str]:
    """FEMNIST-like writer ids, shuffled so that files do not hold them in sorted order."""
    ids = [f"f{i:07d}_{i % 97:02d}" for i in range(n)]
    np.random.default_rng(1).shuffle(ids)
    return ids


def write_leaf(folder: Path, n: int, rows: int, per_file: int) -> None:
    rng = np.random.default_rng(2)
    pool = []
    for _ in range(64):   # FEMNIST-like rows: background 1.0, strokes k / 255 printed as float32 values
        k = np.where(rng.random(SIDE * SIDE) < 0.7, 255, rng.integers(0, 255, SIDE * SIDE))
        pool.append("[" + ", ".join(repr(float(np.float32(v / 255))) for v in k) + "]")
    train, test = sizes(n, rows, 0)
    ids = client_ids(n)
    for split, counts in (("train", train), ("test", test)):
        os.makedirs(folder / split, exist_ok=True)
        for f, start in enumerate(range(0, n, per_file)):
            users = ids[start:start + per_file]
            ns = [int(c) for c in counts[start:start + per_file]]
            with open(folder / split / f"all_data_{f}_niid_0_keep_0_{split}_9.json", "w") as out:
                out.write('{"users": ' + json.dumps(users) + ', "num_samples": ' + json.dumps(ns)
                          + ', "hierarchies": [], "user_data": {')
                for j, (u, m) in enumerate(zip(users, ns)):
                    xs = ", ".join(pool[int(i)] for i in rng.integers(0, len(pool), m))
                    ys = json.dumps(rng.integers(0, CLASSES, m).tolist())
                    out.write(("" if j == 0 else ", ") + f'"{u}": {{"x": [{xs}], "y": {ys}}}')
                out.write("}}")


def write_tff(folder: Path, n: int, rows: int) -> None:
    import h5py

    rng = np.random.default_rng(3)
    base = np.where(rng.random((64, SIDE, SIDE)) < 0.7, 1.0, rng.random((64, SIDE, SIDE))).astype(np.float32)
    train, test = sizes(n, rows, 0)
    ids = client_ids(n)
    os.makedirs(folder, exist_ok=True)
    for name, counts in (("fed_emnist_train.h5", train), ("fed_emnist_test.h5", test)):
        with h5py.File(folder / name, "w") as f:
            ex = f.create_group("examples")
            for u, m in zip(ids, counts.tolist()):
                g = ex.create_group(u)
                g.create_dataset("pixels", data=base[rng.integers(0, 64, m)])
                g.create_dataset("label", data=rng.integers(0, CLASSES, m).astype(np.int32))


def folder_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20


def measure(fmt: str, root: str, n: int, setup: bool) -> dict:
    """In this (fresh) process: load the files, then optionally a run's start-up and one round."""
    from hpcfl import data
    from hpcfl.config import options

    table = {"image_shape": [1, SIDE, SIDE]} if fmt == "leaf" else {}
    opts = options.build(data.dataset_options(fmt), table, f"data.{fmt}")
    before = rss_mb()
    t = time.perf_counter()
    ds = data.load_dataset(fmt, opts, root, 0)
    out = {"load_s": time.perf_counter() - t, "rss_imports_mb": before, "rss_load_mb": rss_mb(),
           "arrays_mb": (ds.x_train.nbytes + ds.x_test.nbytes) / 2**20, "clients": len(ds.natural_clients),
           "train_rows": len(ds.y_train), "test_rows": len(ds.y_test)}
    del ds
    if setup:
        from mpi4py import MPI

        from hpcfl import config
        from hpcfl.engine import simulation

        cfg = config.from_dict({
            "run": {"name": "bench", "seed": 0, "rounds": 1, "eval_every": 1},
            "data": {"dataset": fmt, "root": root, "partition": "natural", "num_clients": n, fmt: table},
            "model": {"name": "logreg"},
            "algorithm": {"name": "fedavg", "clients_per_round": 10, "lr": 0.05, "batch_size": 10, "local_steps": 2},
            "runtime": {"threads": 1, "progress": "none"}})
        t = time.perf_counter()
        s = simulation.prepare(cfg, MPI.COMM_SELF)
        out["prepare_s"] = time.perf_counter() - t
        t = time.perf_counter()
        simulation.run(s)
        out["round_s"] = time.perf_counter() - t
        out["rss_run_mb"] = rss_mb()
    return out


def child(fmt: str, root: Path, n: int, setup: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, __file__, "--measure", fmt, str(root), str(n)] + (["--setup"] if setup else []),
                       capture_output=True, text=True, env=env, check=False)
    if p.returncode:
        sys.exit(f"{fmt} N={n} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[1000, 10000])
    ap.add_argument("--format", nargs="+", default=["leaf", "tff"], choices=["leaf", "tff"])
    ap.add_argument("--rows", type=int, default=20, help="training rows per client on average")
    ap.add_argument("--users-per-file", type=int, default=100,
                    help="LEAF: users per JSON file (LEAF's FEMNIST: about 100)")
    ap.add_argument("--setup", action="store_true", help="also time a run's start-up and one round")
    ap.add_argument("--measure", nargs=3, metavar=("FORMAT", "ROOT", "N"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.measure:
        fmt, root, n = a.measure
        print(json.dumps(measure(fmt, root, int(n), a.setup)))
        return
    for n in a.clients:
        for fmt in a.format:
            with tempfile.TemporaryDirectory(prefix=f"hpcfl-bench-{fmt}-") as tmp:
                root = Path(tmp)
                t = time.perf_counter()
                write_leaf(root, n, a.rows, a.users_per_file) if fmt == "leaf" else write_tff(root, n, a.rows)
                wrote = time.perf_counter() - t
                r = child(fmt, root, n, a.setup)
                line = (f"N={n:>6} {fmt:4}: {r['clients']} clients, {r['train_rows']} + {r['test_rows']} rows, files "
                        f"{folder_mb(root):.0f} MB (written in {wrote:.1f} s); load {r['load_s']:.2f} s "
                        f"({1e6 * r['load_s'] / n:.0f} us/client), peak RSS {r['rss_load_mb']:.0f} MB = "
                        f"{r['rss_imports_mb']:.0f} after imports + {r['rss_load_mb'] - r['rss_imports_mb']:.0f} "
                        f"(arrays {r['arrays_mb']:.0f} MB)")
                if a.setup:
                    line += (f"; run start-up {r['prepare_s']:.2f} s, one round {r['round_s']:.2f} s, peak RSS "
                             f"{r['rss_run_mb']:.0f} MB")
                print(line, flush=True)


if __name__ == "__main__":
    main()
