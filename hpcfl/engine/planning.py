"""Before a run starts: what rank 0 finds in ``--out`` (fresh, resume, done), which checkpoint to
resume from, and, once every rank is ready, the changes to files that start it (docs/reliability.md);
and start-up's agreement between ranks (:func:`agree`), HDF5 locking and a process whose HDF5 is no
longer usable.

:func:`plan_run` only reads; :func:`commit` is the first step that changes anything.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import HpcflError
from ..io import rundir
from ..parallel.meet import Abort, meet


@dataclass
class Plan:
    """What rank 0 decided from the job and the files in ``--out`` (nothing changed yet)."""

    mode: str                      # "fresh", "resume", "done" or "diverged" (nothing to do either way)
    run_id: str
    ckpt_dir: Path
    loaded: object = None          # hpcfl.io.checkpoint.Loaded when resuming
    notes: list = field(default_factory=list)
    replace: list = field(default_factory=list)   # the old run's files and export folders, set aside by --force


def plan_run(cfg, out: Path, force: bool = False) -> Plan:
    """Rank 0: fresh start, resume from a checkpoint, or already done (docs/reliability.md).

    Only reads: every path and ownership problem is raised here, before the job's data
    is loaded and long before anything is moved or written (see :func:`commit`). ``force``: start
    over (``--force``), setting the old run's files aside.
    """
    from .. import config
    from ..config import notices
    from . import resume
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
    if force:
        rundir.check_owner(ckpt_dir, None, path)
        exports = [out / name for name in rundir.EXPORT_FOLDERS]   # they describe the old run: never beside the new
        old = [path] + exports + ([p for _, p in store.list()] + [ckpt_dir / rundir.MARKER] if store else [])
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
        raise HpcflError(f"{out} holds results of a different job: it {job_difference(old, cfg, unsafe)}; to keep "
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


def job_difference(old: dict, cfg, keys: list[str]) -> str:
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


def settle(cfg, setup, plan: Plan) -> None:
    """Rank 0, once the job is set up: resume from the newest checkpoint whose arrays fit it
    (:func:`hpcfl.engine.resume.settle`); says which one and why others were passed over."""
    from . import resume
    from ..io.checkpoint import CheckpointStore

    chosen, warnings = resume.settle(setup, CheckpointStore(plan.ckpt_dir, keep=cfg.checkpoint.keep), plan.loaded,
                                     cfg)
    if chosen is not plan.loaded:
        plan.notes = [n for n in plan.notes if not n.startswith("resuming from ")] + warnings + [
            f"resuming from {chosen.path.name} (written after round {chosen.round})"]
        plan.loaded = chosen


def commit(cfg, out: Path, plan: Plan):
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


# ---- start-up's helpers (hpcfl.engine.job.JobRun.plan and commit) ----------------------------

def agree(comm, err: Exception | None, what: str) -> None:
    """Collective: if any rank failed, every rank raises the first failed rank's error (that rank its
    own, with its traceback; the others a copy), and the ``--out`` that planning locked is released
    (and removed if planning created it): nothing was started. Every rank meets at ``what`` through
    :func:`hpcfl.parallel.meet.meet`: a rank whose peers do not come ends them all within seconds."""
    gathered = meet(comm, err, what, abort=Abort(undo=rundir.abandon))
    first = next((r for r, e in enumerate(gathered) if e is not None), None)
    if first is not None:
        rundir.abandon()
        raise err if comm.rank == first else gathered[first]


def set_locking(on: bool) -> None:
    """HDF5 file locking for this run's results and checkpoints (``results.locking``)."""
    from ..io import results as results_io
    from ..io.checkpoint import configure_locking

    configure_locking(on)
    results_io.configure(locking=on)


def usable_hdf5() -> None:
    """Refuse a run in a process where an HDF5 write failed: the library keeps objects it could not
    close, and touching HDF5 again there can crash the process (docs/python.md, "After a WriteError")."""
    from ..io.h5check import FAILED_WRITE

    if FAILED_WRITE:
        raise HpcflError(f"a write in {FAILED_WRITE[0]} failed earlier in this process (a full disk), and the HDF5 "
                         f"library cannot be used safely in it any more; start a new process (in a notebook: "
                         f"restart the kernel) once there is space, and run again to resume")
