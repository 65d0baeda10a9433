"""AFL's fixed local period: the baseline GIFT compares with (``steps = "afl"``).

Wang, Tuor, Salonidis, Leung, Makaya, He, Chan, "Adaptive Federated Learning in Resource
Constrained Edge Computing Systems", IEEE JSAC 2019. As GIFT's evaluation uses it, a
trial run estimates the loss's smoothness and divergence and yields ONE tau, kept for the
rest of the run (docs/algorithms/gift.md, "Baselines").

Trial rounds (the first ``trial_rounds``, at tau0 = ``algorithm.local_steps``): on a
sample of ``stat_batch`` training samples per client (keyed by seed, round, client),

- statistics phase, at the round-start model w: F_i(w) and grad F_i(w); one exact
  reduction gives grad F(w) = sum D_i grad F_i(w) / D (D_i: the client's samples), and a
  gather gives delta_r = sum D_i ||grad F_i(w) - grad F(w)|| / D on every rank;
- after local training to w_i: beta_i = ||grad F_i(w_i) - grad F_i(w)|| / ||w_i - w|| and
  rho_i = |F_i(w_i) - F_i(w)| / ||w_i - w||, reduced as D-weighted means (segment ``afl``).

beta, rho and delta are the means over the trial rounds. At the end of the last trial
round rank 0 sets tau* = argmin_tau G(tau) (:func:`hpcfl.algorithms.afl_bound.afl_tau`)
with eta the client lr, c the seconds per local iteration and b the seconds of
communication per round (from the simulated clock's trial rounds, else ``compute_s`` and
``comm_s``; with both unset, c = 1 and b = tau0: time counted in local iterations, a round at
tau0 half computing and half communicating), and the budget R = ``budget_s`` (default: the
whole run at tau0, rounds x (c tau0 + b)). Losses are the model's training loss without weight decay,
measured in eval mode (dropout off, batch norm on running statistics).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..client.stats import stats_sample
from ..errors import ConfigError
from .afl_bound import afl_tau
from .gift import TAU_FIELDS, TauSteps
from .options import AflOptions  # noqa: F401  (its home is torch-free; re-exported here)
from .protocol import Field, Segment


class AflSteps(TauSteps):
    """``steps = "afl"``: see the module docstring."""

    round_fields = {**TAU_FIELDS,
                    "afl_beta": Field(np.float64, "1/s^0", "trial round's D-weighted mean beta_i (NaN after the trial)"),
                    "afl_rho": Field(np.float64, "loss", "trial round's D-weighted mean rho_i (NaN after the trial)"),
                    "afl_delta": Field(np.float64, "grad", "trial round's gradient divergence delta (NaN after)")}

    def __init__(self, opts: AflOptions, tau0: int, num_params: int, rounds: int, clock: bool):
        super().__init__(tau0, "afl")
        self.c, self.b = opts.compute_s, opts.comm_s     # used when the clock is off
        self.notes = []
        if not clock and opts.compute_s == 0 and opts.comm_s == 0:
            # Time in local iterations, a round's communication as long as tau0 of them: a round at
            # tau0 is half computing, half communicating. Only b / c matters to tau*: R scales with both.
            self.c, self.b = 1.0, float(tau0)
            self.notes.append(f"afl: [system] is off and algorithm.afl.compute_s, comm_s are unset, so time is "
                              f"counted in local iterations: c = 1 per iteration, b = tau0 = {tau0} per round's "
                              f"communication (set both, or enable [system], for your own)")
        elif not clock and (opts.compute_s == 0 or opts.comm_s == 0) and rounds > opts.trial_rounds:
            raise ConfigError("algorithm.steps = 'afl' needs both the seconds per local iteration c and per round "
                              "of communication b: set algorithm.afl.compute_s and algorithm.afl.comm_s (or "
                              "neither: time then counts local iterations), or turn on [system] (enabled = true)")
        self.opts, self.P, self.tau0, self.rounds, self.clock = opts, int(num_params), int(tau0), int(rounds), clock
        # sums over the trial rounds: beta, rho, delta, c, b, trial rounds seen
        self.acc = np.zeros(6)
        self.own: dict[int, tuple] = {}       # cohort position -> (sample, F_i(w), grad F_i(w))
        self.delta_r = self.beta_r = self.rho_r = float("nan")

    def _trial(self, ctx) -> bool:
        return ctx.rnd < self.opts.trial_rounds

    def segments(self) -> list[Segment]:
        return [Segment("afl", 3)]

    def _loss_grad(self, c, x, y) -> tuple[float, torch.Tensor]:
        c.model.module.eval()
        loss = c.loss_fn(c.model.module(x), y)
        return float(loss.detach()), c.model.grad(loss)[: self.P].double()

    def statistics(self, ctx) -> None:
        self.own, self.delta_r = {}, float("nan")
        if not self._trial(ctx):
            return
        c, k = ctx.clients, len(ctx.cohort)
        c.load_x0()
        rows = []
        for j in ctx.mine:
            j = int(j)
            pos = stats_sample(int(ctx.sizes[j]), self.opts.stat_batch, c.generator(j))
            x, y = c.data(j, pos)
            f, g = self._loss_grad(c, x, y)
            self.own[j] = (x, y, f, g)
            rows.append(np.append(float(ctx.sizes[j]) * g.cpu().numpy(), float(ctx.sizes[j])))
        tot = ctx.collective.sum("afl_grad", rows, self.P + 1, k)
        grad_f = torch.from_numpy(tot[: self.P] / tot[self.P]).to(c.x0.device)
        mine = [[float(torch.linalg.vector_norm(self.own[int(j)][3] - grad_f))] for j in ctx.mine]
        dist = ctx.collective.gather("afl_divergence", ctx.mine, np.array(mine).reshape(-1, 1), k)[:, 0]
        sizes = np.asarray(ctx.sizes, dtype=np.float64)
        self.delta_r = float((sizes * dist).sum() / sizes.sum())

    def pack(self, ctx, j, slot, res, weight) -> dict:
        if j not in self.own:
            return {}
        x, y, f0, g0 = self.own[j]
        c = ctx.clients
        step = res.delta.detach()
        dist = float(torch.linalg.vector_norm(step[: self.P], dtype=torch.float64))
        if dist == 0:
            return {}
        c.model.load(c.x0 + step)
        f1, g1 = self._loss_grad(c, x, y)
        d = float(ctx.sizes[j])
        beta = float(torch.linalg.vector_norm(g1 - g0)) / dist
        return {"afl": np.array([d * beta, d * abs(f1 - f0) / dist, d])}

    def decide(self, ctx, seg, sc) -> tuple[int, str]:
        self.beta_r = self.rho_r = float("nan")
        if not self._trial(ctx):
            return self.tau, ""
        b, r, d = seg["afl"]
        if d > 0:
            self.beta_r, self.rho_r = b / d, r / d
            plan = ctx.plan
            if plan is not None:     # c and b of the trial rounds as the simulated clock sees them
                part = ~plan.dropped
                step_s = float(plan.step_s[part].mean()) if part.any() else 0.0
                comm = float((plan.download_s + plan.upload_s + plan.delay_s)[part].mean()) if part.any() else 0.0
            else:
                step_s, comm = self.c, self.b
            self.acc += [self.beta_r, self.rho_r, self.delta_r, step_s, comm, 1.0]
        if ctx.rnd != self.opts.trial_rounds - 1 or self.acc[5] == 0:
            return self.tau, ""
        beta, rho, delta, step_s, comm = self.acc[:5] / self.acc[5]
        budget = self.opts.budget_s or self.rounds * (step_s * self.tau0 + comm)
        tau = afl_tau(ctx.lr, beta, rho, delta, self.opts.phi, step_s, comm, budget, int(self.opts.tau_max))
        return int(tau), "afl"

    def round_records(self, ctx) -> dict:
        return {**super().round_records(ctx), "afl_beta": self.beta_r, "afl_rho": self.rho_r,
                "afl_delta": self.delta_r if math.isfinite(self.beta_r) else float("nan")}

    def _scalars(self) -> np.ndarray:
        return self.acc.copy()

    def _load(self, v) -> None:
        self.acc = np.array(v, dtype=np.float64)
