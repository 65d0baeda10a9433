"""The round loop (ARCHITECTURE section 3), and nothing else.

:func:`prepare` builds everything a rank needs (data, partition, model, policies);
:func:`run` is the loop, readable top to bottom:

1. cohort      seeded by (seed, round); identical on every rank
2. decisions   steps tau_i and weights p_i for the whole cohort, on every rank
3. train       each rank trains its own cohort clients, one after another
4. pack        each client's contribution is one row [delta | extras | scalars]
5. reduce      one exact, order-independent sum over all ranks, to rank 0
6. server      rank 0 applies the server rule and optimizer; broadcast to all
7. evaluate    test chunks split over ranks, counts reduced exactly; rank 0 records
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from . import rng
from .algorithms import SCALARS, Algorithm
from .client.trainer import Trainer, evaluate_chunks
from .comm import ExactSum, make_sum, node_layout, owners
from .config import GuardSection
from .control import RunControl
from .errors import ConfigError
from .params import FlatModel
from .runtime import pick_device, pick_threads


def sample_cohort(seed: int, rnd: int, num_clients: int, per_round: int) -> np.ndarray:
    """Sorted ids of the clients in round ``rnd``: uniform without replacement, or all."""
    if per_round == 0 or per_round >= num_clients:
        return np.arange(num_clients, dtype=np.int64)
    gen = rng.numpy_rng(seed, rng.COHORT, rnd)
    return np.sort(gen.choice(num_clients, size=per_round, replace=False)).astype(np.int64)


def cohort_and_weights(cfg, rnd: int, all_weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The round's cohort (sorted, unique) and each member's aggregation weight.

    ``all_weights`` (N,) are the weights policy's w_i for every client. Sampling modes
    (fednova.md 3.4): "uniform" takes q clients without replacement and keeps w_i (the
    server renormalises by their sum, Alg. 1); "with_replacement" draws q clients with
    probability p_i = w_i / sum w and weights each draw 1/q (a client drawn k times gets
    k/q); "unbiased" samples uniformly without replacement with weight p_i N / q (the
    server does not renormalise).
    """
    a, n = cfg.algorithm, len(all_weights)
    q = a.clients_per_round
    if a.sampling == "with_replacement":
        gen = rng.numpy_rng(cfg.run.seed, rng.COHORT, rnd)
        draws = gen.choice(n, size=q, replace=True, p=all_weights / all_weights.sum())
        cohort, counts = np.unique(draws, return_counts=True)
        return cohort.astype(np.int64), counts / q
    cohort = sample_cohort(cfg.run.seed, rnd, n, q)
    if a.sampling == "unbiased":
        return cohort, all_weights[cohort] / all_weights.sum() * n / q
    return cohort, all_weights[cohort]


@dataclass
class Setup:
    """Everything one rank needs for the loop (built by :func:`prepare`)."""

    cfg: object
    comm: object
    device: torch.device
    dataset: object
    parts: list            # per-client train index arrays (numpy), all clients
    sizes: np.ndarray      # (N,) samples per client
    owner: np.ndarray      # (N,) rank of each client
    slot: np.ndarray       # (N,) position of a client among its rank's clients (-1 elsewhere)
    client_index: torch.Tensor   # this rank's clients' indices, concatenated, on device
    client_offset: np.ndarray    # (local clients + 1,) offsets into client_index
    model: FlatModel
    trainer: Trainer
    algo: Algorithm
    x_test: torch.Tensor
    y_test: torch.Tensor
    threads: int
    system: object = None  # hpcfl.system.SystemModel when [system] enabled


def prepare(cfg, comm) -> Setup:
    """Load data, partition, place clients, build the model and the policies on this rank."""
    from . import data, models

    local_rank, local_size = node_layout(comm)
    device = pick_device(cfg.runtime.device, local_rank)
    threads = pick_threads(cfg.runtime.threads, local_size)
    torch.set_num_threads(threads)
    dtype = torch.float64 if cfg.runtime.dtype == "float64" else torch.float32

    ds = data.load_dataset(cfg.data.dataset, cfg.dataset_options, cfg.data.root, cfg.run.seed)
    parts = data.make_partition(cfg.data.partition, ds.y_train, cfg.data.num_clients, cfg.partition_options,
                                cfg.run.seed, ds)
    if len(parts) != cfg.data.num_clients:
        raise ConfigError(f"data.num_clients = {cfg.data.num_clients} but the partition made {len(parts)} clients; "
                          f"set data.num_clients = {len(parts)}")
    sizes = np.array([len(p) for p in parts], dtype=np.int64)
    empty = np.flatnonzero(sizes == 0)
    if empty.size:
        raise ConfigError(f"{empty.size} clients got no training samples (first: client {empty[0]}); "
                          f"lower data.num_clients or use a partition with a minimum size")
    owner = owners(cfg.data.num_clients, comm.size, cfg.runtime.placement)
    mine = np.flatnonzero(owner == comm.rank)
    slot = np.full(cfg.data.num_clients, -1, dtype=np.int64)
    slot[mine] = np.arange(mine.size)
    offsets = np.concatenate([[0], np.cumsum(sizes[mine])])
    index = np.concatenate([parts[i] for i in mine]).astype(np.int64)

    torch.manual_seed(rng.torch_seed(cfg.run.seed, rng.MODEL_INIT))
    module = models.build_model(cfg.model.name, cfg.model_options, ds.input_shape, ds.num_classes)
    model = FlatModel(module, device, dtype)
    x_train = torch.from_numpy(ds.x_train).to(device=device, dtype=dtype)
    y_train = torch.from_numpy(ds.y_train).to(device=device)
    augment = None
    if ds.augment:
        from .data.augment import augment_batch
        augment = augment_batch
    trainer = Trainer(model, x_train, y_train, cfg.algorithm.batch_size, augment)
    algo = Algorithm(cfg, model.length, model.num_params, mine.size, device, dtype)
    system = None
    if cfg.system is not None and cfg.system.enabled:
        from .system import SystemModel
        nbytes = model.length * model.flat.element_size()
        up = nbytes * (2 if cfg.algorithm.local in ("scaffold",) else 1)   # SCAFFOLD also sends Delta c
        down = nbytes * (2 if cfg.algorithm.local in ("scaffold", "vr") else 1)  # and receives c / hbar
        system = SystemModel(cfg.system, cfg.data.num_clients, cfg.run.seed, nbytes, upload_bytes=up,
                             download_bytes=down, base_dir=cfg.job_dir)
    return Setup(cfg, comm, device, ds, parts, sizes, owner, slot,
                 torch.from_numpy(index).to(device), offsets, model, trainer, algo,
                 torch.from_numpy(ds.x_test).to(device=device, dtype=dtype),
                 torch.from_numpy(ds.y_test).to(device=device), threads, system)


def evaluate(s: Setup, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """(accuracy, mean loss) of the current model on (x, y); valid on rank 0.

    Chunks of ``eval_batch_size`` samples are dealt to ranks round-robin; their counts
    and loss sums are reduced exactly, so the result does not depend on the rank count.
    """
    n = x.shape[0]
    bs = s.cfg.runtime.eval_batch_size
    chunks = [(lo, min(lo + bs, n)) for lo in range(0, n, bs)]
    acc = ExactSum(3)
    for row in evaluate_chunks(s.model, x, y, chunks[s.comm.rank :: s.comm.size]):
        acc.add(row)
    tot = acc.reduce(s.comm, total=len(chunks), root=0)
    if tot is None:
        return float("nan"), float("nan")
    has_accuracy = getattr(s.model.module, "loss", None) is None
    return (tot[0] / tot[2] if has_accuracy else float("nan")), tot[1] / tot[2]


class Stopped(Exception):
    """Raised on every rank together when a stop signal was agreed (checkpoint written)."""


class GuardStop(Exception):
    """Raised on every rank together when a guarded update stops the run (guard.policy = "stop")."""


REJECTED = 5  # /clients/dropped code of an update refused by the guard


def run(s: Setup, on_round=None, start: int = 0, sim_time: float = 0.0, x: np.ndarray | None = None,
        control=None, checkpoint=None) -> np.ndarray:
    """Run rounds ``start .. rounds-1``; returns the final flat model (every rank).

    ``on_round(metrics, clients)`` is called on rank 0 after each round. ``x`` and
    ``sim_time`` continue a resumed run. ``control`` (hpcfl.control.RunControl) gives
    phases, guards and the stop agreement; ``checkpoint(rounds_done, x, sim_time)`` is a
    collective called at round ends when one is due, on a stop, and after the last round.
    """
    cfg, comm, algo = s.cfg, s.comm, s.algo
    control = control or RunControl(comm, GuardSection(), 0.0)
    seed, N, B = cfg.run.seed, cfg.data.num_clients, cfg.algorithm.batch_size
    x = s.model.numpy() if x is None else x      # global model; authoritative on rank 0
    comm.Bcast(x, root=0)
    extra = algo.broadcast_extra()
    acc = make_sum(cfg.runtime.reduce, algo.layout.length)   # buffers kept across rounds
    all_weights = algo.weights(-1, np.arange(N), s.sizes)
    train_eval = _train_eval_set(s) if cfg.run.eval_train else None
    every = cfg.checkpoint.every
    for rnd in range(start, cfg.run.rounds):
        t0 = time.perf_counter()
        control.phase("train", rnd)
        # 1-2. cohort, weights, steps, and what the simulated clients' systems allow
        cohort, weights = cohort_and_weights(cfg, rnd, all_weights)
        steps = algo.steps(rnd, cohort, s.sizes[cohort])
        plan = s.system.plan(rnd, cohort, steps, B) if s.system is not None else None
        if plan is not None:
            steps = plan.steps
            sim_time += plan.duration_s
        lr = algo.begin_round(rnd, cfg.run.rounds)

        # 3-4. local training of this rank's cohort clients, one contribution row each
        x0 = torch.from_numpy(x).to(s.device)
        acc.reset()
        records, refused = [], []
        for j in np.flatnonzero((s.owner[cohort] == comm.rank) & (steps > 0)):
            cid, slot = int(cohort[j]), int(s.slot[cohort[j]])
            gen = rng.torch_generator(s.device, seed, rng.CLIENT_TRAIN, rnd, cid)
            rng.seed_device(s.device, rng.torch_seed(seed, rng.CLIENT_TRAIN, rnd, cid))  # dropout and the like
            idx = s.client_index[s.client_offset[slot] : s.client_offset[slot + 1]]
            res = s.trainer.train(x0, idx, int(steps[j]), algo.solver, gen, algo.correction(slot), lr)
            norm = float(torch.linalg.vector_norm(res.delta, dtype=torch.float64))   # on the device
            problem = control.check_update(cid, rnd, norm)
            if problem is not None:         # never averaged in: skip and record, or stop the run
                refused.append(problem)
                records.append((cid, float("nan"), 0.0, REJECTED))
                continue
            acc.add(algo.contribution(slot, res, float(weights[j])))
            records.append((cid, res.loss, res.anorm, 0))
        t1 = time.perf_counter()   # before any collective: waiting for slower ranks counts as reduce

        # 5. one exact reduction of all contributions (after the guard's verdict, if it may stop)
        control.phase("reduce", rnd)
        if cfg.guard.policy == "stop":
            refused = control.agree_guard(refused)
            if refused:
                raise GuardStop("; ".join(refused))
        sums = acc.reduce(comm, total=len(cohort), root=0)
        gathered = comm.gather(records, root=0)
        t2 = time.perf_counter()

        # 6. server update on rank 0, broadcast of the model (and server state)
        control.phase("server", rnd)
        diag = {}
        if comm.rank == 0:
            x, diag = algo.server_step(x, sums, N)
        comm.Bcast(x, root=0)
        if extra is not None:           # SCAFFOLD's c, VR's hbar
            host = extra.cpu().numpy()  # a view when extra is on the CPU
            comm.Bcast(host, root=0)
            if extra.device.type != "cpu":
                extra.copy_(torch.from_numpy(host))
        t3 = time.perf_counter()

        # 7. evaluation (test chunks split over ranks), then rank 0 records the round
        control.phase("eval", rnd)
        test_acc = test_loss = train_acc = train_loss = float("nan")
        if rnd == cfg.run.rounds - 1 or (cfg.run.eval_every and (rnd + 1) % cfg.run.eval_every == 0):
            s.model.load(x)
            test_acc, test_loss = evaluate(s, s.x_test, s.y_test)
            if train_eval is not None:
                train_acc, train_loss = evaluate(s, *train_eval)
        t4 = time.perf_counter()

        if comm.rank == 0:
            metrics, clients = _round_records(algo, sums, gathered, cohort, weights, steps, plan, rnd, lr, diag)
            metrics.update(test_accuracy=test_acc, test_loss=test_loss, global_train_accuracy=train_acc,
                           global_train_loss=train_loss, sim_time=sim_time, time_train=t1 - t0,
                           time_reduce=t2 - t1, time_server=t3 - t2, time_eval=t4 - t3, time_round=t4 - t0)
            if on_round is not None:
                on_round(metrics, clients)

        # 8. round boundary: agree on stop requests; checkpoint when due, on a stop, at the end
        stop = control.should_stop()
        done = rnd + 1
        if checkpoint is not None and (stop or done == cfg.run.rounds or (every and done % every == 0)):
            control.phase("checkpoint", rnd)
            checkpoint(done, x, sim_time)
        if stop:
            raise Stopped(f"stopped by {stop} after round {rnd} with a checkpoint")
    return x


def _train_eval_set(s: Setup) -> tuple[torch.Tensor, torch.Tensor]:
    """The samples held by clients, for F(x) = sum_i p_i F_i(x) with p_i = n_i / n."""
    idx = torch.from_numpy(np.sort(np.concatenate(s.parts)).astype(np.int64)).to(s.device)
    return s.trainer.x[idx], s.trainer.y[idx]


def _round_records(algo, sums, gathered, cohort, weights, steps, plan, rnd, lr, diag):
    """Round metrics (without test and timing fields) and per-client rows, on rank 0."""
    sc = dict(zip(SCALARS, algo.layout.split(sums)["scalars"]))
    done = {cid: (loss, anorm, code) for part in gathered for cid, loss, anorm, code in part}
    ok = {c for c, (_, _, code) in done.items() if code == 0}
    total_w = sc["weight"]
    k = len(cohort)
    dropped = np.array(plan.reason if plan is not None else np.zeros(k), dtype=np.int8)
    dropped[[j for j, c in enumerate(cohort) if c in done and done[c][2]]] = REJECTED
    clients = {
        "round": np.full(k, rnd), "client": cohort, "steps": steps,
        "weight": np.array([weights[j] / total_w if c in ok else 0.0 for j, c in enumerate(cohort)]),
        "train_loss": np.array([done.get(c, (np.nan,))[0] for c in cohort]),
        "anorm": np.array([done[c][1] if c in ok else 0.0 for c in cohort]),
        "sim_time": plan.total_s if plan is not None else np.zeros(k),
        "dropped": dropped,
    }
    metrics = {
        "round": rnd, "train_loss": sc["weight_loss"] / total_w if total_w else float("nan"),
        "clients_participating": len(ok), "lr": lr, "tau_eff": diag.get("tau_eff", float("nan")),
    }
    return metrics, clients
