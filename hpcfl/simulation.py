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
from .algorithms import Algorithm
from .client.trainer import Trainer, evaluate_chunks
from .comm import ExactSum, make_sum, node_layout, owners
from .errors import ConfigError
from .params import FlatModel
from .runtime import pick_device, pick_threads


def sample_cohort(seed: int, rnd: int, num_clients: int, per_round: int) -> np.ndarray:
    """Sorted ids of the clients in round ``rnd``: uniform without replacement, or all."""
    if per_round == 0 or per_round >= num_clients:
        return np.arange(num_clients, dtype=np.int64)
    gen = rng.numpy_rng(seed, rng.COHORT, rnd)
    return np.sort(gen.choice(num_clients, size=per_round, replace=False)).astype(np.int64)


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
    algo = Algorithm(cfg.algorithm, model.length, model.num_params, mine.size, device, dtype)
    return Setup(cfg, comm, device, ds, parts, sizes, owner, slot,
                 torch.from_numpy(index).to(device), offsets, model, trainer, algo,
                 torch.from_numpy(ds.x_test).to(device=device, dtype=dtype),
                 torch.from_numpy(ds.y_test).to(device=device), threads)


def evaluate(s: Setup) -> tuple[float, float]:
    """(accuracy, mean loss) of the current model on the test set; valid on rank 0."""
    n = s.x_test.shape[0]
    bs = s.cfg.runtime.eval_batch_size
    chunks = [(lo, min(lo + bs, n)) for lo in range(0, n, bs)]
    acc = ExactSum(3)
    for row in evaluate_chunks(s.model, s.x_test, s.y_test, chunks[s.comm.rank :: s.comm.size]):
        acc.add(row)
    tot = acc.reduce(s.comm, total=len(chunks), root=0)
    if tot is None:
        return float("nan"), float("nan")
    return tot[0] / tot[2], tot[1] / tot[2]


def run(s: Setup, on_round=None) -> np.ndarray:
    """Run all rounds; returns the final flat model (every rank).

    ``on_round(metrics, clients)`` is called on rank 0 after each round.
    """
    cfg, comm, algo = s.cfg, s.comm, s.algo
    seed, N = cfg.run.seed, cfg.data.num_clients
    x = s.model.numpy()                          # global model; authoritative on rank 0
    comm.Bcast(x, root=0)
    extra = algo.broadcast_extra()
    acc = make_sum(cfg.runtime.reduce, algo.layout.length)   # buffers kept across rounds
    for rnd in range(cfg.run.rounds):
        t0 = time.perf_counter()
        cohort = sample_cohort(seed, rnd, N, cfg.algorithm.clients_per_round)
        sizes = s.sizes[cohort]
        steps = algo.steps(rnd, cohort, sizes)
        weights = algo.weights(rnd, cohort, sizes)

        x0 = torch.from_numpy(x).to(s.device)
        acc.reset()
        records = []
        for j in np.flatnonzero(s.owner[cohort] == comm.rank):
            cid, slot = int(cohort[j]), int(s.slot[cohort[j]])
            gen = rng.torch_generator(s.device, seed, rng.CLIENT_TRAIN, rnd, cid)
            torch.manual_seed(rng.torch_seed(seed, rng.CLIENT_TRAIN, rnd, cid))  # dropout and the like
            idx = s.client_index[s.client_offset[slot] : s.client_offset[slot + 1]]
            res = s.trainer.train(x0, idx, int(steps[j]), algo.solver, gen, algo.correction(slot))
            acc.add(algo.contribution(slot, res, float(weights[j])))
            records.append((rnd, cid, int(steps[j]), float(weights[j]), res.loss))
        t1 = time.perf_counter()

        sums = acc.reduce(comm, total=len(cohort), root=0)
        gathered = comm.gather(records, root=0)
        t2 = time.perf_counter()

        if comm.rank == 0:
            x = algo.server_step(x, sums, N)
        comm.Bcast(x, root=0)
        if extra is not None:  # server state every rank needs (SCAFFOLD's c)
            host = extra.cpu().numpy()  # a view when extra is on the CPU
            comm.Bcast(host, root=0)
            if extra.device.type != "cpu":
                extra.copy_(torch.from_numpy(host))
        t3 = time.perf_counter()

        last = rnd == cfg.run.rounds - 1
        every = cfg.run.eval_every
        test_acc = test_loss = float("nan")
        if last or (every and (rnd + 1) % every == 0):
            s.model.load(x)
            test_acc, test_loss = evaluate(s)
        t4 = time.perf_counter()

        if comm.rank == 0:
            seg = algo.layout.split(sums)["scalars"]
            rows = sorted(r for part in gathered for r in part)
            total_w = seg[0]
            clients = {
                "round": [r[0] for r in rows], "client": [r[1] for r in rows], "steps": [r[2] for r in rows],
                "weight": [r[3] / total_w for r in rows], "train_loss": [r[4] for r in rows],
            }
            metrics = {
                "round": rnd, "train_loss": seg[3] / total_w, "test_accuracy": test_acc, "test_loss": test_loss,
                "clients_participating": len(cohort), "time_train": t1 - t0, "time_reduce": t2 - t1,
                "time_server": t3 - t2, "time_eval": t4 - t3, "time_round": t4 - t0,
            }
            if on_round is not None:
                on_round(metrics, clients)
    return x
