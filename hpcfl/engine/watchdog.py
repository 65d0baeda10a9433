"""The watchdog: a job whose rank froze ends with a resumable exit instead of hanging.

A rank that freezes (``SIGSTOP``, a hung node, a stuck file system) ends nothing: the other
ranks wait for it in the round's next collective until the batch system's time limit. Each
rank runs a thread that watches how long the rank has been in its current phase and, past a
limit, prints where it is and calls ``comm.Abort`` (the only way out of a blocked collective),
with exit :data:`~hpcfl.parallel.exits.EXIT_RESUMABLE`: the checkpoints on disk are intact, so
running the same command again resumes from the newest (docs/reliability.md, *No hangs*).

The limit (:meth:`Watchdog.limit`) is ``watchdog.timeout_s`` when set, else derived from the
run's own round times, so that a logistic regression's millisecond rounds and a VGG's
minute-long ones are both watched without tuning::

    limit = max(floor_s, factor * max(slowest round so far, this round's time before this phase))
    and at least startup_s while no round has finished, or in a phase of a kind not yet finished

A round's time leaves out its checkpoint, so that after a checkpoint of many gigabytes a frozen
rank in an ordinary phase is still found within about floor_s. The checkpoint phase has its own::

    limit = max(floor_s, factor * slowest checkpoint so far, checkpoint bytes / ALLOWANCE_RATE)
    and at least startup_s before a first checkpoint has finished

where the bytes are the state the checkpoint writes (:meth:`Watchdog.expect_checkpoint`), so a
first checkpoint's allowance grows with it.

Under ``srun`` the job's exit code cannot say 75: ``MPI_Abort`` makes Slurm kill every task,
and ``srun`` reports 137. So the first aborting rank leaves a note, which slurm/hpcfl_srun.sh
reads to requeue (slurm/README.md): at the path it gives (``HPCFL_STALL_NOTE``), its first line
naming that launch (``HPCFL_ATTEMPT``) and the run, so that a stale or planted note never turns a
crash into a requeue; without the launcher, in ``<out>/.hpcfl-stalled``. The write gets 2 s in a thread of its own: a stuck file system must not stop the abort.

Time in which this process itself did not run (the whole job stopped by ``scontrol suspend``
or a Ctrl-Z, a suspended laptop) is not counted: the thread notices that it woke far later than
it asked to.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import HpcflError
from ..io import safefs
from ..parallel.exits import EXIT_RESUMABLE

# A wake-up this much later than asked means this process was stopped (not starved for a
# moment): the gap is not counted against the phase. Several seconds, so that a loaded machine's
# late wake-ups still count and a frozen peer is still found.
PAUSE_GAP_S = 5.0

CHECKPOINT = "checkpoint"   # the phase kind timed apart from the rounds

# Checkpoints through rank 0 (hpcfl.engine.resume.write) were measured at 1 GB in 5.1 s, 2 GB in
# 12.7 s and 4 GB in 31.7 s on 2 ranks: 126-196 MB/s, slower as the state grows (docs/reliability.md).
SAVE_RATE = 125e6       # bytes/s: the slowest measured, for the estimate said at start (job.py)
ALLOWANCE_RATE = 20e6   # bytes/s: the watchdog's allowance, about 6x slower than the slowest measured
                        # (a shared file system under load, a busy node), so a healthy save is never ended


@dataclass(frozen=True)
class Limits:
    """How long a phase may run: ``fixed`` seconds (> 0), off (``fixed`` = 0), or derived (None).

    ``floor_s``, ``factor`` and ``startup_s`` are ``watchdog.floor_s``, ``watchdog.factor`` and
    ``watchdog.startup_s`` (used when ``fixed`` is None).
    """

    fixed: float | None = None
    floor_s: float = 60.0
    factor: float = 10.0
    startup_s: float = 600.0

    @classmethod
    def of(cls, section, ranks: int) -> Limits:
        """From a ``[watchdog]`` section. Derived limits watch only a job of several ranks: a
        single process has no other rank to wait for (an explicit ``timeout_s`` still watches it)."""
        if section.timeout_s is None and ranks == 1:
            return cls(fixed=0.0)
        return cls(section.timeout_s, section.floor_s, section.factor, section.startup_s)

    @property
    def on(self) -> bool:
        return self.fixed is None or self.fixed > 0


class Watchdog:
    """Ends the whole job (exit 75) when one phase of one round runs past :meth:`limit`.

    Parameters
    ----------
    comm : MPI communicator
    limits : Limits or float
        A float is a fixed ``timeout_s`` (0: off), as before derived limits existed.
    clock : callable
        Seconds, monotonic (tests give a fake one; they call :meth:`tick` themselves with
        ``start=False``).
    start : bool
        Start the watching thread (when the limits are on).
    marker : Path, optional
        Where to leave the message before aborting (:func:`hpcfl.io.rundir.stall_marker`).
    header : str
        The note's first line (:func:`hpcfl.io.rundir.stall_header`: the launch and the run).
    memory : Path, optional
        Where the rounds this watchdog ended are remembered across attempts (in the run folder,
        :func:`remembered_rounds`): on the next attempt, each of them gets ``startup_s`` in every
        phase, so that a round that is only slow is not ended on every requeue.
    remembered : set of int
        Rounds (counted from 0) a watchdog ended in an earlier attempt of this run.
    """

    def __init__(self, comm, limits, clock=time.monotonic, start: bool = True, marker: Path | None = None,
                 header: str = "hpcfl-stalled", memory: Path | None = None, remembered=frozenset()):
        self.comm, self.marker, self.header = comm, marker, header
        self.memory, self.remembered = memory, frozenset(remembered)
        self.limits = limits if isinstance(limits, Limits) else Limits(fixed=float(limits))
        self.clock = clock
        self.paused = 0.0               # seconds this process did not run (not counted)
        self.where, self.kind = ("start-up", -1), "start-up"
        self.since = self.round_start = self._now()
        self.round_rnd = None           # the round being timed
        self.slowest = None             # the slowest finished round, its checkpoint left out, seconds
        self.round_checkpoint = 0.0     # seconds the current round spent checkpointing
        self.slowest_checkpoint = None  # the slowest finished checkpoint, seconds
        self.checkpoint_bytes = 0       # the size of the state a checkpoint writes (expect_checkpoint)
        self.finished: set[str] = set()   # phase kinds that ran to their end at least once
        self.last_checkpoint = None     # rounds done at this process's newest checkpoint
        self.resumed_from = 0           # rounds done at the checkpoint this process started from
        self._last_wake = self.clock()
        # Several runs can share one process (hpcfl sweep): a finished run's thread must end,
        # or it would keep counting and abort the next run.
        self._stopped = threading.Event()
        self._thread = None
        if start and self.limits.on:
            self._thread = threading.Thread(target=self._watch, name="hpcfl-watchdog", daemon=True)
            self._thread.start()

    def _now(self) -> float:
        return self.clock() - self.paused

    def enter(self, phase: str, rnd: int, kind: str | None = None) -> None:
        """The rank enters ``phase`` of round ``rnd``; ``kind`` (default: the phase) tells apart
        what costs differently under one name (an evaluating round's "eval" from a recording one)."""
        now = self._now()
        self.finished.add(self.kind)
        if self.kind == CHECKPOINT:   # a checkpoint has finished: timed on its own, not in its round
            took = now - self.since
            self.round_checkpoint += took
            self.slowest_checkpoint = took if self.slowest_checkpoint is None else max(self.slowest_checkpoint, took)
        if rnd != self.round_rnd:
            if self.round_rnd is not None:   # the round before has finished (its checkpoint left out)
                took = now - self.round_start - self.round_checkpoint
                self.slowest = took if self.slowest is None else max(self.slowest, took)
            self.round_rnd, self.round_start, self.round_checkpoint = rnd, now, 0.0
        self.where, self.kind, self.since = (phase, rnd), kind or phase, now

    def expect_checkpoint(self, nbytes: int) -> None:
        """The checkpoint being (or next) written holds ``nbytes`` bytes of state: its allowance."""
        self.checkpoint_bytes = int(nbytes)

    def checkpoint_allowance(self) -> float:
        """Seconds a checkpoint of :attr:`checkpoint_bytes` gets at :data:`ALLOWANCE_RATE`."""
        return self.checkpoint_bytes / ALLOWANCE_RATE

    def limit(self) -> float:
        """Seconds the current phase may last (0: not watched)."""
        lim = self.limits
        if lim.fixed is not None:
            return lim.fixed
        if self.kind == CHECKPOINT:   # from checkpoints alone: the round's work is done on every rank
            base = self.slowest_checkpoint
            out = max(lim.floor_s, lim.factor * (base or 0.0), self.checkpoint_allowance())
        else:
            base = self.slowest
            before = self.since - self.round_start - self.round_checkpoint   # this rank's own share so far
            out = max(lim.floor_s, lim.factor * max(base or 0.0, before))
        if base is None or self.kind not in self.finished or self.where[1] in self.remembered:
            out = max(out, lim.startup_s)
        return out

    def tick(self, period: float) -> tuple[float, float] | None:
        """One wake-up of the thread, ``period`` seconds after the last: (seconds held, limit) when
        the current phase is past its limit, else None."""
        wake = self.clock()
        late = wake - self._last_wake - period
        self._last_wake = wake
        if late > PAUSE_GAP_S:   # this process was stopped: the others could not have been waiting on it
            self.paused += late
        held, limit = self._now() - self.since, self.limit()
        return (held, limit) if limit > 0 and held > limit else None

    def period(self) -> float:
        return min(1.0, self.limits.fixed / 4) if self.limits.fixed else 1.0

    def stop(self) -> None:
        """End the watching thread (at most one wake-up period later); idempotent."""
        self._stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def message(self, held: float, limit: float) -> str:
        phase, rnd = self.where
        lim = self.limits
        if lim.fixed is not None:
            why = f"watchdog.timeout_s = {lim.fixed:g}"
        elif self.kind == CHECKPOINT:
            slowest = "none finished yet" if self.slowest_checkpoint is None else f"{self.slowest_checkpoint:.3g} s"
            why = (f"derived: max(watchdog.floor_s = {lim.floor_s:g}, watchdog.factor = {lim.factor:g} x the slowest "
                   f"checkpoint ({slowest}), {self.checkpoint_bytes / 1e9:.3g} GB of state at "
                   f"{ALLOWANCE_RATE / 1e6:g} MB/s), at least watchdog.startup_s = {lim.startup_s:g} in a first "
                   f"checkpoint")
        else:
            slowest = "none finished yet" if self.slowest is None else f"{self.slowest:.3g} s"
            why = (f"derived: max(watchdog.floor_s = {lim.floor_s:g}, watchdog.factor = {lim.factor:g} x the slowest "
                   f"round ({slowest})), at least watchdog.startup_s = {lim.startup_s:g} in a first round or phase")
        done = self.last_checkpoint if self.last_checkpoint is not None else self.resumed_from
        resume = (f"the checkpoint after round {done}" if done else
                  "round 1 (this run has written no checkpoint yet)")
        if rnd in self.remembered:
            why += (f"; the watchdog ended round {rnd + 1} in an earlier attempt too, so it had watchdog.startup_s in "
                    f"every phase this time")
        return (f"hpcfl watchdog: rank {self.comm.rank} stuck in phase '{phase}' of round {rnd + 1} for {held:.0f} s "
                f"(limit {limit:.0f} s, {why}). A rank that does not print this line is frozen, lost with its node, "
                f"or stuck in its own work. Ending the job with exit {EXIT_RESUMABLE}: run the same command again to "
                f"resume from {resume}. If round {rnd + 1} is only slow, raise watchdog.floor_s or "
                f"watchdog.startup_s, or set watchdog.timeout_s (0: off)")

    def leave_marker(self, text: str, wait: float = 2.0) -> None:
        """Write :attr:`header` and ``text`` to :attr:`marker`, once: the first rank that aborts
        writes a whole file, a name already there (another rank's note, a planted link) is left
        as it is. Gives up after ``wait`` seconds; errors are ignored."""
        if self.marker is None:
            return

        def write():
            try:
                safefs.write_once(self.marker, f"{self.header}\n{text}\n".encode())
            except (OSError, ValueError):   # a stuck or full file system: the abort matters more
                pass

        t = threading.Thread(target=write, name="hpcfl-stall-marker", daemon=True)
        t.start()
        t.join(wait)

    def remember(self, rnd: int, wait: float = 2.0) -> None:
        """Add round ``rnd`` to :attr:`memory` (a whole new file each time, never through a link),
        giving up after ``wait`` seconds; errors are ignored: the abort matters more."""
        if self.memory is None or rnd < 0:
            return
        text = "".join(f"{r + 1}\n" for r in sorted(self.remembered | {rnd}))

        def write():
            try:
                safefs.write_new(self.memory, text.encode())
            except (OSError, ValueError):
                pass

        t = threading.Thread(target=write, name="hpcfl-watchdog-memory", daemon=True)
        t.start()
        t.join(wait)

    def _watch(self) -> None:
        period = self.period()
        while not self._stopped.wait(period):
            over = self.tick(period)
            if over is None:
                continue
            text = self.message(*over)
            print(text, file=sys.stderr, flush=True)
            self.leave_marker(text)
            self.remember(self.where[1])
            # MPI_Abort tears mpiexec down at once; without a pause the launcher can exit
            # before it forwards this line (seen in CI: an empty stderr). Every rank
            # that times out in the pause prints too, so the user sees each rank's phase.
            if self._stopped.wait(1.0):   # the run ended in the pause: nothing left to abort
                return
            self.comm.Abort(EXIT_RESUMABLE)


# The Slurm templates send USR1 this long before the time limit (``#SBATCH --signal=B:USR1@300``):
# the time a stopped run has for its checkpoint. They export no variable for it, so it is assumed.
SIGNAL_MARGIN_S = 300.0


def checkpoint_note(nbytes: int, margin_s: float = SIGNAL_MARGIN_S) -> str | None:
    """A start-up note when a checkpoint of ``nbytes`` bytes, at :data:`SAVE_RATE`, would outlast
    the templates' signal margin (a run stopped at its time limit would be killed mid-save); else None."""
    est = nbytes / SAVE_RATE
    if est <= margin_s:
        return None
    return (f"a checkpoint of this run's state ({nbytes / 1e9:.3g} GB) takes about {est:.0f} s through rank 0 "
            f"(at {SAVE_RATE / 1e6:g} MB/s), longer than the {margin_s:g} s the Slurm templates leave between "
            f"their stop signal and the time limit (#SBATCH --signal=B:USR1@{margin_s:g}; assumed, hpcfl cannot "
            f"read it): a job stopped by its time limit would be killed during that checkpoint and resume from "
            f"the one before. Raise the margin in the template's --signal line to at least {2 * est:.0f} s, or "
            f"checkpoint less state (fewer clients, a smaller model)")


def remembered_rounds(path: Path) -> set[int]:
    """The rounds (counted from 0) a watchdog ended in earlier attempts, from ``path`` (one round,
    counted from 1, per line); empty when there is no such file or it does not read as one."""
    try:
        text = safefs.read_small(path)
    except (OSError, HpcflError):
        return set()
    return {int(w) - 1 for w in (text or "").split() if w.isdigit() and 0 < int(w) < 1 << 40}
