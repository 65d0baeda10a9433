"""FedDisco: discrepancy-aware aggregation weights (pure numpy).

Reference: Ye, Xu, Wang, Xu, Chen, Wang, "FedDisco: Federated Learning with
Discrepancy-Aware Collaboration", ICML 2023, eq. 3. For the round's participants S,

    n_k = |B_k| / sum_S |B_m|,   d~_k = d_k / sum_S d_m,
    q_k = max(n_k - a d~_k + b, 0),   p_k = q_k / sum_S q_m,

where d_k = e(D_k, T) is the distance of client k's label distribution D_k to a target
T (uniform by default; KL(D_k || T) by default, natural log, 0 log 0 = 0). The paper does
not say how d is scaled; the authors' released code divides it by its sum over the
round's participants (0 when that sum is 0), and so does this module, for every metric
unless ``normalize = False``. When every q_k is 0 the formula is 0/0; the weights then
fall back to the size weights n and ``info["fallback"]`` is set. ``a = b = 0`` returns n
bit for bit (plain FedAvg).

``weights = "disco"`` (:class:`DiscoWeights`) is the policy on the round protocol; the
functions above are its maths.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError
from .protocol import Field, Policy

TARGETS = ("uniform", "global", "unweighted_mean", "explicit")


def _kl(dist, target):
    # 0 log 0 = 0; callers have already rejected T_c = 0 where D_c > 0
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(dist > 0, dist * np.log(dist / target), 0.0).sum(axis=1)


_METRIC_FNS = {
    "kl": _kl,
    "l1": lambda dist, target: np.abs(dist - target).sum(axis=1),
    "l2": lambda dist, target: np.sqrt(((dist - target) ** 2).sum(axis=1)),
    # row by row (not ``dist @ t``: a BLAS product may round a row differently depending on
    # how many rows a rank holds, and each rank computes its own clients' values)
    "cosine": lambda dist, t: 1.0 - (dist * t).sum(axis=1) / (np.sqrt((dist * dist).sum(axis=1))
                                                             * np.sqrt((t * t).sum())),
}
METRICS = tuple(_METRIC_FNS)


@dataclass(frozen=True)
class DiscoOptions:
    """``[algorithm.disco]``: metric e, target T, and the coefficients a, b of eq. 3."""

    metric: str = field(default="kl", metadata={
        "choices": METRICS, "help": "discrepancy d_k between a client's label distribution and the target"})
    target: str = field(default="uniform", metadata={
        "choices": TARGETS, "help": "target distribution T: uniform, global (all clients' data), unweighted_mean (of "
                                    "the clients' distributions), explicit (target_vector)"})
    target_vector: tuple[float, ...] = field(default=(), metadata={
        "help": "one value per class, rescaled to sum to 1; only with target = 'explicit'"})
    a: float = field(default=0.5, metadata={"ge": 0, "help": "discrepancy penalty a in q_k = max(n_k - a d_k + b, 0)"})
    b: float = field(default=0.1, metadata={
        "ge": 0, "help": "offset b in q_k = max(n_k - a d_k + b, 0), pulling the weights towards uniform"})
    normalize: bool = field(default=True, metadata={
        "help": "divide d by its sum over the round's participants (the authors' code); false: raw d"})

    def validate(self) -> list[str]:
        vec = self.target_vector
        if self.target == "explicit" and not vec:
            return ["target = 'explicit' needs target_vector (one probability per class)"]
        if self.target != "explicit" and vec:
            return [f"target_vector is set but target = {self.target!r}; "
                    "set target = 'explicit' or remove target_vector"]
        if vec and not all(math.isfinite(v) for v in vec):
            return ["target_vector must contain finite numbers only"]
        if vec and (min(vec) < 0 or not sum(vec) > 0):
            return ["target_vector must be non-negative and sum to a positive number"]
        return []


def target_distribution(kind: str, counts: np.ndarray, explicit: tuple = ()) -> np.ndarray:
    """Target label distribution T, shape (C,), float64, summing to 1.

    ``counts`` is the (K, C) label-count matrix of ALL clients. "global" is the label
    distribution of the union of their data; "unweighted_mean" averages the D_k of the
    non-empty clients (the paper's App. A.3 example sums distributions, not counts);
    "explicit" rescales the C values of ``explicit`` to sum to 1.
    """
    counts = _as_counts(counts)
    num_classes, totals = counts.shape[1], counts.sum(axis=1)
    if kind in ("global", "unweighted_mean") and not totals.sum() > 0:
        raise ConfigError(f"algorithm.disco.target = {kind!r} needs labelled samples; every client is empty")
    if kind == "uniform":
        return np.full(num_classes, 1.0 / num_classes)
    if kind == "global":
        return counts.sum(axis=0) / totals.sum()
    if kind == "unweighted_mean":
        return (counts[totals > 0] / totals[totals > 0, None]).mean(axis=0)
    if kind == "explicit":
        vec = np.asarray(explicit, dtype=np.float64)
        if vec.shape != (num_classes,):
            raise ConfigError(f"algorithm.disco.target_vector has {vec.size} values but the dataset "
                              f"has {num_classes} classes; give one value per class")
        if not np.isfinite(vec).all() or (vec < 0).any() or not vec.sum() > 0:
            raise ConfigError("algorithm.disco.target_vector must be finite, non-negative and sum "
                              "to a positive number")
        return vec / vec.sum()
    raise ConfigError(f"algorithm.disco.target = {kind!r} is not valid; choose one of {TARGETS}")


def discrepancy(counts: np.ndarray, target: np.ndarray, metric: str) -> np.ndarray:
    """Raw discrepancy d_k = e(D_k, T), shape (K,), float64, non-negative.

    ``counts`` (K, C) gives D_k = counts_k / counts_k.sum(); ``target`` is T, (C,).
    kl = sum_c D log(D / T) (natural log, 0 log 0 = 0); l1 = sum |D - T|;
    l2 = sqrt(sum (D - T)^2); cosine = 1 - <D, T> / (|D| |T|). A client with no samples
    has no distribution and gets d = 0; :func:`disco_weights` refuses it as a participant.
    """
    counts = _as_counts(counts)
    target = np.asarray(target, dtype=np.float64)
    if target.shape != (counts.shape[1],):
        raise ConfigError(f"target has {target.size} entries but counts has {counts.shape[1]} classes")
    if metric not in _METRIC_FNS:
        raise ConfigError(f"algorithm.disco.metric = {metric!r} is not valid; choose one of {METRICS}")
    rows = counts.sum(axis=1) > 0
    dist = counts[rows] / counts[rows].sum(axis=1, keepdims=True)
    bad = np.argwhere((dist > 0) & (target == 0))
    if metric == "kl" and bad.size:
        k, c = np.flatnonzero(rows)[bad[0, 0]], bad[0, 1]
        raise ConfigError(f"KL(D_k || T) is infinite: client {k} holds class {c} but the target gives "
                          "it 0 mass; give every class positive target mass in "
                          "algorithm.disco.target_vector (or use metric = 'l1', 'l2' or 'cosine')")
    out = np.zeros(counts.shape[0])
    # every metric is >= 0; clip round-off (KL or cosine at D == T) so normalising never sees d < 0
    out[rows] = np.maximum(_METRIC_FNS[metric](dist, target), 0.0)
    return out


def disco_weights(sizes, d_raw, a: float = 0.5, b: float = 0.1,
                  normalize: bool = True) -> tuple[np.ndarray, dict]:
    """Aggregation weights of eq. 3 over one round's k participants.

    Parameters
    ----------
    sizes : (k,) positive sample counts |B_k|
    d_raw : (k,) non-negative raw discrepancies
    a, b : float >= 0
    normalize : divide d by its sum over these k participants (all 0 when that sum is 0)

    Returns
    -------
    p : (k,) float64, non-negative, summing to 1
    info : {"d_norm": (k,) the d used, "q": (k,) clipped scores, "zeroed": (k,) bool q <= 0,
        "fallback": bool, True when every q <= 0 and p is the size weights n}
    """
    sizes = np.asarray(sizes, dtype=np.float64)
    d_raw = np.asarray(d_raw, dtype=np.float64)
    if sizes.ndim != 1 or sizes.size == 0 or d_raw.shape != sizes.shape:
        raise ConfigError(f"FedDisco weights need equal-length, non-empty sizes and discrepancies; "
                          f"got shapes {sizes.shape} and {d_raw.shape}")
    if not (np.isfinite(sizes).all() and (sizes > 0).all()):
        raise ConfigError("FedDisco weights need a positive sample count for every participant; "
                          "use a partition that leaves no client empty")
    if not (np.isfinite(d_raw).all() and (d_raw >= 0).all()):
        raise ConfigError("FedDisco discrepancies must be finite and non-negative")
    n = sizes / sizes.sum()
    total = d_raw.sum()
    d = d_raw.copy() if not normalize else d_raw / total if total > 0 else np.zeros_like(d_raw)
    q = np.maximum(n - a * d + b, 0.0)
    fallback = not q.sum() > 0
    # a = b = 0 is FedAvg: q == n, but q / q.sum() can differ from n in the last bit
    p = n.copy() if fallback or (a == 0 and b == 0) else q / q.sum()
    return p, {"d_norm": d, "q": q, "zeroed": q <= 0, "fallback": bool(fallback)}


class DiscoWeights(Policy):
    """``weights = "disco"``: p_k proportional to ReLU(n_k - a d_k + b) over each round's participants.

    Setup (once): the target distribution (uniform, explicit, or the global label
    distribution from one exact reduction of the ranks' label histograms); each rank
    computes the raw discrepancy of the clients it owns, and one gather gives every rank
    all of them. Per round: :func:`disco_weights` over the sampled set, the same on every
    rank. Combines with every local solver, steps policy and server rule (FedNova's
    tau_eff becomes sum p ||a||_1, i.e. sum p tau under plain SGD; SCAFFOLD's control
    variates stay unweighted).
    """

    client_fields = {
        "disco_d": Field(np.float64, "1", "FedDisco discrepancy normalised over the round's participants"),
        "disco_d_raw": Field(np.float64, "1", "FedDisco raw discrepancy of the client's label distribution"),
    }
    round_fields = {"disco_fallback": Field(np.int8, "flag", "FedDisco fallback: 1 if every ReLU term was 0 and size weights were used")}

    def __init__(self, opts: DiscoOptions):
        self.opts = opts
        self.d_raw: np.ndarray | None = None   # (N,) raw discrepancy of every client
        self.info: dict = {}

    def setup(self, ctx) -> None:
        o, counts = self.opts, ctx.class_counts
        if o.target == "global":   # sum of label histograms: integers, so the reduction is exact
            hist = ctx.collective.sum_int("disco_label_histogram", counts[ctx.owned].sum(0))
            target = hist / hist.sum()
        else:
            target = target_distribution(o.target, counts, o.target_vector)
        d_mine = discrepancy(counts[ctx.owned], target, o.metric)   # computed "client side"
        self.d_raw = ctx.collective.gather("disco_discrepancy", ctx.owned, d_mine[:, None],
                                           len(ctx.all_sizes))[:, 0]

    def weights(self, ctx) -> np.ndarray:
        o = self.opts
        p, self.info = disco_weights(ctx.sizes, self.d_raw[ctx.cohort], o.a, o.b, o.normalize)
        if self.info["fallback"]:
            ctx.log(f"FedDisco: every ReLU(n - a d + b) term is 0 (a = {o.a:g}, b = {o.b:g}); "
                    f"using size weights this round")
        return p

    def client_records(self, ctx) -> dict:
        return {"disco_d": self.info["d_norm"], "disco_d_raw": self.d_raw[ctx.cohort]}

    def round_records(self, ctx) -> dict:
        return {"disco_fallback": int(self.info["fallback"])}


def _as_counts(counts) -> np.ndarray:
    counts = np.asarray(counts)
    if counts.ndim != 2 or counts.shape[1] == 0 or (counts < 0).any():
        raise ConfigError(f"label counts must be a non-negative (clients, classes) matrix; "
                          f"got shape {counts.shape}")
    return counts
