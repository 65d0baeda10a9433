"""What a run tells its callbacks: :class:`Start`, :class:`Round`, :class:`Evaluation`, :class:`End`,
and :class:`Callbacks`, which calls them (docs/python.md, "Callbacks").

A callback is any callable taking one event; ``event.kind`` says which (``"start"``, ``"round"``,
``"eval"``, ``"end"``). Callbacks run on rank 0 only, in the order given, after the round's records
are in results.h5's buffer, and see read-only data: a mapping proxy for the metrics and numpy
arrays whose ``writeable`` flag is off. One that raises is not called again; the run stops at the
end of that round with a checkpoint, and :class:`hpcfl.errors.CallbackError` names it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import ClassVar, Mapping

import numpy as np

from ..errors import CallbackError, HpcflError


def _read_only(a):
    """A view of array ``a`` that cannot be written through (no copy; the engine's own flags stay as they are)."""
    if not isinstance(a, np.ndarray):
        return a
    v = a.view()
    v.setflags(write=False)
    return v


def _frozen(arrays: Mapping) -> Mapping:
    """``arrays`` as a read-only mapping of read-only views."""
    return MappingProxyType({k: _read_only(a) for k, a in arrays.items()})


@dataclass(frozen=True)
class Start:
    """The run is about to train (after planning, resume and the results file are settled).

    job : the whole job, every default filled in (results.h5's ``config`` attribute)
    out : the run's output folder (``results.h5``, ``checkpoints/``)
    run_id : the run's identity, kept across resumes
    rounds : ``run.rounds``
    start_round : rounds already done: 0 for a fresh run, k when resuming after round k
    world_size : MPI ranks
    devices : each rank's device, e.g. ``("cpu", "cpu")``
    classifier : whether the model has a test accuracy (False: the quadratic, test loss only)
    """

    kind: ClassVar[str] = "start"
    job: Mapping
    out: Path
    run_id: str
    rounds: int
    start_round: int
    world_size: int
    devices: tuple
    classifier: bool


@dataclass(frozen=True)
class Round:
    """A round has finished and its records are written.

    round : the round, from 1
    metrics : its ``/metrics`` row: name -> float or int (``test_accuracy`` is NaN where the round
        was not evaluated)
    clients : its ``/clients`` rows: name -> array (k,), one entry per cohort member
    """

    kind: ClassVar[str] = "round"
    round: int
    metrics: Mapping
    clients: Mapping


@dataclass(frozen=True)
class Evaluation:
    """Each client's accuracy on its own held-out test rows (``run.eval_clients``), at an evaluated round.

    round : the round, from 1
    accuracy, loss : float64 (N,), one per client (NaN for a client with no held-out rows)
    samples : int64 (N,), held-out rows of each client
    """

    kind: ClassVar[str] = "eval"
    round: int
    accuracy: np.ndarray
    loss: np.ndarray
    samples: np.ndarray


@dataclass(frozen=True)
class End:
    """The run has ended, in an orderly way (a rank that dies or a frozen rank ends the process instead).

    status : ``"finished"``, ``"diverged"``, ``"stopped"`` (a stop signal or a callback; a checkpoint
        was written), ``"guard"`` (the update guard) or ``"failed"`` (results or a checkpoint could not
        be written)
    rounds_done : the last round recorded in results.h5 (from 1)
    out : the run's output folder
    message : why it ended, when not finished
    """

    kind: ClassVar[str] = "end"
    status: str
    rounds_done: int
    out: Path
    message: str | None = None


def name_of(callback) -> str:
    """How messages name a callback: its qualified name, or its class's for a callable object."""
    name = getattr(callback, "__qualname__", None) or type(callback).__qualname__
    module = getattr(callback, "__module__", None) or type(callback).__module__
    return f"{module}.{name}" if module not in (None, "__main__", "builtins") else name


class Callbacks:
    """The run's callbacks, called on rank 0 (``active``) with each event.

    Parameters
    ----------
    callbacks : sequence of callables
        Each takes one event. Checked here, before the run touches anything.
    active : bool
        Whether this rank calls them (rank 0); elsewhere every :meth:`emit` does nothing.
    """

    def __init__(self, callbacks, active: bool):
        callbacks = list(callbacks or ())
        wrong = [repr(c)[:60] for c in callbacks if not callable(c)]
        if wrong:
            raise HpcflError(f"callbacks must be callables taking one event; got {', '.join(wrong)}: pass functions, "
                             f"e.g. callbacks=[print_round] with def print_round(event): ...")
        self.live = callbacks if active else []
        self.failure: CallbackError | None = None   # the first callback that raised

    def emit(self, event) -> None:
        """Call every live callback with ``event``; one that raises is dropped and remembered."""
        for cb in list(self.live):
            try:
                cb(event)
            except Exception as exc:   # noqa: BLE001 - a user's code: any error stops the run cleanly
                self.live.remove(cb)
                if self.failure is None:
                    where = f"round {event.round}" if hasattr(event, "round") else f"the run's {event.kind}"
                    self.failure = CallbackError(
                        f"callback {name_of(cb)} raised {type(exc).__name__}: {exc} (its {event.kind} event, "
                        f"{where})", name_of(cb))
                    self.failure.__cause__ = exc

    def start(self, **fields) -> None:
        self.emit(Start(**fields))

    def round(self, metrics: dict, clients: dict) -> None:
        self.emit(Round(int(metrics["round"]), MappingProxyType(dict(metrics)), _frozen(clients)))

    def evaluation(self, round_: int, accuracy, loss, samples) -> None:
        self.emit(Evaluation(round_, _read_only(accuracy), _read_only(loss), _read_only(samples)))

    def end(self, status: str, rounds_done: int, out: Path, message: str | None = None) -> None:
        self.emit(End(status, rounds_done, out, message))
