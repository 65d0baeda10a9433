"""A client's kernels see the same shapes on 1, 2 and 3 ranks (vectorised blocks, issue 50).

Kernel libraries pick algorithms by shape (cuBLAS, cuDNN), so a client trained in a group of 10
rows on one rank and of 5 on another may round differently. The torch paths of
:class:`~hpcfl.client.block.BlockTrainer` therefore run groups of a fixed width,
``min(group_size, clients the round trains)``, padded, with every row computing at every step.

A :class:`TorchDispatchMode` records the op and the shapes and dtypes of the tensor arguments of
every kernel call made during a group's local steps, attributed to the clients taking that step
(:attr:`BlockTrainer.trace` says which). The group's set-up before its first step (the schedule's
integer work, one gather of its batches, one division for the per-sample weights) is not
attributed: integer work, copies and correctly rounded element-wise division give every element the
same bits whatever the shape. The clients each rank trains come from the engine's own
placement rules (``deal`` for "balanced", ``owners`` for "block") at R = 1, 2, 3, and each rank's
share is trained by the engine's own ``_local_training``.

``HPCFL_SHAPES_DEVICE=cuda`` runs the same check on a GPU (bench/gpu_check.sh does).
"""

import os
from collections import defaultdict

import numpy as np
import pytest
import torch
from mpi4py import MPI
from runner import job
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from hpcfl import config
from hpcfl.client import block
from hpcfl.engine import simulation
from hpcfl.parallel.comm import Collectives, owners

DEVICE = os.environ.get("HPCFL_SHAPES_DEVICE", "cpu")
RANKS = (1, 2, 3)


class KernelShapes(TorchDispatchMode):
    """Every kernel call's (op, ((shape, dtype) of each tensor argument, ...)), per live client."""

    def __init__(self):
        super().__init__()
        self.live: list = []
        self.calls: dict = defaultdict(list)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.live:
            call = (func.name(), tuple((tuple(t.shape), str(t.dtype)) for t in tree_leaves((args, kwargs))
                                       if isinstance(t, torch.Tensor)))
            for client in self.live:
                self.calls[client].append(call)
        return func(*args, **kwargs)


def setup(model):
    """A prepared run (one process) and round 0's context after its decisions: unequal step counts."""
    if model == "lenet5":
        table = job(**{"data.dataset": "synthetic_images", "model.name": "lenet5"})
        table["data"]["synthetic_images"] = {"num_train": 600, "num_test": 50, "image_shape": [1, 16, 16]}
    else:
        table = job()   # digits, an MLP 64 -> 16 -> 10
    table["data"]["num_clients"] = 12
    table["algorithm"].update(clients_per_round=7, local_epochs=1, batch_size=16)
    del table["algorithm"]["local_steps"]
    table["runtime"].update(vectorize="on", device=DEVICE)
    cfg = config.from_dict(table)
    s = simulation.prepare(cfg, MPI.COMM_SELF)
    ctx = simulation.round_context(s, 0, Collectives(MPI.COMM_SELF, cfg.runtime.reduce), s.algo.lr)
    x0 = torch.from_numpy(s.model.numpy()).to(s.device)
    ctx.clients.x0 = x0
    s.algo.decide(ctx)
    assert len(set(ctx.steps.tolist())) > 2, "want clients of unequal steps (finished rows inside a group)"
    return s, ctx, x0


def per_client(s, ctx, x0, shares):
    """Kernel calls and results per cohort position, training each rank's ``shares`` in turn."""
    rec, results = KernelShapes(), {}
    for mine in shares:
        ctx.mine = mine
        todo = [int(j) for j in mine[ctx.steps[mine] > 0]]   # the order of _local_training's jobs
        s.block.trace = lambda k, ids, todo=todo: setattr(rec, "live", [todo[i] for i in ids])
        with rec:
            for j, res in simulation._local_training(s, ctx, x0):
                results[j] = res
    s.block.trace = None
    return rec.calls, results


def placements(ctx, B, R):
    """Each rank's cohort positions at R ranks: as dealt ("balanced") and by home block ("block")."""
    dealt = simulation.deal(simulation._work(ctx, B), R)
    home = owners(12, R, "block")[ctx.cohort]
    return {"balanced": [np.flatnonzero(dealt == r) for r in range(R)],
            "block": [np.flatnonzero(home == r) for r in range(R)]}


def first_difference(a: dict, b: dict) -> str | None:
    for client in sorted(set(a) | set(b)):
        x, y = a.get(client, []), b.get(client, [])
        for i, (u, v) in enumerate(zip(x, y)):
            if u != v:
                return f"client at cohort position {client}, call {i}: {u} vs {v}"
        if len(x) != len(y):
            return f"client at cohort position {client}: {len(x)} vs {len(y)} calls"
    return None


def shapes_on_1_2_3_ranks(model, group_size):
    s, ctx, x0 = setup(model)
    s.block.group_size = group_size
    B = s.cfg.algorithm.batch_size
    runs = {}
    for R in RANKS:
        for how, shares in placements(ctx, B, R).items():
            if R == 1 and how == "block":
                continue
            runs[R, how] = per_client(s, ctx, x0, shares)
    return runs


@pytest.mark.parametrize("model", ["lenet5", "mlp"])
@pytest.mark.parametrize("group_size", [64, 3])
def test_a_clients_kernels_have_the_same_shapes_on_1_2_and_3_ranks(model, group_size):
    """64: one group of 7 rows on 1 rank, padded groups of 7 on 2 and 3; 3: groups of 3 rows, a
    rank's last one padded. Per-client results are bitwise equal too."""
    runs = shapes_on_1_2_3_ranks(model, group_size)
    ref_calls, ref_res = runs[1, "balanced"]
    assert len(ref_calls) == 7 and all(len(c) > 10 for c in ref_calls.values())
    for key, (calls, res) in runs.items():
        assert first_difference(ref_calls, calls) is None, f"{key}: {first_difference(ref_calls, calls)}"
        for j, r in ref_res.items():
            assert torch.equal(r.delta, res[j].delta) and r.loss == res[j].loss, (key, j)
    # the layers' batched products run on (width, ...) operands: 7 rows, or 3
    width = min(group_size, 7)
    bmm = [args[0][0] for op, args in ref_calls[0] if op == "aten::bmm"]
    assert len(bmm) >= 4 and {shape[0] for shape in bmm} == {width}


@pytest.mark.parametrize("model", ["lenet5", "mlp"])
def test_the_check_sees_groups_that_follow_the_block(model, monkeypatch):
    """The old rule (a group as wide as the rank's own jobs) gives a client other shapes on 2 ranks."""
    monkeypatch.setattr(block, "group_width", lambda group_size, cohort, jobs: min(group_size, jobs))
    runs = shapes_on_1_2_3_ranks(model, 64)
    diff = first_difference(runs[1, "balanced"][0], runs[2, "balanced"][0])
    assert diff is not None and "(7," in diff and ("(4," in diff or "(3," in diff), diff
