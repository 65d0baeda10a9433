"""Before a run resumes: do ``results.h5``, the newest checkpoint and the job agree on the rounds?

A resume from the checkpoint written after round R keeps results.h5's rows of rounds 1..R and
trains R+1 .. ``run.rounds``. That is only whole when results.h5 holds every round 1..R and R is
not past the job's last round. Three ways it is not, each refused with exit 2 (the caller's
:class:`hpcfl.errors.HpcflError`) naming the files, the rounds and the fix, before anything is
changed:

- results.h5 behind its checkpoint (an older copy put back, a file system that lost the tail
  of the file): resuming would finish with a gap (rounds 1, 2, 3, 6);
- ``run.rounds`` lowered below the checkpoint's round: the run is already past the job's end;
- a checkpoint ahead of its own job (round 99 of a 6-round job): it is not this run's.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..errors import HpcflError
from . import reader


def spans(rounds) -> str:
    """Sorted round numbers as ranges: [1, 2, 3, 6] -> "1-3, 6" (empty: "none")."""
    r = np.unique(np.asarray(rounds, dtype=np.int64))
    if r.size == 0:
        return "none"
    breaks = np.flatnonzero(np.diff(r) != 1)
    starts, ends = r[np.r_[0, breaks + 1]], r[np.r_[breaks, r.size - 1]]
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in zip(starts.tolist(), ends.tolist()))


def check(results: Path, ckpt: Path, ckpt_round: int, job_rounds: int, ckpt_job_rounds: int | None,
          file_rounds: np.ndarray | None = None) -> None:
    """Raise :class:`HpcflError` unless resuming ``results`` from ``ckpt`` (written after
    ``ckpt_round`` rounds) is whole for a job of ``job_rounds`` rounds.

    Parameters
    ----------
    results, ckpt : Path
    ckpt_round : int
        Rounds completed when the checkpoint was written.
    job_rounds : int
        ``run.rounds`` of the job being run now.
    ckpt_job_rounds : int or None
        ``run.rounds`` of the job stored in the checkpoint (None: not recorded).
    file_rounds : np.ndarray, shape (rows,), optional
        The rounds results.h5 holds (from 1); read from ``results`` when not given.
    """
    start_over = "or pass --force to set the old run aside and start over"
    if ckpt_round > job_rounds:
        if ckpt_job_rounds is not None and ckpt_round <= ckpt_job_rounds:
            raise HpcflError(
                f"run.rounds = {job_rounds} is below the round of checkpoint {ckpt} (written after round "
                f"{ckpt_round}; its job has run.rounds = {ckpt_job_rounds}): this run is already past the rounds "
                f"the job asks for, and nothing would be run. Set run.rounds to {ckpt_round} or more (e.g. --set "
                f"run.rounds={ckpt_job_rounds}) to continue it, {start_over} with {job_rounds} rounds")
        raise HpcflError(
            f"checkpoint {ckpt} claims round {ckpt_round}, beyond the job's run.rounds = "
            f"{ckpt_job_rounds if ckpt_job_rounds is not None else job_rounds}: it is not this run's (damaged or "
            f"put there by hand), and resuming from it would leave the rounds between missing from {results}. "
            f"Remove it from {ckpt.parent} (the run then resumes from the newest older checkpoint), {start_over}")
    have = _rounds_of(results) if file_rounds is None else np.asarray(file_rounds, dtype=np.int64)
    kept = np.unique(have[have <= ckpt_round])
    if not np.array_equal(kept, np.arange(1, ckpt_round + 1)):   # rounds 1..ckpt_round are all there
        missing = np.setdiff1d(np.arange(1, ckpt_round + 1), kept)
        covered = int(missing[0]) - 1   # the file is whole up to this round
        older = (f"remove the checkpoints after round {covered} from {ckpt.parent} so that the run resumes from "
                 f"one the file covers" if covered else
                 f"remove the checkpoints from {ckpt.parent} so that the run starts again at round 1")
        raise HpcflError(
            f"{results} holds rounds {spans(have)} but checkpoint {ckpt} was written after round {ckpt_round}: "
            f"results.h5 is behind its checkpoint (rounds {spans(missing)} are missing; an older copy put back, or "
            f"a file system that lost its end), and resuming would finish with those rounds missing. Put back the "
            f"results.h5 written with that checkpoint, or {older}, {start_over}")


def job_rounds_of(loaded) -> int | None:
    """``run.rounds`` of the job a checkpoint (:class:`hpcfl.io.checkpoint.Loaded`) records, or None."""
    try:
        rounds = json.loads(loaded.meta.get("config"))["run"]["rounds"]
    except (TypeError, ValueError, KeyError, RecursionError):
        return None
    return rounds if isinstance(rounds, int) and not isinstance(rounds, bool) else None


def _rounds_of(results: Path) -> np.ndarray:
    """The round (from 1) of every row of ``/metrics`` (the reader converts older files' rounds)."""
    return np.array([row["round"] for row in reader.metric_rows(results)], dtype=np.int64)
