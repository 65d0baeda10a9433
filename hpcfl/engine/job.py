"""One run of a job, start to end: what :func:`hpcfl.run` and ``hpcfl run`` do (docs/python.md).

:meth:`JobRun.run` reads top to bottom, one method a step:

1. plan     every rank reads the job and prepares it (data, partition, model, policies); rank 0
            reads ``--out`` and decides: fresh, resume, or nothing to do. Nothing is written.
2. commit   rank 0 sets an old run aside (``force``), creates ``--out`` and claims the
            checkpoint folder: the first change to any file
3. open     the checkpoint's state on every rank; rank 0 creates or reopens results.h5 and
            says what runs; the :class:`~hpcfl.engine.events.Start` event
4. loop     the rounds (:func:`hpcfl.engine.simulation.run`): records, callbacks, checkpoints,
            stop requests, guards
5. finish   rank 0 writes the final model (or marks the run diverged); the End event; every
            rank returns the same :class:`~hpcfl.io.reader.Results`

Every error is one of :mod:`hpcfl.errors`', raised on every rank together. Two kinds of failure
still end the process, because the other ranks may be blocked in a collective that only an abort
reaches: a rank that dies or freezes (the watchdog), and an operation without a deterministic
kernel on some ranks of a multi-rank run.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

from .. import config, signals
from ..errors import EXIT_INPUT, CallbackError, GuardStopped, HpcflError, RunError, RunStopped, WriteError
from ..io import rundir
from ..parallel.runtime import NondeterministicOp, versions
from ..parallel.shared import NodeTables
from . import planning, resume, simulation
from .control import RunControl, fault_notice, write_failed
from .setup import release_tables, share_tables
from .events import Callbacks
from .watchdog import Limits, checkpoint_note


def batching(flush_seconds: float) -> dict:
    """How rank 0 buffers rounds before writing them to results.h5 (``results.flush_seconds``; 0:
    every round): at most that many seconds, and a bounded number of client rows (about 40 MB)."""
    return {"batch_seconds": float(flush_seconds), "batch_rows": 1 << 18}


class JobRun:
    """One run of ``job`` on ``comm`` (every rank builds one and calls :meth:`run`).

    Parameters
    ----------
    job : path, TOML text or dict (:func:`hpcfl.config.read_any`)
    comm : MPI communicator
    out : output folder; default ``runs/<run.name>``
    overrides : ``--set`` texts, ``"section.key=value"``
    force : set the old run in ``out`` aside and start over
    callbacks : callables taking one event (:mod:`hpcfl.engine.events`), called on rank 0
    """

    def __init__(self, job, comm, out=None, overrides=(), force: bool = False, callbacks=()):
        self.job, self.comm, self.out_arg, self.overrides, self.force = job, comm, out, list(overrides), force
        self.events = Callbacks(callbacks, comm.rank == 0)
        self.cfg = self.setup = self.planned = self.store = self.aside = self.writer = self.control = None
        self.tables = None   # the node's shared windows (hpcfl.parallel.shared.NodeTables), from set-up to the end
        self.out: Path | None = None
        self.mode, self.start, self.done, self.broken, self.run_id = "fresh", 0, 0, False, ""
        self.started = self.ended = False   # whether the Start and End events were sent
        self.t0 = time.perf_counter()

    def run(self):
        """Plan, commit, open, loop, finish; returns the run's Results on every rank."""
        signals.begin_startup(undo=rundir.abandon)   # nothing is written until the commit
        try:
            self.plan()
            self.commit()
            if self.mode in ("done", "diverged"):
                if self.comm.rank == 0 and self.mode == "done":
                    print(f"hpcfl: {self.out} is already finished ({self.start} rounds); nothing to do", flush=True)
                try:
                    return self.results(f"already {'finished' if self.mode == 'done' else 'diverged'}")
                finally:
                    self._release()
            self.open()
            return self.loop()
        except HpcflError:   # raised on every rank together: the node's windows go (another run may follow)
            self._release()
            raise
        except BaseException as exc:   # not one of hpcfl's endings (a bug, an interrupt): close what is open
            self._close_results()        # (the windows are left to MPI_Finalize: the other ranks may be elsewhere)
            if self.started and not self.ended:
                self.events.end("failed", self.done, self.out, f"{type(exc).__name__}: {exc}")
            raise
        finally:
            if self.control is not None:
                self.control.close()   # another run may follow in this process: end this one's watchdog
            rundir.unlock()
            signals.end_startup()
            planning.set_locking(True)

    # ---- 1. plan -----------------------------------------------------------------------------

    def plan(self) -> None:
        """Every rank: read and check the job, find its data, build everything for the rounds; rank 0
        also reads ``--out`` (:func:`hpcfl.engine.planning.plan_run`). One problem on any rank is
        raised on every rank (exit 2); a stop signal meanwhile ends the run with nothing written."""
        comm, err = self.comm, None
        try:
            planning.usable_hdf5()
            fault = fault_notice(os.environ.get("HPCFL_FAULT", ""))   # a test hook: checked before anything is made
            if fault and comm.rank == 0:
                print(fault, file=sys.stderr, flush=True)
            self.cfg = cfg = config.load(self.job, self.overrides, files=True)
            self.out = Path(self.out_arg or Path("runs") / cfg.run.name)
            planning.set_locking(cfg.results.locking)
            if comm.rank == 0:
                self.planned = planning.plan_run(cfg, self.out, self.force)
        except HpcflError as exc:
            err = exc
        # Rank 0's refusal must reach every rank here, before set-up: set-up's own collectives
        # (placement, the per-node data) would otherwise wait for a rank 0 that waits here.
        planning.agree(comm, err, "the end of planning")
        self._stopped()
        # the node's shared windows: the dataset's (loaded once per node) now, the client tables' below
        self.tables = NodeTables(comm)
        try:
            self.setup = simulation.prepare(self.cfg, comm, self.tables)
            if comm.rank == 0 and self.planned.mode == "resume":   # a checkpoint that does not fit: an older one
                planning.settle(self.cfg, self.setup, self.planned)
        except HpcflError as exc:
            err = exc
        planning.agree(comm, err, "the end of set-up")
        self._stopped()
        # every rank's set-up succeeded: the read-only per-client tables go to the node's shared memory
        share_tables(self.setup, comm)
        signals.end_startup()

    def _stopped(self) -> None:
        """Collective: a stop signal on any rank during start-up ends the run, nothing written."""
        if any(self.comm.allgather(signals.stop_requested())):
            rundir.abandon()
            raise RunStopped("stopped during start-up; nothing was written or changed. Run the same command again "
                             "to start")

    # ---- 2. commit ---------------------------------------------------------------------------

    def commit(self) -> None:
        """Rank 0, once every rank has the job ready: the first changes to files
        (:func:`hpcfl.engine.planning.commit`); then every rank learns the mode and the start round."""
        comm, err = self.comm, None
        if comm.rank == 0 and self.planned.mode not in ("done", "diverged"):
            try:
                self.store, self.aside = planning.commit(self.cfg, self.out, self.planned)
            except HpcflError as exc:
                err = exc
        planning.agree(comm, err, "the end of the commit")
        loaded = self.planned.loaded if comm.rank == 0 else None
        self.mode, self.start, self.run_id = comm.bcast(
            (self.planned.mode, loaded.round if loaded else 0, self.planned.run_id) if comm.rank == 0 else None,
            root=0)
        self.done = self.start
        if comm.rank == 0:
            for note in self.planned.notes:
                print(f"hpcfl: {note}", flush=True)

    # ---- 3. open -----------------------------------------------------------------------------

    def open(self) -> None:
        """Every rank: the resumed model and state; rank 0: results.h5 (created, or reopened at the
        checkpoint's round) and what runs where; then the Start event. A failure of either, or of a
        start callback, is raised on every rank."""
        comm, s = self.comm, self.setup
        loaded = self.planned.loaded if comm.rank == 0 else None
        self.sim_time = comm.bcast(loaded.meta.get("sim_time", 0.0) if loaded else 0.0, root=0)
        self.x = resume.read(s, loaded) if self.mode == "resume" else None
        placed = comm.gather((str(s.device), s.placement.describe(comm.rank)), root=0) or []
        err = None
        if comm.rank == 0:
            try:
                self.writer = self._writer([d for d, _ in placed])
            except HpcflError as exc:   # a full disk, or a results file damaged since planning
                err = exc
        failed = write_failed(comm, err)
        if failed:
            raise failed
        if comm.rank == 0:
            self._say_start(placed)
            cfg = self.cfg
            self.events.start(job=cfg.to_dict(), out=self.out, run_id=self.planned.run_id, rounds=cfg.run.rounds,
                              start_round=self.start, world_size=comm.size, devices=tuple(d for d, _ in placed),
                              classifier=getattr(s.model.module, "loss", None) is None)
        self.started = True
        failure = self._agreed(self.events.failure)
        if failure is not None:
            self._end("stopped", failure.after("the run stopped before its first round (no round was written): "
                                               "fix the callback and run again"))

    def _writer(self, devices: list):
        """Rank 0: results.h5, new or reopened at the checkpoint's round."""
        from ..io.panel import client_panel
        from ..io.results import FinalModel, ResultsWriter

        cfg, s, comm = self.cfg, self.setup, self.comm
        attrs = {"config": cfg.to_dict(), "config_sha256": cfg.digest(), "run_id": self.planned.run_id,
                 "versions": versions(), "world_size": comm.size, "devices": devices, "seed": cfg.run.seed}
        if cfg.plugins():   # which code of your own ran: file and SHA-256, the latest and each segment's
            attrs["plugins"] = cfg.plugins()
            attrs["versions"] = {**attrs["versions"], "plugins": cfg.plugins()}
        rows, panel = cfg.algorithm.clients_per_round or len(s.class_counts), None
        if cfg.results.clients == "sampled":   # the panel's rows only (docs/results.md, "Large cohorts")
            panel = client_panel(cfg.run.seed, len(s.class_counts), cfg.results.sample_fraction)
            # every client each round: the panel's P rows a round, chunked by round as a cohort of P; a
            # sampled cohort meets a varying part of the panel, which fills uncompressed chunks
            rows = 0 if cfg.algorithm.clients_per_round else len(panel)
        return ResultsWriter(self.out / "results.h5", attrs, s.class_counts,
                             resume_at=self.start if self.mode == "resume" else None,
                             metric_fields=s.algo.round_fields, client_fields=s.algo.client_fields,
                             client_eval=s.client_eval is not None, **batching(cfg.results.flush_seconds),
                             cohort=rows, clients=cfg.results.clients, panel=panel, model=FinalModel(
                                 s.model.names, s.model.shapes, cfg.runtime.dtype, s.dataset.input_shape,
                                 s.dataset.num_classes))

    def _say_start(self, placed: list) -> None:
        """Rank 0: the run in one line, each rank's GPU, and the notes the job leaves implicit."""
        from ..config import notices

        cfg, s, comm = self.cfg, self.setup, self.comm
        auto = " (runtime.threads = 0: one for a model under 1M parameters)" if not cfg.runtime.threads \
            and s.threads == 1 else ""
        if s.lanes is not None:   # how the threads are used (docs/performance.md, "Clients on CPU threads")
            auto += f", {s.lanes.count} clients at a time (runtime.lanes; 1: one client on all threads)"
        print(f"hpcfl: {cfg.run.name}: {cfg.algorithm.name} on {cfg.data.dataset}, {cfg.data.num_clients} clients, "
              f"{comm.size} rank(s), device {s.device}, {s.threads} thread(s)/rank{auto}; startup "
              f"{time.perf_counter() - self.t0:.1f} s", flush=True)
        if any(d != "cpu" for d, _ in placed):   # which GPU each rank took (docs/guide.md, "Devices")
            for _, line in placed:
                print(f"hpcfl: {line}", flush=True)
        big = checkpoint_note(resume.state_bytes(s))   # would outlast the Slurm templates' signal margin
        for note in (*cfg.notes, *notices.start_notes(cfg), *s.algo.notes, *s.notes, *([big] if big else [])):
            print(f"hpcfl: note: {note}", flush=True)

    # ---- 4. loop -----------------------------------------------------------------------------

    def loop(self):
        """Every rank: the rounds, then :meth:`finish`; each way a run can stop ends here too."""
        cfg, comm = self.cfg, self.comm
        self.control = RunControl(comm, cfg.guard, Limits.of(cfg.watchdog, comm.size), cfg.checkpoint.every_minutes,
                                  resumed_from=self.start, out=self.out, run_id=self.run_id)
        try:
            x = simulation.run(self.setup, on_round=self.on_round, start=self.start, sim_time=self.sim_time, x=self.x,
                               control=self.control, checkpoint=self.checkpoint, on_eval=self.on_eval)
        except simulation.Diverged as exc:
            return self.finish(None, diverged=exc)
        except NondeterministicOp as exc:   # raised where the operation ran: perhaps on some ranks only
            self._close_results()
            if comm.size > 1:   # the other ranks may wait in a collective: only an abort reaches them
                print(f"hpcfl: {exc}", file=sys.stderr, flush=True)
                comm.Abort(EXIT_INPUT)
            self._end("failed", exc)
        except simulation.GuardStop as exc:
            self._end("guard", GuardStopped(f"{exc} (stopped by the guard)"))
        except simulation.Stopped as exc:   # a stop signal or a callback that raised: a checkpoint is written
            trouble = self.control.trouble
            self._end("stopped", trouble.after(
                f"the run stopped after round {exc.round} with a checkpoint (results.h5 and the checkpoints are "
                f"intact): fix the callback and run again to resume") if isinstance(trouble, CallbackError) else
                RunStopped(f"{exc} (resumable: run the same command again to continue)"))
        except RunError as exc:   # a write failed: results.h5 is closed as it was, no checkpoint was written
            self._end("failed", exc)
        return self.finish(x)

    def on_round(self, metrics: dict, clients: dict) -> None:
        """Rank 0, after each round: its records into results.h5, then the callbacks."""
        if self.broken:
            return
        try:
            self.writer.append_round(metrics, clients)
        except HpcflError as exc:
            return self._write_broke(exc)
        self.done = int(metrics["round"])
        self.events.round(metrics, clients)
        if self.events.failure is not None:
            self.control.report(self.events.failure)

    def on_eval(self, round_: int, accuracy, loss) -> None:
        """Rank 0, at each evaluated round with per-client evaluation: its rows, then the callbacks."""
        if self.broken:
            return
        sizes = self.setup.client_eval.sizes
        try:
            self.writer.append_client_eval(round_, accuracy, loss, sizes)
        except HpcflError as exc:
            return self._write_broke(exc)
        self.events.evaluation(round_, accuracy, loss, sizes)
        if self.events.failure is not None:
            self.control.report(self.events.failure)

    def _write_broke(self, exc: HpcflError) -> None:
        """Rank 0: a round could not be written (disk full). results.h5 is closed as it is, with every
        round flushed before; every rank ends at this round's boundary, without a checkpoint, which
        would be ahead of results.h5."""
        self.broken = True
        self.writer.close_after_failure()
        self.control.report(WriteError(str(exc)))

    def checkpoint(self, done: int, x, sim_time: float) -> None:
        """Collective: the checkpoint after round ``done``, results.h5 synced to disk first (never
        behind a checkpoint, docs/reliability.md); the old run set aside by ``force`` is deleted once
        the new one can resume on its own. A failed save is raised on every rank."""
        comm, s, cfg = self.comm, self.setup, self.cfg
        # Every rank's watchdog gives this checkpoint an allowance for its size (rank 0 knows the server's arrays).
        self.control.expect_checkpoint(comm.bcast(resume.state_bytes(s) if comm.rank == 0 else None, root=0))
        failure = resume.write(s, x, self.store, done, meta={"sim_time": sim_time, "config": cfg.to_json()},
                               manifest={"world_size": comm.size, "config_sha256": cfg.digest(),
                                         "versions": versions()}, before=self.writer.sync if comm.rank == 0 else None,
                               shards=cfg.checkpoint.shards)
        if comm.rank == 0 and failure is not None:   # a swapped checkpoint folder is the user's to fix: exit 2
            from ..io.heldir import DirectoryMoved
            failure = RunError(str(failure), EXIT_INPUT) if isinstance(failure, DirectoryMoved) else \
                WriteError(str(failure))
        if comm.rank == 0 and failure is None and self.aside is not None:
            shutil.rmtree(self.aside, ignore_errors=True)
            print(f"hpcfl: deleted the previous run set aside in {self.aside}", flush=True)
            self.aside = None
        failure = self._agreed(failure)
        if failure is not None:
            if comm.rank == 0:
                self.broken = True
                self.writer.close_after_failure()
            raise failure

    # ---- 5. finish ---------------------------------------------------------------------------

    def finish(self, x, diverged: simulation.Diverged | None = None):
        """After the last round (or a diverged one): rank 0 writes the final model, or marks the run
        diverged, and closes results.h5; the End event; the Results on every rank."""
        comm = self.comm
        if diverged is None:
            self.control.phase("final", self.cfg.run.rounds - 1)   # rank 0 fills /final: start-up allowance
        err = None
        if comm.rank == 0:
            try:
                if diverged is None:
                    self.writer.write_final(x)
                else:
                    self.writer.mark_diverged(diverged.round)
            except HpcflError as exc:   # a full disk: results.h5 keeps every round, the checkpoints intact
                err = exc
            self._close_results()
            if self.writer.moved_from is not None:   # --out moved mid-run: the results went with it
                self.out = self.writer.path.parent
                print(f"hpcfl: note: {self.writer.moved_from.parent} was moved while the run wrote it; its "
                      f"results.h5 was finished where it is now, in {self.out}", flush=True)
        failed = write_failed(comm, err)
        if failed:
            self._end("failed", failed)
        self.ended = True
        if diverged is not None:
            self.events.end("diverged", self.done, self.out, str(diverged))
            if comm.rank == 0:
                print(f"hpcfl: {diverged}", file=sys.stderr, flush=True)
        else:
            self.events.end("finished", self.done, self.out)
        try:
            return self.results("diverged" if diverged is not None else "finished")
        finally:
            self._release()   # every rank is here (results() is collective, and raises on every rank)

    def _release(self) -> None:
        """Collective over the node: free the run's shared windows (the dataset's and the client
        tables'). Called where every rank ends the run together; nothing may read them afterwards."""
        if self.setup is not None:
            release_tables(self.setup)
        if self.tables is not None:
            self.tables.free()   # set-up failed on some rank: no Setup holds them
            self.tables = None

    def results(self, outcome: str):
        """Every rank: the run's Results (rank 0 reads results.h5, its per-client tables when first
        used, and sends them), or the error of a callback that raised on the way (the run itself is
        complete then)."""
        from ..io.reader import load

        got = mine = None
        if self.comm.rank == 0:
            failure = self.events.failure
            if failure is not None:
                mine = failure.after("the run had ended: results.h5 is complete")
            else:
                try:
                    mine = load(self.out, lazy=True)
                    mine.outcome = outcome
                except HpcflError as exc:
                    mine = exc
        got = self.comm.bcast(mine, root=0)
        got = mine if self.comm.rank == 0 else got
        if isinstance(got, BaseException):
            raise got
        return got

    # ---- endings -----------------------------------------------------------------------------

    def _agreed(self, err):
        """Collective: rank 0's error (or None) on every rank; rank 0 keeps its own (with its cause)."""
        got = self.comm.bcast(err if self.comm.rank == 0 else None, root=0)
        return err if self.comm.rank == 0 else got

    def _close_results(self) -> None:
        """Rank 0: write the buffered rounds and close results.h5; a write that fails (disk full) is
        reported, and the run ends as it would have (those rounds follow the newest checkpoint)."""
        if self.comm.rank != 0 or self.writer is None or self.broken:
            return
        try:
            self.writer.close()
        except HpcflError as exc:
            print(f"hpcfl: {exc}", file=sys.stderr, flush=True)

    def _end(self, status: str, err: HpcflError):
        """Every rank, for a run that cannot go on: close results.h5, the End event, raise ``err``."""
        self._close_results()
        self.ended = True
        self.events.end(status, self.done, self.out, str(err))
        raise err
