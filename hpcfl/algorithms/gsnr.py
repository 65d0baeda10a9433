"""FedGSNR: local steps allocated by each client's gradient signal-to-noise ratio.

Reference: "Accelerating federated learning on non-iid data via maximum gradient
signal-to-noise ratio" (FedGSNR), Theorem 3.7 (optimal local steps), Definition 4.1
(GSNR), eqs. 8-9 (global statistics), and the budget-normalised allocation of its
experiments (section 5). ``steps = "gsnr"`` with ``[algorithm.gsnr]`` options.

The statistics phase, at the round-start model, on every rank for its cohort clients:

1. ``stat_batch`` samples of the client's data (keyed by seed, round, client), their
   per-sample gradients (``torch.func``), mean mu_k and biased per-coordinate variance v_k
   (an estimate of the per-sample gradient noise, whatever its sample count);
2. ONE exact reduction of ``[sum p mu | sum p (v + mu^2) | sum p]`` (length 2P + 1; p
   the round's aggregation weights) gives mu_g and v_g on every rank (eqs. 8-9, diagonal);
3. each rank finishes its own clients' M_k, N_k, n_opt,k and GSNR r_k, and one gather of
   these four scalars per client gives every rank the same values. B in these formulas is
   the SGD mini-batch ``algorithm.batch_size``: Theorem 3.7 models a local step as the mean
   of B per-sample gradients, noise Sigma / B (the statistics batch only estimates Sigma);
4. every rank allocates the same steps: E_k = N E_const n_opt,k / sum n_opt
   (largest-remainder rounding, E_min/E_max), or m n_opt,k ("scale"), or E_const
   ("observe": measure GSNR, train like the base algorithm). Clients with E_k = 0 do not
   train and are not aggregated, so the weights renormalise over the others (except
   with ``sampling = "unbiased"``, where the server never renormalises). A client whose
   aggregation weight is 0 (FedDisco can give that) gets n_opt = 0: steps spent on it
   would be averaged in with weight 0. If every n_opt is 0, every client runs E_const.

E_const is ``algorithm.local_steps``. Combines with FedAvg, FedProx, SCAFFOLD (the
statistics follow the corrected direction g + c - c_i when ``grad_source = "effective"``)
and FedDisco weights. Statistics run with the model in eval mode (dropout off, batch
norm on running statistics), where per-sample gradients are well defined. A rank's
clients share vectorised calls of up to ``chunk`` samples (0: about 4M gradient values per
call); with ``chunk = 1`` no two clients ever share a call. Models made only of linear
layers under cross-entropy take an exact shortcut with no per-sample gradients
(``hpcfl.client.stats.linear_moments``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from ..errors import ConfigError
from .gsnr_math import allocate_steps, allocation_entropy, global_moments, optimal_steps, scaled_steps
from .protocol import Field, Policy


@dataclass(frozen=True)
class GsnrOptions:
    """``[algorithm.gsnr]``: see the module docstring."""

    stat_batch: int = field(default=64, metadata={
        "gt": 0, "help": "samples per client for the per-sample gradient statistics (the estimator); the "
                         "formulas' B is algorithm.batch_size"})
    step_mode: str = field(default="budget", metadata={
        "choices": ("budget", "scale", "observe"),
        "help": "budget: E_k = N E_const n_opt,k / sum n_opt; scale: E_k = round(m n_opt,k); observe: measure only, "
                "every client runs E_const"})
    m: float = field(default=1.0, metadata={
        "gt": 0, "help": "multiplier for step_mode = 'scale': E_k = round(m n_opt,k)"})
    min_steps: int = field(default=1, metadata={"ge": 0, "help": "E_min: fewest steps of a client with n_opt > 0"})
    max_steps: int = field(default=0, metadata={
        "ge": 0, "help": "E_max: most steps of one client; 0: no cap beyond the budget"})
    exclude_zero: bool = field(default=True, metadata={
        "help": "a client with n_opt = 0 sits out the round; false: it runs min_steps"})
    grad_source: str = field(default="effective", metadata={
        "choices": ("effective", "raw"),
        "help": "effective: statistics of the corrected direction g + c - c_i (SCAFFOLD); raw: of g"})
    r_max: float = field(default=1.0e6, metadata={
        "gt": 0, "help": "cap on a client's GSNR r_k (reached when its statistics align with the global ones)"})
    chunk: int = field(default=0, metadata={
        "ge": 0, "help": "samples per vectorised per-sample-gradient call; 0: auto (about 4M gradient values)"})

    def validate(self) -> list[str]:
        if self.max_steps and self.min_steps > self.max_steps:
            return [f"min_steps = {self.min_steps} exceeds max_steps = {self.max_steps} (0 means no cap)"]
        return []


class GsnrSteps(Policy):
    """``steps = "gsnr"`` (see the module docstring)."""

    client_fields = {
        "gsnr": Field(np.float64, "1", "GSNR r_k = max(0, cot theta_k) at the round-start model", summary="median"),
        "gsnr_nopt": Field(np.float64, "1", "optimal local-step multiplier n_opt,k (Theorem 3.7)"),
        "gsnr_M": Field(np.float64, "grad^2", "<a_k, a_g>, the client's alignment with the global statistics"),
        "gsnr_N": Field(np.float64, "grad^2", "||a_k||^2 of the client's statistics"),
    }
    round_fields = {
        "gsnr_L": Field(np.float64, "grad^2", "||a_g||^2 of the global statistics"),
        "gsnr_entropy": Field(np.float64, "nats", "entropy of the step allocation q = n_opt / sum n_opt"),
        "gsnr_entropy_norm": Field(np.float64, "1", "allocation entropy divided by ln(cohort size)"),
        "gsnr_sum_steps": Field(np.int64, "steps", "sum of the local steps run (E_k after any [system] cut)"),
    }

    def __init__(self, opts: GsnrOptions, e_const: int, num_params: int, batch_size: int):
        if e_const <= 0:
            raise ConfigError("algorithm.steps = 'gsnr' shares a budget of algorithm.local_steps steps per client; "
                              "set algorithm.local_steps > 0, the paper's E_const (e.g. --set algorithm.local_steps=20)")
        self.opts, self.e_const, self.num_params = opts, e_const, num_params
        self.batch = int(batch_size)   # Theorem 3.7's B: the SGD mini-batch, not stat_batch
        self.values: np.ndarray | None = None   # (k, 4) [n_opt, gsnr, M, N] of the round's cohort
        self.L = float("nan")

    def _moments(self, ctx) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """(mu, v) float64 (P,) of each own client's per-sample gradients of the local objective at x0."""
        # torch's per-sample gradients, imported here: the registry (and so reading a job) must not import torch
        from ..client.stats import auto_chunk, per_sample_moments_many, stats_sample

        c, o = ctx.clients, self.opts
        xs, ys = [], []
        for j in ctx.mine:
            x, y = c.data(int(j), stats_sample(int(ctx.sizes[j]), o.stat_batch, c.generator(int(j))))
            xs.append(x)
            ys.append(y)
        chunk = o.chunk or auto_chunk(self.num_params)
        moments = per_sample_moments_many(c.model.module, c.model.params, xs, ys, c.loss_fn, chunk)
        out = {}
        for j, (mu, v) in zip(ctx.mine, moments):
            if c.weight_decay:     # the L2 term's gradient is the same for every sample: it shifts mu only
                mu = mu + c.weight_decay * c.x0[: self.num_params].double()
            corr = c.correction(int(j)) if o.grad_source == "effective" else None
            if corr is not None:   # SCAFFOLD / VR: the direction the solver actually follows
                mu = mu + corr.double()
            out[int(j)] = (mu.cpu().numpy(), v.cpu().numpy())
        return out

    def statistics(self, ctx) -> None:
        P, k, B = self.num_params, len(ctx.cohort), self.batch
        ctx.clients.load_x0()
        p = ctx.weights / ctx.weights.sum()
        own = self._moments(ctx)
        rows = [np.concatenate([p[j] * mu, p[j] * (v + mu * mu), [p[j]]]) for j, (mu, v) in own.items()]
        tot = ctx.collective.sum("gsnr_moments", rows, 2 * P + 1, k)
        mu_g, v_g = global_moments(tot[:P], tot[P : 2 * P], float(tot[2 * P]))
        mine = []
        for j in ctx.mine:
            r = optimal_steps(*own[int(j)], mu_g, v_g, B, self.opts.r_max)
            mine.append([r["n_opt"], r["gsnr"], r["M"], r["N"]])
        self.values = ctx.collective.gather("gsnr_scalars", ctx.mine, np.array(mine).reshape(-1, 4), k)
        self.values[ctx.weights == 0, 0] = 0.0   # weight 0: its update would count for nothing
        self.L = float(mu_g @ mu_g + v_g.sum() / B)

    def steps(self, ctx) -> np.ndarray:
        o, n_opt = self.opts, self.values[:, 0]
        if not np.any(n_opt > 0):   # nobody aligned with the global statistics: the base round
            return np.full(len(n_opt), self.e_const, dtype=np.int64)
        if o.step_mode == "budget":
            return allocate_steps(n_opt, self.e_const, o.min_steps, o.max_steps, o.exclude_zero)
        if o.step_mode == "scale":
            return scaled_steps(n_opt, o.m, o.min_steps, o.max_steps, o.exclude_zero)
        return np.full(len(n_opt), self.e_const, dtype=np.int64)

    def client_records(self, ctx) -> dict:
        v = self.values
        return {"gsnr": v[:, 1], "gsnr_nopt": v[:, 0], "gsnr_M": v[:, 2], "gsnr_N": v[:, 3]}

    def round_records(self, ctx) -> dict:
        h, h_norm = allocation_entropy(self.values[:, 0])
        return {"gsnr_L": self.L, "gsnr_entropy": h, "gsnr_entropy_norm": h_norm,
                "gsnr_sum_steps": int(np.sum(ctx.steps))}
