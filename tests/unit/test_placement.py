"""Per-client rows that follow a dealt client for one round (hpcfl/engine/placement.py, Migration),
on a stand-in world of ranks run as threads: which rows go where, into which guest slots, what
comes back home after training, what is never sent, and the moved-client count.

The MPI suite checks balanced placement bitwise at 2 and 3 ranks through whole runs; these pin
each step of the exchange in seconds, so that a broken one fails here first.
"""

import threading
from types import SimpleNamespace

import numpy as np
import torch

from hpcfl.algorithms.protocol import RowTable
from hpcfl.engine.placement import Migration


class World:
    """``size`` ranks whose ``alltoall`` meets at a barrier; every payload sent is recorded."""

    def __init__(self, size):
        self.size, self.boxes, self.sent = size, [None] * size, [[] for _ in range(size)]
        self.barrier = threading.Barrier(size, timeout=10)

    def comm(self, rank):
        world = self

        class Comm:
            def __init__(self):
                self.rank, self.size = rank, world.size

            def alltoall(self, payload):
                assert len(payload) == world.size
                world.sent[rank].append(payload)
                world.boxes[rank] = payload
                world.barrier.wait()
                got = [world.boxes[src][rank] for src in range(world.size)]
                world.barrier.wait()   # every rank has read before the next exchange writes
                return got
        return Comm()

    def run(self, fn):
        """fn(rank) on every rank at once; the first error raised on any rank is raised here."""
        errors = []

        def body(r):
            try:
                fn(r)
            except BaseException as exc:   # noqa: BLE001  (re-raised below)
                errors.append(exc)
                self.barrier.abort()
        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
        if errors:
            raise errors[0]


# 6 clients, homes 0 0 1 1 2 2 (two rows per rank); row of client c is [c, 10 c], two tables
OWNER = np.array([0, 0, 1, 1, 2, 2], dtype=np.int64)


def _setup(size=3, width=2, tables=2):
    world = World(size)
    ranks = []
    for r in range(size):
        mine = np.flatnonzero(OWNER == r)
        home_slot = np.full(len(OWNER), -1, dtype=np.int64)
        home_slot[mine] = np.arange(len(mine))
        rts = [RowTable(len(mine), width, "cpu", torch.float64) for _ in range(tables)]
        for k, rt in enumerate(rts):
            rt.tensor().copy_(torch.tensor([[c + 100 * k, 10 * c + 100 * k] for c in mine], dtype=torch.float64))
        cts = [rt.client_table(f"t{k}") for k, rt in enumerate(rts)]
        ranks.append(SimpleNamespace(rts=rts, mig=Migration(world.comm(r), cts, OWNER, home_slot, len(mine)),
                                     home_slot=home_slot))
    return world, ranks


def _ctx(rank, cohort, steps, home_slot):
    slots = np.where(OWNER[cohort] == rank, home_slot[cohort], -1)
    return SimpleNamespace(cohort=np.asarray(cohort, dtype=np.int64), steps=list(steps), slots=slots)


# cohort position j is client j; dealt: 0 home, 1 -> rank 1, 2 -> 2, 3 -> 2 (but untrained), 4 -> 0, 5 -> 1
COHORT, DEALT, STEPS = np.arange(6), np.array([0, 1, 2, 2, 0, 1]), [3, 3, 3, 0, 3, 3]


def _fetch(world, ranks, cohort=COHORT, dealt=DEALT, steps=STEPS):
    ctxs = [_ctx(r, cohort, steps, ranks[r].home_slot) for r in range(len(ranks))]
    world.run(lambda r: ranks[r].mig.fetch(ctxs[r], dealt))
    return ctxs


def test_fetch_puts_each_dealt_clients_rows_in_the_trainers_guest_slots():
    world, ranks = _setup()
    ctxs = _fetch(world, ranks)
    # rank 0 trains client 4 (home 2); rank 1 clients 1 and 5, in cohort order; rank 2 client 2 only:
    # client 3 is dealt to 2 but has no steps, so its rows stay home
    assert [rk.mig.guests for rk in ranks] == [[4], [1, 5], [2]]
    assert ctxs[0].slots.tolist() == [0, 1, -1, -1, 2, -1]        # guest slots follow the 2 own rows
    assert ctxs[1].slots.tolist() == [-1, 2, 0, 1, -1, 3]
    assert ctxs[2].slots.tolist() == [-1, -1, 2, -1, 0, 1]
    for rk, want in zip(ranks, ([[4, 40]], [[1, 10], [5, 50]], [[2, 20]])):
        for k, rt in enumerate(rk.rts):
            assert rt.guests == len(want)
            assert [rt[rk.mig.home + g].tolist() for g in range(len(want))] == \
                [[a + 100 * k, b + 100 * k] for a, b in want]
    # moved: clients 1, 2, 4, 5 left home (3 is untrained, 0 trains at home), counted on every rank
    assert [rk.mig.moved for rk in ranks] == [4, 4, 4]


def test_fetch_sends_rows_only_where_a_client_goes_and_nothing_elsewhere():
    world, ranks = _setup()
    _fetch(world, ranks)
    (to0, to1, to2), = world.sent[0]       # rank 0 sends client 1 (its slot 1) to rank 1, nothing else
    assert to0 is None and to2 is None
    pos, rows = to1
    assert pos.tolist() == [1] and pos.dtype == np.int64 and len(rows) == 2
    assert [r.tolist() for r in rows] == [[[1, 10]], [[101, 110]]]
    (to0, to1, to2), = world.sent[1]       # rank 1: client 2 to rank 2; client 3 (no steps) stays
    assert to0 is None and to1 is None and to2[0].tolist() == [2]
    (to0, to1, to2), = world.sent[2]       # rank 2: client 4 to rank 0, client 5 to rank 1
    assert to2 is None and to0[0].tolist() == [4] and to1[0].tolist() == [5]


def test_give_back_returns_the_rows_as_training_left_them_and_clears_the_guests():
    world, ranks = _setup()
    ctxs = _fetch(world, ranks)
    for r, rk in enumerate(ranks):            # "training": each guest row of each table gains 1000 (r + 1)
        for rt in rk.rts:
            for g in range(len(rk.mig.guests)):
                rt[rk.mig.home + g] = rt[rk.mig.home + g] + 1000 * (r + 1)
    world.run(lambda r: ranks[r].mig.give_back(ctxs[r]))
    home_rows = [[rt.tensor().tolist() for rt in rk.rts] for rk in ranks]
    # client 1 trained on rank 1 (+2000), 2 on rank 2 (+3000), 4 on rank 0 (+1000), 5 on rank 1 (+2000);
    # 0 and 3 never left
    assert home_rows[0] == [[[0, 0], [2001, 2010]], [[100, 100], [2101, 2110]]]
    assert home_rows[1] == [[[3002, 3020], [3, 30]], [[3102, 3120], [103, 130]]]
    assert home_rows[2] == [[[1004, 1040], [2005, 2050]], [[1104, 1140], [2105, 2150]]]
    assert [rk.mig.guests for rk in ranks] == [[], [], []]
    (to0, to1, to2), = world.sent[1][1:]     # rank 1 sends back clients 1 (home 0) and 5 (home 2)
    assert to1 is None and to0[0].tolist() == [1] and to2[0].tolist() == [5]
    assert [r.tolist() for r in to0[1]] == [[[2001, 2010]], [[2101, 2110]]]


def test_a_round_trained_at_home_moves_nothing_and_counts_nothing():
    world, ranks = _setup()
    ctxs = _fetch(world, ranks, dealt=OWNER.copy())
    assert [rk.mig.guests for rk in ranks] == [[], [], []] and [rk.mig.moved for rk in ranks] == [0, 0, 0]
    assert all(rt.guests == 0 for rk in ranks for rt in rk.rts)          # no room made
    assert all(p is None for sent in world.sent for payload in sent for p in payload)
    assert ctxs[1].slots.tolist() == [-1, -1, 0, 1, -1, -1]


def test_the_count_adds_up_over_rounds_and_guest_room_never_shrinks():
    """Round 1 moves 4 clients (rank 1 hosts 2), round 2 moves client 0 alone to rank 1: 5 in all,
    rank 1's guest room stays 2 and client 0 takes its first guest slot."""
    world, ranks = _setup()
    ctxs = _fetch(world, ranks)
    world.run(lambda r: ranks[r].mig.give_back(ctxs[r]))
    ctxs = _fetch(world, ranks, cohort=np.array([0, 2]), dealt=np.array([1, 1]), steps=[2, 2])
    assert [rk.mig.moved for rk in ranks] == [5, 5, 5] and ranks[1].mig.guests == [0]
    assert ctxs[1].slots.tolist() == [2, 0] and ranks[1].rts[0].guests == 2
    assert ranks[1].rts[0][2].tolist() == [0, 0] and ranks[1].rts[1][2].tolist() == [100, 100]


def test_guest_slots_follow_cohort_order_not_the_senders_rank_order():
    """Position 0 is client 4 (home 2), position 1 client 2 (home 1), both trained on rank 0: rank 1's
    rows arrive first, yet position 0 takes the first guest slot (slots are a function of the
    cohort, the same whichever rank sends first)."""
    world, ranks = _setup()
    ctxs = _fetch(world, ranks, cohort=np.array([4, 2]), dealt=np.array([0, 0]), steps=[1, 1])
    assert ranks[0].mig.guests == [0, 1] and ctxs[0].slots.tolist() == [2, 3]
    assert [rk.mig.moved for rk in ranks] == [2, 2, 2]            # one step each is still training
    assert ranks[0].rts[0][2].tolist() == [4, 40] and ranks[0].rts[0][3].tolist() == [2, 20]
