"""``hpcfl run``: parse, call :func:`hpcfl.api.run`, print what ended the run and its summary, and
give the exit code (:mod:`hpcfl.parallel.exits`). The run itself is :class:`hpcfl.engine.job.JobRun`.

Errors come back as :mod:`hpcfl.errors`' exceptions on every rank together; rank 0 prints the
message once and every rank returns the error's ``exit_code``: input errors (bad config, missing
data files, more ranks than clients) as they are, errors of a run that had started after
``hpcfl:``. A run that diverged returns its results and exits 4.
"""

from __future__ import annotations

import os
import sys
import time

from ..errors import EXIT_DIVERGED, HpcflError, RunError


def _columns() -> int | None:
    """The terminal's width for the summary, or None when stdout is not a terminal (a log)."""
    from .progress import terminal_width

    return terminal_width(sys.stdout) if sys.stdout.isatty() else None


def process_seconds() -> float | None:
    """Seconds since this process started (Linux's /proc: Python's start-up and the imports count), or
    None where there is no /proc."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()   # after the command name, which may hold spaces
        with open("/proc/uptime") as f:
            up = float(f.read().split()[0])
        return max(0.0, up - int(fields[19]) / os.sysconf("SC_CLK_TCK"))   # field 22: start time in ticks
    except (OSError, ValueError, IndexError):
        return None


def closing_lines(fair: list, command_s: float) -> list[str]:
    """After the summary table: the clients' accuracies at the last evaluated round (run.eval_clients),
    and what the wall time covers."""
    from ..analysis.fairness import fairness

    lines = []
    if fair:
        rnd, acc = fair[-1]
        f = fairness(acc)
        lines.append(f"per-client test accuracy (round {rnd}, {len(acc)} clients' held-out rows): mean "
                     f"{f['mean']:.4f}, worst 10% {f['worst10']:.4f}, std {f['std']:.4f}, Jain {f['jain']:.4f}")
    age = process_seconds()
    if age is not None and age >= command_s:
        lines.append(f"wall time: {command_s:.1f} s in this run, {age:.1f} s since the process started (Python, "
                     f"imports and anything before this run: {age - command_s:.1f} s)")
    return lines


def message(exc: HpcflError) -> str:
    """How ``hpcfl run`` prints an error: a run's own after ``hpcfl:``, an input error as it is."""
    from ..parallel.runtime import NondeterministicOp

    return f"hpcfl: {exc}" if isinstance(exc, (RunError, NondeterministicOp)) else str(exc)


def run_job(job, out, overrides, force: bool, comm) -> int:
    """Collective: run ``job`` through :func:`hpcfl.api.run`, print, return the exit code (``hpcfl run``
    and each point of ``hpcfl sweep``)."""
    from .. import api
    from ..engine import job as _engine  # noqa: F401  (torch and the engine load before the run's clock starts)
    from .progress import fit_to_terminal, summary_table

    restore = fit_to_terminal() if comm.rank == 0 else None   # no line wider than the user's terminal
    fair: list[tuple] = []   # the last evaluation's (round, each client's accuracy), for the closing line

    def keep_fairness(event):
        if event.kind == "eval":
            fair[:] = [(event.round, event.accuracy)]

    t_start = time.perf_counter()
    try:
        res = api.run(job, out=out, overrides=overrides, force=force, comm=comm, callbacks=[keep_fairness])
        if comm.rank == 0 and res.outcome in ("finished", "diverged"):   # else the run said why nothing ran
            wall = time.perf_counter() - t_start
            rows = [{k: v[i].item() for k, v in res.metrics.items()} for i in range(len(res.metrics["round"]))]
            print(summary_table(rows, wall, res.source, _columns()), flush=True)
            for line in closing_lines(fair, wall) if res.outcome == "finished" else ():
                print(line, flush=True)
        return EXIT_DIVERGED if res.outcome == "diverged" else 0
    except HpcflError as exc:
        if comm.rank == 0:
            print(message(exc), file=sys.stderr, flush=True)
        return exc.exit_code
    finally:
        if restore:
            restore()


def cmd_run(args, comm) -> int:
    """``hpcfl run``. A run that finished (or had finished) ignores stop signals from here on: the
    process only exits, and a late SIGTERM must not turn exit 0 into a kill."""
    from .. import signals

    code = run_job(args.job, args.out, args.overrides, args.force, comm)
    if code == 0:
        signals.ignore()
    return code
