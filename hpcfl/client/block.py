"""Vectorised client blocks: a group of clients trained as one batched computation.

The sequential :class:`~hpcfl.client.trainer.Trainer` pays the framework's per-step
overhead (autograd graph, kernel launches, Python) once per client and step; for tiny
models (FedNova's quadratic, logistic regression, small MLPs) that overhead is nearly
all of the time. :class:`BlockTrainer` trains G clients at once: their weights are the
rows of one (G, P) tensor, one batched forward/backward gives every client's gradient,
and one vectorised solver step updates every row. Models may give that gradient in closed
form (``batched_loss_grad``: the quadratic, logistic regression); any other vmappable model
goes through ``torch.func.vmap`` of its forward and one autograd call per step. Logistic
regression and the quadratic on CPU go further where numba is installed: a group's whole round
is one compiled call (:mod:`hpcfl.client.fused`), with the same batches and solver, also equal
within rounding.

What stays exactly as in the sequential loop:

- each client's batches: the same seeded per-epoch permutations of its indices, drawn
  from its own generator in the same order (a partial last batch per epoch);
- the solver's update formula and the coefficients ``||a||_1``, ``||a||_2^2``, ``a_{-1}``
  (from the solver's own recurrences, so FedNova's weights are bitwise the sequential loop's).

What differs: a mini-batch loss is a masked sum over a padded batch divided by the
batch's size, and the batched kernels may sum in another order than the per-client
ones, so results equal the sequential loop's within float rounding, not bitwise.
Each client's row is computed by kernels that never mix rows, so a client's result
does not depend on which other clients share its group: on the CPU results are bitwise the
same on any number of ranks and for any grouping (tests/unit/test_block.py checks both).

Groups of a fixed width. Kernel libraries choose algorithms by shape (cuBLAS and cuDNN on a
GPU), so a client's kernels must not see shapes that depend on where it was placed. On the
torch paths every group has exactly ``min(group_size, K)`` rows (:func:`group_width`), K being
the clients the round trains on all ranks together (the engine passes it), and every local step
runs all rows: clients are ordered by steps, longest first; rows whose client has finished, and
the padding rows of a rank's last group, keep computing, but their gradient is zeroed before the
update (``w - lr * 0`` is ``w`` bitwise) and their loss is not counted. So every kernel call of
a client's steps has shapes (width, B, ...) on 1, 2 or R ranks (tests/unit/test_block_shapes.py
records them through a dispatch mode). The cost: padding rows compute like real ones, so a rank
with fewer clients than the width pays for the width (on R ranks a cohort of K <= 64 pads each
rank's ~K/R clients to K rows: a small cohort gains no speed from more ranks), a rank's last group
is padded, and finished rows keep computing until their group's longest client is done; memory
stays bounded by ``group_size`` rows. The compiled CPU kernel (:mod:`hpcfl.client.fused`) loops
over rows in C with no torch kernel per step, so its groups hold real rows only.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch.func import functional_call, vmap

from ..algorithms.local import LocalSolver, SolverSpec
from ..params import FlatModel
from ..plugins import is_plugin
from .trainer import ClientResult

GROUP_SIZE = 64   # clients per batched computation (bounds memory: a few (G, P) tensors)
PREGATHER = 1 << 22   # input values of a group's whole round gathered up front when at most this many


def unsupported(model: FlatModel, augment, spec: SolverSpec) -> str | None:
    """Why this model/solver cannot be trained in blocks, or None when it can."""
    m = model.module
    if model.length != model.num_params:
        return "the model has float buffers (batch norm running statistics), which a batched forward cannot update"
    if augment is not None:
        return "data augmentation draws per-sample randomness the batched path does not reproduce"
    if any(isinstance(mod, (torch.nn.Dropout, torch.nn.modules.dropout._DropoutNd)) for mod in m.modules()):
        return "the model uses dropout (per-client random masks)"
    if getattr(m, "loss", None) is not None and getattr(m, "batched_loss_grad", None) is None:
        return "the model has its own loss without a batched form (batched_loss_grad)"
    if any(isinstance(mod, (torch.nn.RNNBase,)) for mod in m.modules()):
        return "recurrent layers are not vmapped here"
    return None


def solver_coefficients(spec: SolverSpec, lr: float, steps: int) -> np.ndarray:
    """``(||a||_1, ||a||_2^2, a_{-1})`` after 0..steps local steps, (steps + 1, 3) float64.

    Every client of a block takes the same solver steps, so these depend on the step count
    only. They come from :class:`~hpcfl.algorithms.local.LocalSolver` itself, run on a
    one-element dummy (its scalar recurrences ignore the gradient), so they are bitwise
    the sequential loop's values.
    """
    key = (spec, float(lr))
    have = _COEFFICIENTS.get(key)
    if have is None or len(have) <= steps:   # the recurrences do not depend on the total: prefixes are reused
        solver = LocalSolver(spec)
        dummy = torch.zeros(1, dtype=torch.float64)
        solver.begin(dummy.clone(), lr)
        have = np.zeros((steps + 1, 3))
        for k in range(steps):
            solver.step(dummy, dummy, None)
            have[k + 1] = solver.anorm(), solver.anorm2(), solver.alast()
        if len(_COEFFICIENTS) > 64:   # a per-round lr schedule makes a new key each round
            _COEFFICIENTS.clear()
        _COEFFICIENTS[key] = have
    return have[: steps + 1]


_COEFFICIENTS: dict = {}   # (spec, lr) -> coefficients after 0..n steps, for the longest n asked


class BlockTrainer:
    """Trains groups of clients as batched computations (see module docstring).

    Parameters
    ----------
    model : FlatModel
        Parameters only (no float buffers); its module gives the forward pass.
    x_train, y_train : torch.Tensor, shapes (N, *input_shape) and (N,)
    batch_size : int
    group_size : int
        Most clients trained together; the torch paths' groups are ``min(group_size, K)`` rows
        wide, padded (:func:`group_width`).
    fused : bool
        Train logistic regression and the quadratic on CPU with a compiled group kernel
        (:mod:`hpcfl.client.fused`: C, else numba) where one can be had; False keeps the batched
        torch step.
    """

    def __init__(self, model: FlatModel, x_train, y_train, batch_size: int, group_size: int = GROUP_SIZE,
                 fused: bool = True):
        self.model, self.x, self.y = model, x_train, y_train
        self.batch_size, self.group_size = batch_size, group_size
        m = model.module
        kind = _fused_kind(model, x_train) if fused else None
        self.fused = None
        if kind is not None:
            from .fused import kernel

            self.fused = kernel(kind)   # compiled (or loaded from the kernel cache) now, before any round
        if self.fused is not None:   # the kernel reads numpy views of the data in the model's dtype
            xs = x_train.reshape(len(x_train), -1) if kind == "logreg" else x_train
            self._xn = xs.to(model.dtype).contiguous().numpy()
            self._yn = y_train.to(torch.int64).contiguous().numpy()
            self._classes = m.fc.out_features if kind == "logreg" else 0
        self.trace = None   # trace(step, ids of the clients taking it), before each step of a torch path (tests)
        self._closed = getattr(m, "batched_loss_grad", None)   # (w, xb, yb, weight) -> (loss (G,), grad (G, P))
        names = [n.split(":", 1)[1] for n in model.names]
        sizes = [int(np.prod(s)) for s in model.shapes]
        self._layout = list(zip(names, model.shapes, np.cumsum([0] + sizes[:-1]).tolist(), sizes))

        def forward(w: torch.Tensor, xb: torch.Tensor) -> torch.Tensor:
            params = {n: w[o : o + k].view(shape) for n, shape, o, k in self._layout}
            return functional_call(m, params, (xb,))

        self._forward = vmap(forward)

    def _schedule(self, indices: torch.Tensor, steps: int, gen: torch.Generator) -> torch.Tensor:
        """The client's batches as rows of sample indices, (steps, B), -1 padding a partial batch.

        Draws ``randperm`` from ``gen`` once per epoch started, exactly like the sequential loop.
        """
        n, B = int(indices.numel()), self.batch_size
        per_epoch = -(-n // B)
        epochs = -(-steps // per_epoch)
        rows = torch.full((epochs, per_epoch * B), -1, dtype=torch.int64, device=indices.device)
        if n == 1:   # every permutation of one sample is the same (the generator is not used after training)
            rows[:, 0] = indices[0]
        else:
            perms = torch.stack([torch.randperm(n, generator=gen, device=gen.device) for _ in range(epochs)])
            rows[:, :n] = indices[perms.to(indices.device)]
        return rows.view(epochs * per_epoch, B)[:steps]

    def _losses(self, w: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        """Per-sample losses (G, B) of G clients' weights ``w`` (G, P) on their batches."""
        out = self._forward(w, xb)
        return F.cross_entropy(out.flatten(0, 1), yb.flatten(), reduction="none").view(yb.shape)

    def train(self, x0: torch.Tensor, jobs: list, spec: SolverSpec, lr: float,
              corrections: list | None = None, cohort: int | None = None) -> list[ClientResult]:
        """Train clients from the global state ``x0`` (P,); one :class:`ClientResult` per job, in order.

        ``jobs`` holds (indices, steps, generator) per client (steps > 0); ``corrections``
        the solver's per-client gradient correction (P,) or None each (SCAFFOLD, VR).
        ``cohort`` is the number of clients the round trains on all ranks together: it fixes
        the torch paths' group width (:func:`group_width`), so that a client's kernels see the
        same shapes on any number of ranks; None (one caller trains every client) takes ``len(jobs)``.
        """
        corrections = corrections or [None] * len(jobs)
        order = sorted(range(len(jobs)), key=lambda i: -jobs[i][1])   # longest first: active rows are a prefix
        # the compiled kernel has no per-step torch kernel whose shape could matter: real rows only
        width = self.group_size if self.fused is not None else group_width(self.group_size, cohort, len(jobs))
        results: list = [None] * len(jobs)
        for lo in range(0, len(order), width):
            group = order[lo : lo + width]
            got = self._train_group(x0, [jobs[i] for i in group], spec, lr, [corrections[i] for i in group],
                                    width, group)
            for i, res in zip(group, got):
                results[i] = res
        return results

    def _train_group(self, x0, jobs, spec: SolverSpec, lr: float, corrs, width: int, ids: list) -> list[ClientResult]:
        """One group's round: results for ``jobs``; the torch paths pad the group to ``width`` rows.

        Every step runs all ``width`` rows, so every kernel call has shapes (width, B, ...) whatever
        the group holds. Padding rows (no batches: weight 0) and rows whose client has finished
        keep computing; their gradient is zeroed before the update (``w + (-lr) * 0`` is ``w``
        exactly) and their loss is not counted, so real rows get bitwise what they got alone.
        ``ids`` (the jobs' positions in :meth:`train`) only name the rows to :attr:`trace`.
        """
        n, P, B = len(jobs), self.model.num_params, self.batch_size
        G = n if self.fused is not None else width
        steps = np.array([s for _, s, _ in jobs] + [0] * (G - n))   # padding rows take no step
        S = int(steps[0])
        sched = torch.full((S, G, B), -1, dtype=torch.int64, device=x0.device)
        for g, (indices, k, gen) in enumerate(jobs):
            sched[:k, g] = self._schedule(indices, int(k), gen)
        valid = sched >= 0
        count = valid.sum(2)                                        # (S, G) batch sizes
        if self.fused is not None:
            return self._train_group_fused(x0, sched, steps, spec, lr, corrs, count)
        # per-step views made once, so that no call inside the loop sees the group's step count S
        weights = (valid.to(x0.dtype) / count.clamp(min=1).unsqueeze(2).to(x0.dtype)).unbind(0)
        done = (torch.as_tensor(steps, device=x0.device) <= torch.arange(S, device=x0.device).unsqueeze(1))
        done = done.unsqueeze(2).unbind(0)                          # (G, 1) per step: row takes no step
        sched.clamp_(min=0)                                         # padding reads sample 0, weighted 0
        w = x0[:P].expand(G, P).clone()
        corr = None
        if any(c is not None for c in corrs):
            corr = torch.stack([torch.zeros_like(x0[:P]) if c is None else c for c in corrs]
                               + [torch.zeros_like(x0[:P])] * (G - n))
        u = torch.zeros_like(w) if spec.momentum else None
        x0p = x0[:P]
        loss_sum = torch.zeros(G, dtype=torch.float64, device=x0.device)
        active = np.searchsorted(-steps, -np.arange(S), side="left")   # rows with steps > s still train
        # small rounds gather every batch at once (one indexing op instead of two per step)
        if sched.numel() * self.x[0].numel() <= PREGATHER:
            xs, ys = self.x[sched].unbind(0), self.y[sched].unbind(0)
        else:
            xs, ys = None, None
        steps_sched = sched.unbind(0)
        for k in range(S):
            if self.trace is not None:
                self.trace(k, ids[: int(active[k])])
            xb, yb = (xs[k], ys[k]) if xs is not None else (self.x[steps_sched[k]], self.y[steps_sched[k]])
            if self._closed is not None:   # the model's own gradient: no autograd graph per step
                with torch.no_grad():
                    per_client, g = self._closed(w, xb, yb, weights[k])
                wa = w
            else:
                wa = w.detach().requires_grad_(True)
                per_client = (self._losses(wa, xb, yb) * weights[k]).sum(1)
                (g,) = torch.autograd.grad(per_client.sum(), wa)
            with torch.no_grad():
                # the sequential solver's operations, row-wise (LocalSolver.step)
                if spec.weight_decay:
                    g = g.add(wa, alpha=spec.weight_decay)
                if spec.mu:
                    g = g.add(wa - x0p, alpha=spec.mu)
                if corr is not None:
                    g = g.add(corr)
                if spec.momentum:   # a finished row's buffer is never read again: masking it below is harmless
                    g = u.copy_(g) if k == 0 else u.mul_(spec.momentum).add_(g)
                g.masked_fill_(done[k], 0.0)       # rows without this step: w - lr * 0 == w, bitwise
                scale = spec.decay**k if spec.decay != 1.0 else 1.0
                w.add_(g, alpha=-lr * scale)
                loss_sum += per_client.detach().masked_fill(done[k].squeeze(1), 0.0)
        if self.trace is not None:
            self.trace(S, [])
        return _results(spec, lr, steps[:n], count[:, :n], (w - x0p)[:n], loss_sum[:n])

    def _train_group_fused(self, x0, sched, steps, spec, lr: float, corrs, count) -> list[ClientResult]:
        """The group's whole round in one compiled call (:mod:`hpcfl.client.fused`)."""
        from .fused import train_group

        P, G = self.model.num_params, len(steps)
        x0p = x0[:P]
        w = x0p.expand(G, P).contiguous().clone()
        corr = None
        if any(c is not None for c in corrs):
            corr = torch.stack([torch.zeros_like(x0p) if c is None else c for c in corrs]).contiguous().numpy()
        loss = train_group(self.fused, w.numpy(), self._xn, self._yn, sched.numpy(), steps, spec, lr, corr,
                           x0p.contiguous().numpy(), self._classes)
        return _results(spec, lr, steps, count, w - x0p, torch.from_numpy(loss))


def _results(spec: SolverSpec, lr: float, steps: np.ndarray, count: torch.Tensor, delta: torch.Tensor,
             loss_sum: torch.Tensor) -> list[ClientResult]:
    """One ClientResult per row: ``delta`` (G, P), loss sums (G,), batch sizes ``count`` (S, G)."""
    a = solver_coefficients(spec, lr, int(steps[0]))
    samples = count.sum(0).tolist()
    return [ClientResult(delta[g], int(steps[g]), float(a[steps[g], 0]), float(loss_sum[g]) / int(steps[g]),
                         int(samples[g]), anorm2=float(a[steps[g], 1]), alast=float(a[steps[g], 2]))
            for g in range(len(steps))]


def _fused_kind(model: FlatModel, x_train) -> str | None:
    """Which compiled group kernel (:data:`hpcfl.client.fused.KINDS`) trains this model, or None
    (other models, or not on CPU)."""
    from ..models.quadratic import Quadratic
    from ..models.simple import LogReg

    if model.device.type != "cpu":
        return None
    if isinstance(model.module, LogReg):
        return "logreg"
    if isinstance(model.module, Quadratic):
        return "quadratic" if x_train.dim() == 2 else "quadratic_general"
    return None


def choose_block_trainer(cfg, comm, model: FlatModel, augment, spec: SolverSpec, x_train, y_train):
    """The vectorised trainer when ``runtime.vectorize`` asks for it (or "auto" picks it), else None.

    "auto" is a rule, not a timing, so that the mode (and with it the last bits of the
    results) is a function of the job and the device kind alone: blocks for models with a
    closed-form batched gradient (``batched_loss_grad``: the quadratic, logistic regression),
    where they were measured 11-35x faster on one CPU core with the compiled kernels
    (docs/architecture.md); on a GPU, blocks for every model that vmaps (no batch norm, dropout,
    augmentation or recurrent layers: LeNet-5, VGG without batch norm, MLPs), whose one-client
    steps leave a GPU mostly idle (W: 2.6x the sequential loop's speed on an H200); the
    sequential loop for everything else. Rank 0 of ``comm`` prints the choice.
    """
    mode = cfg.runtime.vectorize
    if mode == "off":
        return None
    why = unsupported(model, augment, spec)
    if mode == "on" and why is not None:
        from ..errors import ConfigError

        raise ConfigError(f"runtime.vectorize = 'on' cannot train model {cfg.model.name!r} on "
                          f"{cfg.data.dataset!r} in batched groups: {why}; set runtime.vectorize = 'off'")
    closed = getattr(model.module, "batched_loss_grad", None) is not None
    gpu = model.device.type == "cuda"
    if mode == "auto" and (why is not None or not (closed or gpu)):
        if comm.rank == 0 and is_plugin(cfg.model.name):   # your own model: say which loop it gets, and why
            reason = why or ("on the CPU 'auto' batches only models with a closed-form batched gradient "
                             "(batched_loss_grad), and it has none; runtime.vectorize = 'on' batches it anyway")
            print(f"hpcfl: runtime.vectorize = 'auto': model {cfg.model.name!r} trains one client at a time: "
                  f"{reason}", flush=True)
        return None
    block = BlockTrainer(model, x_train, y_train, cfg.algorithm.batch_size, group_size(model))
    if mode == "auto" and comm.rank == 0:
        how = "; each group's round is one compiled call" if block.fused is not None else ""
        reason = (f"model {cfg.model.name!r} has a closed-form batched gradient{how}" if closed else
                  f"model {cfg.model.name!r} vmaps, on {model.device}; up to {block.group_size} clients a group")
        print(f"hpcfl: runtime.vectorize = 'auto': training clients in batched groups ({reason}; 'off' for the "
              f"one-by-one loop)", flush=True)
    return block


def group_size(model: FlatModel) -> int:
    """Clients per group: :data:`GROUP_SIZE`, fewer on a GPU whose memory a group's weights, gradients
    and updates (about 4 copies of the model each) would take more than a quarter of. The same on every
    rank of one device kind, so the group width it bounds (:func:`group_width`) does not depend on the
    rank count; on the CPU results do not depend on it at all (a client's row never mixes with another's)."""
    if model.device.type != "cuda":
        return GROUP_SIZE
    total = torch.cuda.get_device_properties(model.device).total_memory
    per_client = 4 * model.num_params * model.flat.element_size()
    return int(max(1, min(GROUP_SIZE, total // 4 // max(per_client, 1))))


def group_width(group_size: int, cohort: int | None, jobs: int) -> int:
    """Rows of every group on the torch paths: ``min(group_size, cohort)``.

    ``cohort`` (the round's clients on all ranks together) is the same on 1, 2 or R ranks, and so
    is ``group_size`` on one device kind, so a client's kernels have the same shapes wherever it is
    placed. A rank's jobs are cut into groups of this width and its last group is padded, which
    costs compute where a rank has fewer jobs than the width: on R ranks a cohort of K <= 64 pads each
    rank's ~K/R clients to K rows. None (one caller trains every client): ``jobs``.
    """
    return max(1, min(group_size, jobs if cohort is None else int(cohort)))
