"""What one rank builds before the first round: :func:`prepare` and the :class:`Setup` it returns.

The data (loaded once per node: :mod:`hpcfl.engine.dataload`), the partition, this rank's block
of clients, the model, the trainer, the policies, the simulated clock and per-client evaluation:
everything :func:`hpcfl.engine.simulation.run` reads. Nothing here writes a file or talks to
another rank beyond the placement's and the data's own collectives.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

from .. import rng
from ..algorithms import Algorithm
from ..client.trainer import Trainer
from ..errors import ConfigError
from ..parallel.comm import owners
from ..parallel.gpus import place
from ..parallel.runtime import configure_determinism, pick_threads
from ..params import FlatModel
from .control import FaultInjector
from .dataload import load_per_node


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
    client_index: torch.Tensor   # every client's sample indices, concatenated in id order, on device
    client_offset: np.ndarray    # (N + 1,) offsets into client_index
    model: FlatModel
    trainer: Trainer
    algo: Algorithm
    x_test: torch.Tensor
    y_test: torch.Tensor
    threads: int
    class_counts: np.ndarray = None   # (N, C) label counts per client
    system: object = None  # hpcfl.system.SystemModel when [system] enabled
    block: object = None   # hpcfl.client.block.BlockTrainer when runtime.vectorize chose it
    dealt: bool | None = None   # each round's training dealt to ranks by expected work (set by settle_placement)
    migration: object = None    # hpcfl.engine.placement.Migration when dealt clients carry per-client state
    placement: object = None    # hpcfl.parallel.gpus.Placement: host, node-local rank, device
    acc: object = None          # the round's sum (hpcfl.parallel.gridsum.GridSum or comm.FloatSum), see accumulator()
    client_eval: object = None  # hpcfl.engine.evaluation.ClientEval when run.eval_clients applies (a classifier)
    home: np.ndarray = None     # ids of this rank's own clients, ascending (found once: a round never scans all N)
    notes: tuple = ()           # what the run should say once at its start (hpcfl.engine.job)
    lanes: object = None        # hpcfl.client.lanes.Lanes when clients train side by side on CPU threads
    tables: object = None       # hpcfl.parallel.shared.NodeTables: the dataset's windows (if any), the read-only tables


def share_tables(s: Setup, comm) -> None:
    """Collective over ``comm``, after every rank's :func:`prepare` succeeded: the read-only tables
    over all N clients move into the node's shared windows (:mod:`hpcfl.parallel.shared`), each
    rank dropping its private copy. :func:`release_tables` gives them back at the end of the run.

    Shared: the partition (every client's sample indices, its sizes and offsets), the owner of
    every client, the class counts, and the per-client evaluation's (test row, client) pairs.
    Private: the slot table (each rank's own) and everything a rank writes.
    """
    from ..data.partition import Groups
    from ..parallel.shared import NodeTables

    tables = s.tables if s.tables is not None else NodeTables(comm)   # prepare's holds the dataset's windows
    if not tables.on:
        tables.free()
        trim_heap()
        return
    s.tables = tables
    s.client_offset = tables.share(s.client_offset)
    s.sizes = tables.share(s.sizes)
    s.owner = tables.share(s.owner)
    s.class_counts = tables.share(s.class_counts)
    if s.device.type == "cpu":   # on a GPU the index lives in device memory, one copy per GPU
        index = tables.share(s.client_index.numpy())
        s.client_index = tensor(index)
        s.parts = Groups(index, s.sizes, s.client_offset[1:])
    if s.client_eval is not None:
        ce = s.client_eval
        ce.sizes, ce.sample, ce.client = tables.share(ce.sizes), tables.share(ce.sample), tables.share(ce.client)
    trim_heap()


def tensor(array: np.ndarray) -> torch.Tensor:
    """``torch.from_numpy(array)``, the same memory, also for a read-only view of a shared window,
    which torch takes with a warning (it cannot mark a tensor read-only): nothing writes through
    these tensors (the trainers gather batches into buffers of their own)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning)
        return torch.from_numpy(array)


def trim_heap() -> None:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim``; elsewhere nothing).

    Set-up's temporaries (partition and class-count scratch of N-sized arrays, the private tables
    just moved to shared windows) are freed to the heap, which glibc keeps: at 1M clients that left
    tens of MB per rank counted as the rank's own memory for the whole run.
    """
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    try:
        ctypes.CDLL(name).malloc_trim(0)
    except (OSError, AttributeError, TypeError):   # not glibc: nothing to trim
        pass


def release_tables(s: Setup) -> None:
    """Collective over the node: free :func:`share_tables`' windows at the end of a run. The tables
    go with them (set to None): nothing may read them afterwards."""
    if s.tables is None:
        return
    s.tables.free()
    s.tables = None
    s.client_offset = s.sizes = s.owner = s.class_counts = s.client_index = s.parts = None
    s.dataset = s.x_test = s.y_test = None   # perhaps views of the windows (prepare's load_per_node)
    if s.client_eval is not None:
        s.client_eval.sizes = s.client_eval.sample = s.client_eval.client = None


def split_clients(cfg, ds) -> tuple:
    """The job's partition of ``ds``, checked: (parts, sizes (N,), index), ``index`` every client's
    sample indices concatenated in id order (int64). The run and ``hpcfl plan`` both take it from here."""
    from .. import data

    parts = data.make_partition(cfg.data.partition, ds.y_train, cfg.data.num_clients, cfg.partition_options,
                                cfg.run.seed, ds)
    if len(parts) != cfg.data.num_clients:
        raise ConfigError(f"data.num_clients = {cfg.data.num_clients} but the partition made {len(parts)} clients; "
                          f"set data.num_clients = {len(parts)}")
    flat = getattr(parts, "flat", None)   # most partitions come concatenated too (data.partition.Groups)
    sizes = parts.sizes if flat is not None else np.fromiter(map(len, parts), dtype=np.int64, count=len(parts))
    empty = np.flatnonzero(sizes == 0)
    if empty.size:
        raise ConfigError(f"{empty.size} clients got no training samples (first: client {empty[0]}); "
                          f"lower data.num_clients or use a partition with a minimum size")
    index = flat if flat is not None else np.concatenate(parts, dtype=np.int64)   # class counts read it too
    return parts, sizes, index


def prepare(cfg, comm, tables=None) -> Setup:
    """Load data, partition, place clients, build the model and the policies on this rank.

    ``tables`` (:class:`hpcfl.parallel.shared.NodeTables` over ``comm``) receives the windows of a
    dataset loaded once per node (:func:`hpcfl.engine.dataload.load_per_node`); the caller frees
    it when set-up fails on some rank (the run does: :class:`hpcfl.engine.job.JobRun`). Without
    it, one is made here. Either way ``Setup.tables`` holds it where the node has several ranks,
    and :func:`release_tables` frees it.
    """
    from .. import data, models
    from ..models import pool
    from ..parallel.shared import NodeTables

    configure_determinism(cfg.runtime.deterministic)   # before CUDA is first touched
    FaultInjector(comm.rank).check("setup", 0)   # a test hook: one rank refusing while the others place
    placement = place(comm, cfg.runtime.device, cfg.runtime.share_gpus)
    device, local_size = placement.device, placement.local_size
    dtype = torch.float64 if cfg.runtime.dtype == "float64" else torch.float32

    tables = NodeTables(comm) if tables is None else tables
    ds = load_per_node(cfg, comm, tables)   # once per node: mapped from the cache, or in the node's windows
    if not tables.on:
        tables.free()   # one rank on this node: nothing to share
    parts, sizes, index = split_clients(cfg, ds)
    if cfg.algorithm.batch_size > len(ds.y_train):   # batch buffers are B samples long
        raise ConfigError(f"algorithm.batch_size = {cfg.algorithm.batch_size} exceeds the whole training set "
                          f"({len(ds.y_train)} samples); a batch holds at most one client's samples, so for "
                          f"full-batch steps set it to the largest client's size, {int(sizes.max())}")
    owner = owners(cfg.data.num_clients, comm.size, cfg.runtime.placement)
    mine = np.flatnonzero(owner == comm.rank)
    slot = np.full(cfg.data.num_clients, -1, dtype=np.int64)
    slot[mine] = np.arange(mine.size)
    # Every client's indices (8 bytes per training sample) on every rank, so that any rank can train any client.
    offsets = np.concatenate([[0], np.cumsum(sizes)])

    torch.manual_seed(rng.torch_seed(cfg.run.seed, rng.MODEL_INIT))
    module = models.build_model(cfg.model.name, cfg.model_options, ds.input_shape, ds.num_classes)
    _check_ids(cfg, module, ds)
    model = FlatModel(module, device, dtype)
    threads = pick_threads(cfg.runtime.threads, local_size, model.num_params)   # by the model's size
    torch.set_num_threads(threads)
    pool.load_for(module, device)   # the compiled pooling's load belongs to start-up, not to round 1
    # on the CPU in the model's dtype these are the arrays' own memory (no copy), shared where the node shares them
    x_train = tensor(ds.x_train).to(device=device, dtype=dtype)
    y_train = tensor(ds.y_train).to(device=device)
    augment = None
    if ds.augment:
        from ..data.augment import augment_batch
        augment = augment_batch
    from ..plugins import is_plugin
    plugin = is_plugin(cfg.model.name)
    # your own model keeps autograd: tracing its forward could run code of yours (client/program.py)
    trainer = Trainer(model, x_train, y_train, cfg.algorithm.batch_size, augment,
                      "autograd" if plugin else cfg.runtime.step)
    algo = Algorithm(cfg, model.length, model.num_params, mine.size, device, dtype, sizes)
    from ..client.block import choose_block_trainer
    block = choose_block_trainer(cfg, comm, model, augment, algo.solver.spec, x_train, y_train)
    from ..client.lanes import Lanes, lane_count
    count, _ = lane_count(cfg, model, plugin, threads, block is not None)
    lanes = Lanes(trainer, algo.solver.spec, count) if count > 1 else None
    system = None
    if cfg.system is not None and cfg.system.enabled:
        from ..system import SystemModel
        item = model.flat.element_size()
        nbytes = model.length * item
        up, down = algo.transfer()          # the policies' extra floats each way (SCAFFOLD: Delta c, c)
        system = SystemModel(cfg.system, cfg.data.num_clients, cfg.run.seed, nbytes, upload_bytes=nbytes + up * item,
                             download_bytes=nbytes + down * item, base_dir=cfg.job_dir)
    counts = data.class_counts_flat(ds.y_train, index, sizes, ds.num_classes)
    client_eval, notes = None, []
    if cfg.run.eval_clients and getattr(module, "loss", None) is None:   # a classifier: per-sample hits and losses
        client_eval, notes = _client_eval(cfg, ds, counts)
    return Setup(cfg, comm, device, ds, parts, sizes, owner, slot,
                 torch.from_numpy(index).to(device), offsets, model, trainer, algo,
                 tensor(ds.x_test).to(device=device, dtype=dtype),
                 tensor(ds.y_test).to(device=device), threads, counts, system, block,
                 placement=placement, client_eval=client_eval, home=mine, notes=tuple(notes), lanes=lanes,
                 tables=tables if tables.on else None)


def _client_eval(cfg, ds, counts):
    """(:class:`ClientEval`, notes): each client's own test rows where the dataset has them and the
    partition is its own clients', else rows drawn with the client's label mix (:mod:`hpcfl.data.client_test`)."""
    from ..data.client_test import client_test_pairs, own_test_pairs
    from .evaluation import ClientEval

    own = getattr(ds, "natural_test", None)
    if cfg.data.partition != "natural" or own is None:
        return ClientEval(*client_test_pairs(ds.y_test, counts, cfg.run.seed, cfg.run.eval_clients_min)), []
    client_eval = ClientEval(*own_test_pairs(own))
    none = int(np.count_nonzero(client_eval.sizes == 0))
    if not none:
        return client_eval, []
    return client_eval, [(f"per-client evaluation uses each client's own test rows; {none} of {client_eval.n} "
                          f"clients have none in the test file(s): their /client_eval accuracy and loss are NaN")]


def _check_ids(cfg, module, ds) -> None:
    """A model that embeds its inputs as ids (``char_lstm``) needs every id below its ``vocab_size``:
    refused here, naming the option, rather than as an index error in round 1."""
    limit = getattr(module, "vocab_size", None)
    if limit is None:
        return
    top = max(float(ds.x_train.max(initial=0)), float(ds.x_test.max(initial=0)))
    low = min(float(ds.x_train.min(initial=0)), float(ds.x_test.min(initial=0)))
    if top >= limit or low < 0:
        raise ConfigError(f"model.name = {cfg.model.name!r} embeds its inputs as ids 0..{limit - 1} (model."
                          f"{cfg.model.name}.vocab_size, 0: num_classes = {ds.num_classes}), but "
                          f"data.dataset = {cfg.data.dataset!r} holds ids {low:g}..{top:g}; set "
                          f"model.{cfg.model.name}.vocab_size to at least {int(top) + 1} (the vocabulary's ids)")
