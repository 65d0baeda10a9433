"""Device heterogeneity as a steps policy: some clients finish only part of their local work.

FedLGA's setting (Li et al., arXiv 2112.11989, Sec. II-B and V-A; docs/algorithms/fedlga.md):
every client is asked for E local epochs (or E steps), but a fraction rho of the round's
clients are slow. A slow client draws tau_i uniformly from ``tau_min .. tau_max`` and runs
E_i = E - tau_i + 1 epochs; a complete client has tau_i = 1. Because this is a property
of the system, not of the algorithm, it is a steps policy that any algorithm can use:
FedAvg, FedProx, FedNova, SCAFFOLD, FedDyn and FedLGA then see the same (cohort, tau)
draws for the same seed.

Assignment (``[algorithm.straggler] assignment``):

- ``per_round`` (default): exactly round(rho K) of the K cohort positions are slow, drawn
  without replacement from (seed, round), each with a fresh tau_i.
- ``fixed``: a persistent set of round(rho N) slow clients drawn once from the seed, each
  with a fixed tau_i; the number of slow clients in a round then varies.

``ctx.full_steps`` gets the full-E steps, so a server rule can tell complete clients
(steps == full_steps) from truncated ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import rng
from ..errors import ConfigError
from .policies import epoch_steps
from .protocol import Field, Policy


def half_up(x: float) -> int:
    """round(x) with halves rounded up (round(0.5 * 5) = 3), unlike Python's banker's rounding."""
    return int(np.floor(x + 0.5))


@dataclass(frozen=True)
class StragglerOptions:
    """Slow clients and how much of their local work they finish."""

    rho: float = field(default=0.5, metadata={
        "ge": 0, "le": 1, "help": "fraction of slow clients: round(rho K) per round (per_round) or round(rho N) "
                                  "(fixed)"})
    tau_max: int = field(default=4, metadata={
        "ge": 1, "help": "largest tau_i of a slow client; it runs E - tau_i + 1 epochs (FedLGA: E - 1)"})
    tau_min: int = field(default=1, metadata={
        "ge": 1, "help": "smallest tau_i of a slow client; 1 (the paper's U{1..tau_max}) lets a slow client finish, "
                         "2 guarantees E_i < E"})
    unit: str = field(default="epoch", metadata={
        "choices": ("epoch", "step"),
        "help": "epoch: E = algorithm.local_epochs passes of ceil(n_i / B) steps; step: E = algorithm.local_steps "
                "single steps (the paper's theory)"})
    assignment: str = field(default="per_round", metadata={
        "choices": ("per_round", "fixed"),
        "help": "per_round: exactly round(rho K) slow cohort positions each round; fixed: round(rho N) clients slow "
                "for the whole run"})

    def validate(self):
        return [] if self.tau_min <= self.tau_max else [f"tau_min = {self.tau_min} exceeds tau_max = {self.tau_max}"]


class StragglerSteps(Policy):
    """tau_i draws and the steps E_i = E - tau_i + 1 they leave (see the module docstring).

    Parameters
    ----------
    opts : StragglerOptions
    epochs : int
        E in the chosen unit (``local_epochs`` for "epoch", ``local_steps`` for "step").
    batch_size : int
    seed : int
    num_clients : int
    rounding : str
        Epoch rounding of :func:`hpcfl.algorithms.policies.epoch_steps`.
    """

    client_fields = {
        "het_tau": Field(np.int64, "1", "heterogeneity index tau_i = E - E_i + 1 (1: the client ran all its local "
                                        "work)"),
    }
    round_fields = {
        "slow_clients": Field(np.int64, "clients", "cohort members with tau_i > 1 this round"),
    }

    def __init__(self, opts: StragglerOptions, epochs: int, batch_size: int, seed: int, num_clients: int,
                 rounding: str = "ceil"):
        if opts.unit == "step" and epochs < 1:
            raise ConfigError("algorithm.straggler.unit = 'step' needs algorithm.local_steps > 0 (E in steps)")
        if opts.tau_max > epochs:
            key = "local_epochs" if opts.unit == "epoch" else "local_steps"
            raise ConfigError(f"algorithm.straggler.tau_max = {opts.tau_max} exceeds E = algorithm.{key} = {epochs}: "
                              f"a client must run at least one {opts.unit}; set tau_max <= {epochs}")
        self.opts, self.E, self.batch_size, self.seed = opts, int(epochs), batch_size, seed
        self.num_clients, self.rounding = num_clients, rounding
        self._tau = None
        if opts.assignment == "fixed":
            self._fixed = self._fixed_taus()

    def _fixed_taus(self) -> np.ndarray:
        """(N,) tau_i of every client for the whole run (1 for clients that are not slow)."""
        o = self.opts
        gen = rng.numpy_rng(self.seed, rng.STRAGGLER, -1)
        slow = gen.choice(self.num_clients, size=half_up(o.rho * self.num_clients), replace=False)
        tau = np.ones(self.num_clients, dtype=np.int64)
        tau[np.sort(slow)] = gen.integers(o.tau_min, o.tau_max + 1, size=slow.size)
        return tau

    def taus(self, rnd: int, cohort: np.ndarray) -> np.ndarray:
        """(k,) tau_i of the cohort in round ``rnd`` (keyed by (seed, round), never by rank)."""
        o = self.opts
        if o.assignment == "fixed":
            return self._fixed[cohort]
        k = len(cohort)
        gen = rng.numpy_rng(self.seed, rng.STRAGGLER, rnd)
        slow = gen.choice(k, size=half_up(o.rho * k), replace=False)
        tau = np.ones(k, dtype=np.int64)
        tau[slow] = gen.integers(o.tau_min, o.tau_max + 1, size=slow.size)
        return tau

    def _work(self, units: np.ndarray, sizes: np.ndarray) -> np.ndarray:
        if self.opts.unit == "step":
            return np.asarray(units, dtype=np.int64)
        return epoch_steps(units, sizes, self.batch_size, self.rounding)

    def steps(self, ctx) -> np.ndarray:
        self._tau = self.taus(ctx.rnd, ctx.cohort)
        ctx.full_steps = self._work(np.full(len(ctx.cohort), self.E), ctx.sizes)
        return self._work(self.E - self._tau + 1, ctx.sizes)

    def client_records(self, ctx) -> dict:
        return {"het_tau": self._tau}

    def round_records(self, ctx) -> dict:
        return {"slow_clients": int(np.count_nonzero(self._tau > 1))}
