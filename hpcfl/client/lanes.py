"""Several clients trained at once on one rank's CPU threads, one client per thread.

Small convolutional and dense models use two CPU threads badly when both work on one
client's operations: LeNet-5's 5 x 5 convolutions over 32 images split into pieces too small
to keep two cores busy (2 threads: 2.9-3.2 ms a step; 1 thread: 3.6-4.0 ms). Two clients
trained side by side, each on one thread, do a step every 2.2 ms (docs/performance.md,
"Clients on CPU threads"). A :class:`Lanes` holds one :class:`~hpcfl.client.trainer.Trainer`
(its own model copy and batch buffers) and one local solver per lane; a thread pool runs the
round's clients on them and hands the results back in cohort order, so everything after
training (packing, the guard, per-client records) sees exactly the one-by-one loop's sequence.

Reproducibility. torch's intra-op thread count is set to one for the whole training phase
(it is one setting for the process: libgomp keeps it for threads outside a parallel region,
and the main thread's own operations run in between) and restored after it. A client's
computation is therefore the same kernels on one thread, whatever the number of lanes,
ranks or other clients: a run with lanes gives the bits of the same run with
``runtime.threads = 1``. Each client draws only from its own generator, keyed by (seed, round,
client); a model that draws from torch's global generator (dropout) cannot be trained in
lanes, and :func:`lane_count` refuses it.

Memory. Results wait for their turn in cohort order. Clients are started longest first
(the round ends soonest) when the round's results fit in :data:`HOLD_BYTES`; otherwise in
cohort order with at most twice as many in flight as lanes.
"""

from __future__ import annotations

import collections
import queue
from concurrent.futures import ThreadPoolExecutor, wait

import torch

from ..algorithms.local import LocalSolver, SolverSpec
from ..errors import ConfigError
from ..parallel.runtime import SMALL_MODEL_PARAMS
from .trainer import Trainer

MIN_PARAMS = 100_000   # a dense model (no convolution or recurrence) this large or more takes lanes by default
HOLD_BYTES = 256 << 20   # results held for their turn at most, when clients start longest first


def lane_count(cfg, model, plugin: bool, threads: int, vectorized: bool) -> tuple[int, str]:
    """Lanes for this run and why, from ``runtime.lanes`` (0: auto).

    Auto gives the rank's torch ``threads`` for a zoo model trained one client at a time on
    CPU that has convolutions or recurrent layers, or at least :data:`MIN_PARAMS` parameters,
    and under 1M parameters; else 1. Below, a step is mostly Python, and two lanes queue for
    the interpreter lock (the quickstart's MLP: 0.33 ms a step in lanes, 0.16 one at a time);
    above, a model's operations split well over threads (docs/performance.md, "Torch threads":
    2 threads 0.50-0.58x the time of one), and lanes would idle where a rank has fewer clients
    than threads in a round. The rule reads the model only, never a timing, so that whether a
    run's clients see one thread or several does not depend on the machine's load. An explicit
    count above 1 is refused where lanes cannot keep results exact (dropout) or do not apply (a
    GPU, vectorised blocks).
    """
    asked = cfg.runtime.lanes
    dropout = any(isinstance(m, torch.nn.modules.dropout._DropoutNd) for m in model.module.modules())
    off = ("the model trains on a GPU" if model.device.type != "cpu" else
           "runtime.vectorize trains clients in batched groups" if vectorized else
           "the model uses dropout, which draws from torch's global generator" if dropout else None)
    if asked == 0:
        heavy = any(isinstance(m, (torch.nn.modules.conv._ConvNd, torch.nn.RNNBase)) for m in model.module.modules())
        if off or plugin or threads < 2 or model.num_params >= SMALL_MODEL_PARAMS or not (
                heavy or model.num_params >= MIN_PARAMS):
            return 1, off or ("your own model may draw from torch's global generator: set runtime.lanes to "
                              "train it in lanes" if plugin else "one torch thread" if threads < 2 else
                              "a model of 1M parameters or more splits each operation well over the threads"
                              if model.num_params >= SMALL_MODEL_PARAMS else
                              "a small dense model's step is mostly Python, which lanes cannot run in parallel")
        return threads, f"{threads} threads"
    if asked > 1 and off:
        raise ConfigError(f"runtime.lanes = {asked}: {off}; set runtime.lanes = 1 (or 0 for the automatic choice)")
    return asked, "runtime.lanes"


class Lanes:
    """``count`` lanes, each a trainer of its own model copy and a local solver.

    Parameters
    ----------
    trainer : Trainer
        The rank's trainer; each lane trains a :meth:`Trainer.replica` of it.
    spec : SolverSpec
        The local solver's settings (each lane has its own solver state).
    count : int
        Clients trained at once (>= 2).
    """

    def __init__(self, trainer: Trainer, spec: SolverSpec, count: int):
        self.count = count
        self._free: queue.SimpleQueue = queue.SimpleQueue()
        for _ in range(count):
            self._free.put((trainer.replica(), LocalSolver(spec)))
        self.row_bytes = trainer.model.length * trainer.model.flat.element_size()

    def train(self, x0: torch.Tensor, tasks: list, correction, lr):
        """Yield (cohort position, ClientResult) for ``tasks`` in their order.

        ``tasks``: (position, slot, indices, steps, generator) per client, in cohort order;
        ``correction(slot)``: the solver's gradient correction (P,) or None, read when the
        client starts (after every earlier client of the same slot was handed back).
        """
        longest = len(tasks) * self.row_bytes <= HOLD_BYTES and len({t[1] for t in tasks}) == len(tasks)
        starts = sorted(range(len(tasks)), key=lambda i: -tasks[i][3]) if longest else list(range(len(tasks)))
        window = len(tasks) if longest else 2 * self.count
        done: dict = {}
        running = collections.OrderedDict()   # task index -> future, in start order
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with ThreadPoolExecutor(self.count, thread_name_prefix="hpcfl-lane") as pool:
                nxt = 0   # next task to hand back, in cohort order
                for i in starts:
                    while len(running) + len(done) >= window or tasks[i][1] in {tasks[k][1] for k in running}:
                        nxt = yield from self._hand_back(tasks, running, done, nxt)
                    _, slot, indices, steps, gen = tasks[i]
                    running[i] = pool.submit(self._run, x0, indices, steps, gen, correction(slot), lr)
                while nxt < len(tasks):
                    nxt = yield from self._hand_back(tasks, running, done, nxt)
        finally:   # an error or a closed generator: clients not started are dropped, started ones end
            for future in running.values():
                future.cancel()
            wait(list(running.values()))
            torch.set_num_threads(threads)

    def _hand_back(self, tasks, running, done, nxt):
        """Wait for task ``nxt`` and yield it, with any later ones already finished; the new ``nxt``."""
        if nxt not in done:
            done[nxt] = running.pop(nxt).result()
        while nxt in done:
            yield tasks[nxt][0], done.pop(nxt)
            nxt += 1
            if nxt in running and running[nxt].done():
                done[nxt] = running.pop(nxt).result()
        return nxt

    def _run(self, x0, indices, steps, gen, corr, lr):
        trainer, solver = self._free.get()
        try:
            return trainer.train(x0, indices, steps, solver, gen, corr, lr)
        finally:
            self._free.put((trainer, solver))
