"""Command line: ``hpcfl run | info | partition``.

Input errors (bad config, missing data files, more ranks than clients) are collected
from all ranks, printed once by rank 0, and end every rank with exit code 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

from .errors import HpcflError

EXIT_INPUT = 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hpcfl", description="MPI simulator for federated learning")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run a job file (under mpiexec for several ranks)")
    r.add_argument("job", help="TOML job file, e.g. jobs/quickstart.toml")
    r.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set algorithm.lr=0.05 (repeatable)")
    r.add_argument("--out", help="output directory (default runs/<run.name>)")
    r.add_argument("--force", action="store_true", help="overwrite an existing results.h5 in --out")
    sub.add_parser("info", help="ranks, devices, MPI library and versions")
    pt = sub.add_parser("partition", help="preview a job's client partition without training")
    pt.add_argument("job")
    pt.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    pt.add_argument("--png", help="heatmap path (default <job stem>_partition.png)")
    return p


def _agree(comm, err: Exception | None) -> None:
    """Collective: if any rank failed, rank 0 prints the first message and all exit 2."""
    msgs = comm.allgather(None if err is None else str(err))
    bad = [m for m in msgs if m is not None]
    if bad:
        if comm.rank == 0:
            print(bad[0], file=sys.stderr, flush=True)
        _exit_all(EXIT_INPUT)


def _exit_all(code: int) -> None:
    """Exit with ``code`` on a path every rank takes together.

    A plain ``sys.exit`` under ``python -m mpi4py`` becomes ``MPI_Abort`` (noisy, and it
    kills the other ranks before they print); since all ranks agreed, finalise cleanly.
    """
    from .comm import mpi_module

    sys.stdout.flush()
    sys.stderr.flush()
    mpi_module().Finalize()
    os._exit(code)


def cmd_run(args, comm) -> int:
    from . import config, simulation
    from .io.results import ResultsWriter
    from .progress import Progress, summary_table
    from .runtime import versions

    t_start = time.perf_counter()
    err, cfg, setup, out = None, None, None, None
    try:
        cfg = config.load(args.job, args.overrides)
        out = Path(args.out or Path("runs") / cfg.run.name)
        if comm.rank == 0 and (out / "results.h5").exists() and not args.force:
            raise HpcflError(f"{out / 'results.h5'} already exists; choose another --out, or pass --force to overwrite it")
        setup = simulation.prepare(cfg, comm)
    except HpcflError as exc:
        err = exc
    _agree(comm, err)

    devices = comm.gather(str(setup.device), root=0)
    writer = progress = None
    if comm.rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        from . import data
        counts = data.class_counts(setup.dataset.y_train, setup.parts, setup.dataset.num_classes)
        attrs = {"config": cfg.to_dict(), "config_sha256": cfg.digest(), "versions": versions(),
                 "world_size": comm.size, "devices": devices, "seed": cfg.run.seed}
        writer = ResultsWriter(out / "results.h5", attrs, counts)
        progress = Progress(cfg.run.rounds, cfg.runtime.progress)
        print(f"hpcfl: {cfg.run.name}: {cfg.algorithm.name} on {cfg.data.dataset}, {cfg.data.num_clients} clients, "
              f"{comm.size} rank(s), device {setup.device}, {setup.threads} thread(s)/rank; startup "
              f"{time.perf_counter() - t_start:.1f} s", flush=True)
    history = []

    def on_round(metrics, clients):
        writer.append_round(metrics, clients)
        history.append(metrics)
        progress.update(metrics)

    x = simulation.run(setup, on_round=on_round)
    if comm.rank == 0:
        writer.write_final(x, setup.model.names, setup.model.shapes)
        writer.close()
        progress.close()
        print(summary_table(history, time.perf_counter() - t_start, out / "results.h5"), flush=True)
    return 0


def cmd_info(args, comm) -> int:
    import torch

    from .comm import node_layout
    from .runtime import pick_device, versions

    local_rank, local_size = node_layout(comm)
    dev = pick_device("auto", local_rank)
    rows = comm.gather((comm.rank, local_rank, local_size, str(dev), torch.get_num_threads()), root=0)
    if comm.rank == 0:
        print(f"ranks: {comm.size}")
        for r, lr, ls, d, th in rows:
            print(f"  rank {r}: node-local {lr}/{ls}, device {d}, torch threads {th}")
        print(f"cuda devices on rank 0's node: {torch.cuda.device_count()}")
        for k, v in versions().items():
            print(f"{k}: {v}")
    return 0


def cmd_partition(args, comm) -> int:
    from . import config, data
    from .data.preview import heatmap_png, summary

    if comm.rank != 0:
        return 0
    t0 = time.perf_counter()
    try:
        cfg = config.load(args.job, args.overrides)
        # Labels only: the partition is the same, and no image is generated or normalised.
        ds = data.load_labels(cfg.data.dataset, cfg.dataset_options, cfg.data.root, cfg.run.seed)
        parts = data.make_partition(cfg.data.partition, ds.y_train, cfg.data.num_clients,
                                    cfg.partition_options, cfg.run.seed, ds)
    except HpcflError as exc:
        print(exc, file=sys.stderr)
        return EXIT_INPUT
    print(summary(parts, ds.y_train, ds.num_classes))
    png = Path(args.png or f"{Path(args.job).stem}_partition.png")
    counts = data.class_counts(ds.y_train, parts, ds.num_classes)
    heatmap_png(counts, png, f"{cfg.data.dataset}: {cfg.data.partition}, {len(parts)} clients")
    print(f"heatmap: {png}  ({time.perf_counter() - t0:.1f} s)")
    return 0


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    from .comm import world

    comm = world()
    handler = {"run": cmd_run, "info": cmd_info, "partition": cmd_partition}[args.cmd]
    return handler(args, comm)


if __name__ == "__main__":
    sys.exit(main())
