"""Rank 0's memory and time for a checkpoint of large per-client state, and for resuming from it.

SCAFFOLD with an MLP of 99,985 parameters (gaussian_mixture, 20 inputs, hidden [3225], float32)
on ``mpiexec -n 2``, with as many clients as make ``--gb`` GB of per-client rows (c_i) in all
(2,500 clients a GB). The rows are filled with random numbers (touched, as after many rounds);
then one checkpoint is written into a fresh folder and read back, as ``hpcfl run`` does.

    mpiexec -n 2 python bench/checkpoint_memory.py --gb 1 2 4 [--mode rank0 shards]

``--mode``: how the checkpoint is written, each for every size, side by side in one sitting:
``rank0`` (one file, every row through rank 0: ``checkpoint.shards = false``, and the only way
before shards) and ``shards`` (every rank writes its own rows, rank 0 the manifest).

For each size it prints rank 0's resident memory before (its own rows included), its peak during
the save and during the load (Linux VmHWM, reset before each through /proc/self/clear_refs), the
seconds of each, the file size, the memory left after the load (a resumed run frees what it
loaded), and whether every rank's rows came back bitwise. Rank 0's peak must stay within
its own rows plus 256 MB (docs/performance.md). Linux only; not a timed test.

Runs against whichever hpcfl is on the path: ``PYTHONPATH=<other checkout>`` gives the figures
before a change (the older API, ``resume.capture`` and ``CheckpointStore.save``, is used when
``resume.write`` is absent).
"""

import argparse
import gc
import hashlib
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

from hpcfl import config
from hpcfl.engine import resume, simulation
from hpcfl.io.checkpoint import CheckpointStore
from hpcfl.state import ClientTable

HIDDEN, DIM, PARAMS = 3225, 20, 99_985    # 20*3225 + 3225 + 3225*10 + 10


def status(key: str) -> float:
    """A /proc/self/status figure (VmRSS, VmHWM) in MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    raise KeyError(key)


def reset_peak() -> None:
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:   # 5: reset the peak resident set (VmHWM)
        f.write("5")


def tables(s):
    return [it for it in resume.state_items(s) if isinstance(it, ClientTable)]


def rows_digest(s) -> str:
    h = hashlib.sha256()
    for t in tables(s):
        h.update(np.ascontiguousarray(t.get()).view(np.uint8))
    return h.hexdigest()


def save(s, x, store, cfg, mode):
    comm = s.comm
    meta = {"sim_time": 0.0, "config": cfg.to_json()}
    manifest = {"world_size": comm.size, "config_sha256": cfg.digest(), "versions": {}}
    if hasattr(resume, "write"):
        more = {"shards": mode == "shards"} if mode == "shards" else {}   # older code: rank 0 only
        failure = resume.write(s, x, store, 1, meta, manifest, **more)
        assert failure is None, failure
        return
    arrays = resume.capture(s, x)            # the code before streaming
    if comm.rank == 0:
        store.save(1, arrays, meta=meta, manifest=manifest)
    del arrays


def load(s, store):
    loaded = None
    if hasattr(resume, "write"):
        if s.comm.rank == 0:
            loaded = store.load_latest(keep_arrays=False)
        return resume.read(s, loaded)
    if s.comm.rank == 0:
        loaded = store.load_latest()
    x = resume.restore(s, loaded.arrays if loaded else None)
    del loaded
    return x


def point(gb: float, comm, folder: Path, mode: str) -> dict:
    clients = round(gb * 1e9 / (PARAMS * 4))
    cfg = config.from_dict({
        "run": {"name": "ckpt-bench", "seed": 1, "rounds": 2},
        "data": {"dataset": "gaussian_mixture", "partition": "iid", "num_clients": clients,
                 "gaussian_mixture": {"num_train": max(20000, 2 * clients), "dim": DIM}},
        "model": {"name": "mlp", "mlp": {"hidden": [HIDDEN]}},
        "algorithm": {"name": "scaffold", "clients_per_round": 2, "local_steps": 1, "batch_size": 2},
        "runtime": {"threads": 1, "progress": "none"},
    })
    s = simulation.prepare(cfg, comm)
    assert s.model.num_params == PARAMS, s.model.num_params
    rng = np.random.default_rng(comm.rank)
    for t in tables(s):
        rows = t.get()
        for a in range(0, len(rows), 256):
            rows[a:a + 256] = rng.standard_normal(rows[a:a + 256].shape, dtype=np.float32)
    resume.accumulator(s)      # the exact sum's grid exists, as after a round
    own = sum(t.get().nbytes for t in tables(s)) / 2**20
    before = rows_digest(s)
    x = s.model.numpy()
    store = CheckpointStore(folder, keep=2) if comm.rank == 0 else None

    comm.Barrier()
    reset_peak()
    base = status("VmRSS")
    t0 = time.perf_counter()
    save(s, x, store, cfg, mode)
    comm.Barrier()
    t_save = time.perf_counter() - t0
    save_peak = status("VmHWM")

    for t in tables(s):        # forget the rows: the load must bring them back
        t.get()[:] = 0
    comm.Barrier()
    reset_peak()
    base_load = status("VmRSS")
    t0 = time.perf_counter()
    x2 = load(s, store)
    comm.Barrier()
    t_load = time.perf_counter() - t0
    load_peak = status("VmHWM")
    gc.collect()
    after = status("VmRSS")
    same = comm.allreduce(int(rows_digest(s) == before and x2.tobytes() == x.tobytes()), op=MPI.MIN)
    size = sum(p.stat().st_size for p in folder.glob("ckpt-*.h5")) / 2**20 if comm.rank == 0 else 0
    return {"mode": mode, "gb": gb, "clients": clients, "own": own, "base": base, "save_peak": save_peak, "t_save": t_save,
            "base_load": base_load, "load_peak": load_peak, "t_load": t_load, "after": after, "size": size,
            "bitwise": bool(same)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gb", type=float, nargs="+", default=[1.0, 2.0])
    ap.add_argument("--mode", nargs="+", default=["rank0", "shards"], choices=["rank0", "shards"])
    ap.add_argument("--dir", default=None, help="where the checkpoints go (default: a temporary folder)")
    a = ap.parse_args()
    comm = MPI.COMM_WORLD
    rows = []
    for gb in a.gb:
        for mode in a.mode:
            folder = None
            if comm.rank == 0:
                folder = Path(tempfile.mkdtemp(prefix="hpcfl-ckpt-bench-", dir=a.dir))
            folder = Path(comm.bcast(str(folder) if folder else None, root=0))
            rows.append(point(gb, comm, folder, mode))
            if comm.rank == 0:
                shutil.rmtree(folder, ignore_errors=True)
            gc.collect()
    if comm.rank != 0:
        return
    print(f"hpcfl checkpoint bench: {comm.size} ranks, SCAFFOLD, {PARAMS:,} parameters (float32); rank 0, MB "
          f"(pid {os.getpid()})")
    print(f"{'mode':>6} {'state GB':>8} {'clients':>7} {'own rows':>8} {'RSS':>7} {'save peak':>9} {'+extra':>7} {'save s':>7} "
          f"{'load peak':>9} {'+extra':>7} {'load s':>7} {'after':>7} {'file MB':>8} bitwise")
    for r in rows:
        print(f"{r['mode']:>6} {r['gb']:>8.1f} {r['clients']:>7d} {r['own']:>8.0f} {r['base']:>7.0f} {r['save_peak']:>9.0f} "
              f"{r['save_peak'] - r['base']:>7.0f} {r['t_save']:>7.2f} {r['load_peak']:>9.0f} "
              f"{r['load_peak'] - r['base_load']:>7.0f} {r['t_load']:>7.2f} {r['after']:>7.0f} {r['size']:>8.0f} "
              f"{'yes' if r['bitwise'] else 'NO'}")


if __name__ == "__main__":
    main()
