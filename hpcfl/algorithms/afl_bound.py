"""AFL's fixed local period tau*: the argmin over tau of its convergence bound G(tau).

Pure float64 math (no torch, no MPI), called on rank 0 by the ``steps = "afl"`` policy
(:mod:`hpcfl.algorithms.afl`). Wang, Tuor, Salonidis, Leung, Makaya, He, Chan, "Adaptive
Federated Learning in Resource Constrained Edge Computing Systems", IEEE JSAC 2019, and its
reference code's ControlAlgAdaptiveTauServer.
"""

from __future__ import annotations

import math

import numpy as np


def _afl_check(**kw) -> None:
    """Finite numbers with eta, phi, R > 0, tau >= 1 and the rest >= 0; c and b not both 0."""
    for name, x in kw.items():
        low, strict = {"eta": (0, True), "phi": (0, True), "R": (0, True), "tau": (1, False)}.get(name, (0, False))
        finite = isinstance(x, (int, float, np.integer, np.floating)) and math.isfinite(x)
        if not (finite and (x > low if strict else x >= low)):
            raise ValueError(f"AFL: {name} = {x!r} must be a finite number {'>' if strict else '>='} {low}")
    if "c" in kw and not kw["c"] + kw["b"] > 0:
        raise ValueError("AFL: c (seconds per local iteration) and b (seconds per aggregation) are both 0, "
                         "so T'(tau) is infinite; give at least one a positive value")


def afl_h(tau: float, eta: float, beta: float, delta: float) -> float:
    """h(tau) = (delta / beta)((eta beta + 1)^tau - 1) - eta delta tau; 0 at beta = 0 (the limit).

    With x = eta beta, h = delta eta sum_{k>=2} C(tau, k) x^(k-1); that series (exact, all
    terms >= 0) is used where tau x < 0.1, in which the closed form would cancel.
    """
    _afl_check(tau=tau, eta=eta, beta=beta, delta=delta)
    x = eta * beta
    if x == 0 or delta == 0:
        return 0.0
    if tau * x >= 0.1:
        return delta * math.expm1(tau * math.log1p(x)) / beta - eta * delta * tau
    term = tau * (tau - 1) / 2 * x              # C(tau, 2) x, then C(tau, k+1) x^k = C(tau, k) x^(k-1) (tau-k)/(k+1) x
    total, k = 0.0, 2
    while term != 0 and abs(term) > 1e-17 * abs(total) and k < 1000:
        total += term
        term *= (tau - k) / (k + 1) * x
        k += 1
    return delta * eta * total


def afl_G(tau: float, eta: float, beta: float, rho: float, delta: float, phi: float, c: float, b: float,
          R: float) -> float:
    """AFL's bound G(tau) = [1 + sqrt(1 + 4 T'^2 phi rho eta h / tau)] / (2 T' eta phi) + rho h,
    with T'(tau) = R tau / (c tau + b) (R: time budget, c: seconds per local iteration, b: per aggregation)."""
    _afl_check(tau=tau, eta=eta, beta=beta, rho=rho, delta=delta, phi=phi, c=c, b=b, R=R)
    h = afl_h(tau, eta, beta, delta)
    T = R * tau / (c * tau + b)
    return (1 + math.sqrt(1 + 4 * T * T * phi * rho * eta * h / tau)) / (2 * T * eta * phi) + rho * h


def afl_tau(eta: float, beta: float, rho: float, delta: float, phi: float, c: float, b: float, R: float,
            tau_max: int = 100) -> int:
    """tau* = argmin of :func:`afl_G` over 1..tau_max (ties: the smallest tau), fixed for the run."""
    if not (isinstance(tau_max, (int, np.integer)) and tau_max >= 1):
        raise ValueError(f"AFL: tau_max = {tau_max!r} must be an integer >= 1 (100 in the reference code)")
    G = [afl_G(t, eta, beta, rho, delta, phi, c, b, R) for t in range(1, int(tau_max) + 1)]
    return int(np.argmin(G)) + 1
