"""One measured process of ``hpcfl bench`` (started by it, once per side and layout).

    [mpiexec -n R python -m mpi4py] -m hpcfl.bench.side --side hpcfl|bare --workload W --json OUT

Runs the workload through the engine (``hpcfl``: ``simulation.prepare`` and ``run``, in
process, no results file) or through the bare loop (:mod:`hpcfl.bench.bare`), and writes
one JSON object on rank 0: per-round seconds by phase, local steps, start-up (process
start to the first round), peak RSS of every rank, the final test accuracy, and the figures of
one checkpoint of the run's state written and read back in a temporary folder (its size, rank
0's peak memory and the seconds of each, :func:`checkpoint_figures`). With
``--side both`` the process runs the two interleaved, the bare loop's round r right after
the engine's, and the JSON holds one such object per side (start-up and peak memory are
then the process's).
"""

from __future__ import annotations

import os
import time

import numpy as np

T_IMPORT = time.time()


def process_start() -> float:
    """Epoch seconds at which this process started (Linux /proc; else this module's import)."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return time.time() - uptime + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return T_IMPORT


T_START = process_start()


def peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0   # kB on Linux


def run_engine(job: dict, comm, threads: int, after_round=None, device: str = "auto") -> dict:
    from .. import config
    from ..engine import simulation

    job = dict(job, runtime=dict(job.get("runtime", {}), threads=threads, device=device))
    cfg = config.from_dict(job)
    s = simulation.prepare(cfg, comm)
    rounds = []

    def on_round(m, clients):
        ok = clients["dropped"] == 0
        rounds.append({"round": int(m["round"]), "decide": m["time_decide"], "train": m["time_train"],
                       "reduce": m["time_reduce"], "server": m["time_server"], "eval": m["time_eval"],
                       "round_s": m["time_round"], "steps": int(clients["steps"][ok].sum()),
                       "accuracy": float(m["test_accuracy"])})

    t_loop = time.time()
    x = simulation.run(s, on_round=on_round, after_round=after_round)
    return {"t_loop": t_loop, "rounds": rounds, "vectorize": s.block is not None, "dealt": s.dealt,
            "device": str(s.device), "_run": (s, x)}


def _status_mb(key: str) -> float | None:
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) / 1024 for line in f if line.startswith(key + ":"))
    except (OSError, StopIteration, ValueError):
        return None


def _reset_peak() -> bool:
    """Reset this process's peak resident set (Linux: VmHWM), so that the next peak is a step's."""
    import gc

    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def checkpoint_figures(s, x) -> dict:
    """Collective: write one checkpoint of the run's state into a temporary folder and read it back
    (as ``hpcfl run`` does); returns, on rank 0, the state's size, the file's, the seconds of each
    step and rank 0's resident memory before and at its peak during each (None where the
    platform cannot reset the peak)."""
    import shutil
    import tempfile

    from ..engine import resume
    from ..io.checkpoint import CheckpointStore
    from ..state import ClientTable

    comm = s.comm
    folder = comm.bcast(tempfile.mkdtemp(prefix="hpcfl-bench-ckpt-") if comm.rank == 0 else None, root=0)
    store = CheckpointStore(folder, keep=2) if comm.rank == 0 else None
    rows = comm.allreduce(sum(it.get().nbytes for it in resume.state_items(s) if isinstance(it, ClientTable)))
    fig = {}
    try:
        for step in ("save", "load"):
            comm.Barrier()
            reset = _reset_peak()
            fig[f"rss_{step}_mb"] = _status_mb("VmRSS")
            t0 = time.perf_counter()
            if step == "save":
                failure = resume.write(s, x, store, 1, {"sim_time": 0.0}, {"world_size": comm.size,
                                                                         "config_sha256": "", "versions": {}})
                if failure:
                    raise RuntimeError(failure)
            else:
                loaded = store.load_latest(keep_arrays=False) if comm.rank == 0 else None
                resume.read(s, loaded)
            comm.Barrier()
            fig[f"{step}_s"] = time.perf_counter() - t0
            fig[f"peak_{step}_mb"] = _status_mb("VmHWM") if reset else None
        if comm.rank == 0:
            fig["state_mb"] = sum(int(np.prod(shape)) * dt.itemsize for shape, dt in loaded.shapes.values()) / 2**20
            fig["file_mb"] = store.path_for(1).stat().st_size / 2**20
            fig["rows_mb"] = rows / 2**20
    finally:
        if comm.rank == 0:
            shutil.rmtree(folder, ignore_errors=True)
    return fig


def main(argv=None) -> int:
    import argparse
    import json

    ap = argparse.ArgumentParser()
    ap.add_argument("--side", choices=("hpcfl", "bare", "both"), required=True,
                    help="both: the bare loop's round r right after the engine's, in this one process")
    ap.add_argument("--workload", required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--json", required=True)
    ap.add_argument("--layers", choices=("torch", "zoo"), default="torch", help="the bare loop's layers")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                    help="both sides' device: auto is the engine's choice (cuda:<node-local rank> when there is one)")
    ap.add_argument("--vmap", action="store_true", help="the bare loop trains a round's clients vmapped")
    a = ap.parse_args(argv)

    import torch

    from ..config import apply_overrides
    from ..parallel.comm import world
    from .workloads import workload

    torch.set_num_threads(a.threads)
    comm = world()
    job = apply_overrides(workload(a.workload, a.rounds), a.overrides)
    from ..parallel.gpus import place
    from ..parallel.runtime import configure_determinism

    # the engine's device and determinism for both sides: the bare loop does the same work where the engine does.
    # share=True: the bare side never refuses a node with more ranks than GPUs (the engine's side does that)
    configure_determinism(bool(job.get("runtime", {}).get("deterministic", True)))
    device = str(place(comm, a.device, share=True).device)
    out = bare = None
    if a.side == "hpcfl":
        out = run_engine(job, comm, a.threads, device=a.device)
    elif a.side == "bare":
        from .bare import run_bare
        bare = run_bare(job, comm, layers=a.layers, device=device, vmap=a.vmap)
        bare.pop("final")
    else:
        from .bare import bare_rounds
        rounds = bare_rounds(job, comm, layers=a.layers, device=device, vmap=a.vmap)
        next(rounds)   # set up before the engine, so that both sides' rounds start warm
        bare = {"rounds": []}
        out = run_engine(job, comm, a.threads, after_round=lambda rnd: bare["rounds"].append(next(rounds)),
                         device=a.device)
        bare["t_loop"] = out["t_loop"]
    if bare is not None:
        bare.update(device=device, vmap=a.vmap)
    rss = comm.gather(peak_rss_mb(), root=0)   # before the checkpoint's figures reset the peak
    if out is not None:
        out["checkpoint"] = checkpoint_figures(*out.pop("_run"))
    if bare is not None:   # each rank counted its own steps; the engine's records already hold every rank's
        per_round = comm.gather([r["steps"] for r in bare["rounds"]], root=0)
        if comm.rank == 0:
            for i, row in enumerate(bare["rounds"]):
                row["steps"] = sum(ranks[i] for ranks in per_round)
    if comm.rank == 0:
        figs = {name: fig for name, fig in (("hpcfl", out), ("bare", bare)) if a.side in (name, "both")}
        for side, fig in figs.items():
            fig.update(side=side, workload=a.workload, ranks=comm.size, threads=a.threads,
                       startup_s=fig["t_loop"] - T_START, peak_rss_mb=rss,
                       total_steps=sum(r["steps"] for r in fig["rounds"]))
        with open(a.json, "w") as f:
            json.dump(figs if a.side == "both" else figs[a.side], f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
