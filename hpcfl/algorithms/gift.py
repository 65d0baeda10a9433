"""Steps policies that change the local period tau between rounds: GIFT and AdaComm.

GIFT ("GIFT: Toward Accurate and Efficient Federated Learning With Gradient-Instructed
Frequency Tuning", Chen et al. 2023) and AdaComm (Wang & Joshi, "Adaptive communication
strategies to achieve the best error-runtime trade-off in local-update SGD", 2019) give
every client of round r + 1 the same tau, decided on rank 0 at the end of round r from
what the round reduced. docs/algorithms/gift.md has the formulas and our readings.

How they sit on the round protocol (hpcfl.algorithms.protocol):

- ``steps(ctx)``: tau for every cohort member (the simulated clock may still cut a
  client, or drop the late ones with ``system.earliest_fraction``);
- ``pack``: GIFT adds ONE segment, ``gift_abs`` = w_i |u_i| over the trainable parameters
  (P values), to the training reduction. The update sum S = sum w_i u_i is the ``delta``
  segment itself under the plain average rule; under other rules (FedNova's normalised
  updates, FedLGA's adjusted ones) GIFT packs its own ``gift_sum`` as well. The pools are
  simulator bookkeeping: a real server sees the uploads, so nothing is charged to the
  simulated clock (``transfer`` is 0);
- ``control`` (rank 0): the controller of :mod:`hpcfl.algorithms.tau_control` turns the
  sums into the next tau; ``receive`` sets it on every rank;
- state: the controller's scalars (broadcast every round, so a resumed run on any rank
  count continues bitwise) and the EMA pools P~, N~ (rank 0, 2P floats).

Weights: S and A are the aggregation-weighted sums rescaled to the reporters' count,
(n / sum w) sum w_i u_i, which is the paper's plain sum sum_i u_i under uniform weights
(the ``gift`` preset) and a weighted version of it under size weights.
``pool_normalize = "mean"`` divides by n, i.e. pools the weighted mean update.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError
from . import tau_control as tc
from .protocol import Field, Policy, Segment, ServerArray

# /metrics/tau_event codes (the controller_events table spells them out)
EVENTS = {0: "", 1: "stagnation", 2: "relax", 3: "literal", 4: "adacomm", 5: "saturation", 6: "afl"}
EVENT_CODE = {name: code for code, name in EVENTS.items() if name}

TAU_FIELDS = {
    "tau_used": Field(np.int64, "steps", "local period tau every client was asked to run this round"),
    "tau_next": Field(np.int64, "steps", "tau decided at the end of this round, used in the next one"),
    "tau_event": Field(np.int8, "1", "controller event of this round: 0 none, 1 stagnation, 2 relax, 3 literal, "
                                     "4 adacomm, 5 saturation, 6 afl (see /controller_events)"),
    "local_iters_cum": Field(np.int64, "steps", "sum of tau_used over the rounds so far (local iterations per client)"),
}


class TauSteps(Policy):
    """Base of the adaptive-tau steps policies: one tau for the whole cohort, set by rank 0.

    Subclasses provide ``decide(ctx, seg, scalars) -> (tau_next, event name or "")`` on
    rank 0 and the controller state as a flat float64 vector (``_scalars`` / ``_load``).
    """

    round_fields = TAU_FIELDS

    def __init__(self, tau0: int, what: str):
        if tau0 <= 0:
            raise ConfigError(f"algorithm.steps = {what!r} starts from tau0 = algorithm.local_steps; set "
                              f"algorithm.local_steps > 0 (e.g. --set algorithm.local_steps=100)")
        self.tau, self.iters = int(tau0), 0
        self.last = (int(tau0), int(tau0), "")   # rank 0: (tau_used, tau_next, event) of the latest round

    def steps(self, ctx) -> np.ndarray:
        return np.full(len(ctx.cohort), self.tau, dtype=np.int64)

    def control(self, ctx, seg, scalars):
        used = self.tau
        nxt, event = self.decide(ctx, seg, scalars)
        self.last = (used, int(nxt), event)
        return int(nxt)

    def receive(self, decision) -> None:
        self.iters += self.tau         # the round that just ended ran tau local iterations per client
        self.tau = int(decision)

    def round_records(self, ctx) -> dict:
        used, nxt, event = self.last
        return {"tau_used": used, "tau_next": nxt, "tau_event": EVENT_CODE.get(event, 0),
                "local_iters_cum": self.iters}

    def state(self) -> list:
        def get():
            return np.concatenate([[self.tau, self.iters], self._scalars()]).astype(np.float64)

        def put(v):
            self.tau, self.iters = int(v[0]), int(v[1])
            self._load(np.asarray(v[2:], dtype=np.float64))

        return [ServerArray("tau_control", get, put, broadcast=True)]

    # subclasses
    def decide(self, ctx, seg, scalars) -> tuple[int, str]:
        raise NotImplementedError

    def _scalars(self) -> np.ndarray:
        return np.zeros(0)

    def _load(self, v: np.ndarray) -> None:
        pass


@dataclass(frozen=True)
class GiftOptions:
    """``[algorithm.gift]``: GIFT's controller (docs/algorithms/gift.md)."""

    mode: str = field(default="stagnation", metadata={
        "choices": ("stagnation", "literal", "fixed"),
        "help": "stagnation (hpcfl's own rule, not the paper's): divide tau by gamma once C stops falling "
                "(patience rounds without a new minimum eps_rel below the running one); "
                "literal: Algorithm 1 as printed (C_r >= C_r-1 divides tau; with relax, line 14 at any time, no cap; "
                "pools never reset); "
                "fixed: record C, never change tau (the FedAvg baseline)"})
    theta: float = field(default=0.9, metadata={"ge": 0, "help": "EMA decay of the pools P~, N~ (< 1)"})
    gamma: float = field(default=2.0, metadata={"help": "tau becomes ceil(tau / gamma) (> 1)"})
    reduce: str = field(default="coord_mean", metadata={
        "choices": ("coord_mean", "l1"),
        "help": "C as the mean over coordinates of |P~+N~| / (P~-N~), or ||P~+N~||_1 / ||P~-N~||_1"})
    pool_normalize: str = field(default="sum", metadata={
        "choices": ("sum", "mean"),
        "help": "pool the round's summed updates (the paper), or their mean (when the reporter count varies)"})
    patience: int = field(default=10, metadata={"ge": 1, "help": "rounds without a new minimum of C = stagnation"})
    warmup: int = field(default=10, metadata={"ge": 0, "help": "rounds after the start and after each change "
                                                                 "before a decrease may fire"})
    eps_rel: float = field(default=0.1, metadata={
        "ge": 0, "help": "a new minimum of C must be this fraction of the running minimum lower (or eps_abs, "
                         "whichever is larger): C's improvement relative to its own scale"})
    eps_abs: float = field(default=1e-3, metadata={
        "ge": 0, "help": "... or at least this much lower: the floor that decides once C is near 0"})
    peak_guard: bool = field(default=True, metadata={
        "help": "track minima only once C has started to fall after a change (ignores the burst after a halving)"})
    scale_patience: bool = field(default=False, metadata={"help": "multiply patience by gamma after each decrease"})
    reset_ema: bool = field(default=True, metadata={"help": "zero the pools whenever tau changes (stagnation mode)"})
    tau_min: int = field(default=1, metadata={"ge": 1, "help": "tau never goes below this"})
    relax: bool = field(default=False, metadata={
        "help": "frequency relaxation: tau += delta after o rounds of strictly falling C (off in the paper's runs)"})
    delta: int = field(default=5, metadata={"ge": 1, "help": "relaxation step added to tau"})
    o: int = field(default=10, metadata={"ge": 1, "help": "relaxation window: rounds of strictly falling C"})
    phase: str = field(default="initial", metadata={
        "choices": ("initial", "always"),
        "help": "stagnation mode: relax only before the first decrease (initial) or always (literal: always)"})
    tau_max: int = field(default=0, metadata={
        "ge": 0, "help": "stagnation mode: cap on a relaxed tau; 0: 10 x tau0 (literal: no cap)"})

    def validate(self) -> list[str]:
        p = []
        if not self.theta < 1:
            p.append(f"algorithm.gift.theta = {self.theta} must be below 1 (0.9 in the paper)")
        if not self.gamma > 1:
            p.append(f"algorithm.gift.gamma = {self.gamma} must exceed 1 (2 in the paper)")
        return p


class GiftSteps(TauSteps):
    """``steps = "gift"``: see the module docstring."""

    round_fields = {**TAU_FIELDS, "gift_C": Field(np.float64, "1", "gradient consistency C of the round, from the "
                                                                    "EMA pools (NaN if nobody reported)")}

    def __init__(self, opts: GiftOptions, tau0: int, num_params: int, own_sum: bool):
        super().__init__(tau0, "gift")
        self.opts, self.P, self.own_sum = opts, int(num_params), bool(own_sum)
        try:
            self.ctl = tc.GiftController(
                tau0, mode=opts.mode, theta=opts.theta, gamma=opts.gamma, reduce=opts.reduce,
                patience=opts.patience, warmup=opts.warmup, eps_abs=opts.eps_abs, eps_rel=opts.eps_rel,
                peak_guard=opts.peak_guard, scale_patience=opts.scale_patience, reset_ema_on_tau_change=opts.reset_ema,
                tau_min=opts.tau_min, relaxation=opts.relax, delta=opts.delta, o=opts.o, phase=opts.phase,
                tau_max=opts.tau_max or None, size=self.P)
        except ValueError as e:   # e.g. tau_max below tau0: say which table to fix
            raise ConfigError(f"[algorithm.gift] with tau0 = algorithm.local_steps = {tau0}: {e}") from e
        self.C = float("nan")

    def segments(self) -> list[Segment]:
        own = [Segment("gift_sum", self.P)] if self.own_sum else []
        return own + [Segment("gift_abs", self.P)]

    def pack(self, ctx, j, slot, res, weight) -> dict:
        u = res.delta[: self.P].double()        # the real update (buffers are averaged but not pooled)
        out = {"gift_abs": u.abs().mul_(weight)}
        if self.own_sum:
            out["gift_sum"] = u * weight        # not in place: for a float64 model, u is delta itself
        return out

    def decide(self, ctx, seg, sc) -> tuple[int, str]:
        if sc["weight"] == 0:   # nobody reported: no pools to update, tau stays (patience counts reporting rounds)
            self.C = float("nan")
            return self.tau, ""
        S = seg["gift_sum"] if self.own_sum else seg["delta"][: self.P]
        scale = (sc["count"] if self.opts.pool_normalize == "sum" else 1.0) / sc["weight"]
        d = self.ctl.step(S * scale, seg["gift_abs"] * scale)
        self.C = float(d.C)
        return int(d.tau_next), d.reason or ""

    def round_records(self, ctx) -> dict:
        return {**super().round_records(ctx), "gift_C": self.C}

    def _scalars(self) -> np.ndarray:
        return self.ctl.scalars()

    def _load(self, v) -> None:
        self.ctl.load_scalars(v)

    def state(self) -> list:
        return super().state() + [ServerArray("gift_pools", self.ctl.pools, self.ctl.load_pools)]


@dataclass(frozen=True)
class AdaCommOptions:
    """``[algorithm.adacomm]``: AdaComm's schedule (docs/algorithms/gift.md, "Baselines")."""

    interval_s: float = field(default=0.0, metadata={
        "ge": 0, "help": "interval T0 in simulated seconds; 0: the first round's duration x interval_rounds "
                         "(10 rounds at tau0)"})
    interval_rounds: int = field(default=10, metadata={
        "ge": 1, "help": "interval in rounds when the simulated clock is off (and T0's default multiple)"})
    saturation_fix: bool = field(default=True, metadata={
        "help": "halve tau when the training loss did not fall over the last interval (the GIFT paper's variant)"})
    tau_max: int = field(default=0, metadata={"ge": 0, "help": "largest tau; 0: tau0"})


class AdaCommSteps(TauSteps):
    """``steps = "adacomm"``: tau_l = ceil(sqrt(F_l / F_0) tau0) at each interval start."""

    def __init__(self, opts: AdaCommOptions, tau0: int, clock: bool):
        super().__init__(tau0, "adacomm")
        try:
            self.ctl = tc.AdaCommController(tau0, interval_s=opts.interval_s or None,
                                            interval_rounds=opts.interval_rounds, saturation_fix=opts.saturation_fix,
                                            tau_max=opts.tau_max or None, clock=clock)
        except ValueError as e:   # e.g. interval_s without [system] enabled
            raise ConfigError(f"[algorithm.adacomm] with tau0 = algorithm.local_steps = {tau0}: {e}") from e

    def decide(self, ctx, seg, sc) -> tuple[int, str]:
        loss = sc["weight_loss"] / sc["weight"] if sc["weight"] else math.nan
        duration = ctx.plan.duration_s if ctx.plan is not None else None
        d = self.ctl.step(loss, duration)
        return int(d.tau_next), d.reason or ""

    def _scalars(self) -> np.ndarray:
        return self.ctl.scalars()

    def _load(self, v) -> None:
        self.ctl.load_scalars(v)


def events_table(rounds, used, nxt, events) -> np.ndarray:
    """The ``/controller_events`` rows: (round, old_tau, new_tau, reason) where tau changed.

    Parameters
    ----------
    rounds, used, nxt, events : (R,) arrays
        ``/metrics/round``, ``tau_used``, ``tau_next`` and ``tau_event``.
    """
    dtype = np.dtype([("round", np.int64), ("old_tau", np.int64), ("new_tau", np.int64), ("reason", "S10")])
    rows = [(int(r), int(a), int(b), EVENTS.get(int(e), "").encode())
            for r, a, b, e in zip(rounds, used, nxt, events) if int(a) != int(b)]
    return np.array(rows, dtype=dtype)
