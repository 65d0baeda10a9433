"""The one local-training loop shared by every algorithm.

A rank keeps the whole training set as tensors on its device; a client's batches are
index slices of those tensors drawn from the client's own generator, keyed by
(seed, round, client). No DataLoader, no worker processes, no per-client objects.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from .. import rng
from ..algorithms.local import LocalSolver
from ..params import FlatModel


@dataclass
class ClientResult:
    """Outcome of one client's local training in one round.

    Attributes
    ----------
    delta : torch.Tensor, shape (L,)
        x_i^(t, tau_i) - x^(t,0) over the flat state (parameters and float buffers).
    steps : int
        Local steps taken (tau_i).
    anorm : float
        ||a_i||_1 (FedNova's normaliser; equals ``steps`` for plain SGD).
    loss : float
        Mean mini-batch training loss over the local steps.
    samples : int
        Mini-batch samples processed (sum of batch sizes).
    adjusted : numpy.ndarray, shape (L,), float64, or None
        The update the server rule counts instead of ``delta``, when a policy's release
        hook set one (FedLGA's approximation of the full update).
    anorm2 : float
        ||a_i||_2^2 (FedNova's Theorem 1 constants A and B; equals ``steps`` for plain SGD).
    alast : float
        a_{i,-1}, the last gradient's coefficient (1 unless the lr decays within the round).
    """

    delta: torch.Tensor
    steps: int
    anorm: float
    loss: float
    samples: int
    adjusted: np.ndarray | None = None
    anorm2: float = 0.0
    alast: float = 0.0
    _host: np.ndarray | None = field(default=None, repr=False)

    def host(self) -> np.ndarray:
        """``delta`` as a float64 host array, (L,), converted once however many policies read it.

        Read only: for a float64 CPU update it is a view of ``delta`` itself; copy it to change it.
        """
        if self._host is None:
            self._host = self.delta.detach().double().cpu().numpy()
        return self._host


class Trainer:
    """Runs local SGD for one client at a time on a rank.

    Parameters
    ----------
    model : FlatModel
    x_train, y_train : torch.Tensor, shapes (N, *input_shape) and (N,)
        The whole training set, on the model's device.
    batch_size : int
    augment : callable or None
        ``augment(xb, gen) -> xb`` applied to each batch (e.g. CIFAR crop and flip).
    step : {"auto", "autograd"}
        "auto": a model that is a plain chain of layers on CPU takes its step through a
        :class:`~hpcfl.client.program.StepProgram` (torch's kernels without autograd, bitwise
        the same gradients); "autograd" always uses autograd. ``why_autograd`` says why
        "auto" kept autograd.
    """

    def __init__(self, model: FlatModel, x_train, y_train, batch_size: int, augment=None, step: str = "auto"):
        self.model = model
        self.x, self.y = x_train, y_train
        self.batch_size = batch_size
        self.augment = augment
        self.step = step
        self._xb = self._yb = None   # batch buffers, reused every step (filled by index_select)
        self.program, self.why_autograd = None, "runtime.step = 'autograd'"
        if step == "auto" and len(x_train):
            from .program import compile_step

            k = min(4, len(x_train))
            self.program, self.why_autograd = compile_step(model, x_train[:k], y_train[:k])

    def replica(self) -> Trainer:
        """A trainer of its own model copy over the same data tensors (for another thread)."""
        import copy

        model = FlatModel(copy.deepcopy(self.model.module), self.model.device, self.model.dtype)
        return Trainer(model, self.x, self.y, self.batch_size, self.augment, self.step)

    def train(self, x0: torch.Tensor, indices: torch.Tensor, steps: int, solver: LocalSolver,
              gen: torch.Generator, corr: torch.Tensor | None = None, lr: float | None = None) -> ClientResult:
        """Train from the global state ``x0`` (L,) on the samples ``indices`` for ``steps`` steps.

        Batches walk through seeded per-epoch permutations of the client's indices
        (the last batch of an epoch may be partial), cycling epochs as needed.
        """
        m = self.model
        m.load(x0)
        m.module.train()
        w = m.weights
        solver.begin(x0[: m.num_params], lr)
        loss_fn = getattr(m.module, "loss", None) or F.cross_entropy
        n = int(indices.numel())
        loss_sum = torch.zeros((), device=m.device, dtype=torch.float64)
        samples = 0
        perm, pos = None, n
        for _ in range(steps):
            if pos >= n:
                perm, pos = indices[torch.randperm(n, generator=gen, device=gen.device).to(indices.device)], 0
            batch = perm[pos : pos + self.batch_size]
            pos += self.batch_size
            xb, yb = self._gather(batch)
            if self.augment is not None:
                xb = self.augment(xb, gen)
            if self.program is not None:
                loss, g = self.program.loss_grad(xb, yb)
            else:
                loss = loss_fn(m.module(xb), yb)
                g = m.grad_into(loss)   # reused buffer: consumed by the solver's step right away
            with torch.no_grad():
                solver.step(w, g, corr)
            loss_sum += loss.detach()
            samples += int(batch.numel())
        delta = m.flat.detach() - x0
        mean_loss = float(loss_sum) / steps if steps else 0.0
        return ClientResult(delta, steps, solver.anorm() if steps else 0.0, mean_loss, samples,
                            anorm2=solver.anorm2() if steps else 0.0, alast=solver.alast() if steps else 0.0)

    def _gather(self, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x[batch], y[batch]) written into buffers reused across steps: on W, 62 us where indexing
        allocates and takes 140. A buffer is free again once the step's backward has run."""
        if self._xb is None:
            self._xb = self.x.new_empty((self.batch_size, *self.x.shape[1:]))
            self._yb = self.y.new_empty((self.batch_size, *self.y.shape[1:]))
        k = int(batch.numel())
        batch = batch.to(self.x.device)   # no-op where the indices already live with the data
        return (torch.index_select(self.x, 0, batch, out=self._xb[:k]),
                torch.index_select(self.y, 0, batch, out=self._yb[:k]))


class LocalClients:
    """This rank's cohort clients in one round, as the statistics phase sees them.

    ``indices(j)`` are the client's training-sample indices (cohort position ``j``);
    ``data(j, positions)`` its samples at those positions (no augmentation); ``generator(j)`` a torch generator keyed by (seed, STATS, round,
    client); ``x0`` the round-start flat model, which ``load_x0`` puts into ``model``;
    ``correction(j)`` the local solver's gradient correction for that client (SCAFFOLD's
    c - c_i, or None) and ``weight_decay`` its L2 term, so a statistics phase can measure
    the gradient of the same objective the local solver follows.
    """

    def __init__(self, s, rnd: int, cohort: np.ndarray):
        self.model, self.trainer, self.device = s.model, s.trainer, s.device
        self._index, self._offset, self._slot = s.client_index, s.client_offset, s.slot
        self.seed, self.rnd, self.cohort = s.cfg.run.seed, rnd, cohort
        self.x0: torch.Tensor | None = None
        self.loss_fn = getattr(s.model.module, "loss", None) or F.cross_entropy
        self.weight_decay = s.cfg.algorithm.weight_decay
        self._algo = s.algo

    def indices(self, j: int) -> torch.Tensor:
        cid = int(self.cohort[j])   # every rank holds every client's indices: training may be dealt anywhere
        return self._index[self._offset[cid] : self._offset[cid + 1]]

    def data(self, j: int, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self.indices(j)[positions.to(self._index.device)]
        return self.trainer.x[idx], self.trainer.y[idx]

    def generator(self, j: int) -> torch.Generator:
        return rng.torch_generator(self.device, self.seed, rng.STATS, self.rnd, int(self.cohort[j]))

    def correction(self, j: int) -> torch.Tensor | None:
        return self._algo.correction(int(self._slot[self.cohort[j]]))

    def load_x0(self) -> None:
        self.model.load(self.x0)


@torch.no_grad()
def evaluate_chunks(model: FlatModel, x, y, chunks: list[tuple[int, int]], index=None,
                    samples: list | None = None) -> list[np.ndarray]:
    """Per-chunk [correct, loss_sum, count] of the model on test slices.

    ``samples``: a list to receive, per chunk of a classifier, its per-sample (hit, loss),
    two float64 arrays of shape (hi - lo,): per-client evaluation sums them by client.

    Chunk boundaries are fixed by the test set, not by the rank layout, so each chunk's
    values are the same whichever rank computes them; the exact reduction then makes
    the totals independent of the number of ranks. With ``index`` (a tensor of sample
    indices) the chunks are positions in it, gathered one chunk at a time: the training
    set is evaluated in place, never copied whole.
    """
    model.module.eval()
    custom = getattr(model.module, "loss", None)   # models with their own objective have no accuracy
    rows = []
    for lo, hi in chunks:
        if index is None:
            xb, yb = x[lo:hi], y[lo:hi]
        else:
            xb, yb = x[index[lo:hi]], y[index[lo:hi]]
        out = model.module(xb)
        if custom is not None:
            loss, correct = custom(out, yb) * (hi - lo), 0.0   # accuracy reported as NaN
        else:
            loss = F.cross_entropy(out, yb, reduction="sum")
            hit = out.argmax(1) == yb
            correct = float(hit.sum())
            if samples is not None:
                each = F.cross_entropy(out, yb, reduction="none")
                samples.append((hit.to("cpu", torch.float64).numpy(), each.to("cpu", torch.float64).numpy()))
        rows.append(np.array([correct, float(loss), float(hi - lo)]))
    return rows
