"""Which clients take part in a round, and how sampling turns policy weights into p_i.

Sampling probabilities are the sampler's own; aggregation weights are the weights
policy's (computed over the sampled set every round). The three schemes of FedNova's
appendix (Wang et al. 2020, Alg. 1 and the two unbiased variants), and one variant:

- ``uniform``: q clients uniformly without replacement (or all); p_i is the weights
  policy's value, and the server divides by the cohort's weight sum.
- ``with_replacement``: q draws with probability proportional to the static weights
  (client sizes for ``weights = "size"``, equal for ``"uniform"``); each draw is trained
  as its own instance (same data, its own randomness, keyed by the draw) with weight
  1/q. This is FedNova's App. G scheme, x+ - x = -tau_eff sum_{j=1..q} (1/q) eta d_{l_j},
  and scheme I of Li et al. (ICLR 2020), which FedLGA's theory uses. The cohort then
  lists a client once per draw. ``with_replacement_draws`` is an alias of it.
- ``with_replacement_merged``: the same q draws, but a client drawn k times trains once
  with weight k/q (its k updates would be identical only for a deterministic solver);
  the cohort is unique, so per-client state (SCAFFOLD, VR, FedDyn) can follow it.
- ``unbiased``: q clients uniformly without replacement, p_i = w_i / sum_all w * N / q,
  and the server does not renormalise.

All but ``uniform`` are defined for the static policies only (size, uniform).
"""

from __future__ import annotations

import numpy as np

from .. import rng

STATIC_WEIGHTS = ("size", "uniform")
SCHEMES = ("uniform", "with_replacement", "with_replacement_merged", "unbiased")
ALIASES = {"with_replacement_draws": "with_replacement"}   # the name of the per-draw scheme until issue 14


def canonical(scheme: str) -> str:
    """The scheme a job's ``algorithm.sampling`` value names (resolves aliases)."""
    return ALIASES.get(scheme, scheme)


def sample_cohort(seed: int, rnd: int, num_clients: int, per_round: int) -> np.ndarray:
    """Sorted ids of the clients in round ``rnd``: uniform without replacement, or all."""
    if per_round == 0 or per_round >= num_clients:
        return np.arange(num_clients, dtype=np.int64)
    gen = rng.numpy_rng(seed, rng.COHORT, rnd)
    return np.sort(gen.choice(num_clients, size=per_round, replace=False)).astype(np.int64)


class Sampler:
    """Cohorts and the sampling factor of each member.

    Parameters
    ----------
    scheme : {"uniform", "with_replacement", "with_replacement_merged", "unbiased"}
        or an alias of one (``with_replacement_draws``).
    per_round : int
        q, clients (or draws) per round; 0 means every client.
    seed : int
    static_weights : (N,) float64
        w_i of a static weights policy over all clients (sampling probabilities of the
        with-replacement schemes, and the normaliser of ``unbiased``).
    """

    def __init__(self, scheme: str, per_round: int, seed: int, static_weights: np.ndarray):
        self.scheme, self.q, self.seed = canonical(scheme), per_round, seed
        if self.scheme not in SCHEMES:
            raise ValueError(f"unknown sampling scheme {scheme!r}; choose one of {', '.join(SCHEMES)}")
        self.static = np.asarray(static_weights, dtype=np.float64)
        self.normalize = self.scheme != "unbiased"
        self._total = self.static.sum()   # once: no round does O(N) work
        self._cdf_cache = None            # built by the first with-replacement draw

    def _cdf(self) -> np.ndarray:
        """(N,) the sampling probabilities' normalised cumulative sum, computed once: drawing q
        clients is then O(q log N) a round, not O(N). It is what ``Generator.choice(n, q,
        replace=True, p=static / static.sum())`` computes in every call, and the draws that
        follow (``random(q)``, a right-sided search) are choice's too: the same cohorts, bitwise
        (tests/unit/test_sampling.py checks against choice itself)."""
        if self._cdf_cache is None:
            cdf = (self.static / self._total).cumsum()
            cdf /= cdf[-1]
            self._cdf_cache = cdf
        return self._cdf_cache

    def cohort(self, rnd: int) -> tuple[np.ndarray, np.ndarray | None]:
        """(sorted cohort ids, draw counts or None); ids are unique except under
        ``with_replacement``, which lists a client once per draw."""
        n = len(self.static)
        if self.scheme in ("with_replacement", "with_replacement_merged"):
            # Both schemes take the same draws from the same key: they differ only in how a
            # repeated client is trained, so a job can switch between them and keep its cohorts.
            gen = rng.numpy_rng(self.seed, rng.COHORT, rnd)
            draws = self._cdf().searchsorted(gen.random(self.q), side="right").astype(np.int64)
            if self.scheme == "with_replacement":
                return np.sort(draws).astype(np.int64), None
            cohort, counts = np.unique(draws, return_counts=True)
            return cohort.astype(np.int64), counts
        return sample_cohort(self.seed, rnd, n, self.q), None

    def weights(self, policy_weights: np.ndarray, cohort: np.ndarray, draws: np.ndarray | None) -> np.ndarray:
        """Aggregation weights (k,) from the weights policy's values for the cohort."""
        if self.scheme == "with_replacement_merged":
            return draws / self.q
        if self.scheme == "with_replacement":
            return np.full(len(cohort), 1.0 / self.q)
        if self.scheme == "unbiased":
            return self.static[cohort] / self._total * len(self.static) / self.q
        return policy_weights
