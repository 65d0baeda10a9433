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

# quantity -> (mean key, low key, high key, sigma key)
GROUPS = {
    "compute": ("compute_s", "compute_low_s", "compute_high_s", "compute_sigma"),
    "uplink": ("uplink_mbps", "uplink_low_mbps", "uplink_high_mbps", "uplink_sigma"),
    "downlink": ("downlink_mbps", "downlink_low_mbps", "downlink_high_mbps", "downlink_sigma"),
}


def _pos(**extra):
    return field(default=None, metadata={"gt": 0, **extra})


@dataclass(frozen=True)
class SystemOptions:
    """Options of the simulated clock (TOML table ``[system]``); see ``hpcfl.system``."""

    enabled: bool = False
    # per-client compute speed (static, keyed by (seed, client))
    compute_unit: str = field(default="step", metadata={"choices": ("step", "sample")})
    compute_dist: str = field(default="constant", metadata={"choices": STATIC_DISTS})
    compute_s: float = field(default=0.1, metadata={"gt": 0})
    compute_low_s: Optional[float] = _pos()
    compute_high_s: Optional[float] = _pos()
    compute_sigma: Optional[float] = field(default=None, metadata={"ge": 0})
    # per-client bandwidths in megabits per second (inf = instantaneous)
    uplink_dist: str = field(default="constant", metadata={"choices": STATIC_DISTS})
    uplink_mbps: float = field(default=5.0, metadata={"gt": 0})
    uplink_low_mbps: Optional[float] = _pos()
    uplink_high_mbps: Optional[float] = _pos()
    uplink_sigma: Optional[float] = field(default=None, metadata={"ge": 0})
    downlink_dist: str = field(default="constant", metadata={"choices": STATIC_DISTS})
    downlink_mbps: float = field(default=math.inf, metadata={"gt": 0})
    downlink_low_mbps: Optional[float] = _pos()
    downlink_high_mbps: Optional[float] = _pos()
    downlink_sigma: Optional[float] = field(default=None, metadata={"ge": 0})
    trace: Optional[str] = None
    # per-round protocol and draws, keyed by (seed, round, client)
    deadline_s: Optional[float] = field(default=None, metadata={"gt": 0})
    unavailability: float = field(default=0.0, metadata={"ge": 0, "le": 1})
    slowdown_dist: str = field(default="none", metadata={"choices": ("none", "uniform")})
    slowdown_min: float = field(default=0.5, metadata={"gt": 0, "le": 1})
    delay_dist: str = field(
        default="none", metadata={"choices": ("none", "constant", "uniform", "exponential")}
    )
    delay_s: float = field(default=0.0, metadata={"ge": 0})
    delay_low_s: Optional[float] = field(default=None, metadata={"ge": 0})
    delay_high_s: Optional[float] = field(default=None, metadata={"ge": 0})
    server_s: float = field(default=0.0, metadata={"ge": 0})

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
        return out
