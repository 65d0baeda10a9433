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
from dataclasses import dataclass, field
from pathlib import Path

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


@dataclass
class Plan:
    """What rank 0 decided from the job and the files in ``--out`` (nothing changed yet)."""

    mode: str                      # "fresh", "resume", "done" or "diverged" (nothing to do either way)
    run_id: str
    ckpt_dir: Path
    loaded: object = None          # hpcfl.io.checkpoint.Loaded when resuming
    notes: list = field(default_factory=list)
    replace: list = field(default_factory=list)   # the old run's files, set aside by --force


def plan_run(cfg, out: Path, args) -> Plan:
    """Rank 0: fresh start, resume from a checkpoint, or already done (docs/reliability.md).

    Only reads: every path and ownership problem is raised here, before the job's data
    is loaded and long before anything is moved or written (see :func:`_commit`).
    """
    from .. import config
    from ..config import notices
    from ..engine import resume
    from ..io import results
    from ..io.checkpoint import CheckpointStore

    ckpt_dir = Path(cfg.checkpoint.dir or out / "checkpoints")
    rundir.check_writable(out, "--out", "choose a directory you can write, e.g. --out runs/NAME")
    rundir.check_writable(ckpt_dir, "checkpoint.dir", "set checkpoint.dir to a directory you can write, or leave "
                                                      "it unset for <out>/checkpoints")
    if cfg.results.locking:   # before reading (creates --out): a run started at the same time may be planning too
        rundir.lock(out)
    store = CheckpointStore(ckpt_dir, keep=cfg.checkpoint.keep) if ckpt_dir.is_dir() else None
    path = out / "results.h5"
    if args.force:
        rundir.check_owner(ckpt_dir, None, path)
        old = [path] + ([p for _, p in store.list()] + [ckpt_dir / rundir.MARKER] if store else [])
        return Plan("fresh", rundir.new_run_id(), ckpt_dir, replace=old)
    found = rundir.existing_results(path)   # a link, a foreign or a damaged file: refused without --force
    if found is None:
        rundir.check_owner(ckpt_dir, None, path)
        if store and store.list():
            raise HpcflError(f"{store.directory} holds checkpoints but {path} is missing; remove them, choose "
                             f"another --out, or pass --force to start over")
        return Plan("fresh", rundir.new_run_id(), ckpt_dir)
    state, old, old_id = found
    changed, problem = config.resume_changes(old, cfg) if old else ([], None)
    if problem:
        raise HpcflError(f"resuming {out}: {problem}")
    unsafe = [k for k in changed if not config.is_safe_change(k)]
    if unsafe:
        raise HpcflError(f"{out} holds results of a different job (differs in {', '.join(unsafe)}); choose another "
                         f"--out, or pass --force to set the old run aside and start over")
    rundir.check_owner(ckpt_dir, old_id, path)
    run_id = old_id or rundir.new_run_id()
    said = [f"resuming with {notices.describe_changes(old, cfg, changed)} (safe to change)"] if changed else []
    if state == "diverged":   # resuming would only diverge again
        return Plan("diverged", run_id, ckpt_dir, None, [
            f"{path} ended diverged in round {results.diverged_round(path)}; nothing to do (pass --force to "
            f"start over, e.g. with a lower algorithm.lr)"])
    if store is None:
        return Plan("fresh", run_id, ckpt_dir, notes=[f"no checkpoint in {ckpt_dir}; starting at round 1"])
    loaded = store.load_latest()
    notes = said + [f"checkpoint {p.name} skipped: {why}" for p, why in store.last_skipped]
    if loaded is not None:
        resume.check_job(loaded, cfg)   # a checkpoint of another job is never resumed from
    if loaded is None:
        return Plan("fresh", run_id, ckpt_dir, notes=notes + [f"no valid checkpoint in {ckpt_dir}; starting at "
                                                              f"round 1"])
    if state == "finished" and loaded.round >= cfg.run.rounds:
        return Plan("done", run_id, ckpt_dir, loaded, notes)
    return Plan("resume", run_id, ckpt_dir, loaded, notes + [f"resuming from {loaded.path.name} (written "
                                                             f"after round {loaded.round})"])


def _commit(cfg, out: Path, plan: Plan):
    """Rank 0, once every rank has validated the job and found its data: set the old run
    aside (``--force``), create ``--out``, claim the checkpoint directory.

    Returns (checkpoint store, the set-aside folder or None).
    """
    from ..io.checkpoint import CheckpointStore

    try:
        aside = rundir.set_aside(out, plan.replace)
        if aside is not None:
            plan.notes.append(f"--force: the previous run is set aside in {aside}; it is deleted once this run "
                              f"has written its first checkpoint")
        out.mkdir(parents=True, exist_ok=True)
        if cfg.results.locking and not rundir.holding():
            rundir.lock(out)
        rundir.claim(plan.ckpt_dir, plan.run_id, out / "results.h5")
        store = CheckpointStore(plan.ckpt_dir, keep=cfg.checkpoint.keep)
        store.clean_temp()
    except OSError as exc:
        raise HpcflError(f"cannot prepare {out} ({exc}); choose a directory you can write with --out") from None
    return store, aside


def cmd_run(args, comm) -> int:
    """``hpcfl run``. Every path that returns (finished, nothing to do, diverged, an operation
    without a deterministic kernel) releases the ``--out`` lock planning took, so that a caller in
    this process (the next point of ``hpcfl sweep``, tests) can lock its own; the other exits end
    the process, which releases it."""
    try:
        return _run(args, comm)
    finally:
        rundir.unlock()
        from .. import signals
        signals.end_startup()   # however _run ended: a later stop in this process is a request again


def _run(args, comm) -> int:
    from .. import signals

    signals.begin_startup(undo=rundir.abandon)   # (again, for sweep's points): nothing is written until end_startup
    from .. import config
    from ..config import notices
    from ..engine import resume, simulation
    from ..engine.control import RunControl, final_write, write_failed
    from ..io.results import ResultsWriter, metric_rows
    from ..parallel.exits import EXIT_DIVERGED, EXIT_GUARD, EXIT_RESUMABLE, EXIT_WRITE
    from ..parallel.runtime import NondeterministicOp, versions
    from .progress import Progress, summary_table

    t_start = time.perf_counter()
    err, cfg, setup, out, plan, store, aside = None, None, None, None, None, None, None
    try:
        cfg = config.load(args.job, args.overrides)
        out = Path(args.out or Path("runs") / cfg.run.name)
        if not cfg.results.locking:
            from ..io import results as results_io
            from ..io.checkpoint import configure_locking
            configure_locking(False)
            results_io.configure(locking=False)
        if comm.rank == 0:
            plan = plan_run(cfg, out, args)
        setup = simulation.prepare(cfg, comm)
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
    x = resume.restore(setup, loaded.arrays if loaded else None) if mode == "resume" else None
    devices = comm.gather(str(setup.device), root=0)
    writer = progress = None
    history: list[dict] = []
    if comm.rank == 0:
        counts = setup.class_counts
        attrs = {"config": cfg.to_dict(), "config_sha256": cfg.digest(), "run_id": plan.run_id, "versions": versions(),
                 "world_size": comm.size, "devices": devices, "seed": cfg.run.seed}
        try:
            writer = ResultsWriter(out / "results.h5", attrs, counts, resume_at=start if mode == "resume" else None,
                                   metric_fields=setup.algo.round_fields, client_fields=setup.algo.client_fields)
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
        for note in (*cfg.notes, *notices.start_notes(cfg), *setup.algo.notes):
            print(f"hpcfl: note: {note}", flush=True)
        accuracy = getattr(setup.model.module, "loss", None) is None   # the quadratic has a loss, no accuracy
        progress = Progress(cfg.run.rounds, cfg.runtime.progress, accuracy=accuracy, start=start)

    def on_round(metrics, clients):
        try:
            writer.append_round(metrics, clients)
        except HpcflError as exc:     # disk full: say so, end every rank; checkpoints stay valid
            print(f"hpcfl: {exc}", file=sys.stderr, flush=True)
            writer.close_after_failure()
            if comm.size == 1:   # no exit handlers: HDF5's may crash after a write that failed
                sys.stdout.flush()
                os._exit(EXIT_WRITE)
            comm.Abort(EXIT_WRITE)   # the other ranks may be in a collective: only an abort reaches them
        history.append(metrics)
        progress.update(metrics)

    def checkpoint(done, x_now, sim_now):
        nonlocal aside
        arrays = resume.capture(setup, x_now)
        failure = None
        if comm.rank == 0:
            try:
                store.save(done, arrays, meta={"sim_time": sim_now, "config": cfg.to_json()},
                           manifest={"world_size": comm.size, "config_sha256": cfg.digest(), "versions": versions()})
            except HpcflError as exc:
                failure = str(exc)
            if failure is None and aside is not None:   # the new run can now resume on its own
                shutil.rmtree(aside, ignore_errors=True)
                print(f"hpcfl: deleted the previous run set aside in {aside}", flush=True)
                aside = None
        failure = comm.bcast(failure, root=0)
        if failure:
            if comm.rank == 0:
                print(f"hpcfl: {failure}", file=sys.stderr, flush=True)
                writer.close()
            exit_all(EXIT_WRITE)

    control = RunControl(comm, cfg.guard, cfg.watchdog.timeout_s, cfg.checkpoint.every_minutes)
    try:
        x = simulation.run(setup, on_round=on_round, start=start, sim_time=sim_time, x=x, control=control,
                           checkpoint=checkpoint)
    except simulation.Diverged as exc:
        if comm.rank == 0:
            final_write(writer.mark_diverged, exc.round)
            writer.close()
            progress.close()
            print(f"hpcfl: {exc}", file=sys.stderr, flush=True)
            print(summary_table(history, time.perf_counter() - t_start, out / "results.h5"), flush=True)
        control.close()
        return EXIT_DIVERGED
    except NondeterministicOp as exc:   # raised where the operation ran: perhaps on some ranks only
        if comm.rank == 0:
            writer.close()
        print(f"hpcfl: {exc}", file=sys.stderr, flush=True)
        if comm.size > 1:
            comm.Abort(EXIT_INPUT)      # the other ranks may wait in a collective: end them all
        control.close()
        return EXIT_INPUT
    except (simulation.Stopped, simulation.GuardStop) as exc:
        resumable = isinstance(exc, simulation.Stopped)
        if comm.rank == 0:
            writer.close()
            progress.close()
            what = "resumable: run the same command again to continue" if resumable else "stopped by the guard"
            print(f"hpcfl: {exc} ({what})", file=sys.stderr, flush=True)
        exit_all(EXIT_RESUMABLE if resumable else EXIT_GUARD)
    if comm.rank == 0:
        final_write(writer.write_final, x, setup.model.names, setup.model.shapes, setup.dataset.input_shape,
                    setup.dataset.num_classes)
        writer.close()
        progress.close()
    signals.ignore()   # finished: a stop signal from here on changes nothing
    if comm.rank == 0:
        print(summary_table(history, time.perf_counter() - t_start, out / "results.h5"), flush=True)
    control.close()   # another run may follow in this process (hpcfl sweep): end this one's watchdog
    return 0
