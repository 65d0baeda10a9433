"""``hpcfl plan JOB --ranks N [--nodes M]``: memory, results and checkpoint sizes before submitting.

::

    hpcfl plan jobs/bench_w.toml --ranks 4 --nodes 2
    hpcfl plan JOB --ranks 64 --nodes 4 --node-memory 256 --measure-disk --json

Runs in one plain process (no mpiexec, no training); the figures are :mod:`hpcfl.engine.plan`'s. Bad
input (a bad job, more ranks than clients) gets the message ``hpcfl run`` would give, exit 2.
"""

from __future__ import annotations

import contextlib
import json
import sys

from ..errors import HpcflError
from ..parallel.exits import EXIT_INPUT


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="memory per rank and node, results.h5 and checkpoint sizes, before a run",
                       description="Estimate a job's memory per rank and per node, its results.h5 bytes, its "
                                   "checkpoint's size and save time, and warn about what would fail on a cluster.")
    p.add_argument("job", help="TOML job file, e.g. jobs/quickstart.toml")
    p.add_argument("--ranks", type=int, default=1, help="MPI ranks of the run (default 1)")
    p.add_argument("--nodes", type=int, default=1, help="nodes the ranks spread over (default 1)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, as for hpcfl run (repeatable)")
    p.add_argument("--node-memory", type=float, metavar="GB", help="a node's memory (default this machine's)")
    p.add_argument("--signal-margin", type=float, default=300.0, metavar="S",
                   help="seconds between Slurm's USR1 and the kill (templates: --signal=B:USR1@300)")
    p.add_argument("--measure-disk", action="store_true",
                   help="time a 256 MB write+fsync in the output folder instead of the documented save rate")
    p.add_argument("--out", help="the run's output folder (for --measure-disk; default runs/<run.name>)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB" if n >= 1e5 else f"{n / 1e3:,.1f} KB"


def text(plan) -> str:
    """The plan as a readable table."""
    where = ("read from the cache: mapped, one copy per node" if plan.dataset_cached else
             ("a plug-in's: " if plan.dataset_cached is None else "") + (
                 "loaded by each node's first rank, its arrays of 1 MiB or more in shared windows"
                 if plan.ranks_per_node > 1 else "loaded by every rank"))
    lines = [(f"{plan.ranks} rank(s) on {plan.nodes} node(s), {plan.ranks_per_node} per node; {plan.clients} "
              f"clients, up to {plan.clients_per_rank} per rank; {plan.params:,} parameters"), "",
             "memory per rank (resident):"]
    lines += [f"  {k:<42} {_mb(v):>14}" for k, v in plan.terms.items()]
    lines += [f"  {'total per rank':<42} {_mb(plan.rank_bytes):>14}",
              f"memory per node: {_mb(plan.node_bytes)} (dataset {where})"]
    if plan.dataset_cached:
        now = "the cache held it" if plan.cache_hit else "it was not in the cache: this plan generated it"
        lines.append(f"  on a cache miss (the first run): {_mb(plan.node_bytes_miss)} (at its peak: the generating "
                     f"rank holds its arrays until it has written and mapped the entry); {now}")
    elif plan.node_bytes_miss > plan.node_bytes:
        lines.append(f"  at start-up: {_mb(plan.node_bytes_miss)} (at its peak: the first rank holds the arrays it "
                     f"loaded until it has copied them into the windows)")
    bound = "at most " if plan.results_compressed else ""
    lines += ["", (f"results.h5: {bound}{plan.results_round_bytes / 1e3:,.1f} KB per round, {bound}"
                   f"{_mb(plan.results_total_bytes)} in all (HDF5 chunks of 1024 rows included)"),
              f"checkpoint: {_mb(plan.checkpoint_bytes)}, save ~{plan.save_s:.1f} s at {plan.save_rate}" + (
                  f"; every rank writes its own clients' rows at once, the largest share {_mb(plan.save_share)} "
                  f"(checkpoint.shards)" if 0 < plan.save_share < plan.checkpoint_bytes else "")]
    if plan.results_compressed:
        lines.insert(-1, "  (per-client rows of 1,024 or more a round are stored gzip-compressed, by how much depends "
                         "on their values: 10-13 % for a 100k-client cohort, docs/results.md, 'Large cohorts')")
    lines += ["", "warnings:" if plan.warnings else "warnings: none"] + [f"  - {w}" for w in plan.warnings]
    return "\n".join(lines) + "\n"


def main(args, comm) -> int:
    """``hpcfl plan``: exit 2 on bad input."""
    if comm.rank != 0:
        return 0
    from .. import config
    from ..engine import plan as _plan

    try:
        base = _plan.imported_rss()   # M_0: what a run imports, no data yet
        cfg = config.load(args.job, args.overrides, files=True)
        rate = None
        if args.measure_disk:
            from pathlib import Path
            rate = _plan.measure_disk(Path(args.out or Path("runs") / cfg.run.name))
        node = int(args.node_memory * 1e9) if args.node_memory else None
        with contextlib.redirect_stdout(sys.stderr):   # the data's notes (cached ...): stdout is the plan's
            plan = _plan.estimate(cfg, args.ranks, args.nodes, node, args.signal_margin, rate, base)
    except HpcflError as exc:
        print(exc, file=sys.stderr)
        return EXIT_INPUT
    sys.stdout.write(json.dumps(plan.as_dict(), indent=1) + "\n" if args.json else text(plan))
    return 0
