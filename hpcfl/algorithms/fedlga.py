"""FedLGA: the server approximates the full update of clients that could not finish.

Li et al., "FedLGA: Towards System-Heterogeneity of Federated Learning via Local Gradient
Approximation" (arXiv 2112.11989; IEEE Trans. Cybernetics 2024). docs/algorithms/fedlga.md
gives the equations and the readings chosen where the paper is ambiguous.

With D_i = x_i - x^t the update of client i (a displacement), S_i its executed local steps,
the complete clients K2 = {i : steps_i = full_steps_i} and their mean
Dbar = sum_{K2} p_j D_j / sum_{K2} p_j, every incomplete client's update is replaced by

    D~_i = D_i + lam * G_i (beta * Dbar + sigma * D_i)

with G_i = g_i g_i^T applied as g_i (g_i . v) (``hessian = "rank1"``, never an n x n matrix)
or diag(g_i * g_i) (``"diag"``), and g_i (``grad_proxy``): ``"avg_update"`` D_i / (lr S_i),
``"raw_update"`` D_i, ``"full_grad"`` the paper's G (Eq. 6): the gradient of the client's whole
local objective F_i (all its samples, no weight decay) at its last iterate x^t + D_i, or
``"last_grad"`` a cheaper estimate of it on one mini-batch, plus weight decay (hpcfl.algorithms.
fedlga_grad computes both on the rank that holds the client; the client sends one more (P,) vector).
The signs (beta, sigma) are the reading of the paper's sign convention (``variant``,
docs/algorithms/fedlga.md derives each from the paper's lines):

- ``"B_alg1"``, (+1, -1): the paper's algorithm as printed. Algorithm 1 returns Delta = w_{E_i} - w^t,
  so Algorithm 2 line 7 gives w_bar = w^t + Dbar, line 11 (Eq. 5) D + G (w_bar - w_{E_i}) =
  D + lam G (Dbar - D), and line 14 / Eq. 7 step with a plus sign; no sign is changed (Table I and
  Section II-B print the opposite Delta; the convergence proof uses this one). hpcfl adds a guard the
  paper does not have: alpha_i is clipped at alpha_min = 0 unless alpha_min is set (its alpha_i =
  1 - lam ||g||^2 (...) can turn a slow update around);
- ``"C_pseudo"`` (default), (-1, +1): a motivated deviation. Table I's pseudo-gradients
  Delta = w^t - w_{E_i} with three printed signs flipped (line 7, line 14, Eq. 7),
  D~_i = D_i + lam G_i (D_i - Dbar); with g parallel to D it extends slow updates late in
  training (measured in the docs);
- ``"A_table1"``, (+1, +1): line 7 as printed with pseudo-gradients, lines 11 and 14 flipped,
  D + lam G (Dbar + D); inconsistent, kept for comparison.

Then the server averages sum_i p_i D~_i / sum_i p_i as FedAvg does (and the server optimizer
applies server_lr, the paper's eta_g). Under rank1 + avg_update, D~_i = alpha_i D_i with
alpha_i = 1 + lam (beta D_i . Dbar + sigma ||D_i||^2) / (lr S_i)^2: the "Hessian correction" is
a per-client scalar. With full_grad or last_grad the correction lam (g . v) g leaves D_i's direction.

Reductions (all exact):

- rank1 (and diag with ``corr_clip_ratio`` or a gradient proxy): two. Every rank holds its slow clients'
  results; one sum of [p D | p] over the complete clients gives Dbar on every rank
  (``release``); the owning rank corrects its slow clients, which then join the round's
  one training reduction. alpha_i is gathered for the records.
- diag with avg_update or raw_update: one, fused. A slow client adds p g*g and p g*g*D to two
  extra segments, the complete ones [p D | p] to a third; rank 0 adds lam [beta (sum p g*g) * Dbar + sigma sum p g*g*D].

A round with no complete client is a FedAvg round (``lga_no_full`` records it).
Buffers (batch-norm statistics) are averaged as in FedAvg, never corrected.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .fedlga_grad import full_gradient, full_steps_of_pass, last_gradient
from .protocol import Field, Segment, ServerArray
from .server import AverageRule, divide_

# variant -> (beta, sigma) of D~_i = D_i + lam G_i (beta Dbar + sigma D_i); D_i = x_i - x^t throughout.
# Algorithm 2 writes w^_E = w^t + mean_K2 Delta (line 7), Delta~_i = Delta_i + G (w^_E - w_i) (line 11) and
# w^{t+1} = w^t + eta_g mean Delta~ (line 14). Pseudo-gradients Delta = w^t - x_i read consistently make line 7
# w^t - mean Delta and line 14 w^t - eta_g mean Delta~: Delta~_i = -D_i + G (Dbar - D_i), i.e. C_pseudo. Displacements
# Delta = x_i - w^t read literally: B_alg1. Line 7 literal with pseudo-gradients, line 14 flipped: A_table1.
VARIANTS = {"C_pseudo": (-1.0, 1.0), "B_alg1": (1.0, -1.0), "A_table1": (1.0, 1.0)}
# grad_proxy -> the function that computes g at the slow client's last iterate on its rank
GRADIENTS = {"full_grad": full_gradient, "last_grad": last_gradient}


@dataclass(frozen=True)
class LgaOptions:
    """FedLGA's server correction (``[algorithm.lga]``)."""

    variant: str = field(default="C_pseudo", metadata={
        "choices": tuple(VARIANTS),
        "help": "sign reading of the paper: B_alg1 is the algorithm as printed (Alg. 1-2, Eq. 5, 7; the proof's "
                "Delta; Table I and Sec. II-B print the opposite), D + G(Dbar - D), plus a guard the paper does "
                "not have: alpha_i clipped at alpha_min = 0; C_pseudo (default) is a motivated deviation (Table "
                "I's pseudo-gradients, three printed signs flipped), D + G(D - Dbar); A_table1 is inconsistent, "
                "D + G(Dbar + D); docs/algorithms/fedlga.md"})
    hessian: str = field(default="rank1", metadata={
        "choices": ("rank1", "diag"),
        "help": "Hessian estimate: rank1 = g g^T (two reductions a round), diag = diag(g g^T) (one fused reduction; "
                "two with full_grad or last_grad)"})
    grad_proxy: str = field(default="avg_update", metadata={
        "choices": ("avg_update", "raw_update", "full_grad", "last_grad"),
        "help": "the gradient inside G: avg_update = D_i / (lr S_i), raw_update = D_i (both parallel to D_i); "
                "full_grad = the paper's G (Eq. 6), the gradient of the whole local objective (all the client's "
                "samples, no weight decay) at the slow client's last iterate (one more P-vector up, every "
                "client; ceil(n_i / batch_size) more steps of compute for a slow client, on the simulated "
                "clock); last_grad = a cheaper estimate, the gradient on one mini-batch plus weight decay (one "
                "more P-vector up, one more forward-backward)"})
    lam: float = field(default=1.0, metadata={
        "ge": 0, "help": "scale lambda of the correction; 1 is the paper's, 0 gives FedAvg"})
    alpha_min: Optional[float] = field(default=None, metadata={
        "inf": True,
        "help": "rank1 only: clip alpha_i (the scale of D~_i along D_i) from below; unset: 0 for B_alg1 (hpcfl's "
                "guard against turning a slow update around, not the paper's), no clip for the other readings; "
                "-inf: no clip (B_alg1 as the paper has it)"})
    alpha_max: Optional[float] = field(default=None, metadata={
        "help": "rank1 only: clip alpha_i from above; unset: no clip"})
    alpha_max_extrapolate: bool = field(default=False, metadata={
        "help": "rank1 only: clip alpha_i at full_steps_i / S_i, the linear extrapolation to the full work"})
    corr_clip_ratio: Optional[float] = field(default=None, metadata={
        "gt": 0, "help": "diag only: scale each correction to norm <= ratio * ||D_i|| (needs the two-reduction "
                         "path); unset: no clip"})

    def validate(self):
        p = []
        rank1_only = [k for k in ("alpha_min", "alpha_max") if getattr(self, k) is not None]
        if self.alpha_max_extrapolate:
            rank1_only.append("alpha_max_extrapolate")
        if self.hessian == "diag" and rank1_only:
            p.append(f"{', '.join(rank1_only)} clip alpha_i of hessian = 'rank1'; with 'diag' use corr_clip_ratio")
        if self.hessian == "rank1" and self.corr_clip_ratio is not None:
            p.append("corr_clip_ratio is for hessian = 'diag'; with 'rank1' clip alpha_min / alpha_max")
        if self.alpha_min is not None and self.alpha_max is not None and self.alpha_min > self.alpha_max:
            p.append(f"alpha_min = {self.alpha_min} exceeds alpha_max = {self.alpha_max}")
        return p

    @property
    def alpha_floor(self) -> float:
        """The lower clip of alpha_i: alpha_min, or 0 for B_alg1 when unset (its guard), else -inf."""
        if self.alpha_min is not None:
            return self.alpha_min
        return 0.0 if self.variant == "B_alg1" and self.hessian == "rank1" else -np.inf

    @property
    def beta(self) -> float:
        """Sign of Dbar in D~_i = D_i + lam G_i (beta Dbar + sigma D_i)."""
        return VARIANTS[self.variant][0]

    @property
    def sigma(self) -> float:
        """Sign of D_i in D~_i = D_i + lam G_i (beta Dbar + sigma D_i)."""
        return VARIANTS[self.variant][1]


def correct(D: np.ndarray, steps: int, full_steps: int, dbar: np.ndarray, lr: float,
            opts: LgaOptions, grad: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """One slow client's approximated full update and its alpha (NaN for diag).

    Parameters
    ----------
    D : (P,) float64
        The client's update over the parameters.
    steps, full_steps : int
        S_i, the steps it ran, and the steps of the full local work.
    dbar : (P,) float64
        The complete clients' mean update.
    lr : float
        The round's client learning rate.
    grad : (P,) float64 or None
        The gradient at the client's last iterate (``grad_proxy`` ``"full_grad"`` or ``"last_grad"``;
        required then).

    Returns
    -------
    (P,) float64 D~_i, and alpha_i = 1 + corr . D / ||D||^2 (the scale along D_i; rank1).
    Costs O(P) time and memory.
    """
    # At most three (P,) temporaries live at once (g, v or corr, the result): memory O(P).
    if opts.grad_proxy in GRADIENTS:
        if grad is None:
            raise ValueError(f"grad_proxy = {opts.grad_proxy!r} needs the gradient at the client's last iterate")
        g = grad
    else:
        g = D / (lr * steps) if opts.grad_proxy == "avg_update" else D
    v = opts.sigma * D
    if opts.beta > 0:      # in place: no fourth (P,) temporary
        v += dbar
    else:
        v -= dbar
    dd = float(D @ D)
    if opts.hessian == "rank1":
        coef = opts.lam * float(g @ v)
        del v
        corr = coef * g
        alpha = 1.0 + float(corr @ D) / dd if dd > 0 else 1.0
        lo = opts.alpha_floor
        hi = opts.alpha_max if opts.alpha_max is not None else np.inf
        if opts.alpha_max_extrapolate:
            hi = min(hi, full_steps / steps)
        if not lo <= alpha <= hi:
            clipped = float(np.clip(alpha, lo, hi))
            if opts.grad_proxy in GRADIENTS:     # shrink the correction, keeping its direction
                corr *= (clipped - 1.0) / (alpha - 1.0)
            else:                                # corr is parallel to D: the same, written exactly
                corr = (clipped - 1.0) * D
            alpha = clipped
        return D + corr, alpha
    corr = g * g
    corr *= v
    corr *= opts.lam
    del v
    if opts.corr_clip_ratio is not None:
        cap, norm = opts.corr_clip_ratio * np.sqrt(dd), float(np.linalg.norm(corr))
        if norm > cap:
            corr *= cap / norm
    return D + corr, float("nan")


class LgaRule(AverageRule):
    """The FedLGA server rule: FedAvg's weighted mean of the corrected updates.

    Its correction is computed on the host (``tensors = False``): with device sums, the model's
    update runs on host copies.

    Parameters
    ----------
    opts : LgaOptions
    num_params : int
        P, the trainable prefix of the flat update (buffers are never corrected).
    normalize : bool
        Divide by the cohort's weight sum (False under unbiased sampling).
    batch_size : int
        B, the clients' batch size: a full_grad pass over n_i samples costs ceil(n_i / B) steps.
    """

    client_fields = {
        "lga_alpha": Field(np.float64, "1", "FedLGA's scale alpha_i of a slow client's update (rank1); NaN for "
                                            "complete clients and for hessian = 'diag'"),
    }
    round_fields = {
        "lga_no_full": Field(np.int64, "1", "1 when no complete client reported, so the round was plain FedAvg"),
        "lga_no_full_rounds": Field(np.int64, "rounds", "rounds without a complete client so far"),
        "lga_corrected": Field(np.int64, "clients", "slow clients whose update the server corrected"),
        "time_lga": Field(np.float64, "s", "seconds rank 0 spent computing the correction (without waiting "
                                             "in collectives)"),
    }

    tensors = False

    def __init__(self, opts: LgaOptions, num_params: int, normalize: bool = True, batch_size: int = 1):
        super().__init__(num_params, normalize)
        self.opts = opts
        self.batch_size = int(batch_size)
        # a gradient at the last iterate is computed in release: the two-reduction path
        self.fused = opts.hessian == "diag" and opts.corr_clip_ratio is None and opts.grad_proxy not in GRADIENTS
        self.no_full_rounds = 0
        self._full_rows: list[np.ndarray] = []
        self._round = {}

    # ---- which clients the correction concerns --------------------------------------
    @staticmethod
    def _slow(ctx, j: int) -> bool:
        return bool(ctx.steps[j] < ctx.full_steps[j])

    def segments(self) -> list[Segment]:
        if not self.fused:
            return []
        P = self.num_params
        return [Segment("lga_full", P + 1), Segment("lga_gg", P + 1), Segment("lga_ggd", P)]

    def hold(self, ctx, j) -> bool:
        return not self.fused and self._slow(ctx, j)

    def pack(self, ctx, j, slot, res, weight):
        if self._slow(ctx, j) and not self.fused:
            return {}            # a held client, packed after release with its corrected update
        import torch

        if not self._slow(ctx, j):
            if self.fused:   # on the device where the row lives; the same values as the host form below
                D = res.delta[: self.num_params].double()
                return {"lga_full": torch.cat([D * weight, D.new_full((1,), weight)])}
            self._full_rows.append(np.append(res.host()[: self.num_params] * weight, weight))
            return {}
        D = res.delta[: self.num_params].double()
        g = divide_(D.clone(), ctx.lr * res.steps) if self.opts.grad_proxy == "avg_update" else D
        gg = g.mul(weight).mul_(g)                  # (weight g) g, in the host form's order
        return {"lga_gg": torch.cat([gg, gg.new_full((1,), weight)]), "lga_ggd": gg * D}

    # ---- two-reduction path: Dbar first, then the corrected slow updates ----------------
    def release(self, ctx, held) -> None:
        self._round = {"alpha": None, "corrected": 0, "time": 0.0, "no_full": 0}
        if self.fused:
            return
        P = self.num_params
        complete = int(np.count_nonzero((ctx.steps > 0) & (ctx.steps >= ctx.full_steps)))
        sums = ctx.collective.sum("lga_full", self._full_rows, P + 1, max(complete, 1))
        self._full_rows = []
        t0 = time.perf_counter()
        alpha = np.full(len(ctx.mine), np.nan)
        slow_total = int(np.count_nonzero((ctx.steps > 0) & (ctx.steps < ctx.full_steps)))
        if sums[P] > 0:
            dbar = sums[:P] / sums[P]
            where = {int(j): i for i, j in enumerate(ctx.mine)}
            gradient = GRADIENTS.get(self.opts.grad_proxy)
            for j, _, res in held:
                grad = gradient(ctx, int(j), res, P) if gradient is not None else None
                new, a = correct(res.host()[:P], res.steps, int(ctx.full_steps[j]), dbar, ctx.lr, self.opts, grad)
                # a copy: host() may be a view of res.delta, which SCAFFOLD or FedDyn must still see as
                # the client's real update
                adjusted = res.host().copy()
                adjusted[:P] = new
                res.adjusted = adjusted
                alpha[where[j]] = a
            self._round["corrected"] = slow_total
        elif slow_total:
            self._round["no_full"] = 1
            ctx.log(f"FedLGA: none of the {slow_total} reporting clients finished its local work; "
                    f"this round averages the updates as FedAvg")
        self._round["time"] = time.perf_counter() - t0
        if self.opts.hessian == "rank1":
            self._round["alpha"] = ctx.collective.gather("lga_alpha", ctx.mine, alpha, len(ctx.cohort))[:, 0]
        if self.opts.grad_proxy in GRADIENTS and held:
            ctx.clients.load_x0()     # the gradient loaded each slow client's last iterate

    def transfer(self) -> tuple[int, int]:
        # full_grad, last_grad: a slow client uploads its gradient; the clock charges every client (the
        # upload size is fixed before the round), so the figure is an upper bound
        return (self.num_params, 0) if self.opts.grad_proxy in GRADIENTS else (0, 0)

    def finish_steps(self, ctx) -> np.ndarray | None:
        # full_grad: a client that stops short of its full work makes one more pass over its n_i samples
        # before it uploads, forward-backward without updates: ceil(n_i / B) steps' worth of compute
        if self.opts.grad_proxy != "full_grad":
            return None
        return full_steps_of_pass(ctx.sizes, self.batch_size)

    # ---- server -------------------------------------------------------------------------
    def aggregate(self, delta_sum: np.ndarray, s: dict, seg: dict | None = None) -> np.ndarray:
        agg = super().aggregate(delta_sum, s)
        return agg if not self.fused else agg + self._fused_correction(delta_sum, s, seg)

    def _fused_correction(self, delta_sum: np.ndarray, s: dict, seg: dict) -> np.ndarray:
        """lam [beta (sum p g*g) * Dbar + sigma sum p g*g*D] / sum p, from the one fused reduction."""
        P = self.num_params
        t0 = time.perf_counter()
        out = np.zeros_like(delta_sum)
        full, gg = seg["lga_full"], seg["lga_gg"]
        if full[P] > 0:
            dbar = full[:P] / full[P]
            out[:P] = self.opts.lam * (self.opts.beta * gg[:P] * dbar + self.opts.sigma * seg["lga_ggd"])
            out[:P] /= s["weight"] if self.normalize else 1.0
        elif gg[P] > 0:          # slow clients reported, none complete: a FedAvg round
            self._round["no_full"] = 1
        self._round["time"] = time.perf_counter() - t0
        return out

    def server_update(self, ctx, seg, scalars) -> None:
        if self._round.get("no_full"):
            self.no_full_rounds += 1

    # ---- records and state ----------------------------------------------------------------
    def client_records(self, ctx) -> dict:
        alpha = self._round.get("alpha")
        return {"lga_alpha": alpha if alpha is not None else np.full(len(ctx.cohort), np.nan)}

    def round_records(self, ctx) -> dict:
        corrected = self._round.get("corrected", 0)
        if self.fused and not self._round.get("no_full"):
            corrected = int(np.count_nonzero((ctx.steps > 0) & (ctx.steps < ctx.full_steps)))
        return {"lga_no_full": int(self._round.get("no_full", 0)), "lga_no_full_rounds": self.no_full_rounds,
                "lga_corrected": corrected, "time_lga": float(self._round.get("time", 0.0))}

    def state(self) -> list:
        def set_count(v):
            self.no_full_rounds = int(np.asarray(v).reshape(-1)[0])

        return [ServerArray("lga_no_full_rounds", lambda: np.array([self.no_full_rounds], dtype=np.int64),
                            set_count, broadcast=False)]
