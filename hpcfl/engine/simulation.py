"""The round loop (docs/architecture.md), and nothing else.

:func:`hpcfl.engine.setup.prepare` builds everything a rank needs (data, partition, model,
policies); :func:`run` is the loop, readable top to bottom:

1. cohort      seeded by (seed, round); identical on every rank
2. decisions   weights p_i over the sampled set, the statistics phase (per-client
               quantities at the round-start model, reduced exactly), steps tau_i, and
               the simulated clock's plan; identical on every rank
3. train       each rank trains its own cohort clients, one after another
4. pack        each client's contribution is one row [delta | policy segments | scalars]
5. reduce      one exact, order-independent sum over all ranks
6. server      rank 0 applies the server rule, optimizer and policies' server state;
               the controllers decide for the next round; model, state and decisions
               are broadcast
7. evaluate    test chunks split over ranks, counts reduced exactly; rank 0 records

The hooks and their order are documented in :mod:`hpcfl.algorithms.protocol`.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from .. import rng
from ..algorithms.policies import epoch_steps
from ..algorithms.protocol import RoundContext
from ..client.trainer import LocalClients
from ..config import GuardSection
from ..parallel.comm import Collectives, deal, make_sum
from ..parallel.runtime import NondeterministicOp, all_finite, bcast_model, sums_device, sync, to_host
from .control import RunControl
from .evaluation import evaluate, train_eval_set
from .records import REJECTED, round_records
from .setup import Setup, prepare  # noqa: F401  (re-exported: callers have always found them here)


def accumulator(s: Setup):
    """The training reduction's accumulator, kept for the whole run (buffers reused; the exact
    sum's grid is run state, checkpointed through :func:`hpcfl.engine.resume.capture`). Built on first
    use, so a policy added after :func:`prepare` is counted in its length."""
    length = s.algo.layout.length
    if s.acc is None or s.acc.length != length:
        spans = [(sl.start, sl.stop) for sl in s.algo.layout.slices.values()]
        s.acc = make_sum(s.cfg.runtime.reduce, length, spans, sums_device(s.device))
    return s.acc


def settle_placement(s: Setup) -> None:
    """Whether rounds are dealt by work, and whether per-client rows travel (every rank, at the
    start of :func:`run`, after any ``Algorithm.add``: the policies decide). Says why once."""
    comm, algo = s.comm, s.algo
    dealt = s.cfg.runtime.placement == "balanced" and comm.size > 1
    pinned = algo.pinned() if dealt else []
    say = comm.rank == 0 and s.dealt is None
    s.migration = None
    if pinned:
        dealt = False
        if say:
            print(f"hpcfl: runtime.placement = 'balanced': clients train on their home block of ranks, because "
                  f"{'; '.join(pinned)} needs them there", flush=True)
    elif dealt and algo.tables():
        from .placement import Migration
        s.migration = Migration(comm, algo.tables(), s.owner, s.slot, int(np.count_nonzero(s.owner == comm.rank)))
        if say:
            print(f"hpcfl: runtime.placement = 'balanced': per-client state ("
                  f"{', '.join(t.name for t in algo.tables())}) travels with clients dealt to another rank, "
                  f"one row each way", flush=True)
    s.dealt = dealt


class Stopped(Exception):
    """Raised on every rank together when a stop was agreed (checkpoint written after ``round``)."""

    def __init__(self, message: str, round_: int = 0):
        super().__init__(message)
        self.round = round_


class GuardStop(Exception):
    """Raised on every rank together when a guarded update stops the run (guard.policy = "stop")."""


class Diverged(Exception):
    """Raised on every rank together when the server's new model, or its outputs on the
    evaluation data, hold NaN or Inf.

    ``round`` (from 1) is the round whose update diverged; nothing of it is applied.
    """

    def __init__(self, round_: int, what: str = "the global model"):
        super().__init__(f"{what} became NaN or Inf in round {round_} (diverged); the run stopped there: lower "
                         f"algorithm.lr, or bound the updates with guard.max_norm")
        self.round = round_


def round_context(s: Setup, rnd: int, collective: Collectives, lr: float) -> RoundContext:
    """The round's cohort and everything the policies see (before any decision)."""
    cohort, draws = s.algo.sampler.cohort(rnd)
    mine = np.flatnonzero(s.owner[cohort] == s.comm.rank)
    log = (lambda msg: print(f"hpcfl: round {rnd + 1}: {msg}", flush=True)) if s.comm.rank == 0 else (lambda msg: None)
    return RoundContext(rnd, s.cfg.run.rounds, s.cfg.run.seed, cohort, s.sizes[cohort], s.sizes, s.class_counts,
                        lr, mine, s.slot[cohort], collective, s.home,
                        LocalClients(s, rnd, cohort), draws, log=log)


def run(s: Setup, on_round=None, start: int = 0, sim_time: float = 0.0, x: np.ndarray | None = None,
        control=None, checkpoint=None, after_round=None, on_eval=None) -> np.ndarray:
    """Run rounds ``start .. rounds-1``; returns the final flat model (every rank).

    ``on_round(metrics, clients)`` is called on rank 0 after each round; ``after_round(rnd)`` on
    every rank after it, outside the round's timings; ``on_eval(round, accuracy, loss)`` on rank 0 after
    ``on_round`` at each evaluated round when ``s.client_eval`` is set (each client's, shape (N,), round
    from 1) (``hpcfl bench --interleave`` runs the
    bare loop's round there). ``x`` and
    ``sim_time`` continue a resumed run. ``control`` (hpcfl.engine.control.RunControl) gives
    phases, guards and the stop agreement; ``checkpoint(rounds_done, x, sim_time)`` is a
    collective called at round ends when one is due, on a stop, and after the last round.

    Under ``runtime.deterministic``, an operation without a deterministic kernel raises
    :class:`hpcfl.parallel.runtime.NondeterministicOp` (a configuration error) naming it.
    """
    try:
        return _rounds(s, on_round, start, sim_time, x, control, checkpoint, after_round, on_eval)
    except RuntimeError as exc:
        err = NondeterministicOp.match(exc, f"model {s.cfg.model.name!r} on {s.device}")
        if err is None:
            raise
        raise err from None


def _rounds(s: Setup, on_round, start: int, sim_time: float, x, control, checkpoint, after_round,
            on_eval=None) -> np.ndarray:
    """The loop of :func:`run`."""
    cfg, comm, algo = s.cfg, s.comm, s.algo
    settle_placement(s)
    control = control or RunControl(comm, GuardSection(), 0.0)
    B = cfg.algorithm.batch_size
    collective = Collectives(comm, cfg.runtime.reduce)
    acc = accumulator(s)
    on_device = getattr(acc, "device", None) is not None   # the sums, and so the global model, live there
    x = s.model.numpy() if x is None else x      # global model; authoritative on rank 0
    x = bcast_model(comm, torch.from_numpy(x).to(s.device) if on_device else x)
    train_eval = train_eval_set(s) if cfg.run.eval_train else None
    algo.setup(round_context(s, start, collective, algo.lr))
    every = cfg.checkpoint.every
    for rnd in range(start, cfg.run.rounds):
        t0 = time.perf_counter()
        # 1-2. cohort; weights, statistics phase, steps; what the simulated systems allow
        control.phase("decide", rnd)
        ctx = round_context(s, rnd, collective, algo.begin_round(rnd, cfg.run.rounds))
        x0 = x if on_device else torch.from_numpy(x).to(s.device)   # read only: the server makes a new x
        ctx.clients.x0 = x0
        algo.decide(ctx)
        if s.system is not None:
            ctx.plan = s.system.plan(rnd, ctx.cohort, ctx.steps, B, _granularity(s, ctx),
                                     finish_steps=algo.finish_steps(ctx), full_steps=ctx.full_steps)
            ctx.steps = ctx.plan.steps
            sim_time += ctx.plan.duration_s
        if s.dealt:   # from here on "mine" is the share dealt to this rank; per-client rows follow
            dealt = deal(_work(ctx, B), comm.size)
            ctx.mine = np.flatnonzero(dealt == comm.rank)
            if s.migration is not None:
                s.migration.fetch(ctx, dealt)
        sync(s.device)   # each phase's time is its own device work too
        t_decide = time.perf_counter()

        # 3-4. local training of this rank's cohort clients, one contribution row each
        control.phase("train", rnd)
        acc.reset(len(ctx.cohort))
        records, refused, held = [], [], []
        for j, res in _local_training(s, ctx, x0):
            cid, slot = int(ctx.cohort[j]), int(ctx.slots[j])
            norm = float(torch.linalg.vector_norm(res.delta, dtype=torch.float64))   # on the device
            problem = control.check_update(cid, rnd, norm)
            if problem is not None:         # never averaged in: skip and record, or stop the run
                refused.append(problem)
                records.append((int(j), float("nan"), 0.0, REJECTED, 0.0, 0.0))
                continue
            records.append((int(j), res.loss, res.anorm, 0, res.anorm2, res.alast))
            if algo.holds(ctx, int(j)):     # packed after the release phase (FedLGA's slow clients)
                held.append((int(j), slot, res))
                continue
            algo.pack_into(ctx, int(j), slot, res, float(ctx.weights[j]), acc.claim())   # written where it is kept
            acc.commit()
        sync(s.device)
        t1 = time.perf_counter()   # before any collective: waiting for slower ranks counts as reduce
        if s.migration is not None:   # guests' rows, as packing left them, go home
            s.migration.give_back(ctx)
        algo.release(ctx, held)
        for j, slot, res in held:
            algo.pack_into(ctx, j, slot, res, float(ctx.weights[j]), acc.claim())
            acc.commit()

        # 5. one exact reduction of all contributions (after the guard's verdict, if it may stop)
        control.phase("reduce", rnd)
        if cfg.guard.policy == "stop":
            refused = control.agree_guard(refused)
            if refused:
                raise GuardStop("; ".join(refused))
        sums = acc.reduce(comm, total=len(ctx.cohort), root=0)
        gathered = comm.gather(records, root=0)
        sync(s.device)
        t2 = time.perf_counter()

        # 6. server update and controllers on rank 0; broadcast model, server state, decisions
        control.phase("server", rnd)
        diag, verdict = {}, None
        if comm.rank == 0:
            x, diag = algo.server_step(ctx, x, sums)
            verdict = (all_finite(x), algo.control(ctx, sums))
        finite, decisions = comm.bcast(verdict, root=0)   # one broadcast: the divergence check rides along
        if not finite:   # nothing of this round is kept; the last checkpoint stays valid
            raise Diverged(rnd + 1)
        x = bcast_model(comm, x)
        algo.broadcast_state(comm)
        algo.receive(decisions)
        sync(s.device)
        t3 = time.perf_counter()

        # 7. evaluation (test chunks split over ranks), then rank 0 records the round
        evaluating = rnd == cfg.run.rounds - 1 or bool(cfg.run.eval_every and (rnd + 1) % cfg.run.eval_every == 0)
        control.phase("eval", rnd, "eval" if evaluating else "record")   # the watchdog times the two apart
        test_acc = test_loss = train_acc = train_loss = float("nan")
        per_client = None
        if evaluating:
            s.model.load(x)
            if s.client_eval is None:
                test_acc, test_loss = evaluate(s, s.x_test, s.y_test)
            else:   # one pass over the test set gives both
                test_acc, test_loss, *per_client = evaluate(s, s.x_test, s.y_test, clients=s.client_eval)
            if train_eval is not None:
                train_acc, train_loss = evaluate(s, s.trainer.x, s.trainer.y, train_eval)
            if np.isinf(test_loss) or np.isinf(train_loss):   # the same verdict on every rank
                raise Diverged(rnd + 1, "the global model's outputs")
        sync(s.device)
        t4 = time.perf_counter()

        if comm.rank == 0:
            metrics, clients = round_records(algo, ctx, sums, gathered, diag)
            metrics.update(test_accuracy=test_acc, test_loss=test_loss, global_train_accuracy=train_acc,
                           global_train_loss=train_loss, sim_time=sim_time, time_decide=t_decide - t0,
                           time_train=t1 - t_decide, time_reduce=t2 - t1, time_server=t3 - t2,
                           time_eval=t4 - t3, time_round=t4 - t0)
            if on_round is not None:
                on_round(metrics, clients)
            if on_eval is not None and per_client is not None:
                on_eval(rnd + 1, *per_client)
        if after_round is not None:
            after_round(rnd)

        # 8. round boundary: agree on stop requests; checkpoint when due (rounds or rank 0's
        # wall clock), on a stop, at the end
        stop, timely = control.boundary()
        done = rnd + 1
        if checkpoint is not None and (stop or timely or done == cfg.run.rounds or (every and done % every == 0)):
            control.phase("checkpoint", rnd)
            checkpoint(done, to_host(x), sim_time)
            control.checkpointed(done)
        if stop and done < cfg.run.rounds:   # a stop after the last round changes nothing: the run finishes
            raise Stopped(f"stopped by {stop} after round {done} with a checkpoint", done)
    return to_host(x)


def _local_training(s: Setup, ctx, x0: torch.Tensor):
    """Train this rank's cohort clients that have steps; yields (cohort position, ClientResult)
    in cohort order, one client at a time or, when ``runtime.vectorize`` chose it, in batched
    groups (:mod:`hpcfl.client.block`). Each client's randomness is keyed by (seed, round,
    client, draw) either way, so both give every client the same batches."""
    seed, algo = s.cfg.run.seed, s.algo
    todo = [int(j) for j in ctx.mine[ctx.steps[ctx.mine] > 0]]

    def key(j):   # a repeated draw trains with its own randomness
        return ctx.rnd, int(ctx.cohort[j]), _occurrence(ctx.cohort, j)

    if s.lanes is not None:   # clients side by side, one torch thread each, even alone (client/lanes.py)
        tasks = [(j, int(ctx.slots[j]), ctx.clients.indices(j), int(ctx.steps[j]),
                  rng.torch_generator(s.device, seed, rng.CLIENT_TRAIN, *key(j))) for j in todo]
        yield from s.lanes.train(x0, tasks, algo.correction, ctx.lr)
        return
    if s.block is None:
        for j in todo:
            gen = rng.torch_generator(s.device, seed, rng.CLIENT_TRAIN, *key(j))
            rng.seed_device(s.device, rng.torch_seed(seed, rng.CLIENT_TRAIN, *key(j)))  # dropout and the like
            yield j, s.trainer.train(x0, ctx.clients.indices(j), int(ctx.steps[j]), algo.solver, gen,
                                     algo.correction(int(ctx.slots[j])), ctx.lr)
        return
    jobs = [(ctx.clients.indices(j), int(ctx.steps[j]), rng.torch_generator(s.device, seed, rng.CLIENT_TRAIN,
                                                                          *key(j))) for j in todo]
    corrections = [algo.correction(int(ctx.slots[j])) for j in todo]
    trained = int(np.count_nonzero(ctx.steps > 0))   # on all ranks: fixes the group width (shapes as on 1 rank)
    yield from zip(todo, s.block.train(x0, jobs, algo.solver.spec, ctx.lr, corrections, cohort=trained))


def _work(ctx, batch_size: int) -> np.ndarray:
    """Expected training cost of each cohort member, (k,): steps times samples per step.

    A client smaller than one batch runs smaller steps. The per-step cost of one model is
    otherwise the same for every client, so this orders clients by their real work.
    """
    return np.asarray(ctx.steps, dtype=np.float64) * np.minimum(ctx.sizes, batch_size)


def _occurrence(cohort: np.ndarray, j: int) -> int:
    """How many earlier positions of the (sorted) cohort hold the same client: 0 unless
    sampling draws a client twice (``with_replacement``)."""
    return int(j - np.searchsorted(cohort, cohort[j]))


def _granularity(s: Setup, ctx: RoundContext):
    """Steps a deadline-truncated client keeps a multiple of: 1, or its steps per epoch."""
    if s.cfg.system.truncate == "step":
        return 1
    return epoch_steps(1, ctx.sizes, s.cfg.algorithm.batch_size)
