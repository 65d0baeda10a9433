"""FedGSNR's closed forms: global statistics, optimal local steps, GSNR, step allocation.

Reference: FedGSNR (Accelerating FL on non-iid data via maximum gradient signal-to-noise
ratio), eqs. 8-9 (global statistics), Theorem 3.7 (optimal local steps) and Definition 4.1
(GSNR), diagonal-covariance form. A client's statistics are the mean mu and biased (1/B)
per-coordinate variance v of B per-sample gradients, shape (d,). With a = [mu ; sqrt(v/B)]
(length 2d): L = ||a_g||^2, M = <a_l, a_g>, N = ||a_l||^2. Pure float64 numpy, so every
rank computes bit-identical values.
"""

from __future__ import annotations

import numpy as np

# Guards 1 - cos^2 = 0 (a_l parallel to a_g); the r_max cap then applies.
_EPS = np.finfo(np.float64).tiny


def global_moments(sum_pmu: np.ndarray, sum_pq: np.ndarray, sum_p: float) -> tuple[np.ndarray, np.ndarray]:
    """Global mean and diagonal variance from weighted client sums (eqs. 8-9, one pass).

    Parameters
    ----------
    sum_pmu, sum_pq : ndarray, shape (d,)
        sum_k p_k mu_k and sum_k p_k (v_k + mu_k^2) (total variance without a second pass).
    sum_p : float
        sum_k p_k > 0; the weights need not be normalised.

    Returns
    -------
    mu_g, v_g : ndarray, shape (d,), float64
        v_g is clamped at 0: E[g^2] - mu^2 can cancel to a tiny negative value.
    """
    pmu, pq = np.asarray(sum_pmu, dtype=np.float64), np.asarray(sum_pq, dtype=np.float64)
    if not sum_p > 0 or pmu.shape != pq.shape:
        raise ValueError(f"need sum_p > 0 and sums of one shape, got {sum_p}, {pmu.shape}, {pq.shape}")
    mu_g = pmu / sum_p
    return mu_g, np.maximum(pq / sum_p - mu_g * mu_g, 0.0)


def optimal_steps(mu_l, v_l, mu_g, v_g, batch: int, r_max: float = 1e6) -> dict:
    """Theorem 3.7 (n_opt, Delta^2) and Definition 4.1 (GSNR) for one client.

    Parameters
    ----------
    mu_l, v_l, mu_g, v_g : ndarray, shape (d,)
        The client's and the global (:func:`global_moments`) statistics; v >= 0.
    batch : int
        B, the mini-batch size of the local SGD step (``algorithm.batch_size``): one step's gradient
        noise has covariance Sigma / B, so the variances enter L, M, N divided by B. It is not the
        number of per-sample gradients behind ``mu`` and ``v`` (``stat_batch``, which only sets how
        well they are estimated); the spec's B equals the batch size in the paper's experiments.
    r_max : float
        Cap on the GSNR, reached when a_l is parallel to a_g (r = inf in theory).

    Returns
    -------
    dict of float
        ``n_opt`` = max(0, M/N) (0 when N = 0), the local steps that best emulate one
        global step; ``gsnr`` = max(0, cot theta) with cos theta = M / sqrt(L N);
        ``L``, ``M``, ``N`` (units: gradient^2); ``delta2`` = L - M^2/N if M > 0 else L,
        the minimal squared W2 distance divided by lr^2.
    """
    mu_l, v_l, mu_g, v_g = (np.asarray(a, dtype=np.float64) for a in (mu_l, v_l, mu_g, v_g))
    if not mu_l.shape == v_l.shape == mu_g.shape == v_g.shape or mu_l.ndim != 1 or batch <= 0:
        raise ValueError(f"need (d,) vectors and batch > 0, got {mu_l.shape}, {v_l.shape}, "
                         f"{mu_g.shape}, {v_g.shape}, batch {batch}")
    L = float(mu_g @ mu_g + v_g.sum() / batch)
    M = float(mu_l @ mu_g + np.sqrt(v_l * v_g).sum() / batch)
    N = float(mu_l @ mu_l + v_l.sum() / batch)
    n_opt = max(0.0, M / N) if N > 0 else 0.0
    # L N >= M^2 (Cauchy-Schwarz), so Delta^2 >= 0; clamp the rounding residue.
    delta2 = max(L - M * M / N, 0.0) if M > 0 else L
    c = M / (np.sqrt(L) * np.sqrt(N)) if L > 0 and N > 0 else 0.0
    c = min(max(c, -1.0), 1.0)
    gsnr = 0.0 if c <= 0 else min(c / np.sqrt(max(1.0 - c * c, _EPS)), r_max)
    return {"n_opt": float(n_opt), "gsnr": float(gsnr), "L": L, "M": M, "N": N, "delta2": float(delta2)}


def _check_nopt(n_opt, e_min: int = 0, e_max: int = 0, scale: float = 0) -> np.ndarray:
    n = np.asarray(n_opt, dtype=np.float64)
    if n.ndim != 1 or not np.isfinite(n).all() or (n < 0).any():
        raise ValueError(f"n_opt must be a vector of finite non-negative numbers, got {n_opt!r}")
    if e_min < 0 or e_max < 0 or (e_max and e_max < e_min) or not 0 <= scale < np.inf:
        raise ValueError(f"need 0 <= e_min <= e_max (or e_max = 0: no cap) and a finite "
                         f"e_const or m >= 0; got {e_min}, {e_max}, {scale}")
    return n


def allocate_steps(n_opt: np.ndarray, e_const: int, e_min: int = 1, e_max: int = 0,
                   exclude_zero: bool = True) -> np.ndarray:
    """Share a budget of N e_const local steps in proportion to n_opt (the paper's section 5).

    E_k = N e_const n_opt,k / sum_i n_opt,i by largest-remainder rounding (floors, then one
    step each to the largest fractional parts, ties to the lower index), clipped to
    [e_min, e_max] where n_opt > 0 (clipping can move sum E off the budget). All-zero n_opt
    falls back to e_const for everyone (the base algorithm's round).

    Parameters
    ----------
    n_opt : ndarray, shape (N,)
        Non-negative step multipliers of the round's N clients.
    e_const : int
        Baseline steps per client (E_const).
    e_min, e_max : int
        Bounds where n_opt > 0; e_max = 0: no cap beyond the budget.
    exclude_zero : bool
        n_opt = 0 gets 0 steps (the client sits out the round) if true, else e_min.

    Returns
    -------
    ndarray, shape (N,), int64
    """
    n = _check_nopt(n_opt, e_min, e_max, e_const)
    active = n > 0
    if not active.any():
        return np.full(len(n), e_const, dtype=np.int64)
    budget = len(n) * int(e_const)
    share = np.zeros(len(n))
    share[active] = budget * n[active] / n[active].sum()
    steps = np.floor(share).astype(np.int64)
    # Floating-point shares may floor one below their exact value (19.999... -> 19); that
    # step comes back through the remainder of nearly 1, so sum E is still the budget.
    left = min(max(budget - int(steps.sum()), 0), len(n))
    steps[np.argsort(-(share - steps), kind="stable")[:left]] += 1
    steps[active] = np.clip(steps[active], e_min, e_max if e_max > 0 else max(budget, e_min))
    steps[~active] = 0 if exclude_zero else e_min
    return steps


def scaled_steps(n_opt, m: float, e_min: int = 1, e_max: int = 0, exclude_zero: bool = True) -> np.ndarray:
    """Literal Algorithm 1: E_k = clip(rint(m n_opt,k), e_min, e_max) for n_opt,k > 0.

    Parameters as :func:`allocate_steps` (e_max = 0: no upper bound), with m the number of
    ideal global steps a round emulates (Corollary 3.8: n_m = m n_1) instead of a budget.
    ``np.rint`` rounds halves to even. Returns ndarray, shape (N,), int64.
    """
    n = _check_nopt(n_opt, e_min, e_max, m)
    active = n > 0
    steps = np.clip(np.rint(m * n), e_min, e_max if e_max > 0 else np.inf)
    steps[~active] = 0 if exclude_zero else e_min
    return steps.astype(np.int64)


def allocation_entropy(n_opt) -> tuple[float, float]:
    """Entropy of the allocation q = n_opt / sum n_opt (the paper's Fig. 3 diagnostic).

    Parameters
    ----------
    n_opt : ndarray, shape (N,)

    Returns
    -------
    (H, H / ln N) : float, float
        H = -sum q ln q in nats (0 ln 0 = 0); H / ln N is 1.0 when N = 1. (0.0, 0.0) when
        every n_opt is zero (no allocation to measure).
    """
    n = _check_nopt(n_opt)
    total = n.sum()
    if not total > 0:
        return 0.0, 0.0
    q = n[n > 0] / total
    h = float(0.0 - (q * np.log(q)).sum())  # 0.0 - x, not -x: a one-hot gives +0.0, not -0.0
    return h, (h / np.log(len(n)) if len(n) > 1 else 1.0)
