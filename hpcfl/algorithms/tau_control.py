"""The local period tau between rounds: GIFT's gradient consistency and controllers, AdaComm.

Pure float64 numpy (no torch, no MPI); the engine policy (:mod:`hpcfl.algorithms.gift`)
calls it on rank 0 once per round and checkpoints what ``scalars()`` / ``pools()`` return.
References: GIFT (C. Chen et al., "GIFT: Toward Accurate and Efficient Federated Learning With
Gradient-Instructed Frequency Tuning", IEEE JSAC 2023; Eq. (1), Algorithm 1); AdaComm (J. Wang,
G. Joshi, SysML 2019); AFL (S. Wang et al., "Adaptive federated learning in resource
constrained edge computing systems", IEEE JSAC 2019; its fixed tau* is in
:mod:`hpcfl.algorithms.afl_bound`).

The caller passes the cohort sums S = sum_i u_i and A = sum_i |u_i| over the trainable
parameters, shape (M,). Because ReLU(x) - ReLU(-x) = x and ReLU(x) + ReLU(-x) = |x|, the
paper's pooled positive and negative parts are P = (A + S)/2 and N = (S - A)/2, so A is the
only vector GIFT adds to FedAvg's reduction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

REDUCTIONS = ("coord_mean", "l1")


def _vec(x, name: str, size: int) -> np.ndarray:
    v = np.asarray(x, dtype=np.float64)
    if v.shape != (size,) or not np.isfinite(v).all():
        raise ValueError(f"{name} must be a vector of finite floats, shape ({size},); got shape {v.shape}")
    return v


def _ceil_div(tau: int, gamma: float) -> int:
    """ceil(tau / gamma) in exact integer arithmetic on gamma's binary value (11 / 1.1 -> 10, not 11)."""
    n, d = float(gamma).as_integer_ratio()
    return -((-int(tau) * d) // n)


def split(S, A) -> tuple[np.ndarray, np.ndarray]:
    """Pooled parts P = sum_i ReLU(u_i) = (A + S)/2 and N = -sum_i ReLU(-u_i) = (S - A)/2, shape (M,)."""
    S, A = np.asarray(S, dtype=np.float64), np.asarray(A, dtype=np.float64)
    return (A + S) / 2, (S - A) / 2


def consistency(P, N, reduce: str = "coord_mean") -> float:
    """Gradient consistency C in [0, 1] from the (EMA) pools.

    Parameters
    ----------
    P, N : array_like, shape (M,)
        Positive (>= 0) and negative (<= 0) pools; P + N is the signed sum, P - N the absolute one.
    reduce : {"coord_mean", "l1"}
        ``coord_mean``: mean over j of |P_j + N_j| / (P_j - N_j), 0 for a coordinate with
        denominator 0 (nobody moved it). ``l1``: ||P + N||_1 / ||P - N||_1, 0 if the
        denominator is 0. Never the signed sum over coordinates: their signs would cancel.
    """
    P, N = np.asarray(P, dtype=np.float64), np.asarray(N, dtype=np.float64)
    if P.ndim != 1 or P.shape != N.shape or P.size == 0:
        raise ValueError(f"P and N must be vectors of one shape (M,) with M >= 1, got {P.shape} and {N.shape}")
    num, den = np.abs(P + N), P - N
    if reduce == "coord_mean":
        # divide only where den > 0: no 0/0 NaN and no RuntimeWarning
        return float(np.divide(num, den, out=np.zeros_like(num), where=den > 0).mean())
    if reduce == "l1":
        d = float(den.sum())
        return float(num.sum()) / d if d > 0 else 0.0
    raise ValueError(f"reduce = {reduce!r} is not one of {REDUCTIONS}")


class Pools:
    """GIFT's EMA pools P~, N~ (Eq. 1) over M = ``size`` parameters: zero start, no bias correction.

    The bias factor 1 - theta^r would scale numerator and denominator of C alike, so C_1 is
    round 1's raw metric for any ``theta`` in [0, 1). ``reduce``: see :func:`consistency`.
    ``pool_normalize`` is applied here: ``"mean"`` divides S and A by the ``count`` given to
    :meth:`update` (the pools hold the mean update, for cohorts of varying size); ``"sum"``
    pools the sums as the paper writes them and ignores ``count``.
    """

    def __init__(self, size: int, theta: float = 0.9, reduce: str = "coord_mean", pool_normalize: str = "sum"):
        for ok, msg in ((isinstance(size, (int, np.integer)) and size >= 1, f"size = {size!r}: give M >= 1"),
                        (0 <= theta < 1, f"theta = {theta} must be in [0, 1) (0.9 in the paper)"),
                        (reduce in REDUCTIONS, f"reduce = {reduce!r} is not one of {REDUCTIONS}"),
                        (pool_normalize in ("sum", "mean"), f"pool_normalize = {pool_normalize!r}: 'sum' or 'mean'")):
            if not ok:
                raise ValueError(msg)
        self.size, self.theta, self.reduce, self.pool_normalize = int(size), float(theta), reduce, pool_normalize
        self.P, self.N = np.zeros(self.size), np.zeros(self.size)

    def update(self, S, A, count: float | None = None) -> float:
        """Fold one round's S, A (shape (M,)) into the pools; return C of the updated pools."""
        S, A = _vec(S, "S", self.size), _vec(A, "A", self.size)
        if (A < 0).any():
            raise ValueError("A is the sum of |u_i| and cannot be negative (were S and A swapped?)")
        if self.pool_normalize == "mean":
            if count is None or not count > 0:
                raise ValueError(f"pool_normalize = 'mean' needs the round's reporter count > 0, got {count!r}")
            S, A = S / count, A / count
        P_r, N_r = split(S, A)
        th = self.theta
        self.P = th * self.P + (1 - th) * P_r
        self.N = th * self.N + (1 - th) * N_r
        return self.C()

    def C(self) -> float:
        return consistency(self.P, self.N, self.reduce)

    def reset(self) -> None:
        self.P, self.N = np.zeros(self.size), np.zeros(self.size)

    def vector(self) -> np.ndarray:
        """[P~ | N~], shape (2M,), a copy."""
        return np.concatenate([self.P, self.N])

    def load(self, v) -> None:
        v = _vec(v, "pools", 2 * self.size)
        self.P, self.N = v[: self.size].copy(), v[self.size:].copy()


@dataclass(frozen=True)
class Decision:
    """One round's outcome: C (NaN for controllers without it), the tau this round ran,
    the tau for the next round, and why it changed (None when tau_next == tau_used)."""

    C: float
    tau_used: int
    tau_next: int
    reason: str | None = None


class _Packed:
    """state() / load_state() over a fixed-length float64 scalar vector named by ``_NAMES``.

    Integers are stored exactly (below 2**53); +inf and NaN survive float64 as they are.
    """

    _NAMES: tuple[str, ...] = ()    # subclasses also define scalars() and load_scalars(v)

    def _check_scalars(self, v, length: int, ints: tuple[int, ...]) -> np.ndarray:
        v = np.asarray(v, dtype=np.float64)
        if v.shape != (length,) or not all(math.isfinite(v[i]) and v[i].is_integer() for i in ints):
            raise ValueError(f"{type(self).__name__} scalars must have shape ({length},) with integers at "
                             f"{ints}, got shape {v.shape}: a checkpoint of another configuration?")
        return v

    def state(self) -> dict[str, np.ndarray]:
        """Every state field by name (copies); ``C_hist`` is the fixed-length padded history."""
        v = self.scalars()
        out = {name: np.array(v[i]) for i, name in enumerate(self._NAMES)}
        if len(v) > len(self._NAMES):
            out["C_hist"] = v[len(self._NAMES):].copy()
        return out

    def load_state(self, state: dict) -> None:
        """Restore from :meth:`state`; the controller then continues bitwise identically."""
        parts = [np.atleast_1d(np.asarray(state[n], dtype=np.float64)) for n in self._NAMES]
        if "C_hist" in state:
            parts.append(np.asarray(state["C_hist"], dtype=np.float64))
        self.load_scalars(np.concatenate(parts))


class GiftController(_Packed):
    """GIFT's tau controller over M = ``size`` parameters; it owns its :class:`Pools`. Modes:

    - ``"stagnation"`` (default): divide tau by gamma once C has made no new minimum for
      ``patience`` rounds, at least ``warmup`` rounds after the start or the last change. A new
      minimum must lie below the running minimum c_min by more than max(eps_rel c_min,
      eps_abs): with the defaults (0.1, 1e-3, patience 10) tau falls once C has improved by
      less than a tenth of itself in ten rounds, about 1% a round, i.e. relative to C's own
      scale; eps_abs only matters once C is near 0 (below 0.01), where relative changes are
      noise (C decays like theta^r when the updates cancel exactly). With ``peak_guard`` minima
      are tracked only once C has fallen after a change (the start counts as one), so the
      burst of C after a halving is ignored. A change sets c_min = +inf, r_min = that round
      and zeroes the pools if ``reset_ema_on_tau_change``. Relaxation adds ``delta`` after ``o``
      rounds of strictly falling C with tau unchanged (phase "initial": only before the first
      decrease).
    - ``"literal"``: Algorithm 1 (lines 12-15) as printed, nothing added. From round 2,
      C_r >= C_{r-1} divides tau (line 12-13); otherwise line 14 (C fell strictly in each of the
      last o rounds, tau unchanged in them) adds delta when relaxation is on, at any time and
      without a cap (``phase`` and ``tau_max`` belong to the stagnation mode, as do
      ``reset_ema_on_tau_change``, patience, warm-up, the thresholds and the peak guard: the
      pools are never reset). Only the floor ``tau_min`` stays (tau is a whole step count >= 1).
    - ``"fixed"``: tau never changes (FedAvg with C recorded).

    Division is ceil(tau / gamma), never below ``tau_min``; in the stagnation mode relaxed tau is
    capped at ``tau_max`` (None: 10 tau0). Defaults are the paper's (theta 0.9, gamma 2, delta 5, o 10).
    """

    _NAMES = ("round", "tau", "c_min", "r_min", "last_change", "patience_cur", "peaked", "dec_streak",
              "decreased_once", "C_count")
    _INTS = (0, 1, 3, 4, 6, 7, 8, 9)

    def __init__(self, tau0: int = 100, *, size: int, mode: str = "stagnation", theta: float = 0.9,
                 gamma: float = 2.0, reduce: str = "coord_mean", pool_normalize: str = "sum", patience: int = 10,
                 warmup: int = 10, eps_abs: float = 1e-3, eps_rel: float = 0.1, peak_guard: bool = True,
                 scale_patience: bool = False, reset_ema_on_tau_change: bool = True, tau_min: int = 1,
                 tau_max: int | None = None, relaxation: bool = False, delta: int = 5, o: int = 10,
                 phase: str = "initial"):
        tau_max = 10 * tau0 if tau_max is None else tau_max
        problems = [
            (mode in ("stagnation", "literal", "fixed"), f"mode = {mode!r}: use 'stagnation', 'literal' or 'fixed'"),
            (gamma > 1, f"gamma = {gamma} must exceed 1 (2 in the paper)"),
            (patience >= 1 and warmup >= 0, f"patience = {patience} must be >= 1 and warmup = {warmup} >= 0"),
            (eps_abs >= 0 and eps_rel >= 0, f"eps_abs = {eps_abs} and eps_rel = {eps_rel} must be >= 0"),
            (1 <= tau_min <= tau0 <= tau_max, f"need 1 <= tau_min ({tau_min}) <= tau0 ({tau0}) <= tau_max ({tau_max})"),
            (delta >= 1 and o >= 1, f"delta = {delta} and o = {o} must be >= 1 (5 and 10 in the paper)"),
            (phase in ("initial", "always"), f"phase = {phase!r}: use 'initial' or 'always'"),
        ]
        bad = [msg for ok, msg in problems if not ok]
        if bad:
            raise ValueError("GiftController: " + "; ".join(bad))
        self.ema = Pools(size, theta, reduce, pool_normalize)
        self.mode, self.gamma, self.patience, self.warmup = mode, float(gamma), int(patience), int(warmup)
        self.eps_abs, self.eps_rel, self.peak_guard = float(eps_abs), float(eps_rel), bool(peak_guard)
        self.scale_patience, self.reset_ema = bool(scale_patience), bool(reset_ema_on_tau_change)
        self.tau_min, self.tau_max, self.relaxation = int(tau_min), int(tau_max), bool(relaxation)
        self.delta, self.o, self.phase = int(delta), int(o), phase
        self.r, self.tau, self.c_min, self.r_min, self.last_change = 0, int(tau0), math.inf, 0, 0
        self.patience_cur = float(patience)
        self.peaked = not self.peak_guard       # the start counts as a change
        self.dec_streak, self.decreased_once = 0, False
        self.hist: list[float] = []             # the last o + 1 values of C, oldest first

    def step(self, S, A, count: float | None = None) -> Decision:
        """End of a round: fold S, A (shape (M,); ``count``: see :class:`Pools`) and decide the
        tau every client runs next round (``Decision.tau_next``)."""
        C = self.ema.update(S, A, count)
        self.r += 1
        used = self.tau
        prev = self.hist[-1] if self.hist else None
        if prev is not None and C < prev:
            self.peaked, self.dec_streak = True, self.dec_streak + 1
        else:
            self.dec_streak = 0
        # c_min = +inf: any C is a new minimum (inf - eps_rel * inf would be NaN)
        if self.peaked and (math.isinf(self.c_min)
                            or C < self.c_min - max(self.eps_abs, self.eps_rel * self.c_min)):
            self.c_min, self.r_min = C, self.r
        reason = None
        if self.mode == "stagnation":
            reason = self._stagnation()
        elif self.mode == "literal":
            reason = self._literal(C, prev)
        if self.tau != used:
            self.last_change, self.c_min, self.r_min, self.dec_streak = self.r, math.inf, self.r, 0
            self.peaked = not self.peak_guard
            if self.reset_ema and self.mode == "stagnation":   # Algorithm 1 keeps its pools
                self.ema.reset()
        self.hist = (self.hist + [C])[-(self.o + 1):]
        return Decision(C, used, self.tau, reason if self.tau != used else None)

    def _may_relax(self, literal: bool = False) -> bool:
        """Line 14's condition; the stagnation mode adds the phase rule, the literal mode does not."""
        return (self.relaxation and self.dec_streak >= self.o and self.r - self.last_change >= self.o
                and (literal or self.phase == "always" or not self.decreased_once))

    def _divide(self) -> None:
        self.tau = max(self.tau_min, _ceil_div(self.tau, self.gamma))
        self.decreased_once = True

    def _stagnation(self) -> str | None:
        stagnated = (self.peaked and self.r - self.last_change >= self.warmup
                     and self.r - self.r_min >= self.patience_cur and math.isfinite(self.c_min))
        if stagnated and self.tau > self.tau_min:
            self._divide()
            if self.scale_patience:
                self.patience_cur *= self.gamma
            return "stagnation"
        if self._may_relax():
            self.tau = min(self.tau_max, self.tau + self.delta)
            return "relax"
        return None

    def _literal(self, C: float, prev: float | None) -> str | None:
        if prev is not None and C >= prev:      # line 12; C_0 does not exist, so from round 2
            if self.tau > self.tau_min:
                self._divide()
            return "literal"
        if self._may_relax(literal=True):       # lines 14-15: no phase switch, no cap
            self.tau += self.delta
            return "relax"
        return None

    # -- checkpoint: one scalar vector of length 10 + o + 1, and the pools as (2M,)
    def scalars(self) -> np.ndarray:
        hist = np.full(self.o + 1, np.nan)
        hist[: len(self.hist)] = self.hist
        head = [self.r, self.tau, self.c_min, self.r_min, self.last_change, self.patience_cur, self.peaked,
                self.dec_streak, self.decreased_once, len(self.hist)]
        return np.concatenate([np.array(head, dtype=np.float64), hist])

    def load_scalars(self, v) -> None:
        v = self._check_scalars(v, len(self._NAMES) + self.o + 1, self._INTS)
        self.r, self.tau, self.r_min, self.last_change = int(v[0]), int(v[1]), int(v[3]), int(v[4])
        self.c_min, self.patience_cur = float(v[2]), float(v[5])
        self.peaked, self.dec_streak, self.decreased_once = bool(v[6]), int(v[7]), bool(v[8])
        self.hist = [float(c) for c in v[10: 10 + int(v[9])]]

    def pools(self) -> np.ndarray:
        """[P~ | N~], shape (2M,)."""
        return self.ema.vector()

    def load_pools(self, v) -> None:
        self.ema.load(v)

    def state(self) -> dict[str, np.ndarray]:
        """Scalars by name (see ``_NAMES``), ``C_hist`` (o + 1, NaN-padded), ``P_ema``, ``N_ema``."""
        return {**super().state(), "P_ema": self.ema.P.copy(), "N_ema": self.ema.N.copy()}

    def load_state(self, state: dict) -> None:
        super().load_state(state)
        self.ema.load(np.concatenate([state["P_ema"], state["N_ema"]]))


class AdaCommController(_Packed):
    """AdaComm's tau schedule, with the saturation fix of the GIFT paper's comparison.

    Intervals of T0 simulated seconds (``clock=True``; T0 = ``interval_s``, by default
    ``interval_rounds`` x the first round's duration, i.e. ten rounds at tau0) or of
    ``interval_rounds`` rounds (no clock). At the end of the first round whose cumulative time
    reaches the next boundary l T0 (relative tolerance 1e-9, so ten equal rounds fill ten
    rounds' interval despite rounding; one decision even if a round passes several boundaries):

    - F is the mean training loss of that round, F0 the one of the round that first
      reported a loss (round 1 normally; it stands in for F(x_0) and makes no decision);
    - tau = ceil(sqrt(F / F0) tau0) (reason "adacomm");
    - with ``saturation_fix``, if F >= F_prev, the F of the previous decision (F0 for the
      first interval), tau = max(1, ceil(tau_prev / 2)) instead (reason "saturation");
    - tau is clipped to [1, tau_max] (None: tau0). A round with a NaN loss (nobody
      reported) counts its time and changes nothing.
    """

    _NAMES = ("round", "tau", "t_cum", "T0", "interval", "F0", "F_prev")
    _INTS = (0, 1, 4)

    def __init__(self, tau0: int, *, interval_s: float | None = None, interval_rounds: int = 10,
                 saturation_fix: bool = True, tau_max: int | None = None, clock: bool = True):
        tau_max = tau0 if tau_max is None else tau_max
        for ok, msg in ((1 <= tau0 <= tau_max, f"AdaComm needs 1 <= tau0 ({tau0}) <= tau_max ({tau_max})"),
                        (interval_rounds >= 1, f"interval_rounds = {interval_rounds} must be >= 1"),
                        (interval_s is None or (clock and math.isfinite(interval_s) and interval_s > 0),
                         f"interval_s = {interval_s} needs the simulated clock and a value > 0; leave it unset "
                         "to use interval_rounds")):
            if not ok:
                raise ValueError(msg)
        self.tau0, self.tau_max, self.interval_rounds = int(tau0), int(tau_max), int(interval_rounds)
        self.fix, self.clock = bool(saturation_fix), bool(clock)
        self.r, self.tau, self.t, self.l = 0, int(tau0), 0.0, 0
        self.T0 = math.nan if interval_s is None else float(interval_s)
        self.F0 = self.F_prev = math.nan

    def step(self, loss: float, duration: float | None = None) -> Decision:
        """End of a round: its mean training loss and (with the clock) its simulated seconds."""
        self.r += 1
        used, loss = self.tau, float(loss)
        if self.clock:
            if duration is None or not (math.isfinite(duration) and duration >= 0):
                raise ValueError(f"AdaComm with the simulated clock needs the round's duration >= 0, got {duration}")
            self.t += float(duration)
            if math.isnan(self.T0):
                if not duration > 0:
                    raise ValueError("the first round took 0 simulated seconds, so T0 = 10 rounds is 0: "
                                     "set interval_s, or run without the clock (interval_rounds)")
                self.T0 = self.interval_rounds * float(duration)
            reached = math.floor(self.t / (self.T0 * (1 - 1e-9)))
            boundary, self.l = reached > self.l, max(self.l, reached)
        else:
            boundary = self.r % self.interval_rounds == 0
        if not math.isfinite(loss):
            return Decision(math.nan, used, used, None)
        if math.isnan(self.F0):
            if not loss > 0:
                raise ValueError(f"AdaComm's tau = ceil(sqrt(F / F0) tau0) needs a positive training loss F0; "
                                 f"round {self.r} reported {loss}")
            self.F0 = self.F_prev = loss
            return Decision(math.nan, used, used, None)
        reason = None
        if boundary:
            if self.fix and loss >= self.F_prev:
                tau, reason = max(1, -(-self.tau // 2)), "saturation"
            else:
                tau, reason = math.ceil(math.sqrt(max(loss, 0.0) / self.F0) * self.tau0), "adacomm"
            self.tau, self.F_prev = min(max(tau, 1), self.tau_max), loss
        return Decision(math.nan, used, self.tau, reason if self.tau != used else None)

    def scalars(self) -> np.ndarray:
        return np.array([self.r, self.tau, self.t, self.T0, self.l, self.F0, self.F_prev], dtype=np.float64)

    def load_scalars(self, v) -> None:
        v = self._check_scalars(v, len(self._NAMES), self._INTS)
        self.r, self.tau, self.l = int(v[0]), int(v[1]), int(v[4])
        self.t, self.T0, self.F0, self.F_prev = float(v[2]), float(v[3]), float(v[5]), float(v[6])
