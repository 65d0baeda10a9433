"""Run control: the stop agreement, the watchdog, update guards, fault injection.

See docs/reliability.md for the protocol. Nothing here talks to MPI except through the
``comm`` passed in; the round loop calls :meth:`RunControl.phase` when it enters a phase
and :meth:`RunControl.boundary` once per round (a collective).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import numpy as np

from ..errors import EXIT_INPUT, CallbackError, HpcflError, RunError, WriteError
from ..io import rundir
from ..io.h5check import BadFile
from ..signals import stop_requested
from .watchdog import Limits, Watchdog, remembered_rounds


# RunControl.phase's names, and "setup": start-up's set-up, before the placement's collectives (round 0)
FAULT_PHASES = ("decide", "train", "reduce", "server", "eval", "checkpoint", "setup")
FAULT_KINDS = ("raise", "exit", "kill", "hang", "stop", "refuse")
FAULT_FORMAT = (f"HPCFL_FAULT=RANK:PHASE:ROUND:KIND with RANK and ROUND integers counted from 0, PHASE one of "
                f"{', '.join(FAULT_PHASES)} and KIND one of {', '.join(FAULT_KINDS)} (e.g. 0:train:1:kill); it is "
                f"a test hook that makes a run fail on purpose: unset it for real runs")


def parse_fault(spec: str) -> tuple[int, str, int, str] | None:
    """``HPCFL_FAULT``'s value as (rank, phase, round, kind), None when empty; anything else
    raises an input error naming the format (before a run creates anything, so that a mistyped
    test hook never half-starts a run)."""
    if not spec:
        return None
    parts = spec.split(":")
    ok = len(parts) == 4 and parts[0].isdigit() and parts[2].isdigit() and parts[1] in FAULT_PHASES \
        and parts[3] in FAULT_KINDS
    if not ok:
        raise HpcflError(f"HPCFL_FAULT={spec!r} is not a fault to inject; expected {FAULT_FORMAT}")
    return int(parts[0]), parts[1], int(parts[2]), parts[3]


def fault_notice(spec: str) -> str | None:
    """The start-up warning while fault injection is on (None when it is off); raises like :func:`parse_fault`."""
    fault = parse_fault(spec)
    if fault is None:
        return None
    rank, phase, rnd, kind = fault
    return (f"hpcfl: WARNING: fault injection is ON (HPCFL_FAULT={spec}): rank {rank} will {kind} in phase "
            f"'{phase}' of round {rnd + 1}, on purpose. This is a test hook; unset HPCFL_FAULT for real runs")


class FaultInjector:
    """Test hook: ``HPCFL_FAULT=rank:phase:round:kind`` fails that rank there (:data:`FAULT_FORMAT`).

    ``round`` is the loop's index, counted from 0 (messages and files count from 1).

    kind is ``raise`` (an exception), ``refuse`` (an input error, exit 2, as a rank that finds its
    data missing), ``exit`` (exit code 1), ``kill`` (SIGKILL to itself), ``hang`` (sleep forever,
    for the watchdog) or ``stop`` (SIGSTOP to itself: a frozen rank, whose own watchdog thread
    stops with it); each says so on stderr first. Phase ``setup`` is start-up's, in round 0. When
    ``HPCFL_FAULT_STAMP`` names a file, the wall time of the fault is written there first, so
    tests can time the shutdown. Used by the rank-death tests; a no-op when the variable is
    unset. A malformed value raises an input error (``hpcfl run`` checks it before it creates
    anything, and prints a warning at start-up whenever it is set).
    """

    def __init__(self, rank: int):
        fault = parse_fault(os.environ.get("HPCFL_FAULT", ""))
        self.target, self.rank = None, rank
        if fault is not None and fault[0] == rank:
            self.target = fault[1:]

    def check(self, phase: str, rnd: int) -> None:
        if self.target is None or self.target[:2] != (phase, rnd):
            return
        kind = self.target[2]
        stamp = os.environ.get("HPCFL_FAULT_STAMP")
        if stamp:
            with open(stamp, "w") as f:
                f.write(repr(time.time()))
        print(f"hpcfl: HPCFL_FAULT: injecting '{kind}' on rank {self.rank} in phase '{phase}' of round {rnd + 1}",
              file=sys.stderr, flush=True)
        if kind == "raise":
            raise RuntimeError(f"injected fault in phase {phase} of round {rnd}")
        if kind == "refuse":
            raise HpcflError(f"injected refusal on rank {self.rank} in phase {phase} (HPCFL_FAULT)")
        if kind == "exit":
            sys.exit(1)
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "hang":
            while True:
                time.sleep(3600)
        if kind == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)


class RunControl:
    """Per-rank control of one run: phases, guards, the per-round stop agreement.

    Parameters
    ----------
    comm : MPI communicator
    guard : hpcfl.config.GuardSection
    watchdog : hpcfl.engine.watchdog.Limits or float
        The watchdog's limits; a float is a fixed ``watchdog.timeout_s`` (0: off).
    checkpoint_minutes : float
        Wall-clock minutes between checkpoints, measured on rank 0 from the start of the
        run or the last checkpoint; 0 turns the clock off (``checkpoint.every`` and stops
        still checkpoint).
    resumed_from : int
        Rounds done at the checkpoint this run resumed from (0: a fresh run); the watchdog's
        message says where a rerun would resume.
    out : Path, optional
        The run's ``--out``: the watchdog leaves its note there (:func:`hpcfl.io.rundir.stall_marker`).
    run_id : str
        The run's id, named in that note.
    """

    def __init__(self, comm, guard, watchdog: Limits | float, checkpoint_minutes: float = 0.0,
                 resumed_from: int = 0, out=None, run_id: str = ""):
        self.comm, self.guard = comm, guard
        memory = None if out is None else Path(out) / rundir.WATCHDOG_ROUNDS
        # A resumed run remembers the rounds a watchdog ended before (a fresh one starts afresh).
        before = remembered_rounds(memory) if memory is not None and resumed_from else set()
        before = {r for r in before if r >= resumed_from}
        self.watchdog = Watchdog(comm, watchdog, marker=None if out is None else rundir.stall_marker(out),
                                 header=rundir.stall_header(run_id), memory=memory, remembered=before)
        if before and comm.rank == 0 and self.watchdog.limits.fixed is None:   # a fixed timeout_s is the user's
            startup = self.watchdog.limits.startup_s
            print(f"hpcfl: note: the watchdog ended round(s) {', '.join(str(r + 1) for r in sorted(before))} in an "
                  f"earlier attempt; each gets watchdog.startup_s = {startup:g} s in every phase this time",
                  flush=True)
        self.watchdog.resumed_from = resumed_from
        self.faults = FaultInjector(comm.rank)
        self.interval = 60.0 * checkpoint_minutes
        self.last_checkpoint = time.monotonic()
        self.trouble: RunError | None = None   # a failed write or a callback that raised, agreed at the boundary

    def phase(self, name: str, rnd: int, kind: str | None = None) -> None:
        """Entering ``name`` of round ``rnd`` (``kind``: see :meth:`Watchdog.enter`)."""
        self.watchdog.enter(name, rnd, kind)
        self.faults.check(name, rnd)

    def expect_checkpoint(self, nbytes: int) -> None:
        """The checkpoint being written holds ``nbytes`` bytes: the watchdog's allowance for it."""
        self.watchdog.expect_checkpoint(nbytes)

    def check_update(self, cid: int, rnd: int, norm: float) -> str | None:
        """None if an update of L2 norm ``norm`` may be averaged in, else why not.

        A NaN or Inf anywhere in the update makes its norm NaN or Inf.
        """
        if not np.isfinite(norm):
            return f"client {cid} in round {rnd + 1}: its update holds NaN or Inf"
        if self.guard.max_norm and norm > self.guard.max_norm:
            return f"client {cid} in round {rnd + 1}: update norm {norm:.4g} exceeds guard.max_norm = {self.guard.max_norm:g}"
        return None

    def agree_guard(self, problems: list[str]) -> list[str]:
        """Collective: every rank's guard problems (for policy "stop")."""
        return [p for part in self.comm.allgather(problems) for p in part]

    def report(self, trouble: RunError) -> None:
        """During a round (rank 0, recording it): a write failed (:class:`WriteError`) or a callback
        raised (:class:`CallbackError`). The other ranks learn it at the round's :meth:`boundary`."""
        if self.trouble is None:
            self.trouble = trouble

    def boundary(self) -> tuple[str | None, bool]:
        """Collective at a round end: (the first stop signal any rank received or None,
        whether a checkpoint is due by the wall clock).

        Only rank 0's clock counts, so every rank takes the same decision from the same
        allgather; ranks' clocks need not agree. A trouble any rank reported is agreed here
        (:attr:`trouble` on every rank): a failed write is raised on every rank at once, with no
        checkpoint (it would be ahead of results.h5); a callback that raised stops the run as a
        stop signal does, with a checkpoint.
        """
        due = self.interval > 0 and time.monotonic() - self.last_checkpoint >= self.interval
        flags = self.comm.allgather((stop_requested(), due, self.trouble))
        if self.trouble is None:   # the reporting rank keeps its own (with the callback's traceback)
            self.trouble = next((t for _, _, t in flags if t is not None), None)
        if self.trouble is not None and not isinstance(self.trouble, CallbackError):
            raise self.trouble
        stop = next((f for f, _, _ in flags if f), None)
        return stop or ("a callback" if self.trouble is not None else None), flags[0][1]

    def checkpointed(self, done: int | None = None) -> None:
        """A checkpoint after round ``done`` was written: the wall-clock interval starts again."""
        self.last_checkpoint = time.monotonic()
        if done is not None:
            self.watchdog.last_checkpoint = done

    def close(self) -> None:
        """The run is over: stop its watchdog, so that a later run in this process is not aborted."""
        self.watchdog.stop()


def write_failed(comm, err: Exception | None) -> RunError | None:
    """Collective: whether rank 0's write failed (``err``, else None), as the error every rank raises:
    a :class:`RunError` with exit code 2 for a results file found damaged, else a :class:`WriteError`
    (a full disk or another I/O error: nothing written before was lost; free space and run again)."""
    if comm.rank == 0 and err is not None:
        err = RunError(str(err), EXIT_INPUT) if isinstance(err, BadFile) else WriteError(str(err))
    return comm.bcast(err if comm.rank == 0 else None, root=0)

