"""A policy that takes part in every phase of the round protocol, for the protocol tests."""

import numpy as np
import torch

from hpcfl.algorithms.protocol import ClientTable, Field, Policy, Segment, ServerArray


class Probe(Policy):
    """Records what each hook saw; every value is checkable by hand.

    - setup: exact integer sum of the owned clients' class counts (must equal the total);
    - statistics: exact sum of the cohort's sizes, and a by-position gather of client ids;
    - segment "probe": [1, p_i] per trained client, so the server sees (count, sum p);
    - state: per-client "times trained" rows and a broadcast server counter;
    - control: decides rnd + 100, which every rank must receive;
    - records: per-client times trained, per-round the received decision and the sums.
    """

    client_fields = {"probe_id": Field(np.int64, "client", "client id gathered in the statistics phase",
                                       summary="median")}
    round_fields = {"probe_sizes": Field(np.float64, "samples", "sum of the cohort's sizes, reduced exactly"),
                    "probe_count": Field(np.float64, "clients", "trained clients, from the probe segment"),
                    "probe_decision": Field(np.int64, "1", "the decision received from the controller")}

    def __init__(self, num_local: int):
        self.rows = torch.zeros(num_local, 1, dtype=torch.float64)
        self.server_total = np.zeros(1)
        self.decision = -1
        self.seen = {}

    def setup(self, ctx):
        owned = ctx.clients._slot >= 0      # every client this rank owns
        self.seen["setup_counts"] = ctx.collective.sum_int("probe_counts", ctx.class_counts[owned].sum(0))

    def statistics(self, ctx):
        rows = [np.array([float(ctx.sizes[j])]) for j in ctx.mine]
        self.seen["sizes"] = float(ctx.collective.sum("probe_sizes", rows, 1, len(ctx.cohort))[0])
        ids = ctx.collective.gather("probe_ids", ctx.mine, ctx.cohort[ctx.mine].astype(float)[:, None],
                                    len(ctx.cohort))
        self.seen["ids"] = ids[:, 0]

    def segments(self):
        return [Segment("probe", 2)]

    def pack(self, ctx, j, slot, res, weight):
        self.rows[slot] += 1
        return {"probe": np.array([1.0, weight])}

    def server_update(self, ctx, seg, scalars):
        self.seen["segment"] = seg["probe"].copy()
        self.server_total += seg["probe"][0]

    def control(self, ctx, seg, scalars):
        return ctx.rnd + 100

    def receive(self, decision):
        self.decision = decision

    def client_records(self, ctx):
        return {"probe_id": self.seen["ids"].astype(np.int64)}

    def round_records(self, ctx):
        return {"probe_sizes": self.seen["sizes"], "probe_count": self.seen["segment"][0],
                "probe_decision": self.decision}

    def state(self):
        def set_rows(r):
            self.rows.copy_(torch.from_numpy(r))

        def set_total(v):
            self.server_total[:] = v

        return [ClientTable("probe_rows", 1, lambda: self.rows.numpy(), set_rows),
                ServerArray("probe_total", lambda: self.server_total, set_total, broadcast=True)]

    def transfer(self):
        return 3, 5
