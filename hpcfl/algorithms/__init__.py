"""An algorithm is a combination of four policies (docs/architecture.md, docs/algorithms/).

| slot          | choices (see :mod:`hpcfl.algorithms.registry`)                   |
|---------------|-------------------------------------------------------------------|
| local solver  | sgd (momentum, in-round lr decay), prox, scaffold, vr             |
| steps policy  | epochs, fixed, random_epochs, client_steps, gsnr (FedGSNR)        |
| weights       | size, uniform, disco (FedDisco)                                   |
| server rule   | average, nova (+ server optimizer: lr, momentum)                  |

Paper names (fedavg, fedprox, scaffold, fednova, feddisco, fedgsnr) are presets in the registry.

The engine sees one :class:`Algorithm`: it runs the policies' hooks in the order of
:mod:`hpcfl.algorithms.protocol` and owns the reduction buffer :class:`Layout`: each
client's contribution is one row ``[delta | policy segments | scalars]`` summed over the
cohort by one exact reduction; the server reads the sums back by segment name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

# Nothing imported here may import torch: reading a job (``hpcfl config``, ``--help``,
# ``hpcfl report``) goes through this package. The local solver and the server momentum
# state need torch and are imported where an :class:`Algorithm` uses them.
from . import registry
from .protocol import Field, RoundContext, ServerArray, check_policy
from .sampling import STATIC_WEIGHTS, Sampler
from .server import ServerOptimizer

if TYPE_CHECKING:
    import torch

# "nonfinite" counts contributions whose server-side adjustment (FedLGA's correction) overflowed: the exact
# sum cannot take NaN or Inf, so such a row carries only this flag and rank 0 ends the run as diverged.
SCALARS = ("weight", "weight_steps", "weight_anorm", "weight_loss", "count", "samples", "nonfinite")


class Layout:
    """Named contiguous segments of the reduction buffer.

    Parameters
    ----------
    segments : list of (name, length)
    """

    def __init__(self, segments: list[tuple[str, int]]):
        self.slices: dict[str, slice] = {}
        offset = 0
        for name, n in segments:
            if name in self.slices:
                raise ValueError(f"two policies declare the reduction segment {name!r}")
            self.slices[name] = slice(offset, offset + n)
            offset += n
        self.length = offset

    def split(self, buf: np.ndarray) -> dict[str, np.ndarray]:
        return {name: buf[s] for name, s in self.slices.items()}


def milestone_rounds(schedule: str, milestones, milestone_rounds, rounds: int) -> tuple[int, ...]:
    """Milestones m (loop indices, from 0): rounds m+1 onwards, counted from 1 as the files do,
    have the client lr multiplied once more by lr_gamma.

    ``milestone_rounds`` when given; else the fractions ``milestones`` of ``rounds``:
    (0.5, 0.75) is FedNova's code schedule, x0.1 from round floor(R/2) and x0.01 from
    floor(0.75 R) (docs/algorithms/fednova.md). Plain values, so the resume check can
    resolve a stored job's schedule from its dict as well.
    """
    if schedule == "constant":
        return ()
    if milestone_rounds is not None:
        return tuple(int(m) for m in milestone_rounds)
    return tuple(int(m * rounds) for m in milestones)


def round_lr(cfg, rnd: int, rounds: int) -> float:
    """The client lr of round ``rnd`` (from 0): lr times lr_gamma per milestone passed."""
    passed = sum(rnd >= m for m in milestone_rounds(cfg.lr_schedule, cfg.lr_milestones, cfg.lr_milestone_rounds,
                                                     rounds))
    return cfg.lr * cfg.lr_gamma**passed


class Algorithm:
    """The four policies of a job, their state, and the hooks of one round.

    Parameters
    ----------
    cfg : hpcfl.config.Config
    state_length : int
        L, the model's flat length (parameters and float buffers).
    num_params : int
        Trainable prefix of the flat vector.
    num_local : int
        Clients owned by this rank (rows of per-client state).
    device, dtype
        Where and in which precision per-client state lives.
    sizes : (N,) int64
        Training samples of every client.
    """

    def __init__(self, cfg, state_length: int, num_params: int, num_local: int, device, dtype,
                 sizes: np.ndarray):
        a = cfg.algorithm
        self.cfg, self.num_params = a, num_params
        self.notes: list[str] = []     # what the run should say at its start (rank 0 prints them)
        local_steps = a.local_steps
        if not local_steps and a.steps in registry.STEP_COUNT_POLICIES:
            local_steps = registry.epochs_worth(a.local_epochs, a.batch_size, a.epoch_rounding, sizes)
            what = "E_const" if a.steps == "gsnr" else "tau0"
            self.notes.append(f"steps = {a.steps!r} starts from {what} = {local_steps} local steps: "
                              f"algorithm.local_steps is unset, so {a.local_epochs} epoch(s) of batch "
                              f"{a.batch_size}, averaged over the clients (set algorithm.local_steps to choose)")

        def make(slot: str, name: str):
            b = registry.Build(cfg, cfg.policy_options.get(slot), state_length, num_params, num_local,
                               len(sizes), device, dtype, local_steps)
            return registry.SLOTS[slot][name](b)

        self.extras = make("local", a.local)          # stateful add-ons of the local solver
        self.steps_policy = make("steps", a.steps)
        self.weights_policy = make("weights", a.weights)
        self.rule = make("server", a.server)
        for slot, policies in (("local", self.extras), ("steps", [self.steps_policy]),
                               ("weights", [self.weights_policy]), ("server", [self.rule])):
            for p in policies:
                check_policy(p, slot)
        self.policies = [self.weights_policy, self.steps_policy, *self.extras, self.rule]
        self.notes += [n for p in self.policies for n in getattr(p, "notes", ())]
        # A local add-on may bring its own proximal term (FedDyn's alpha/2 ||x - x^t||^2): it adds to mu.
        mu = a.mu + sum(getattr(p, "prox", 0.0) for p in self.extras)
        from .local import LocalSolver, SolverSpec

        self.solver = LocalSolver(SolverSpec(a.lr, a.momentum, a.weight_decay, mu, a.local_lr_decay))
        static = self.weights_policy(-1, np.arange(len(sizes)), sizes) if a.weights in STATIC_WEIGHTS else sizes
        self.sampler = Sampler(a.sampling, a.clients_per_round, cfg.run.seed, static)
        self.server_opt = ServerOptimizer(a.server_lr, a.server_momentum, lr_scaled=a.server == "nova")
        self.state_length = state_length
        self._host_view = None   # the round's device sums as host segments (see segments())
        self._lay_out()
        self.lr = a.lr

    def _lay_out(self) -> None:
        segments = [("delta", self.state_length)]
        segments += [(sg.name, sg.length) for p in self.policies for sg in p.segments()]
        self.layout = Layout(segments + [("scalars", len(SCALARS))])

    def add(self, policy) -> None:
        """Plug in one more policy (an add-on outside the four slots; every rank, before the run)."""
        check_policy(policy, "add-on")
        self.policies.append(policy)
        self._lay_out()

    # ---- declared records and state ----------------------------------------------
    @property
    def client_fields(self) -> dict[str, Field]:
        return {k: v for p in self.policies for k, v in p.client_fields.items()}

    @property
    def round_fields(self) -> dict[str, Field]:
        return {k: v for p in self.policies for k, v in p.round_fields.items()}

    def state(self) -> list:
        """Every :class:`ClientTable` and :class:`ServerArray` of the run (checkpointed)."""
        from .variates import server_momentum_state

        return [server_momentum_state(self.server_opt)] + [item for p in self.policies for item in p.state()]

    def pinned(self) -> list[str]:
        """Policies that need a client trained on its home rank, as ``"Class (reason)"``.

        A statistics phase or a hold/release computes per-client values on the home rank
        that packing reads back, and a :class:`ClientTable` without row access cannot move.
        With none of them, each round's training can be dealt to any rank
        (``runtime.placement = "balanced"``); movable tables then follow their clients
        (:mod:`hpcfl.engine.placement`).
        """
        from .protocol import ClientTable, Policy

        out = []
        for p in self.policies:
            why = [name for name in ("statistics", "hold", "release")
                   if getattr(type(p), name) is not getattr(Policy, name)]
            if any(isinstance(item, ClientTable) and not item.movable for item in p.state()):
                why.insert(0, "per-client state that cannot move")
            if why:
                out.append(f"{type(p).__name__} ({', '.join(why)})")
        return out

    def tables(self) -> list:
        """Every :class:`ClientTable` of the run."""
        from .protocol import ClientTable

        return [item for item in self.state() if isinstance(item, ClientTable)]

    def transfer(self) -> tuple[int, int]:
        """Extra floats per client and round: (upload, download), beyond the model."""
        ups, downs = zip(*(p.transfer() for p in self.policies))
        return sum(ups), sum(downs)

    def finish_steps(self, ctx: RoundContext) -> np.ndarray | int:
        """Steps of compute (k,) a client short of its full work runs after training (0: none)."""
        extra = [e for e in (p.finish_steps(ctx) for p in self.policies) if e is not None]
        return sum(np.asarray(e, dtype=np.int64) for e in extra) if extra else 0

    # ---- the round ---------------------------------------------------------------
    def begin_round(self, rnd: int, rounds: int) -> float:
        """Set and return the round's client lr."""
        self.lr = round_lr(self.cfg, rnd, rounds)
        return self.lr

    def setup(self, ctx: RoundContext) -> None:
        for p in self.policies:
            p.setup(ctx)

    def decide(self, ctx: RoundContext) -> None:
        """Weights over the sampled set, then the statistics phase, then the steps (every rank)."""
        ctx.weights = self.sampler.weights(self.weights_policy.weights(ctx), ctx.cohort, ctx.draws)
        for p in self.policies:
            p.statistics(ctx)
        ctx.steps = np.asarray(self.steps_policy.steps(ctx), dtype=np.int64)
        if ctx.full_steps is None:     # no truncating steps policy: every client is asked its full work
            ctx.full_steps = ctx.steps.copy()

    def correction(self, slot: int) -> torch.Tensor | None:
        for p in self.extras:
            c = p.correction(slot)
            if c is not None:
                return c
        return None

    def holds(self, ctx: RoundContext, j: int) -> bool:
        """Whether some policy keeps the trained client at position ``j`` until :meth:`release`."""
        return any(p.hold(ctx, j) for p in self.policies)

    def release(self, ctx: RoundContext, held: list) -> None:
        """Every rank, after training: the policies' release hooks (collectives allowed)."""
        for p in self.policies:
            p.release(ctx, held)

    def pack(self, ctx: RoundContext, j: int, slot: int, res, weight: float) -> np.ndarray:
        """The reduction row of one trained client (see :class:`Layout`), as a new array."""
        return self.pack_into(ctx, j, slot, res, weight, np.empty(self.layout.length))

    def pack_into(self, ctx: RoundContext, j: int, slot: int, res, weight: float, out):
        """Write the reduction row of one trained client into ``out`` (L_row,) float64.

        ``out`` is a host array (the host form of the sum, :mod:`hpcfl.parallel.gridsum`) or a tensor on
        the training device (its device form, :mod:`hpcfl.parallel.gridsum_torch`); either way the values
        are those of ``float64(delta) * weight``, computed where ``out`` lives, and a policy's
        segment may be given as an array or a tensor. On the device nothing here waits for it:
        scalars are written by ``fill_``, not copied from the host.

        The server rule counts ``res.adjusted`` when a policy set it (FedLGA's approximated
        full update), else the update itself; every other policy sees the real ``res.delta``.
        """
        import torch

        lay = self.layout.slices
        on_device = isinstance(out, torch.Tensor)
        put = _put_tensor if on_device else _put_array
        if res.adjusted is not None and not np.isfinite(res.adjusted).all():
            put(out, 0.0)
            flag = lay["scalars"].start + SCALARS.index("nonfinite")
            put(out[flag: flag + 1], 1.0)
            return out
        seg = out[lay["delta"]]
        if res.adjusted is not None:
            put(seg, res.adjusted)
        elif res._host is not None and not on_device:   # a policy converted it already
            np.copyto(seg, res._host)
        elif on_device:
            seg.copy_(res.delta.detach())
        else:   # from the device straight into the row, converted to float64 on the way
            torch.from_numpy(seg).copy_(res.delta.detach())
        self.rule.contribute_into(seg, weight, res.anorm)
        written = {"delta"}
        for p in self.policies:
            for name, value in p.pack(ctx, j, slot, res, weight).items():
                put(out[lay[name]], value)
                written.add(name)
        for name, sl in lay.items():              # segments no policy filled for this client are zero
            if name not in written and name != "scalars":
                put(out[sl], 0.0)
        values = (weight, weight * res.steps, weight * res.anorm, weight * res.loss, 1.0, res.samples, 0.0)
        if on_device:
            base = lay["scalars"].start
            for i, v in enumerate(values):
                out[base + i].fill_(v)
        else:
            out[lay["scalars"]] = values
        return out

    def segments(self, sums) -> tuple[dict, dict]:
        """(segments by name, scalars by name) of the round's reduced sums, (L_row,) float64.

        Host sums give views. Device sums (a tensor, :mod:`hpcfl.parallel.gridsum_torch`) give host
        arrays, each copied from the device once, when a policy first reads it; the same
        object serves the round's server step, controllers and records.
        """
        import torch

        if not isinstance(sums, torch.Tensor):
            seg = self.layout.split(sums)
        else:
            if self._host_view is None or self._host_view.sums is not sums:
                self._host_view = HostSegments(self.layout, sums)
            seg = self._host_view
        return seg, dict(zip(SCALARS, seg["scalars"]))   # numpy scalars, as policies have always seen them

    def updates_on_device(self) -> bool:
        """Whether the model update can run where device sums live: an element-wise server rule
        (``tensors``) and no server momentum (whose buffer is host state)."""
        return getattr(self.rule, "tensors", False) and self.server_opt.momentum == 0

    def server_step(self, ctx: RoundContext, x, sums) -> tuple:
        """Rank 0: new global model from the reduced sums, server state, round diagnostics.

        ``x`` (L,) and ``sums`` (L_row,) are host arrays, or tensors on the device for device
        sums. There the model's update runs on the device when :meth:`updates_on_device`, else
        on host copies; every other policy reads host segments (:meth:`segments`).
        """
        import torch

        seg, s = self.segments(sums)
        if s["nonfinite"]:             # an adjusted update overflowed: the engine stops the run as diverged
            return x * float("nan"), {"tau_eff": float("nan")}
        if s["weight"] == 0:           # nobody reported (all dropped): keep the model
            return x, {"tau_eff": float("nan")}
        if isinstance(sums, torch.Tensor) and self.updates_on_device():
            agg = self.rule.aggregate(sums[self.layout.slices["delta"]], s, seg)
            new_x = self.server_opt.apply(x, agg, self.lr)
        elif isinstance(x, torch.Tensor):   # device sums, a host-only rule: on host copies, then back
            agg = self.rule.aggregate(seg["delta"], s, seg)
            new_x = torch.from_numpy(self.server_opt.apply(x.cpu().numpy(), agg, self.lr)).to(x.device)
        else:
            new_x = self.server_opt.apply(x, self.rule.aggregate(seg["delta"], s, seg), self.lr)
        for p in self.policies:
            p.server_update(ctx, seg, s)
        return new_x, {"tau_eff": self.rule.tau_eff(s)}

    def control(self, ctx: RoundContext, sums) -> list:
        """Rank 0: every policy's decision for the next round (broadcast by the engine)."""
        seg, s = self.segments(sums)
        return [p.control(ctx, seg, s) for p in self.policies]

    def receive(self, decisions: list) -> None:
        for p, d in zip(self.policies, decisions):
            if d is not None:
                p.receive(d)

    def broadcast_state(self, comm) -> None:
        """Send every broadcast :class:`ServerArray` from rank 0 to all ranks."""
        for item in self.state():
            if isinstance(item, ServerArray) and item.broadcast:
                host = np.ascontiguousarray(item.get())
                comm.Bcast(host, root=0)
                if comm.rank != 0:
                    item.set(host)

    def records(self, ctx: RoundContext) -> tuple[dict, dict]:
        """Rank 0: the policies' (per-client arrays, per-round scalars) for this round."""
        clients, rounds = {}, {}
        for p in self.policies:
            clients.update(p.client_records(ctx))
            rounds.update(p.round_records(ctx))
        return clients, rounds


def _put_array(dst: np.ndarray, value) -> None:
    """``dst[...] = value`` for a host row segment; a tensor value is copied (and converted) by torch."""
    import torch

    if isinstance(value, torch.Tensor):
        torch.from_numpy(dst).copy_(value.detach())
    else:
        dst[...] = value


def _put_tensor(dst: torch.Tensor, value) -> None:
    """``dst[...] = value`` for a device row segment: a scalar by ``fill_``, an array or tensor by ``copy_``."""
    import torch

    if isinstance(value, torch.Tensor):
        dst.copy_(value.detach())
    elif np.ndim(value) == 0:
        dst.fill_(float(value))
    else:
        dst.copy_(torch.from_numpy(np.ascontiguousarray(value, dtype=np.float64)))


class HostSegments(Mapping):
    """The reduced sums by segment name as host float64 arrays, each copied from the device on
    first use (the delta of a model whose update runs on the device is never copied)."""

    def __init__(self, layout: Layout, sums: torch.Tensor):
        self.sums, self._slices, self._host = sums, layout.slices, {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._host:
            self._host[name] = self.sums[self._slices[name]].cpu().numpy()
        return self._host[name]

    def __iter__(self):
        return iter(self._slices)

    def __len__(self) -> int:
        return len(self._slices)
