"""Option tables of the policies whose own modules need torch: AFL and FedDyn.

They live here, torch-free, so that reading a job (``hpcfl config``, ``hpcfl run --help``,
``hpcfl report``) never imports torch; :mod:`hpcfl.algorithms.afl` and
:mod:`hpcfl.algorithms.feddyn` re-export them. Every other policy declares its options
beside its code, in a module that imports numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class AflOptions:
    """``[algorithm.afl]``: see :mod:`hpcfl.algorithms.afl`."""

    trial_rounds: int = field(default=10, metadata={"ge": 1, "help": "rounds at tau0 that estimate beta, rho, delta"})
    stat_batch: int = field(default=64, metadata={"gt": 0, "help": "samples per client for F_i and grad F_i"})
    phi: float = field(default=5e-5, metadata={
        "gt": 0, "help": "AFL's control parameter phi (its code: 0.025 for SVMs, 5e-5 for CNNs)"})
    tau_max: int = field(default=100, metadata={"ge": 1, "help": "largest tau considered"})
    budget_s: float = field(default=0.0, metadata={
        "ge": 0, "help": "time budget R in seconds; 0: the whole run at tau0, rounds x (c tau0 + b)"})
    compute_s: float = field(default=0.0, metadata={
        "ge": 0, "help": "c, seconds per local iteration, when [system] is off (else measured from the clock); "
                         "with comm_s also 0, time is counted in local iterations: c = 1, b = tau0"})
    comm_s: float = field(default=0.0, metadata={
        "ge": 0, "help": "b, seconds of communication per round, when [system] is off (else from the clock); "
                         "0 with compute_s 0: b = tau0 local iterations"})


@dataclass(frozen=True)
class DynOptions:
    """FedDyn's regularisation weight (``[algorithm.dyn]``, read by local and server)."""

    alpha: float = field(default=0.01, metadata={
        "gt": 0, "help": "FedDyn's alpha: the proximal weight of the local objective and the 1/alpha of the "
                         "server's h"})
