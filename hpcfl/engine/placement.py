"""Per-client state that follows its client for one round (``runtime.placement = "balanced"``).

Balanced placement deals each round's training to ranks by expected work
(:func:`hpcfl.parallel.comm.deal`), but per-client state (SCAFFOLD's c_i, FedDyn's gradients) lives
on the client's home rank. :class:`Migration` moves it: before training, every home rank
sends the rows of its clients dealt elsewhere to the rank that trains them, which keeps them
in guest slots after its own rows (``RowTable``); after training (and packing, which updates
them), the rows go back home. Two ``alltoall`` per round, one row per table and moved
client each way, and nothing at all for clients trained at home. Rows travel as bytes, so
a client's state is bitwise the same whichever rank trains it.
"""

from __future__ import annotations

import numpy as np


class Migration:
    """Guest rows of one rank, round by round.

    Parameters
    ----------
    comm : MPI communicator
    tables : list of ClientTable
        The run's movable per-client tables (``ClientTable.movable``).
    owner : (N,) int64
        Home rank of every client.
    home_slot : (N,) int64
        Each client's row on its home rank (-1 on other ranks).
    home : int
        Rows of this rank's own clients; guest slots follow them.
    """

    def __init__(self, comm, tables: list, owner: np.ndarray, home_slot: np.ndarray, home: int):
        self.comm, self.tables, self.owner, self.home_slot, self.home = comm, tables, owner, home_slot, home
        self.guests: list[int] = []   # cohort positions trained here this round but homed elsewhere
        self.moved = 0                # clients whose rows left their home rank, over the run (all ranks)

    def fetch(self, ctx, dealt: np.ndarray) -> None:
        """Collective, before training: rows of clients dealt away go to their trainer.

        Sets ``ctx.slots[j]`` to the guest slot of every position ``j`` this rank trains for
        another rank.
        """
        me, home = self.comm.rank, self.owner[ctx.cohort]
        out = [[] for _ in range(self.comm.size)]
        away = np.flatnonzero((home == me) & (dealt != me) & (np.asarray(ctx.steps) > 0))   # untrained: stay
        for j in away:
            out[int(dealt[j])].append(int(j))
        payload = [(pos, [t.rows(self.home_slot[ctx.cohort[pos]]) for t in self.tables]) if len(pos) else None
                   for pos in (np.array(p, dtype=np.int64) for p in out)]
        got = self.comm.alltoall(payload)
        parts = [p for p in got if p is not None]
        self.guests = sorted(int(j) for pos, _ in parts for j in pos)
        self.moved += int(np.count_nonzero((home != dealt) & (np.asarray(ctx.steps) > 0)))   # known on every rank
        if not self.guests:
            return
        slot_of = {j: self.home + g for g, j in enumerate(self.guests)}
        for t in self.tables:
            t.reserve(len(self.guests))
        for pos, rows in parts:
            slots = np.array([slot_of[int(j)] for j in pos], dtype=np.int64)
            for t, r in zip(self.tables, rows):
                t.put(slots, r)
            ctx.slots[pos] = slots

    def give_back(self, ctx) -> None:
        """Collective, after packing: the guests' rows (as training left them) go home."""
        home = self.owner[ctx.cohort]
        out = [[] for _ in range(self.comm.size)]
        for j in self.guests:
            out[int(home[j])].append(j)
        payload = [(pos, [t.rows(ctx.slots[pos]) for t in self.tables]) if len(pos) else None
                   for pos in (np.array(p, dtype=np.int64) for p in out)]
        for part in self.comm.alltoall(payload):
            if part is None:
                continue
            pos, rows = part
            slots = self.home_slot[ctx.cohort[pos]]
            for t, r in zip(self.tables, rows):
                t.put(slots, r)
        self.guests = []
