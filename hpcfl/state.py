"""What a policy declares: its records (:class:`Field`), its reduction segments (:class:`Segment`)
and its state (:class:`ClientTable`, :class:`ServerArray`).

Plain declarations with no behaviour, below everything that reads them: the algorithms
(:mod:`hpcfl.algorithms.protocol` re-exports them), the exact sum (its grid is a
:class:`ServerArray`), checkpoints and the results file. None of those needs to import the
algorithms to know these types.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class Field:
    """A recorded quantity: numpy dtype, unit (``"1"`` for dimensionless), one-line description.

    ``summary`` ("median" or "mean") asks the results writer to also store, at the end of
    the run, that statistic over rounds for every client (``/clients_summary/<name>_<summary>``).
    """

    dtype: type
    unit: str
    description: str
    summary: str | None = None


@dataclass(frozen=True)
class Segment:
    """A named slice of the training reduction buffer, ``length`` float64 values per client.

    The owning policy fills it for each trained client in :meth:`Policy.pack`; the server
    reads the cohort sum under the same name.
    """

    name: str
    length: int


@dataclass
class ClientTable:
    """Per-client state rows on the owning rank: ``get() -> (clients on rank, width)`` array.

    ``set(rows)`` loads rows (same shape) on restore. ``width`` is per client. ``get()`` should
    be a view where it can (a CPU table): a checkpoint streams from it a block at a time.

    A table that can follow its client to another rank for a round (balanced placement)
    also gives ``reserve(n)`` (room for n guest rows in slots ``home .. home + n - 1``),
    ``rows(slots) -> (m, width)`` and ``put(slots, rows)``; :class:`RowTable` has all of them.
    A resume loads a table with ``put`` a block of own rows at a time where it has one, else
    with one ``set``.
    """

    name: str
    width: int
    get: Callable[[], np.ndarray]
    set: Callable[[np.ndarray], None]
    reserve: Callable[[int], None] | None = None
    rows: Callable[[np.ndarray], np.ndarray] | None = None
    put: Callable[[np.ndarray, np.ndarray], None] | None = None

    @property
    def movable(self) -> bool:
        return self.reserve is not None and self.rows is not None and self.put is not None


@dataclass
class ServerArray:
    """Server-side state held on rank 0: ``get() -> array or None`` (None: not started yet).

    ``broadcast``: every rank needs it each round (SCAFFOLD's c), so the engine broadcasts
    it after each server step and on restore.
    """

    name: str
    get: Callable[[], np.ndarray | None]
    set: Callable[[np.ndarray], None]
    broadcast: bool = False
