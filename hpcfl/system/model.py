"""The system model: per-client profiles, per-round draws and the round plan.

See the package docstring (``hpcfl.system``) for the rules and formulas.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .config import GROUPS, SystemOptions
from .keyed import KeyedUniform
from .trace import COMPUTE_COLUMN, read_trace

# stream ids (static draws are keyed by (seed, stream, client), per-round ones by
# (seed, stream, round, client))
STREAM_COMPUTE, STREAM_UPLINK, STREAM_DOWNLINK = 1, 2, 3
STREAM_AVAILABILITY, STREAM_SLOWDOWN, STREAM_DELAY = 11, 12, 13

# RoundPlan.reason codes
OK, UNAVAILABLE, DEADLINE, LATE, NO_STEPS = 0, 1, 2, 3, 4
REASONS = {OK: "ok", UNAVAILABLE: "unavailable", DEADLINE: "deadline", LATE: "late",
           NO_STEPS: "no_steps"}

# relative slack in floor(budget / step_s) so that e.g. 0.3 s / 0.1 s gives 3 steps, and in
# ceil(earliest_fraction * n) so that e.g. 0.07 * 100 = 7.000000000000001 gives 7
STEP_TOLERANCE = 1e-9


def earliest_count(fraction: float, n: int) -> int:
    """K = ceil(fraction * n), the reports that close a round of ``n`` sampled clients.

    The product is taken with a relative slack of ``STEP_TOLERANCE`` (a fraction written
    as 0.07 or 0.55 is not exact in binary) and K is at least 1 when ``n >= 1``.
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must lie in (0, 1], got {fraction}")
    if n < 1:
        return 0
    return max(1, math.ceil(fraction * n * (1.0 - STEP_TOLERANCE)))


@dataclass(frozen=True)
class RoundPlan:
    """What the cohort of one round does and how long the round lasts.

    All arrays are aligned with ``clients`` (the order given to :meth:`SystemModel.plan`)
    and read-only. Clients that do not participate (``dropped``) have ``steps == 0`` and
    all their times 0.

    Attributes
    ----------
    clients, planned, steps : int64
        Client ids, steps asked for, steps actually run (after the deadline).
    dropped : bool
        ``reason != OK``.
    reason : int8
        OK, UNAVAILABLE, DEADLINE (cannot fit one step / one granule), LATE (not among the
        ``k`` earliest, see :meth:`earliest`) or NO_STEPS (``planned == 0``).
    step_s : float64
        Effective seconds per local step this round (profile x batch / slowdown); also
        filled in for dropped clients (0 when the clock is disabled).
    download_s, compute_s, delay_s, upload_s, total_s : float64
        Per-client times; ``total_s`` is the arrival time at the server.
    duration_s : float
        Simulated length of the round (see the package docstring).
    """

    clients: np.ndarray
    planned: np.ndarray
    steps: np.ndarray
    dropped: np.ndarray
    reason: np.ndarray
    step_s: np.ndarray
    download_s: np.ndarray
    compute_s: np.ndarray
    delay_s: np.ndarray
    upload_s: np.ndarray
    total_s: np.ndarray
    duration_s: float
    server_s: float = 0.0

    def __post_init__(self):
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if isinstance(v, np.ndarray):
                v.flags.writeable = False

    @property
    def participants(self) -> np.ndarray:
        """Ids of the clients that run at least one step and report."""
        return self.clients[~self.dropped]

    @property
    def truncated(self) -> np.ndarray:
        """Mask of participants that run fewer steps than planned."""
        return ~self.dropped & (self.steps < self.planned)

    def earliest(self, k: int) -> "RoundPlan":
        """Keep the ``k`` participants that arrive first (ties: lower client id).

        The others become LATE (steps and times 0). When at least ``k`` participants
        exist the server closes the round at the k-th arrival:
        ``duration_s = k-th smallest total_s + server_s``, also when a deadline dropped
        someone (the server has its k reports and stops waiting). With fewer than ``k``
        participants nothing changes. (GIFT's "collect the 40% earliest" protocol.)
        """
        if int(k) < 1:
            raise ValueError(f"earliest(k) needs k >= 1, got {k}")
        part = np.flatnonzero(~self.dropped)
        if part.size < k:
            return self
        order = part[np.lexsort((self.clients[part], self.total_s[part]))]
        keep, late = order[:k], order[k:]
        arrays = {
            f.name: np.array(getattr(self, f.name))
            for f in dataclasses.fields(self)
            if isinstance(getattr(self, f.name), np.ndarray)
        }
        arrays["reason"][late] = LATE
        arrays["dropped"][late] = True
        for name in ("steps", "download_s", "compute_s", "delay_s", "upload_s", "total_s"):
            arrays[name][late] = 0
        duration = float(self.total_s[keep].max()) + self.server_s
        return RoundPlan(**arrays, duration_s=duration, server_s=self.server_s)


class SystemModel:
    """Simulated devices of a run; a pure function of ``(seed, round, client)``.

    Parameters
    ----------
    options : SystemOptions
    num_clients : int
        Population size; client ids are ``0 .. num_clients - 1``.
    seed : int
        Run seed (non-negative).
    model_bytes : int
        Size of the model on the wire; sets both transfer sizes unless overridden.
    upload_bytes, download_bytes : int, optional
        Bytes sent per participant up / down per round, when an algorithm sends more
        than one model (SCAFFOLD: 2 x model up; FedNova-VR: 2 x model down).
    base_dir : path, optional
        Directory a relative ``options.trace`` is resolved against (the job file's).
    """

    def __init__(self, options: SystemOptions, num_clients: int, seed: int, model_bytes: int,
                 *, upload_bytes: int | None = None, download_bytes: int | None = None,
                 base_dir: str | Path | None = None):
        if int(num_clients) < 1:
            raise ValueError(f"num_clients must be at least 1, got {num_clients}")
        for name, v in (("model_bytes", model_bytes), ("upload_bytes", upload_bytes),
                        ("download_bytes", download_bytes)):
            if v is not None and int(v) < 0:
                raise ValueError(f"{name} must be non-negative, got {v}")
        self.options = options
        self.num_clients = int(num_clients)
        self.seed = int(seed)
        self.upload_bytes = int(model_bytes if upload_bytes is None else upload_bytes)
        self.download_bytes = int(model_bytes if download_bytes is None else download_bytes)
        self._keyed = {s: KeyedUniform(self.seed, s) for s in (
            STREAM_COMPUTE, STREAM_UPLINK, STREAM_DOWNLINK,
            STREAM_AVAILABILITY, STREAM_SLOWDOWN, STREAM_DELAY)}
        self._trace = None
        if options.enabled and options.uses_trace():
            path = Path(options.trace)
            if base_dir is not None and not path.is_absolute():
                path = Path(base_dir) / path
            cols = []
            if options.compute_dist == "trace":
                cols.append(COMPUTE_COLUMN[options.compute_unit])
            cols += [f"{q}_mbps" for q in ("uplink", "downlink")
                     if getattr(options, f"{q}_dist") == "trace"]
            self._trace = read_trace(path, cols)

    # ---------------------------------------------------------------- helpers
    def _clients(self, clients) -> np.ndarray:
        c = np.asarray(clients)
        if c.ndim != 1 or (c.size and not np.issubdtype(c.dtype, np.integer)):
            raise ValueError("clients must be a 1-D array of integer client ids")
        c = c.astype(np.int64)
        if c.size and (c.min() < 0 or c.max() >= self.num_clients):
            raise ValueError(f"client ids must lie in [0, {self.num_clients - 1}]")
        return c

    def _static(self, q: str, stream: int, clients: np.ndarray) -> np.ndarray:
        o = self.options
        mean_key, low_key, high_key, sigma_key = GROUPS[q]
        dist = getattr(o, f"{q}_dist")
        if dist == "constant":
            return np.full(clients.size, getattr(o, mean_key), dtype=np.float64)
        if dist == "trace":
            col = COMPUTE_COLUMN[o.compute_unit] if q == "compute" else f"{q}_mbps"
            rows = clients % self._trace["client"].size
            return self._trace[col][rows].copy()
        u = self._keyed[stream].draw(clients, count=2)
        if dist == "uniform":
            lo, hi = getattr(o, low_key), getattr(o, high_key)
            return lo + (hi - lo) * u[:, 0]
        sigma = getattr(o, sigma_key)  # lognormal with the given arithmetic mean
        z = np.sqrt(-2.0 * np.log(u[:, 0])) * np.cos(2.0 * np.pi * u[:, 1])
        return getattr(o, mean_key) * np.exp(sigma * z - 0.5 * sigma * sigma)

    # ---------------------------------------------------------------- public
    def profile(self, clients) -> dict[str, np.ndarray]:
        """Static per-client values, keyed only by (seed, client).

        Returns ``compute_s`` (seconds per ``compute_unit``: per step or per sample),
        ``uplink_mbps`` and ``downlink_mbps`` (float64, aligned with ``clients``).
        """
        c = self._clients(clients)
        return {
            "compute_s": self._static("compute", STREAM_COMPUTE, c),
            "uplink_mbps": self._static("uplink", STREAM_UPLINK, c),
            "downlink_mbps": self._static("downlink", STREAM_DOWNLINK, c),
        }

    def available(self, rnd: int, clients) -> np.ndarray:
        """True where the client is available in round ``rnd`` (P = 1 - unavailability)."""
        c = self._clients(clients)
        p = self.options.unavailability
        if not self.options.enabled or p == 0.0:
            return np.ones(c.size, dtype=bool)
        return self._keyed[STREAM_AVAILABILITY].draw(c, self._round(rnd))[:, 0] >= p

    def slowdown(self, rnd: int, clients) -> np.ndarray:
        """Per-round speed factor xi in (0, 1]; a step takes step_s / xi."""
        c = self._clients(clients)
        o = self.options
        if not o.enabled or o.slowdown_dist == "none":
            return np.ones(c.size)
        u = self._keyed[STREAM_SLOWDOWN].draw(c, self._round(rnd))[:, 0]
        return 1.0 - (1.0 - o.slowdown_min) * u  # U(slowdown_min, 1]

    def delay(self, rnd: int, clients) -> np.ndarray:
        """Per-round reporting delay in seconds (between compute and upload)."""
        c = self._clients(clients)
        o = self.options
        if not o.enabled or o.delay_dist == "none":
            return np.zeros(c.size)
        if o.delay_dist == "constant":
            return np.full(c.size, o.delay_s)
        u = self._keyed[STREAM_DELAY].draw(c, self._round(rnd))[:, 0]
        if o.delay_dist == "uniform":
            return o.delay_low_s + (o.delay_high_s - o.delay_low_s) * u
        return -o.delay_s * np.log(u)  # exponential with mean delay_s

    @staticmethod
    def _round(rnd: int) -> int:
        if int(rnd) < 0:
            raise ValueError(f"round must be non-negative, got {rnd}")
        return int(rnd)

    def plan(self, rnd: int, clients, planned_steps, batch_sizes=1, granularity=1, finish_steps=0,
             full_steps=None) -> RoundPlan:
        """Plan round ``rnd`` for the sampled ``clients``.

        Parameters
        ----------
        rnd : int
            Round index (>= 0).
        clients : int array
            Sampled client ids (any order; the result is aligned with it).
        planned_steps : int or int array
            Local steps each client is asked to run (>= 0). For "as many as fit in the
            deadline" pass a large cap.
        batch_sizes : int or int array
            Samples per step; used only when ``compute_unit = "sample"``.
        granularity : int or int array
            A deadline-truncated client runs a multiple of this many steps (e.g. the
            client's steps per epoch to truncate to whole epochs). Default 1.
        finish_steps : int or int array
            Steps' worth of compute a participant runs after its local steps when these end
            below ``full_steps`` (FedLGA's full_grad: a pass over its data for the gradient it
            uploads). Charged to ``compute_s``; under a deadline such a client stops training
            early enough to fit it. Default 0.
        full_steps : int array or None
            The full local work of each client (default: ``planned_steps``).

        Notes
        -----
        With ``earliest_fraction < 1`` the cut to the first
        ``K = earliest_count(earliest_fraction, len(clients))`` reports is taken over the
        whole of ``clients``: pass the round's full cohort (the engine does, on every rank).
        """
        o = self.options
        c = self._clients(clients)
        n = c.size
        planned = self._ints("planned_steps", planned_steps, n, 0)
        if not o.enabled:
            reason = np.where(planned == 0, NO_STEPS, OK).astype(np.int8)
            z = np.zeros(n)
            return RoundPlan(c, planned, np.where(reason == OK, planned, 0), reason != OK,
                             reason, z, z.copy(), z.copy(), z.copy(), z.copy(), z.copy(), 0.0)
        prof = self.profile(c)
        step_s = prof["compute_s"] / self.slowdown(rnd, c)
        if o.compute_unit == "sample":
            step_s = step_s * self._ints("batch_sizes", batch_sizes, n, 1)
        with np.errstate(divide="ignore"):
            down = self.download_bytes * 8.0 / (prof["downlink_mbps"] * 1e6)
            up = self.upload_bytes * 8.0 / (prof["uplink_mbps"] * 1e6)
        delay = self.delay(rnd, c)
        avail = self.available(rnd, c)
        finish = self._ints("finish_steps", finish_steps, n, 0)
        full = planned if full_steps is None else self._ints("full_steps", full_steps, n, 0)
        steps = planned.copy()
        if o.deadline_s is not None:
            budget = o.deadline_s - down - up - delay
            fit = np.floor(np.maximum(budget, 0.0) / step_s * (1.0 + STEP_TOLERANCE))
            steps = np.minimum(fit, planned).astype(np.int64)
            # a client that cannot do its full work must leave time for its finishing compute
            fit = np.floor(np.maximum(budget - finish * step_s, 0.0) / step_s * (1.0 + STEP_TOLERANCE))
            steps = np.where(steps < full, np.minimum(steps, fit), steps).astype(np.int64)
            gran = self._ints("granularity", granularity, n, 1)
            cut = steps < planned
            steps[cut] = steps[cut] // gran[cut] * gran[cut]
        reason = np.full(n, OK, dtype=np.int8)
        reason[steps == 0] = DEADLINE
        reason[planned == 0] = NO_STEPS
        reason[~avail] = UNAVAILABLE
        dropped = reason != OK
        steps = np.where(dropped, 0, steps)
        compute = (steps + np.where(~dropped & (steps < full), finish, 0)) * step_s
        keep = ~dropped
        down, up, delay = (np.where(keep, a, 0.0) for a in (down, up, delay))
        total = down + compute + delay + up
        duration = float(total.max()) if n else 0.0
        if o.deadline_s is not None:
            if np.any(reason == DEADLINE):
                duration = o.deadline_s
            duration = min(duration, o.deadline_s)
        plan = RoundPlan(c, planned, steps, dropped, reason, step_s, down, compute, delay, up,
                         total, duration + o.server_s, o.server_s)
        if o.earliest_fraction < 1.0 and n:
            # after the deadline cut: only clients that fit it can be among the first K
            plan = plan.earliest(earliest_count(o.earliest_fraction, n))
        return plan

    @staticmethod
    def _ints(name: str, value, n: int, low: int) -> np.ndarray:
        a = np.asarray(value)
        if a.size and not np.issubdtype(a.dtype, np.integer):
            raise ValueError(f"{name} must be integers")
        a = np.broadcast_to(a, (n,)).astype(np.int64)
        if n and a.min() < low:
            raise ValueError(f"{name} must be at least {low}")
        return a
