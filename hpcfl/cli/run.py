"""``hpcfl run``: plan (fresh, resume, done), commit (--out, the checkpoint folder), then the
rounds, their records and checkpoints, and the summary (docs/reliability.md).

Input errors (bad config, missing data files, more ranks than clients) are collected
from all ranks, printed once by rank 0, and end every rank with exit code 2; the other
exit codes are :mod:`hpcfl.parallel.exits`'.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

from ..engine.planning import Plan, _commit, _job_difference, _settle, plan_run  # noqa: F401
from ..errors import HpcflError
from ..io import rundir   # light (no h5py): the lock and --out checks every path of a run uses
from ..parallel.exits import EXIT_INPUT, exit_all


def agree(comm, err: Exception | None) -> None:
    """Collective: if any rank failed, rank 0 prints the first message and all exit 2."""
    msgs = comm.allgather(None if err is None else str(err))
    bad = [m for m in msgs if m is not None]
    if bad:
        if comm.rank == 0:
            print(bad[0], file=sys.stderr, flush=True)
        rundir.abandon()   # the run will not start: release --out (and remove it if planning created it)
        exit_all(EXIT_INPUT)


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


def batching(flush_seconds: float) -> dict:
    """How rank 0 buffers rounds before writing them to results.h5 (``results.flush_seconds``; 0:
    every round): at most that many seconds, and a bounded number of client rows (about 40 MB)."""
    return {"batch_seconds": float(flush_seconds), "batch_rows": 1 << 18}


def _close(writer) -> None:
    """Rank 0: write the buffered rounds and close results.h5; a write that fails (disk full) is
    reported, and the run's exit code stays its own (those rounds follow the newest checkpoint)."""
    try:
        writer.close()
    except HpcflError as exc:
        print(f"hpcfl: {exc}", file=sys.stderr, flush=True)


def cmd_run(args, comm) -> int:
    """``hpcfl run``. Every path that returns (finished, nothing to do, diverged, an operation
    without a deterministic kernel) releases the ``--out`` lock planning took, so that a caller in
    this process (the next point of ``hpcfl sweep``, tests) can lock its own; the other exits end
    the process, which releases it."""
    from .progress import fit_to_terminal

    restore = fit_to_terminal() if comm.rank == 0 else None   # no line wider than the user's terminal
    try:
        return _run(args, comm)
    finally:
        rundir.unlock()
        from .. import signals
        signals.end_startup()   # however _run ended: a later stop in this process is a request again
        if restore:
            restore()


def _run(args, comm) -> int:
    from .. import signals

    signals.begin_startup(undo=rundir.abandon)   # (again, for sweep's points): nothing is written until end_startup
    from .. import config
    from ..config import notices
    from ..engine import resume, simulation
    from ..engine.control import RunControl, fault_notice, final_write, write_failed
    from ..engine.watchdog import Limits
    from ..io.heldir import DirectoryMoved
    from ..io.results import ResultsWriter, metric_rows
    from ..parallel.exits import EXIT_DIVERGED, EXIT_GUARD, EXIT_RESUMABLE, EXIT_WRITE
    from ..parallel.runtime import NondeterministicOp, versions
    from .progress import Progress, summary_table

    t_start = time.perf_counter()
    err, cfg, setup, out, plan, store, aside = None, None, None, None, None, None, None
    try:
        fault = fault_notice(os.environ.get("HPCFL_FAULT", ""))   # a test hook: checked before anything is made
        if fault and comm.rank == 0:
            print(fault, file=sys.stderr, flush=True)
        cfg = config.load(args.job, args.overrides, files=True)
        out = Path(args.out or Path("runs") / cfg.run.name)
        if not cfg.results.locking:
            from ..io import results as results_io
            from ..io.checkpoint import configure_locking
            configure_locking(False)
            results_io.configure(locking=False)
        if comm.rank == 0:
            plan = plan_run(cfg, out, args)
        setup = simulation.prepare(cfg, comm)
        if comm.rank == 0 and plan.mode == "resume":   # a checkpoint that does not fit the job: an older one
            _settle(cfg, setup, plan)
    except HpcflError as exc:
        err = exc
    agree(comm, err)
    if any(comm.allgather(signals.stop_requested())):   # stopped during start-up: nothing is written
        if comm.rank == 0:
            print("hpcfl: stopped during start-up; nothing was written or changed. Run the same command again to "
                  "start", file=sys.stderr, flush=True)
        rundir.abandon()
        exit_all(EXIT_RESUMABLE)
    signals.end_startup()
    # The job is valid and its data found on every rank: only now may rank 0 change files.
    if comm.rank == 0 and plan.mode not in ("done", "diverged"):
        try:
            store, aside = _commit(cfg, out, plan)
        except HpcflError as exc:
            err = exc
    agree(comm, err)
    loaded = plan.loaded if comm.rank == 0 else None
    mode, start = comm.bcast((plan.mode, loaded.round if loaded else 0) if comm.rank == 0 else None, root=0)
    if comm.rank == 0:
        for note in plan.notes:
            print(f"hpcfl: {note}", flush=True)
    if mode in ("done", "diverged"):   # the notes said why a diverged run is not redone
        signals.ignore()
        if comm.rank == 0 and mode == "done":
            print(f"hpcfl: {out} is already finished ({start} rounds); nothing to do", flush=True)
        return 0

    sim_time = comm.bcast(loaded.meta.get("sim_time", 0.0) if loaded else 0.0, root=0)
    x = resume.read(setup, loaded) if mode == "resume" else None
    placed = comm.gather((str(setup.device), setup.placement.describe(comm.rank)), root=0) or []
    devices = [d for d, _ in placed]
    writer = progress = None
    history: list[dict] = []
    fair: list[tuple] = []   # (round, each client's accuracy) of this process's evaluated rounds
    if comm.rank == 0:
        counts = setup.class_counts
        attrs = {"config": cfg.to_dict(), "config_sha256": cfg.digest(), "run_id": plan.run_id, "versions": versions(),
                 "world_size": comm.size, "devices": devices, "seed": cfg.run.seed}
        try:
            writer = ResultsWriter(out / "results.h5", attrs, counts, resume_at=start if mode == "resume" else None,
                                   metric_fields=setup.algo.round_fields, client_fields=setup.algo.client_fields,
                                   client_eval=setup.client_eval is not None,
                                   **batching(cfg.results.flush_seconds))
            history = metric_rows(out / "results.h5") if mode == "resume" else []
        except HpcflError as exc:   # a full disk, or a results file damaged since planning
            err = exc
    write_failed(comm, err)
    if comm.rank == 0:
        auto = " (runtime.threads = 0: one for a model under 1M parameters)" if not cfg.runtime.threads \
            and setup.threads == 1 else ""
        print(f"hpcfl: {cfg.run.name}: {cfg.algorithm.name} on {cfg.data.dataset}, {cfg.data.num_clients} clients, "
              f"{comm.size} rank(s), device {setup.device}, {setup.threads} thread(s)/rank{auto}; startup "
              f"{time.perf_counter() - t_start:.1f} s", flush=True)
        if any(d != "cpu" for d in devices):   # which GPU each rank took (docs/guide.md, "Devices")
            for _, line in placed:
                print(f"hpcfl: {line}", flush=True)
        for note in (*cfg.notes, *notices.start_notes(cfg), *setup.algo.notes):
            print(f"hpcfl: note: {note}", flush=True)
        accuracy = getattr(setup.model.module, "loss", None) is None   # the quadratic has a loss, no accuracy
        progress = Progress(cfg.run.rounds, cfg.runtime.progress, accuracy=accuracy, start=start)

    def on_round_failed(exc):   # disk full: say so, end every rank; checkpoints stay valid
        print(f"hpcfl: {exc}", file=sys.stderr, flush=True)
        writer.close_after_failure()
        if comm.size == 1:   # no exit handlers: HDF5's may crash after a write that failed
            sys.stdout.flush()
            os._exit(EXIT_WRITE)
        comm.Abort(EXIT_WRITE)   # the other ranks may be in a collective: only an abort reaches them

    def on_round(metrics, clients):
        try:
            writer.append_round(metrics, clients)
        except HpcflError as exc:
            on_round_failed(exc)
        history.append(metrics)
        progress.update(metrics)

    def on_eval(round_, accuracy, loss):
        try:
            writer.append_client_eval(round_, accuracy, loss, setup.client_eval.sizes)
        except HpcflError as exc:
            on_round_failed(exc)
        fair.append((round_, accuracy))

    def checkpoint(done, x_now, sim_now):
        nonlocal aside
        # results.h5 on disk first, so that it is never behind the checkpoint (docs/reliability.md)
        failure = resume.write(setup, x_now, store, done, meta={"sim_time": sim_now, "config": cfg.to_json()},
                               manifest={"world_size": comm.size, "config_sha256": cfg.digest(),
                                         "versions": versions()}, before=writer.sync if comm.rank == 0 else None)
        if comm.rank == 0 and failure is not None:   # a swapped checkpoint folder is the user's to fix: exit 2
            failure = (str(failure), EXIT_INPUT if isinstance(failure, DirectoryMoved) else EXIT_WRITE)
        if comm.rank == 0 and failure is None and aside is not None:   # the new run can now resume on its own
            shutil.rmtree(aside, ignore_errors=True)
            print(f"hpcfl: deleted the previous run set aside in {aside}", flush=True)
            aside = None
        failure = comm.bcast(failure, root=0)
        if failure:
            if comm.rank == 0:
                print(f"hpcfl: {failure[0]}", file=sys.stderr, flush=True)
                writer.close_after_failure()
            exit_all(failure[1])

    control = RunControl(comm, cfg.guard, Limits.of(cfg.watchdog, comm.size), cfg.checkpoint.every_minutes,
                         resumed_from=start, out=out)
    try:
        x = simulation.run(setup, on_round=on_round, start=start, sim_time=sim_time, x=x, control=control,
                           checkpoint=checkpoint, on_eval=on_eval)
    except simulation.Diverged as exc:
        if comm.rank == 0:
            final_write(writer.mark_diverged, exc.round)
            _close(writer)
            progress.close()
            print(f"hpcfl: {exc}", file=sys.stderr, flush=True)
            print(summary_table(history, time.perf_counter() - t_start, out / "results.h5", _columns()), flush=True)
        control.close()
        return EXIT_DIVERGED
    except NondeterministicOp as exc:   # raised where the operation ran: perhaps on some ranks only
        if comm.rank == 0:
            _close(writer)
        print(f"hpcfl: {exc}", file=sys.stderr, flush=True)
        if comm.size > 1:
            comm.Abort(EXIT_INPUT)      # the other ranks may wait in a collective: end them all
        control.close()
        return EXIT_INPUT
    except (simulation.Stopped, simulation.GuardStop) as exc:
        resumable = isinstance(exc, simulation.Stopped)
        if comm.rank == 0:
            _close(writer)
            progress.close()
            what = "resumable: run the same command again to continue" if resumable else "stopped by the guard"
            print(f"hpcfl: {exc} ({what})", file=sys.stderr, flush=True)
        exit_all(EXIT_RESUMABLE if resumable else EXIT_GUARD)
    control.phase("final", cfg.run.rounds - 1)   # rank 0 copies results.h5: a first of its kind, start-up allowance
    if comm.rank == 0:
        final_write(writer.write_final, x, setup.model.names, setup.model.shapes, setup.dataset.input_shape,
                    setup.dataset.num_classes)
        _close(writer)
        progress.close()
    signals.ignore()   # finished: a stop signal from here on changes nothing
    if comm.rank == 0:
        print(summary_table(history, time.perf_counter() - t_start, out / "results.h5", _columns()), flush=True)
        for line in closing_lines(fair, time.perf_counter() - t_start):
            print(line, flush=True)
    control.close()   # another run may follow in this process (hpcfl sweep): end this one's watchdog
    return 0
