"""``[system]`` options: the simulated device population and round protocol.

Flat keys, one group per quantity. ``<q>_dist`` picks the distribution of a per-client
static quantity ``q`` in {compute, uplink, downlink}; the other keys of the group are its
parameters:

- ``constant``: every client gets the mean key (``compute_s``, ``uplink_mbps``,
  ``downlink_mbps``; bandwidths may be ``inf`` = instantaneous transfer).
- ``uniform``: U[``<q>_low_*``, ``<q>_high_*``] (both required, finite, low <= high).
- ``lognormal``: mean * exp(sigma Z - sigma^2 / 2), Z ~ N(0, 1), with sigma =
  ``<q>_sigma`` (required); the arithmetic mean stays the mean key.
- ``trace``: the client's row of the CSV file ``trace`` (see :mod:`hpcfl.system.trace`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

STATIC_DISTS = ("constant", "uniform", "lognormal", "trace")

# Seconds per local SGD iteration (``compute_s`` with ``compute_unit = "step"``) of the
# m5.large clients of GIFT's testbed (Chen et al. 2023, "GIFT: Toward Accurate and Efficient
# Federated Learning With Gradient-Instructed Frequency Tuning", Table II), for job files
# that reproduce it. The paper reports hours only, so c is solved from its FedAvg rows
# (tau = 100, 1000 rounds, 5 Mbit/s uplink, free downlink, no delay): one round takes
# t_up + 100 c with t_up = 32 M / 5e6 s (M fp32 parameters), hence
# c = (hours * 3600 / 1000 - t_up) / 100:
#   lenet5    M = 62,006      t_up = 0.397 s   1.56 h -> 5.616 s/round  -> c = 0.05219
#   vgg16     M = 14,728,266  t_up = 94.26 s   81.9 h -> 294.84 s/round -> c = 2.0058
#   kws_lstm  M = 61,066      t_up = 0.391 s   3.14 h -> 11.304 s/round -> c = 0.10913
# (LeNet-5 and VGG-16 in their CIFAR-10 variants, VGG-16 with batch norm; the LSTM has 2
# layers of 64 on 40 input features.) A reporting delay whose K-th order statistic has mean d
# would have to be subtracted from the per-round time first.
CALIBRATED_COMPUTE_S = {"lenet5": 0.05219, "vgg16": 2.0058, "kws_lstm": 0.10913}

# quantity -> (mean key, low key, high key, sigma key)
GROUPS = {
    "compute": ("compute_s", "compute_low_s", "compute_high_s", "compute_sigma"),
    "uplink": ("uplink_mbps", "uplink_low_mbps", "uplink_high_mbps", "uplink_sigma"),
    "downlink": ("downlink_mbps", "downlink_low_mbps", "downlink_high_mbps", "downlink_sigma"),
}


def _pos(help_text: str):
    """An optional positive number (unset by default) with its ``hpcfl config`` help line."""
    return field(default=None, metadata={"gt": 0, "help": help_text})


@dataclass(frozen=True)
class SystemOptions:
    """Options of the simulated clock (TOML table ``[system]``); see ``hpcfl.system``."""

    enabled: bool = field(default=False, metadata={
        "help": "turn the simulated clock on; false: planned steps run, nobody drops out, sim_time stays 0"})
    # per-client compute speed (static, keyed by (seed, client))
    compute_unit: str = field(default="step", metadata={
        "choices": ("step", "sample"),
        "help": "compute times are seconds per local step (step) or per training sample (sample)"})
    compute_dist: str = field(default="constant", metadata={
        "choices": STATIC_DISTS, "help": "per-client compute time: constant (compute_s), uniform (low..high), "
                                         "lognormal (sigma), trace (CSV)"})
    compute_s: float = field(default=0.1, metadata={
        "gt": 0, "help": "mean compute seconds per step or per sample (compute_unit)"})
    compute_low_s: Optional[float] = _pos("lower bound of compute_dist = 'uniform', seconds; unset: none")
    compute_high_s: Optional[float] = _pos("upper bound of compute_dist = 'uniform', seconds; unset: none")
    compute_sigma: Optional[float] = field(default=None, metadata={
        "ge": 0, "help": "std of the log for compute_dist = 'lognormal' (the mean stays compute_s); unset: none"})
    # per-client bandwidths in megabits per second (inf = instantaneous)
    uplink_dist: str = field(default="constant", metadata={
        "choices": STATIC_DISTS, "help": "per-client uplink bandwidth: constant (uplink_mbps), uniform, lognormal, "
                                         "trace"})
    uplink_mbps: float = field(default=5.0, metadata={
        "gt": 0, "inf": True, "help": "mean uplink bandwidth, Mbit/s; inf: uploads take no time"})
    uplink_low_mbps: Optional[float] = _pos("lower bound of uplink_dist = 'uniform', Mbit/s; unset: none")
    uplink_high_mbps: Optional[float] = _pos("upper bound of uplink_dist = 'uniform', Mbit/s; unset: none")
    uplink_sigma: Optional[float] = field(default=None, metadata={
        "ge": 0, "help": "std of the log for uplink_dist = 'lognormal'; unset: none"})
    downlink_dist: str = field(default="constant", metadata={
        "choices": STATIC_DISTS, "help": "per-client downlink bandwidth: constant (downlink_mbps), uniform, "
                                         "lognormal, trace"})
    downlink_mbps: float = field(default=math.inf, metadata={
        "gt": 0, "inf": True, "help": "mean downlink bandwidth, Mbit/s; inf: downloads take no time"})
    downlink_low_mbps: Optional[float] = _pos("lower bound of downlink_dist = 'uniform', Mbit/s; unset: none")
    downlink_high_mbps: Optional[float] = _pos("upper bound of downlink_dist = 'uniform', Mbit/s; unset: none")
    downlink_sigma: Optional[float] = field(default=None, metadata={
        "ge": 0, "help": "std of the log for downlink_dist = 'lognormal'; unset: none"})
    trace: Optional[str] = field(default=None, metadata={
        "help": "CSV of client profiles for *_dist = 'trace', relative to the job file; unset: none"})
    # per-round protocol and draws, keyed by (seed, round, client)
    deadline_s: Optional[float] = field(default=None, metadata={
        "gt": 0, "help": "round deadline, simulated seconds: clients run the steps that fit, or drop out; unset: no "
                         "deadline"})
    truncate: str = field(default="step", metadata={
        "choices": ("step", "epoch"),
        "help": "a client cut by the deadline keeps the steps that fit (step) or only its whole local epochs "
                "(epoch: multiples of ceil(n_i / B) steps)"})
    unavailability: float = field(default=0.0, metadata={
        "ge": 0, "le": 1, "help": "probability that a client is unavailable in a round"})
    slowdown_dist: str = field(default="none", metadata={
        "choices": ("none", "uniform"),
        "help": "per-round slowdown factor xi: none (1) or uniform on (slowdown_min, 1]; a step takes c_i / xi"})
    slowdown_min: float = field(default=0.5, metadata={
        "gt": 0, "le": 1, "help": "smallest slowdown factor for slowdown_dist = 'uniform'"})
    delay_dist: str = field(default="none", metadata={
        "choices": ("none", "constant", "uniform", "exponential"),
        "help": "reporting delay per client and round: none, constant (delay_s), uniform "
                "(delay_low_s..delay_high_s), exponential (mean delay_s)"})
    delay_s: float = field(default=0.0, metadata={
        "ge": 0, "help": "delay for delay_dist = 'constant', or its mean for 'exponential', seconds"})
    delay_low_s: Optional[float] = field(default=None, metadata={
        "ge": 0, "help": "lower bound of delay_dist = 'uniform', seconds; unset: none"})
    delay_high_s: Optional[float] = field(default=None, metadata={
        "ge": 0, "help": "upper bound of delay_dist = 'uniform', seconds; unset: none"})
    server_s: float = field(default=0.0, metadata={"ge": 0, "help": "server aggregation seconds added to every round"})
    earliest_fraction: float = field(default=1.0, metadata={
        "gt": 0, "le": 1, "help": "the server closes a round at the first ceil(fraction * cohort) reports, the "
                                  "rest are late and not trained (GIFT: 0.4); 1: wait for every participant"})

    def uses_trace(self) -> bool:
        return "trace" in (self.compute_dist, self.uplink_dist, self.downlink_dist)

    def validate(self) -> list[str]:
        out = []
        for q, (mean, low, high, sigma) in GROUPS.items():
            dist = getattr(self, f"{q}_dist")
            key = f"system.{q}_dist = {dist!r}"
            if q == "compute" and not math.isfinite(self.compute_s):
                out.append(f"system.compute_s = {self.compute_s} must be finite")
            if dist == "uniform":
                lo, hi = getattr(self, low), getattr(self, high)
                if lo is None or hi is None:
                    out.append(f"{key} needs system.{low} and system.{high}; set both")
                elif not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
                    out.append(
                        f"system.{low} = {lo} and system.{high} = {hi} must be finite "
                        f"with {low} <= {high}"
                    )
            elif dist == "lognormal":
                if getattr(self, sigma) is None:
                    out.append(f"{key} needs system.{sigma} (std of the log); set it")
                if not math.isfinite(getattr(self, mean)):
                    out.append(f"{key} needs a finite system.{mean} (the mean)")
            elif dist == "trace" and self.trace is None:
                out.append(f"{key} needs system.trace = \"path/to/trace.csv\"")
        if self.trace is not None and not self.uses_trace():
            out.append(
                "system.trace is set but no system.*_dist is 'trace'; set compute_dist, "
                "uplink_dist and/or downlink_dist = \"trace\", or remove system.trace"
            )
        if self.delay_dist == "uniform":
            lo, hi = self.delay_low_s, self.delay_high_s
            if lo is None or hi is None:
                out.append(
                    "system.delay_dist = 'uniform' needs system.delay_low_s and "
                    "system.delay_high_s; set both"
                )
            elif not math.isfinite(hi) or lo > hi:
                out.append(
                    f"system.delay_low_s = {lo} and system.delay_high_s = {hi} must be "
                    "finite with delay_low_s <= delay_high_s"
                )
        if self.delay_dist in ("constant", "exponential") and not math.isfinite(self.delay_s):
            out.append(f"system.delay_s = {self.delay_s} must be finite")
        if self.earliest_fraction < 1.0 and not self.enabled:
            # without the clock nobody arrives first: the cut would silently not happen
            out.append(
                f"system.earliest_fraction = {self.earliest_fraction} needs the simulated clock "
                "(arrival times decide who reports first); set system.enabled = true, or remove "
                "earliest_fraction to wait for every client"
            )
        return out
