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
    from ..io import results, resume_check
    from ..io.checkpoint import CheckpointStore
    from ..io.heldir import link_error

    ckpt_dir = Path(cfg.checkpoint.dir or out / "checkpoints")
    if ckpt_dir.is_symlink():   # held open without following links: refused before a probe file goes through it
        raise link_error(ckpt_dir)
    rundir.check_writable(out, "--out", "choose a directory you can write, e.g. --out runs/NAME")
    rundir.check_writable(ckpt_dir, "checkpoint.dir", "set checkpoint.dir to a directory you can write, or leave "
                                                      "it unset for <out>/checkpoints")
    if cfg.results.locking:   # before reading (creates --out): a run started at the same time may be planning too
        rundir.lock(out)
    rundir.check_scratch(out)
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
        raise HpcflError(f"{out} holds results of a different job: it {_job_difference(old, cfg, unsafe)}; to keep "
                         f"both runs choose another --out (e.g. --out {out.parent / (out.name + '-2')}), or pass "
                         f"--force to set the old run aside and start over")
    rundir.check_owner(ckpt_dir, old_id, path)
    run_id = old_id or rundir.new_run_id()
    said = [f"resuming with {notices.describe_changes(old, cfg, changed)} (safe to change)"] if changed else []
    if state == "diverged":   # resuming would only diverge again
        return Plan("diverged", run_id, ckpt_dir, None, [
            f"{path} ended diverged in round {results.diverged_round(path)}; nothing to do (pass --force to "
            f"start over, e.g. with a lower algorithm.lr)"])
    if store is None:
        return Plan("fresh", run_id, ckpt_dir, notes=[f"no checkpoint in {ckpt_dir}; starting at round 1"])
    loaded = store.load_latest(keep_arrays=False)   # verified a block at a time; read on resume
    notes = said + [f"checkpoint {p.name} skipped: {why}" for p, why in store.last_skipped]
    if loaded is not None:
        resume.check_job(loaded, cfg)   # a checkpoint of another job is never resumed from
        # results.h5, the checkpoint and run.rounds agree on the rounds, or nothing is resumed (exit 2)
        resume_check.check(path, loaded.path, loaded.round, cfg.run.rounds, resume_check.job_rounds_of(loaded))
    if loaded is None:
        return Plan("fresh", run_id, ckpt_dir, notes=notes + [f"no valid checkpoint in {ckpt_dir}; starting at "
                                                              f"round 1"])
    if state == "finished" and loaded.round >= cfg.run.rounds:
        return Plan("done", run_id, ckpt_dir, loaded, notes)
    return Plan("resume", run_id, ckpt_dir, loaded, notes + [f"resuming from {loaded.path.name} (written "
                                                             f"after round {loaded.round})"])


def _columns() -> int | None:
    """The terminal's width for the summary, or None when stdout is not a terminal (a log)."""
    from .progress import terminal_width

    return terminal_width(sys.stdout) if sys.stdout.isatty() else None


def _job_difference(old: dict, cfg, keys: list[str]) -> str:
    """``differs in algorithm.name "fedavg" -> "fednova" (its preset also sets algorithm.server, ...)``.

    The keys the user changed come first with their values; the ones a changed
    ``algorithm.name`` fills in through its preset (docs/algorithms/) are named after it,
    as following from it, rather than listed as if the user had touched them.
    """
    from ..config import notices
    from ..config.sections import POLICY_SLOTS

    # What a preset sets: the policy slots, and the option tables of the policies they choose.
    preset_made = lambda k: k.startswith("algorithm.") and (
        k.split(".", 1)[1] in POLICY_SLOTS or k.count(".") >= 2)
    implied = [k for k in keys if preset_made(k)] if "algorithm.name" in keys else []
    named = sorted((k for k in keys if k not in implied), key=lambda k: k != "algorithm.name")   # the cause first
    text = f"differs in {notices.describe_changes(old, cfg, named)}"
    if implied:
        text += f" (its preset also sets {', '.join(implied)})"
    return text


def _settle(cfg, setup, plan: Plan) -> None:
    """Rank 0, once the job is set up: resume from the newest checkpoint whose arrays fit it
    (:func:`hpcfl.engine.resume.settle`); says which one and why others were passed over."""
    from ..engine import resume
    from ..io.checkpoint import CheckpointStore

    chosen, warnings = resume.settle(setup, CheckpointStore(plan.ckpt_dir, keep=cfg.checkpoint.keep), plan.loaded,
                                     cfg)
    if chosen is not plan.loaded:
        plan.notes = [n for n in plan.notes if not n.startswith("resuming from ")] + warnings + [
            f"resuming from {chosen.path.name} (written after round {chosen.round})"]
        plan.loaded = chosen


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
        rundir.clear_stall(out)   # an earlier attempt's watchdog note; this attempt has not stalled
        store = CheckpointStore(plan.ckpt_dir, keep=cfg.checkpoint.keep)
        store.hold()   # from here on the run writes only into this folder, wherever it goes (docs/reliability.md)
        rundir.claim(plan.ckpt_dir, plan.run_id, out / "results.h5")
        store.clean_temp()
    except OSError as exc:
        raise HpcflError(f"cannot prepare {out} ({exc}); choose a directory you can write with --out") from None
    return store, aside


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
