"""Command line: ``hpcfl run | info | partition | report | plot | sweep | config | bench | export | data | plan``.

``run`` is :mod:`hpcfl.cli.run`; ``info`` and ``partition`` are here; the others live in their
own modules (:data:`EXTERNAL`). Exit codes of ``hpcfl run``: 0 finished (or already finished),
2 bad input, 3 stopped by the update guard, 4 diverged (the model became NaN or Inf; the results
up to that round are kept and the file says so), 74 results or a checkpoint could not be written,
75 stopped by a signal with a checkpoint written (run again to resume), anything else a failure
(:mod:`hpcfl.parallel.exits`).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

from ..errors import HpcflError
from ..parallel.exits import EXIT_INPUT, exit_all
from . import run


def _parser() -> argparse.ArgumentParser:
    from ..version import __version__

    p = argparse.ArgumentParser(prog="hpcfl", description="MPI simulator for federated learning")
    p.add_argument("--version", action="version", version=f"hpcfl {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run a job file (under mpiexec for several ranks)")
    r.add_argument("job", help="TOML job file, e.g. jobs/quickstart.toml")
    r.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set algorithm.lr=0.05 (repeatable)")
    r.add_argument("--out", help="output directory (default runs/<run.name>)")
    r.add_argument("--force", action="store_true",
                   help="start over: set the results and checkpoints in --out aside (deleted once the new run "
                        "has written its first checkpoint)")
    r.add_argument("--allow-change", action="append", default=[], metavar="KEY",
                   help="accepted and no longer needed: keys that are safe to change (run.rounds, runtime.threads, "
                        "...) change on resume without it, and the run says which")
    sub.add_parser("info", help="ranks, devices, MPI library and versions")
    pt = sub.add_parser("partition", help="preview a job's client partition without training")
    pt.add_argument("job")
    pt.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    pt.add_argument("--png", help="heatmap path (default <job stem>_partition.png)")
    pt.add_argument("--log", action="store_true", help="log colour scale (for skewed client sizes)")
    for module in EXTERNAL.values():   # each module declares its own arguments
        importlib.import_module(module).add_parser(sub)
    return p


# Commands that live in their own modules: each has add_parser(subparsers) and
# main(args, comm) -> exit code, and imports nothing heavy at module level.
EXTERNAL = {"report": "hpcfl.cli.report", "plot": "hpcfl.cli.plot", "sweep": "hpcfl.cli.sweep",
            "config": "hpcfl.cli.config_cmd", "bench": "hpcfl.bench", "export": "hpcfl.cli.export",
            "data": "hpcfl.cli.data_cmd", "plan": "hpcfl.cli.plan"}


def cmd_info(args, comm) -> int:
    import torch

    from ..parallel.gpus import place
    from ..parallel.runtime import versions

    p = place(comm, "auto", share=True)   # what a run would take (runtime.share_gpus = true: never refused here)
    gpu = f" ({p.gpu}{f', shared by {p.sharing} ranks' if p.sharing > 1 else ''})" if p.gpu else ""
    rows = comm.gather(f"rank {comm.rank}: node-local {p.local_rank}/{p.local_size} on {p.host}, device {p.device}"
                       f"{gpu}, torch threads {torch.get_num_threads()}", root=0)
    if comm.rank == 0:
        print(f"ranks: {comm.size}")
        for line in rows:
            print(f"  {line}")
        print(f"cuda devices on rank 0's node: {torch.cuda.device_count()}")
        for k, v in versions().items():
            print(f"{k}: {v}")
        from ..models import pool  # compiles the C kernels here if no run has yet (once per machine)

        k = pool.kernels()
        if k is None:
            print("cpu pooling kernels: torch's layers (neither a C compiler nor numba, or both switched off)")
        elif k.backend == "numba":
            print("cpu pooling kernels: numba (no C compiler found, or HPCFL_NO_CC is set)")
        else:
            print(f"cpu pooling kernels: C, {k.path}")
        # vectorize = "auto"'s group kernels, likewise compiled here if need be
        from ..client import fused

        g = fused.kernel("logreg")
        form = ("the batched torch step (neither a C compiler nor numba, or both switched off)" if g is None else
                "numba (no C compiler found, HPCFL_NO_CC is set, or the C build was refused)"
                if fused.backend(g) == "numba" else f"C, {g.path}")
        print(f"cpu group kernels (vectorised logreg, quadratic): {form}")
    return 0


def cmd_partition(args, comm) -> int:
    import dataclasses

    from .. import config, data, plugins
    from ..analysis import words
    from ..data.preview import heatmap_png, summary

    if comm.rank != 0:
        return 0
    t0 = time.perf_counter()
    try:
        cfg = config.load(args.job, args.overrides, files=True)
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
    try:
        split = words.partition_words(cfg.data.partition, dataclasses.asdict(cfg.partition_options),
                                      plugins.defaults(type(cfg.partition_options)))   # a plug-in's may be required
        heatmap_png(counts, png, f"{cfg.data.dataset}: {split}, {len(parts)} clients", log=args.log)
    except OSError as exc:
        print(f"--png {png} cannot be written ({exc.strerror or exc}); choose a path in a writable directory",
              file=sys.stderr)
        return EXIT_INPUT
    print(f"heatmap: {png}  ({time.perf_counter() - t0:.1f} s)")
    return 0


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.cmd == "run":      # again for the console script, which does not pass through __main__
        from .. import signals
        signals.install(startup=True)
    from ..parallel import launch
    from ..parallel.comm import world

    comm = world()
    split = launch.split_world(comm.size)
    if split and args.cmd in ("run", "sweep", "info"):   # N srun tasks, each its own world of 1
        if launch.first_task():   # info only reports what it sees; run and sweep stop before --out
            print(f"hpcfl: {split}" + ("" if args.cmd == "info" else " Stopped before touching --out."),
                  file=sys.stderr, flush=True)
        if args.cmd != "info":
            exit_all(EXIT_INPUT)
    if args.cmd in EXTERNAL:
        return importlib.import_module(EXTERNAL[args.cmd]).main(args, comm)
    handler = {"run": run.cmd_run, "info": cmd_info, "partition": cmd_partition}[args.cmd]
    return handler(args, comm)


# Commands that load torch and data: after them the interpreter's teardown (freeing torch's and
# numpy's memory) kept the user waiting 4-7 s after the summary, so they end with
# exit_all (flush, MPI_Finalize, C's exit: no Python teardown). Every rank returns from main together, and every file
# is closed by then (results, checkpoints, figures). The light commands end as usual.
QUICK_EXIT = ("run", "sweep", "bench", "info")


def finish(code: int, argv: list) -> None:
    """End the process after ``main`` returned ``code`` for the command line ``argv`` (its first word)."""
    if argv[:1] and argv[0] in QUICK_EXIT:
        exit_all(code)
    sys.exit(code)


def entry() -> None:
    """The ``hpcfl`` console script: :func:`main`, then :func:`finish` (as ``python -m hpcfl``)."""
    finish(main(), sys.argv[1:2])


if __name__ == "__main__":
    sys.exit(main())
