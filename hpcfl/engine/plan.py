"""What a run will need, before it is submitted: :func:`estimate` (``hpcfl plan``).

A plain process, no MPI and no training: the job is resolved as ``hpcfl run`` resolves it, its
dataset loaded (through the cache, as a run would), partitioned, the model built and the
policies constructed for one client, and from those the figures are computed:

* per-rank resident memory, ``M_rank = M_0 + D + T_N + n_r * sum_t(w_t) * b + k * P * b``
  (docs/performance.md, "Memory you can plan"), and per node (``ceil(R / nodes)`` ranks, the
  dataset counted once per node: mapped from the cache, or its big arrays in the node's windows);
* ``results.h5``: bytes each round writes (a ``/metrics`` row, a ``/clients`` row per cohort
  member, ``/client_eval`` rows for every client on evaluated rounds) and the file in all,
  rounded up to HDF5's chunks of :data:`hpcfl.io.schema.CHUNK` rows as the file grows;
* the checkpoint's size and its save time at a rate (:data:`SAVE_S_PER_GB`, or measured);
* warnings, each naming the fix.

The per-client tables are the arrays the run builds, built here the same way and counted, not
a constant per client.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from ..parallel.shared import MIN_BYTES

# Checkpoint save seconds per GB of state: least squares through 0 of 5.1, 12.7 and 31.7 s at
# 1, 2 and 4 GB (SCAFFOLD on 2 ranks, every byte through rank 0, the 2-core development machine;
# docs/performance.md). This machine's rate, not a cluster's: use --measure-disk there.
SAVE_S_PER_GB = 7.5
SIGNAL_MARGIN_S = 300.0   # slurm/*.sbatch: --signal=B:USR1@300
# Model-sized buffers a rank holds (k in k * P * b): the model, its gradient, the round-start
# copy, the local solver's momentum, the delta, and the float64 reduction buffer (2 of b=4).
MODEL_COPIES = 7
RESULTS_HEADER_BYTES = 64 << 10   # attributes, groups, empty columns' headers: an empty results.h5
CHECKPOINT_FIXED_BYTES = 12 << 10   # RNG states, metadata, HDF5's headers
# A running rank's working memory beyond its tables: the round's and evaluation's buffers, the
# results writer, the allocator's slack. Measured: peak RSS less the other terms, 82 MB (FedAvg,
# 200,000 clients, logreg) and 98 MB (quickstart) on 1 rank; docs/performance.md.
WORKING_BYTES = 90 << 20
CHECKPOINT_BLOCK = 64 << 20   # rank 0 holds one block of another rank's rows while it saves (io/ckptblocks)


@dataclass
class Plan:
    """The figures of :func:`estimate` (bytes, seconds); ``terms`` per rank, ``warnings`` lines."""

    ranks: int
    nodes: int
    ranks_per_node: int
    clients: int
    clients_per_rank: int
    params: int
    dataset_cached: bool | None          # True: mapped from the cache; False, None (plug-in): in the node's windows
    cache_hit: bool | None = None        # the cache held the dataset before this plan (else the plan made it)
    terms: dict = field(default_factory=dict)        # per-rank memory terms
    rank_bytes: int = 0
    node_bytes: int = 0
    node_bytes_miss: int = 0             # the node's peak at start-up (a cache miss, or the windows being filled)
    results_round_bytes: int = 0         # logical bytes of an average round
    results_total_bytes: int = 0         # the file after run.rounds, chunks included
    checkpoint_bytes: int = 0
    save_s: float = 0.0
    save_rate: str = ""
    warnings: list = field(default_factory=list)
    results_compressed: bool = False     # per-client rows gzip-compressed: the results figures are upper bounds
    save_share: int = 0                  # bytes the slowest rank writes in a save (less than all with shards)

    def as_dict(self) -> dict:
        return asdict(self)


def imported_rss() -> int:
    """M_0: this process's resident bytes once it has imported what a run imports (torch, the
    engine, mpi4py, h5py), before any data."""
    import h5py  # noqa: F401
    import torch  # noqa: F401

    from ..parallel.mpi import mpi_module
    from . import job  # noqa: F401

    mpi_module()

    return base_rss()


def base_rss() -> int:
    """This process's resident bytes now (Linux ``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def node_memory() -> int:
    """This machine's MemTotal in bytes (the default for ``--node-memory``)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


def results_bytes(metric_bytes: int, client_bytes: int, eval_bytes: int, cohort: int, clients: int,
                  rounds: int, eval_rounds: int, counts_bytes: int, chunk: int, model_bytes: int = 0) -> tuple[int, int]:
    """(logical bytes of an average round, the file after ``rounds``).

    Parameters
    ----------
    metric_bytes, client_bytes, eval_bytes : int
        One row of ``/metrics``, of ``/clients``, of ``/client_eval`` (all columns).
    cohort, clients : int
        Clients trained per round (k), all clients (N).
    rounds, eval_rounds : int
        Rounds in the run; of them, rounds with per-client evaluation (0 without).
    counts_bytes : int
        ``/partition/class_counts``, N x C x 8.
    model_bytes : int
        The final model, written at the end.
    chunk : int
        Rows per HDF5 chunk: a column takes whole chunks.
    """
    def chunked(rows: int, row_bytes: int) -> int:
        return -(-rows // chunk) * chunk * row_bytes

    per_round = metric_bytes + cohort * client_bytes + clients * eval_bytes * eval_rounds / max(rounds, 1)
    total = (RESULTS_HEADER_BYTES + counts_bytes + model_bytes + chunked(rounds, metric_bytes) + chunked(rounds * cohort, client_bytes)
             + chunked(eval_rounds * clients, eval_bytes))
    return int(per_round), int(total)


def save_bytes(cfg, ranks: int, ckpt: int, rows: int, own_rows: int) -> int:
    """The bytes the slowest rank writes in a checkpoint of ``ckpt`` bytes, ``rows`` of them per-client
    rows: all of it through rank 0 (one rank, ``checkpoint.shards = false``, no per-client state), or
    with shards the manifest plus the largest rank's ``own_rows``, written at once by every rank (the
    filesystem taking the ranks' writes in parallel, as a cluster's does; docs/performance.md)."""
    if ranks > 1 and cfg.checkpoint.shards and rows > 0:
        return ckpt - rows + own_rows
    return ckpt


def recorded_rows(cfg, cohort: int, n: int) -> float:
    """``/clients`` rows an average round writes: the cohort (``results.clients = "all"``), none, or
    (``"sampled"``) the cohort's expected share of the panel, ceil(fraction N) of the N clients."""
    if cfg.results.clients == "none":
        return 0
    if cfg.results.clients == "sampled":
        from ..io.panel import panel_size
        return cohort * panel_size(n, cfg.results.sample_fraction) / n
    return cohort


def measure_disk(folder, nbytes: int = 256 << 20) -> float:
    """Seconds per GB of a timed write of ``nbytes`` and fsync in ``folder`` (the file is removed, and
    the folder too if this made it)."""
    made = not os.path.isdir(folder)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f".hpcfl-plan-disk-{os.getpid()}")
    block = np.random.default_rng(0).bytes(8 << 20)
    t0 = time.perf_counter()
    try:
        with open(path, "wb") as f:
            f.writelines(block for _ in range(max(1, nbytes // len(block))))
            f.flush()
            os.fsync(f.fileno())
        return (time.perf_counter() - t0) / (nbytes / 1e9)
    finally:
        os.remove(path)
        if made:
            os.rmdir(folder)


def _eval_rounds(run) -> int:
    if not run.eval_every:
        return 0
    return len(range(run.eval_every, run.rounds + 1, run.eval_every)) + (run.rounds % run.eval_every != 0)


def estimate(cfg, ranks: int, nodes: int = 1, node_bytes: int | None = None, signal_margin: float = SIGNAL_MARGIN_S,
             save_s_per_gb: float | None = None, base: int | None = None) -> Plan:
    """Figures for ``cfg`` on ``ranks`` ranks over ``nodes`` nodes.

    Parameters
    ----------
    cfg : hpcfl.config.Config
        The resolved job (:func:`hpcfl.config.load`).
    ranks, nodes : int
        R ranks, spread over M nodes (ceil(R / M) per node).
    node_bytes : int, optional
        A node's memory (default this machine's MemTotal).
    signal_margin : float
        Seconds between Slurm's USR1 and the kill (the templates' 300).
    save_s_per_gb : float, optional
        Measured save rate (``--measure-disk``); default :data:`SAVE_S_PER_GB`.
    base : int, optional
        M_0 in bytes (default: this process's RSS now).

    Raises
    ------
    hpcfl.errors.ConfigError
        The run's own errors: more ranks than clients, empty clients.
    """
    import torch

    from .. import data, models
    from ..algorithms import Algorithm
    from ..errors import ConfigError
    from ..io.schema import CHUNK, CLIENT_EVAL, CLIENT_FIELDS, METRICS
    from ..parallel.comm import owners
    from ..params import FlatModel
    from .setup import split_clients

    if ranks < 1 or nodes < 1 or nodes > ranks:
        raise ConfigError(f"--ranks {ranks} over --nodes {nodes}: give at least one rank and one node, "
                          f"and no more nodes than ranks")
    base = imported_rss() if base is None else base
    n = cfg.data.num_clients
    own = owners(n, ranks, cfg.runtime.placement)   # the run's check and message: more ranks than clients
    per_rank = int(np.bincount(own, minlength=ranks).max())
    per_node = -(-ranks // nodes)
    cached = None
    if not _is_plugin(cfg.data.dataset):
        cached = data.uses_cache(cfg.data.dataset, cfg.data.cache)
    hit = _cache_holds(cfg) if cached else None
    before = base_rss()
    ds = data.load_dataset(cfg.data.dataset, cfg.dataset_options, cfg.data.root, cfg.run.seed, cfg.data.cache)
    arrays = (ds.x_train, ds.y_train, ds.x_test, ds.y_test)
    dataset = sum(a.nbytes for a in arrays)
    loader = max(0, base_rss() - before - dataset)   # modules the loader imports (sklearn for digits)
    parts, sizes, index = split_clients(cfg, ds)   # the run's partition and its refusals
    dtype = torch.float64 if cfg.runtime.dtype == "float64" else torch.float32
    b = 8 if dtype == torch.float64 else 4
    module = models.build_model(cfg.model.name, cfg.model_options, ds.input_shape, ds.num_classes)
    model = FlatModel(module, torch.device("cpu"), dtype)
    algo = Algorithm(cfg, model.length, model.num_params, 1, torch.device("cpu"), dtype, sizes)
    counts = data.class_counts_flat(ds.y_train, index, sizes, ds.num_classes)

    # D: the arrays, and a private copy where the run converts the inputs to the model's dtype
    convert = sum(a.size * b for a in (ds.x_train, ds.x_test) if a.dtype != np.dtype(f"f{b}"))
    # T_N: the tables over all N clients every rank reads (setup.prepare, the sampler, evaluation). The
    # read-only arrays (each of at least MIN_BYTES) live once per node when a node has several ranks
    # (hpcfl.engine.setup.share_tables): their sizes, per table
    arrays = {"partition index": [index.nbytes], "sizes, owner, offsets": [8 * n, 8 * n, 8 * n + 8],
              "class counts": [counts.nbytes]}
    private = {"slot": 8 * n, "sampler": algo.sampler.static.nbytes}
    if getattr(parts, "flat", None) is None and per_node == 1:   # per-client arrays (share_tables: index views)
        private["partition lists"] = sum(p.nbytes for p in parts) + 112 * n
    if cfg.run.eval_clients and getattr(module, "loss", None) is None:
        from ..data.client_test import client_test_pairs
        ev_sizes, sample, client = client_test_pairs(ds.y_test, counts, cfg.run.seed, cfg.run.eval_clients_min)
        arrays["evaluation pairs and sizes"] = [ev_sizes.nbytes, sample.nbytes, client.nbytes]
        private["evaluation sums"] = 2 * 8 * n
        eval_rounds = _eval_rounds(cfg.run)
    else:
        eval_rounds = 0
    tables = {**{k: sum(v) for k, v in arrays.items()}, **private}
    shared = 0 if per_node == 1 else sum(b for v in arrays.values() for b in v if b >= MIN_BYTES)
    state = algo.tables()
    row_bytes = sum(t.width * t.get().dtype.itemsize for t in state)
    server = sum(np.asarray(a.get()).nbytes for a in algo.state() if not hasattr(a, "width") and a.get() is not None)
    terms = {"M_0 (python, torch, hpcfl, mpi4py, h5py)": base, "dataset's loader (imports)": loader,
             "dataset": dataset + convert, "tables over N clients": sum(tables.values()),
             **{f"  {k}": v for k, v in tables.items()}, "  of which shared per node": shared,
             "per-client state (own)": per_rank * row_bytes, "model copies": MODEL_COPIES * model.length * b + server,
             "working memory (rounds, results)": WORKING_BYTES}
    ckpt = CHECKPOINT_FIXED_BYTES + model.length * b + server + n * row_bytes
    terms["checkpoint block (rank 0)"] = min(CHECKPOINT_BLOCK, ckpt)   # while it saves
    rank = sum(v for k, v in terms.items() if not k.startswith(" "))
    # a rank's resident memory counts the shared pages it reads; a node holds them once
    if cached:   # pages mapped from the cache: one copy per node; the converted copy stays per rank
        node = per_node * (rank - dataset - shared) + dataset + shared
        miss = node + dataset   # while the generating rank holds its arrays, before it maps the entry it wrote
    elif per_node > 1:   # the node's first rank loads it, its arrays of MIN_BYTES or more into the node's windows
        held = sum(a.nbytes for a in (ds.x_train, ds.y_train, ds.x_test, ds.y_test) if a.nbytes >= MIN_BYTES)
        node = per_node * (rank - held - shared) + held + shared
        miss = node + held   # while that rank fills the windows from the arrays it loaded
    else:
        node = miss = rank
    metric_bytes = sum(np.dtype(f.dtype).itemsize for f in {**METRICS, **algo.round_fields}.values())
    client_bytes = sum(np.dtype(f.dtype).itemsize for f in {**CLIENT_FIELDS, **algo.client_fields}.values())
    eval_bytes = sum(np.dtype(f.dtype).itemsize for f in CLIENT_EVAL.values())
    cohort = min(cfg.algorithm.clients_per_round, n) if cfg.algorithm.clients_per_round else n
    recorded = recorded_rows(cfg, cohort, n)
    per_round, total = results_bytes(metric_bytes, client_bytes, eval_bytes, recorded, n,
                                     cfg.run.rounds, eval_rounds, counts.nbytes, CHUNK, model.length * b)
    rate = save_s_per_gb if save_s_per_gb is not None else SAVE_S_PER_GB
    # a cohort (or, evaluated, a client count) of COMPRESS_FROM rows or more is stored compressed (io/schema.py):
    # how small depends on the values, so the figures above are then upper bounds
    from ..io.schema import COMPRESS_FROM
    compressed = recorded >= COMPRESS_FROM or (eval_rounds > 0 and n >= COMPRESS_FROM)
    share = save_bytes(cfg, ranks, ckpt, n * row_bytes, per_rank * row_bytes)   # what the slowest rank writes
    plan = Plan(ranks, nodes, per_node, n, per_rank, model.num_params, cached, hit, terms, rank, node, miss, per_round,
                total, ckpt, share / 1e9 * rate,
                f"{rate:.2f} s/GB " + ("measured" if save_s_per_gb is not None else "(the development machine's)"))
    plan.results_compressed = compressed
    plan.save_share = share
    plan.warnings = warnings(plan, cfg, node_bytes or node_memory(), signal_margin)
    return plan


def warnings(plan: Plan, cfg, node_bytes: int, margin: float) -> list[str]:
    """Lines naming each problem and its fix: a save longer than the signal margin, a first
    checkpoint near the watchdog's allowance, a node's memory exceeded."""
    out = []
    if plan.save_s > margin:
        out.append(f"checkpoint save ~{plan.save_s:.0f} s is longer than the signal margin of {margin:g} s: a "
                   f"preempted job is killed mid-save and resumes from the checkpoint before; raise the margin "
                   f"(--signal=B:USR1@{int(plan.save_s * 1.5)}), or shrink the state (fewer clients, an algorithm "
                   f"without per-client rows)")
    allowance = cfg.watchdog.startup_s
    if plan.save_s > 0.5 * allowance:
        out.append(f"first checkpoint ~{plan.save_s:.0f} s is over half the watchdog's first-checkpoint allowance "
                   f"of {allowance:g} s: raise watchdog.startup_s (e.g. --set watchdog.startup_s="
                   f"{int(plan.save_s * 3)}), and checkpoint.every_minutes so saves stay a small share of the run")
    worst = max(plan.node_bytes, plan.node_bytes_miss)
    if node_bytes and worst > node_bytes:
        out.append(f"a node needs ~{worst / 1e9:.1f} GB but has {node_bytes / 1e9:.1f} GB: use more nodes "
                   f"(--nodes), fewer ranks per node, or fewer clients (data.num_clients)")
    return out


def _is_plugin(name: str) -> bool:
    from .. import plugins

    return plugins.is_plugin(name)


def _cache_holds(cfg) -> bool:
    """Whether the dataset cache holds the job's dataset now (a run would map it, not generate it)."""
    from .. import data
    from ..data.cache import path_for
    from ..native.cachedir import cache_root

    spec = data.DATASETS[cfg.data.dataset]
    opts = cfg.dataset_options if cfg.dataset_options is not None else spec.options()
    return path_for(cache_root(cfg.data.cache), cfg.data.dataset, opts, int(cfg.run.seed)).exists()
