"""The round protocol: what a policy sees, what it may join, what it keeps and records.

Every policy (local solver, steps, weights, server rule, and stateful add-ons such as
SCAFFOLD's control variates) is an object with optional hooks, all no-ops by default
(:class:`Policy`). The round loop (``hpcfl.engine.simulation.run``) calls them through
:class:`hpcfl.algorithms.Algorithm`, in this order, and never names a policy:

======================  ==========  =====================================================
phase                   where       hooks
======================  ==========  =====================================================
setup (once)            all ranks   ``setup(ctx)``; may use ``ctx.collective``
decide: weights         all ranks   ``weights(ctx)`` of the weights policy -> p over the
                                    round's sampled set
decide: statistics      all ranks   ``statistics(ctx)``: per-client quantities at the
                                    round-start model, reduced with ``ctx.collective``
decide: steps           all ranks   ``steps(ctx)`` of the steps policy -> tau_i
train + pack            own clients ``correction(slot)``; ``pack(ctx, j, slot, res, w)``
                                    fills the policy's declared :class:`Segment` s;
                                    a client some ``hold(ctx, j)`` keeps waits
release                 all ranks   ``release(ctx, held)``: may reduce what was packed
                                    so far and adjust the held results; then they
                                    are packed (FedLGA's two-phase correction)
reduce                  all ranks   one exact sum of ``[delta | segments | scalars]``
server                  rank 0      ``server_update(ctx, segments, scalars)``
controller              rank 0      ``control(ctx, segments, scalars)`` -> a decision,
                                    broadcast; every rank then calls ``receive(decision)``
record                  rank 0      ``client_records(ctx)``, ``round_records(ctx)``
======================  ==========  =====================================================

Every rank computes the same decisions because they depend only on keyed randomness
(seed, round, client) and on exactly reduced (order-independent) sums.

State a policy keeps is declared by :meth:`Policy.state` as :class:`ClientTable` (rows of
the clients a rank owns) and :class:`ServerArray` (held on rank 0, optionally broadcast
to every rank after each server step). Checkpoints stream client rows to rank 0 in client-id
order and send them to their owners on resume, a block at a time, so a run resumes
bit-exactly on any rank count. :meth:`Policy.transfer` says how many extra floats a client sends and receives,
and :meth:`Policy.finish_steps` how much compute a client short of its full work runs after
training, for the simulated clock.

Records are declared as :class:`Field` s (dtype, unit, one-line description) and land in
``results.h5`` under ``/clients/<name>`` and ``/metrics/<name>`` with those attributes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

# The state and record declarations live below both the algorithms and the engine's transport
# (hpcfl.state); policies import them from here as before.
from ..state import ClientTable, Field, Segment, ServerArray  # noqa: F401


class RowTable:
    """Per-client rows of a policy on the device, zero at start: ``table[slot]`` is one row (P,).

    Slots ``0 .. home - 1`` are the rank's own clients, held in one (home, width) tensor
    (:meth:`tensor`), which is what checkpoints hold; slots from ``home`` on are guest slots for
    clients trained here for one round under balanced placement (their rows are fetched from the
    home rank and sent back, :mod:`hpcfl.engine.placement`), held apart in a (guests, width)
    tensor, so that making room for more guests (:meth:`reserve`) never reallocates or copies
    the rank's own rows: the first round after a start or a resume costs what any other does.
    """

    def __init__(self, home: int, width: int, device, dtype):
        self.home, self.width, self.device, self.dtype = home, width, device, dtype
        self.guests = 0
        self._t = None   # own rows, allocated at first use
        self._g = None   # guest rows

    def tensor(self):
        """The rank's own rows, (home, width)."""
        if self._t is None:
            import torch

            self._t = torch.zeros(self.home, self.width, device=self.device, dtype=self.dtype)
        return self._t

    def _where(self, slot):
        slot = int(slot)
        if slot < self.home:
            return self.tensor(), slot
        if slot - self.home >= self.guests:
            raise IndexError(f"guest slot {slot} beyond the {self.guests} reserved")
        return self._g, slot - self.home

    def __getitem__(self, slot):
        t, i = self._where(slot)
        return t[i]

    def __setitem__(self, slot, value) -> None:
        t, i = self._where(slot)
        t[i] = value

    def reserve(self, n: int) -> None:
        """Room for ``n`` guest rows (their contents are set by ``put`` before use)."""
        if n > self.guests:
            import torch

            self.guests = n
            self._g = torch.zeros(n, self.width, device=self.device, dtype=self.dtype)

    def client_table(self, name: str) -> ClientTable:
        import torch

        def set_home(rows):
            self.tensor().copy_(torch.from_numpy(np.asarray(rows)))

        def split(slots):
            slots = np.asarray(slots, dtype=np.int64)
            own = slots < self.home
            return slots, own

        def rows(slots):
            slots, own = split(slots)
            out = torch.empty(len(slots), self.width, device=self.device, dtype=self.dtype)
            if own.any():
                out[torch.as_tensor(np.flatnonzero(own), device=self.device)] = \
                    self.tensor()[torch.as_tensor(slots[own], device=self.device)]
            if (~own).any():
                out[torch.as_tensor(np.flatnonzero(~own), device=self.device)] = \
                    self._g[torch.as_tensor(slots[~own] - self.home, device=self.device)]
            return out.cpu().numpy()

        def put(slots, values):
            slots, own = split(slots)
            values = torch.from_numpy(np.asarray(values)).to(self.device)
            if len(slots) and own.all() and np.all(np.diff(slots) == 1):
                self.tensor()[int(slots[0]):int(slots[-1]) + 1].copy_(values)   # a run of rows (a resume)
                return
            if own.any():
                self.tensor()[torch.as_tensor(slots[own], device=self.device)] = \
                    values[torch.as_tensor(np.flatnonzero(own), device=self.device)]
            if (~own).any():
                self._g[torch.as_tensor(slots[~own] - self.home, device=self.device)] = \
                    values[torch.as_tensor(np.flatnonzero(~own), device=self.device)]

        return ClientTable(name, self.width, lambda: self.tensor().detach().cpu().numpy(), set_home,
                           self.reserve, rows, put)


@dataclass
class RoundContext:
    """What every policy sees in one round (identical on every rank except ``mine``).

    Attributes
    ----------
    rnd, rounds, seed : int
        Round index (0-based), rounds in the run, the run's seed.
    cohort : (k,) int64
        The round's sampled clients, sorted; a client appears once per draw under ``with_replacement``.
    sizes : (k,) int64
        Training samples of each cohort member; ``all_sizes`` (N,) for every client.
    class_counts : (N, C) int64
        The partition's label counts per client.
    lr : float
        The round's client learning rate.
    mine : (m,) int64
        Positions j in ``cohort`` of the clients this rank handles: the ones it owns (its
        home block) up to the steps decision; under ``runtime.placement = "balanced"`` the
        share of the training dealt to it from then on (only when no policy pins clients to
        their home rank, see ``Algorithm.pinned``).
    owned : (n,) int64
        Ids of every client this rank owns (cohort or not), e.g. for a setup that each
        client computes once.
    slots : (k,) int64
        Each cohort member's row in this rank's client tables (-1 if owned elsewhere).
    collective : Collectives
        Exact reductions and by-client gathers across ranks (no MPI import needed).
    clients : object
        This rank's client data and model for the statistics phase
        (``hpcfl.engine.simulation.LocalClients``).
    draws : (k,) or None
        Draw counts under ``with_replacement_merged``; None otherwise.
    weights : (k,) float64
        Aggregation weights p_i, set by the weights policy (and possibly adjusted later).
    steps : (k,) int64
        Local steps tau_i, set by the steps policy (and by the system model's plan).
    full_steps : (k,) int64
        The steps a client would run without device heterogeneity: what a steps policy
        that truncates clients (``straggler``) sets, else the steps policy's ``steps``.
        A client with ``steps < full_steps`` is incomplete (FedLGA's tau_i > 1).
    plan : hpcfl.system.RoundPlan or None
        The simulated clock's plan for the round.
    log : callable
        ``log(message)`` prints once (rank 0) with the round number.
    """

    rnd: int
    rounds: int
    seed: int
    cohort: np.ndarray
    sizes: np.ndarray
    all_sizes: np.ndarray
    class_counts: np.ndarray
    lr: float
    mine: np.ndarray
    slots: np.ndarray
    collective: object
    owned: np.ndarray = None
    clients: object = None
    draws: np.ndarray | None = None
    weights: np.ndarray | None = None
    steps: np.ndarray | None = None
    full_steps: np.ndarray | None = None
    plan: object = None
    log: Callable[[str], None] = print
    notes: dict = field(default_factory=dict)


class Policy:
    """Base of every policy: each hook is optional and does nothing here.

    Subclasses override only what they take part in (see the module docstring for the
    order). ``client_fields`` and ``round_fields`` declare records; the matching
    ``client_records`` / ``round_records`` return arrays (k,) aligned with the cohort and
    scalars.
    """

    client_fields: dict[str, Field] = {}
    round_fields: dict[str, Field] = {}

    def setup(self, ctx: RoundContext) -> None:
        """Once, on every rank, before the first round of this process (also after a resume)."""

    def statistics(self, ctx: RoundContext) -> None:
        """Before training, on every rank: measure, reduce, and adjust ``ctx`` decisions."""

    def segments(self) -> list[Segment]:
        return []

    def correction(self, slot: int):
        """A gradient correction (num_params,) added at every local step, or None."""
        return None

    def pack(self, ctx: RoundContext, j: int, slot: int, res, weight: float) -> dict[str, np.ndarray]:
        """Values of this policy's segments for the trained client at cohort position ``j``."""
        return {}

    def hold(self, ctx: RoundContext, j: int) -> bool:
        """True: keep the trained client at position ``j`` unpacked until :meth:`release`."""
        return False

    def release(self, ctx: RoundContext, held: list) -> None:
        """Every rank, after its clients trained, before the held ones are packed.

        ``held`` lists this rank's ``(j, slot, res)`` that some policy held. A policy may
        call ``ctx.collective`` here (every rank calls this hook, held clients or not) and
        set ``res.adjusted``, the update the server rule counts in place of ``res.delta``.
        """

    def server_update(self, ctx: RoundContext, seg: dict[str, np.ndarray], scalars: dict[str, float]) -> None:
        """Rank 0, after the model update: update server-side state from the reduced sums."""

    def control(self, ctx: RoundContext, seg: dict[str, np.ndarray], scalars: dict[str, float]):
        """Rank 0, after the server update: a decision for the next round (picklable), or None."""
        return None

    def receive(self, decision) -> None:
        """Every rank: the decision that rank 0's :meth:`control` returned."""

    def client_records(self, ctx: RoundContext) -> dict[str, np.ndarray]:
        return {}

    def round_records(self, ctx: RoundContext) -> dict[str, float]:
        return {}

    def state(self) -> list:
        """:class:`ClientTable` and :class:`ServerArray` items this policy keeps."""
        return []

    def transfer(self) -> tuple[int, int]:
        """Extra floats a client uploads and downloads per round (beyond the model)."""
        return 0, 0

    def finish_steps(self, ctx: RoundContext) -> np.ndarray | None:
        """Steps' worth of compute (k,) that a client which stops short of ``full_steps`` runs after
        training, before it uploads (FedLGA's full_grad: one pass over its data); None: nothing.
        The simulated clock charges it and, under a deadline, has such a client stop early enough."""
        return None


class ServerRule(Policy):
    """Base of every server rule (the ``server`` slot): one method for each of its duties.

    - :meth:`contribute_into`: a trained client's update becomes its contribution to the
      round's sum, in place (FedAvg: times p_i; FedNova: times p_i / ||a_i||_1);
    - :meth:`aggregate`: the cohort sums become the aggregate update (a model delta);
    - :meth:`tau_eff`: the round's effective local steps, recorded for every rule.

    ``tensors``: whether :meth:`aggregate` takes the delta sum as a device tensor. Only an
    element-wise rule that reads no segment may set it (its update then runs on the device);
    a rule that reads ``seg`` keeps False and gets host arrays.
    """

    tensors = False

    def contribute_into(self, out, weight: float, anorm: float):
        """``out`` (L,) float64, a host array or a device tensor, holds the client's update
        (``res.adjusted`` where a policy set one); make it the contribution in place and return it."""
        out *= weight
        return out

    def aggregate(self, delta_sum, s: dict, seg: dict | None = None):
        """The aggregate update (L,) from the cohort's delta sum, the scalar sums ``s`` and every
        reduced segment ``seg`` by name; ``delta_sum`` must not be changed."""
        raise NotImplementedError

    def tau_eff(self, s: dict) -> float:
        """The implicit tau_eff = sum p ||a||_1 / sum p (Wang et al. 2020, eqs. 5-6), for diagnostics."""
        return s["weight_anorm"] / s["weight"]


SERVER_DUTIES = ("contribute_into", "aggregate", "tau_eff")
# Names a rule could be written with that the engine never calls (the extension guide once said
# `contribution`): a rule defining one is refused instead of silently ignored.
NOT_HOOKS = {"contribution": "contribute_into", "contribute": "contribute_into"}


def check_policy(policy, slot: str) -> None:
    """Refuse ``policy`` for ``slot`` ("local", "steps", "weights", "server" or "add-on") if the
    engine would ignore a method it defines; called where policies are registered
    (:class:`hpcfl.algorithms.Algorithm`: its four slots, and :meth:`~hpcfl.algorithms.Algorithm.add`).

    Raises
    ------
    TypeError
        Naming the class, the method, and the one the engine calls.
    """
    cls, name = type(policy), type(policy).__name__
    if not isinstance(policy, Policy):
        raise TypeError(f"{name} ({slot}) does not derive from hpcfl.algorithms.protocol.Policy: the engine calls "
                        f"only the hooks that class declares")
    for wrong, right in NOT_HOOKS.items():
        if hasattr(cls, wrong):
            raise TypeError(f"{name} defines {wrong}(), which the engine never calls: a server rule turns a client's "
                            f"update into its contribution in {right}(out, weight, anorm), in place "
                            f"(hpcfl.algorithms.protocol.ServerRule)")
    if slot == "server":
        if not isinstance(policy, ServerRule):
            raise TypeError(f"{name} is a server rule but does not derive from hpcfl.algorithms.protocol.ServerRule "
                            f"(contribute_into, aggregate, tau_eff)")
        if cls.aggregate is ServerRule.aggregate:
            raise TypeError(f"{name} is a server rule but does not define aggregate(delta_sum, s, seg)")
        return
    misplaced = [d for d in SERVER_DUTIES if hasattr(cls, d)]
    if misplaced:
        raise TypeError(f"{name} ({slot}) defines {', '.join(f'{d}()' for d in misplaced)}, which the engine calls "
                        f"only on the server rule; move it into the job's server rule (algorithm.server)")

