"""One measured process of ``hpcfl bench`` (started by it, once per side and layout).

    [mpiexec -n R python -m mpi4py] -m hpcfl.bench.side --side hpcfl|bare --workload W --json OUT

Runs the workload through the engine (``hpcfl``: ``simulation.prepare`` and ``run``, in
process, no results file) or through the bare loop (:mod:`hpcfl.bench.bare`), and writes
one JSON object on rank 0: per-round seconds by phase, local steps, start-up (process
start to the first round), peak RSS of every rank, and the final test accuracy. With
``--side both`` the process runs the two interleaved, the bare loop's round r right after
the engine's, and the JSON holds one such object per side (start-up and peak memory are
then the process's).
"""

from __future__ import annotations

import os
import time

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
    simulation.run(s, on_round=on_round, after_round=after_round)
    return {"t_loop": t_loop, "rounds": rounds, "vectorize": s.block is not None, "dealt": s.dealt,
            "device": str(s.device)}


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
    from ..parallel.comm import node_layout
    from ..parallel.runtime import configure_determinism, pick_device

    # the engine's device and determinism for both sides: the bare loop does the same work where the engine does
    configure_determinism(bool(job.get("runtime", {}).get("deterministic", True)))
    device = str(pick_device(a.device, node_layout(comm)[0]))
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
    rss = comm.gather(peak_rss_mb(), root=0)
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
