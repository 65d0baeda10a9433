"""FedNova's diagnostics of one round's local work (Wang et al. 2020, Sec. 4, Theorems 1-2).

Every local solver of hpcfl changes client i's model by Delta_i = -eta sum_k a_{i,k} g_{i,k}
(:mod:`hpcfl.algorithms.local`). Averaging the raw Delta_i with weights p_i, as FedAvg and
FedProx do, is the paper's general rule (4) with

    tau_eff = sum_i p_i ||a_i||_1,      w_i = p_i ||a_i||_1 / tau_eff          (Eqs. 5-6)

so those algorithms minimise the surrogate sum_i w_i F_i instead of sum_i p_i F_i. The
quantities below measure that: the distance of w from p that sets the non-vanishing error
of Theorem 2, the slowdown in the first term of Theorem 1, and the constants A, B, C of its
variance and drift terms (Eq. 9). They describe the local work of the round whatever the
server rule: FedNova itself aggregates with w = p, and what is reported for it is what
averaging the same updates would have done.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PREFIX = "nova_"


@dataclass(frozen=True)
class NovaDiagnostics:
    """One round's diagnostics (see :func:`nova_diagnostics` for the equations).

    Attributes
    ----------
    tau_eff : float
        Implicit effective steps sum_i p_i ||a_i||_1 (steps).
    w : numpy.ndarray, shape (m,)
        Implicit aggregation weights of averaging, summing to 1.
    chi2 : float
        chi^2 divergence of p from w (Theorem 2).
    slowdown : float
        tau_bar / tau_eff (Theorem 1, first term).
    A, B, C : float
        Theorem 1's constants (Eq. 9).
    """

    tau_eff: float
    w: np.ndarray
    chi2: float
    slowdown: float
    A: float
    B: float
    C: float

    def metrics(self) -> dict[str, float]:
        """The per-round metrics ``nova_tau_eff``, ``nova_chi2``, ``nova_slowdown``, ``nova_A/B/C``."""
        names = ("tau_eff", "chi2", "slowdown", "A", "B", "C")
        return {PREFIX + n: float(getattr(self, n)) for n in names}


def nova_diagnostics(p, tau, anorm, anorm2, alast) -> NovaDiagnostics:
    """Diagnostics of the m clients that reported in one round.

    Parameters
    ----------
    p : array_like, shape (m,)
        Their aggregation weights (any positive scale; normalised here to sum to 1).
    tau : array_like, shape (m,)
        Local steps tau_i.
    anorm, anorm2, alast : array_like, shape (m,)
        ||a_i||_1, ||a_i||_2^2 and the last coefficient a_{i,-1} of each client's
        gradient-accumulation vector (:class:`hpcfl.algorithms.local.LocalSolver`).

    Returns
    -------
    NovaDiagnostics
        With p normalised and m = len(p) (Wang et al. 2020, Eqs. 5-6, 8-10)::

            tau_eff  = sum_i p_i ||a_i||_1
            w_i      = p_i ||a_i||_1 / tau_eff
            chi2     = sum_i (p_i - w_i)^2 / w_i                        chi^2_{p||w}, Theorem 2
            slowdown = tau_bar / tau_eff,  tau_bar = (1/m) sum_i tau_i  Theorem 1's tau_bar
            A        = m tau_eff sum_i w_i^2 ||a_i||_2^2 / ||a_i||_1^2
            B        = sum_i w_i (||a_i||_2^2 - a_{i,-1}^2)
            C        = max_i (||a_i||_1^2 - ||a_i||_1 a_{i,-1})

        A client with p_i = 0 has w_i = 0 and adds nothing to chi2. With m = 0 every value
        is NaN. Under plain SGD (a_i = 1) these are the paper's FedAvg forms (Eq. 11):
        w_i = p_i tau_i / sum_j p_j tau_j, B = sum_i w_i (tau_i - 1), C = tau_max (tau_max - 1).
    """
    p, tau, a1, a2, last = (np.asarray(v, dtype=np.float64).reshape(-1) for v in (p, tau, anorm, anorm2, alast))
    m = p.size
    if not all(v.size == m for v in (tau, a1, a2, last)):
        raise ValueError(f"p, tau, anorm, anorm2 and alast need one value per client each; got sizes "
                         f"{[v.size for v in (p, tau, a1, a2, last)]}")
    if m == 0 or not p.sum() > 0:
        nan = float("nan")
        return NovaDiagnostics(nan, np.full(m, nan), nan, nan, nan, nan, nan)
    p = p / p.sum()
    # ||a_i||_1 > 0 for every solver with lr mu <= 1; beyond that the prox coefficients change sign and a
    # client's sum may be 0: its terms then read inf or NaN, once per round, without a warning each time.
    with np.errstate(divide="ignore", invalid="ignore"):
        tau_eff = float(p @ a1)
        w = p * a1 / tau_eff
        pos = p != 0      # p_i = 0 gives w_i = 0: the (0 - 0)^2 / 0 term of the divergence is 0
        chi2 = float(((p[pos] - w[pos]) ** 2 / w[pos]).sum())
        slowdown = float(tau.mean()) / tau_eff
        A = m * tau_eff * float((w**2 * a2 / a1**2).sum())
    B = float(w @ (a2 - last**2))
    C = float(np.max(a1**2 - a1 * last))
    return NovaDiagnostics(tau_eff, w, chi2, slowdown, A, B, C)
